# The Python runner of lockbox code contexts (embedded in the agent, run as `python3 -c`).
# Requests on fd 4: "<length>\n<code>", after "env <count>\n" and count "<length>\nNAME=VALUE"
# for a run's own variables (set for the run, given their earlier values back after it).
# Events on fd 3: "<length>\n<json>", one of
# {"result": {"data": {mime: value}, "is_main_result": bool}}, {"error": {name, value,
# traceback}}, {"done": {"exit_code": null}}. User output goes to fds 1 and 2 as it is written.
import ast, base64, json, linecache, os, signal, sys, traceback

_REQ = os.fdopen(os.dup(4), "rb", buffering=0)
_EV = os.dup(3)
os.close(3)
os.close(4)
os.set_inheritable(_EV, False)
os.set_inheritable(_REQ.fileno(), False)
os.environ.setdefault("MPLBACKEND", "Agg")
sys.stdout.reconfigure(line_buffering=True)
sys.stderr.reconfigure(line_buffering=True)
sys.argv = [""]
_running = False


def _on_sigint(signum, frame):
    if _running:
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, _on_sigint)


def _send(obj):
    data = json.dumps(obj).encode()
    out = b"%d\n" % len(data) + data
    while out:
        out = out[os.write(_EV, out):]


def _read_exact(n):
    parts = []
    while n > 0:
        chunk = _REQ.read(n)
        if not chunk:
            return None
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _read_line():
    line = b""
    while not line.endswith(b"\n"):
        c = _REQ.read(1)
        if not c:
            return None
        line += c
    return line[:-1]


def _read_frame(line):
    body = _read_exact(int(line))
    return None if body is None else body.decode("utf-8", "replace")


def _read_request():
    """(env, code), or None at the end: the run's own variables ("env N" and N frames
    "NAME=VALUE") come before its code."""
    line = _read_line()
    if line is None:
        return None
    env = []
    if line.startswith(b"env "):
        for _ in range(int(line[4:])):
            entry_line = _read_line()
            entry = None if entry_line is None else _read_frame(entry_line)
            if entry is None:
                return None
            name, _, value = entry.partition("=")
            env.append((name, value))
        line = _read_line()
        if line is None:
            return None
    code = _read_frame(line)
    return None if code is None else (env, code)


_MIME = {
    "_repr_html_": "text/html",
    "_repr_markdown_": "text/markdown",
    "_repr_svg_": "image/svg+xml",
    "_repr_png_": "image/png",
    "_repr_jpeg_": "image/jpeg",
    "_repr_latex_": "text/latex",
    "_repr_json_": "application/json",
    "_repr_javascript_": "application/javascript",
    "_repr_pdf_": "application/pdf",
}


def _encode(mime, value):
    if isinstance(value, bytes):
        if mime.startswith("text/") or mime == "image/svg+xml":
            return value.decode("utf-8", "replace")
        return base64.b64encode(value).decode()
    if mime == "application/json":
        try:
            json.dumps(value)
            return value
        except (TypeError, ValueError):
            return str(value)
    if not isinstance(value, str):
        return str(value)
    return value


def _figure_png(fig):
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def _bundle(obj):
    data = {}
    mb = getattr(obj, "_repr_mimebundle_", None)
    if callable(mb) and not isinstance(obj, type):
        try:
            got = mb()
            if isinstance(got, tuple):
                got = got[0]
            for k, v in (got or {}).items():
                data[k] = _encode(k, v)
        except Exception:
            pass
    for meth, mime in _MIME.items():
        if mime in data:
            continue
        f = getattr(obj, meth, None)
        if not callable(f) or isinstance(obj, type):
            continue
        try:
            v = f()
        except Exception:
            continue
        if isinstance(v, tuple):
            v = v[0]
        if v is not None:
            data[mime] = _encode(mime, v)
    mpl = sys.modules.get("matplotlib.figure")
    if mpl is not None and isinstance(obj, mpl.Figure) and "image/png" not in data:
        data["image/png"] = base64.b64encode(_figure_png(obj)).decode()
    if "text/plain" not in data:
        try:
            data["text/plain"] = repr(obj)
        except Exception as e:
            data["text/plain"] = "<repr failed: %s>" % e
    return data


def display(*objs):
    """Shows each object as a result of the running code (like IPython's display())."""
    for obj in objs:
        _send({"result": {"data": _bundle(obj), "is_main_result": False}})


def _flush_figures(skip=None):
    """Sends every open figure as a PNG result and closes them all (`skip`: the cell's
    value, sent as the main result instead)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        fig = plt.figure(num)
        if fig is skip:
            continue
        _send({"result": {"data": {"image/png": base64.b64encode(_figure_png(fig)).decode(),
                                   "text/plain": repr(fig)}, "is_main_result": False}})
    plt.close("all")


def _show(*args, **kwargs):
    _flush_figures()


def _lockbox_system(cmd):
    """IPython's `!cmd`: runs `cmd` in the user's shell (`$SHELL`, else /bin/sh), its output
    on the run's stdout and stderr."""
    import subprocess
    sys.stdout.flush()
    sys.stderr.flush()
    subprocess.call(cmd, shell=True, executable=os.environ.get("SHELL") or None)


def _shell_escapes(code):
    """`code` with IPython's `!cmd` lines as calls of `_lockbox_system` (line for line, so
    tracebacks keep their numbers); None if it has none."""
    lines = code.splitlines(True)
    changed = False
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if stripped.startswith("!"):
            body = stripped.rstrip("\r\n")
            end = stripped[len(body):]
            indent = line[: len(line) - len(stripped)]
            lines[i] = "%s_lockbox_system(%r)%s" % (indent, body[1:], end)
            changed = True
    return "".join(lines) if changed else None


_ns = {"__name__": "__main__", "__builtins__": __builtins__, "display": display,
       "_lockbox_system": _lockbox_system}


def _error(e):
    tb = e.__traceback__
    # Leave out the runner's own frames.
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    if isinstance(e, SyntaxError):
        lines = traceback.format_exception_only(type(e), e)
    else:
        lines = traceback.format_exception(type(e), e, tb)
    return {"name": type(e).__name__, "value": str(e), "traceback": "".join(lines)}


_count = 0


def _run(code):
    global _running, _count
    _count += 1
    name = "<cell %d>" % _count
    # Kept in linecache so that tracebacks show the lines of earlier cells too.
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    try:
        tree = ast.parse(code, name, "exec")
    except SyntaxError as e:
        # Not Python: maybe IPython's shell escapes (`!pip install ...`), which only code
        # that does not parse can hold outside a string. The error is then the rest's.
        escaped = _shell_escapes(code)
        if escaped is None:
            _send({"error": _error(e)})
            return
        try:
            tree = ast.parse(escaped, name, "exec")
        except SyntaxError as e2:
            _send({"error": _error(e2)})
            return
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    _running = True
    try:
        if tree.body:
            exec(compile(tree, name, "exec"), _ns)
        value = eval(compile(last, name, "eval"), _ns) if last is not None else None
        if "matplotlib.pyplot" in sys.modules:
            plt = sys.modules["matplotlib.pyplot"]
            if plt.show is not _show:
                plt.show = _show
        _running = False
        _flush_figures(skip=value)
        if value is not None:
            _ns["_"] = value
            _send({"result": {"data": _bundle(value), "is_main_result": True}})
    except BaseException as e:  # KeyboardInterrupt and SystemExit too: the context lives on
        _running = False
        _send({"error": _error(e)})
    finally:
        _running = False


def _main():
    while True:
        request = _read_request()
        if request is None:
            return
        env, code = request
        saved = [(k, os.environ.get(k)) for k, _ in env]
        for k, v in env:
            os.environ[k] = v
        try:
            _run(code)
        finally:
            # Backwards, so that a name given twice gets its value from before the run.
            for k, old in reversed(saved):
                if old is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = old
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        _send({"done": {"exit_code": None}})


_main()
