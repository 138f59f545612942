"""Code contexts (docs/code-contexts.md): persistent interpreters in a sandbox, on
`Sandbox.open` and on a live `lockbox serve` through `lockbox.Client` alike. The sandbox's
Python is this test venv's (made readable in the sandbox), so matplotlib is importable."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from conftest import need
from test_client import server  # noqa: F401 - the live `lockbox serve` fixture

from lockbox import Client, Execution, Sandbox
from lockbox.errors import ServerError

VENV_PATH = f"{sys.prefix}/bin:/usr/local/bin:/usr/bin:/bin"


@pytest.fixture(params=["local", "remote"])
def open_box(request, tmp_path):
    """A sandbox that can read this venv, in process or on a live `lockbox serve`."""
    kw = {"fs_readable": [sys.prefix]}
    if request.param == "local":
        return lambda: Sandbox.open(state_dir=tmp_path / "state", **kw)
    url, token = request.getfixturevalue("server")
    return lambda: Client(url, token).create(**kw)


def test_the_default_context_keeps_variables_across_100_runs(open_box):
    with open_box() as box:
        box.run_code("n = 0")
        for i in range(1, 101):
            ex = box.run_code("n += 1\nn")
            assert isinstance(ex, Execution) and ex.error is None
            assert ex.text == str(i)
        (ctx,) = box.contexts()
        assert ctx.id == "default" and ctx.language == "python" and ctx.runs == 101


def test_a_matplotlib_figure_comes_back_as_a_png_result(open_box):
    need(os.path.exists(f"{sys.prefix}/lib") and _has_matplotlib(), "matplotlib in the test venv")
    with open_box() as box:
        ctx = box.create_context(env={"PATH": VENV_PATH})
        ex = box.run_code(
            "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()", ctx)
        assert ex.error is None, ex.error
        pngs = [r for r in ex.results if "png" in r.formats()]
        assert len(pngs) == 1, ex.results
        assert pngs[0].png_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        assert pngs[0].text.startswith("<Figure")


def test_errors_carry_name_value_and_traceback_and_rich_results_their_formats(open_box):
    with open_box() as box:
        ex = box.run_code("def f():\n    raise KeyError('missing')\nprint('before')\nf()")
        assert ex.error.name == "KeyError" and ex.error.value == "'missing'"
        assert "in f" in ex.error.traceback and ex.stdout == "before\n"
        ex = box.run_code("class H:\n    def _repr_html_(self): return '<i>h</i>'\nH()")
        (r,) = ex.results
        assert r.is_main_result and r.html == "<i>h</i>" and set(r.formats()) == {"html", "text"}


def test_an_infinite_loop_is_interrupted_and_the_context_survives(open_box):
    with open_box() as box:
        box.run_code("kept = 'yes'")
        started = time.monotonic()
        ex = box.run_code("while True:\n    pass", timeout=0.3)
        assert time.monotonic() - started < 2
        assert ex.timed_out and not ex.state_lost
        assert ex.error.name == "KeyboardInterrupt"
        assert box.run_code("kept").text == "'yes'"


def test_a_crashing_interpreter_is_reported_and_restarted(open_box):
    with open_box() as box:
        box.run_code("kept = 1")
        ex = box.run_code("import os\nos._exit(9)")
        assert ex.state_lost and ex.error.name == "InterpreterDied" and "status 9" in ex.error.value
        assert box.run_code("'kept' in globals()").text == "False"
        assert box.contexts()[0].restarts == 1


def test_stdout_is_streamed_to_the_callback_before_the_run_ends(open_box):
    with open_box() as box:
        seen = []
        done = threading.Event()

        def on_stdout(text):
            seen.append((text, done.is_set()))

        ex = box.run_code("import time\nprint('early')\ntime.sleep(1)\nprint('late')", on_stdout=on_stdout)
        done.set()
        assert [t for t, _ in seen] == ["early\n", "late\n"]
        assert ex.stdout == "early\nlate\n"


def test_a_streamed_error_reaches_on_error_as_an_execution_error(open_box):
    # mypy --strict found it: the remote client's on_error called the HTTP error parser.
    with open_box() as box:
        errors = []
        ex = box.run_code("1/0", on_error=errors.append)
        assert [(e.name, "division by zero" in e.value) for e in errors] == [("ZeroDivisionError", True)]
        assert ex.error is not None and ex.error.name == "ZeroDivisionError"


def test_a_bash_context_keeps_cwd_and_variables_and_contexts_are_deleted(open_box):
    with open_box() as box:
        sh = box.create_context("bash", id="sh")
        assert sh.id == "sh" and sh.language == "bash"
        assert box.run_code("cd /tmp && X=1", sh).exit_code == 0
        assert box.run_code("echo $X $PWD", "sh").stdout == "1 /tmp\n"
        assert box.run_code("exit 3", sh).error.name == "InterpreterDied"
        box.delete_context(sh)
        with pytest.raises(ServerError) as e:
            box.run_code("true", "sh")
        assert e.value.code == "CONTEXT_NOT_FOUND" and e.value.status == 404
        with pytest.raises(ServerError) as e:
            box.create_context("cobol")
        assert e.value.status == 400 and e.value.details.get("field") == "language"


def test_a_runs_env_holds_for_that_run_only(open_box):
    with open_box() as box:
        ctx = box.create_context("python", env={"MODE": "fast"})
        run = box.run_code("import os; (os.environ['MODE'], os.environ['EXTRA'])", ctx,
                           env={"MODE": "slow", "EXTRA": "1"})
        assert run.text == "('slow', '1')"
        after = box.run_code("(os.environ['MODE'], os.environ.get('EXTRA'))", ctx)
        assert after.text == "('fast', None)"
        with pytest.raises(ServerError) as e:
            box.run_code("1", ctx, env={"1BAD": "x"})
        assert e.value.status == 400 and e.value.details.get("field") == "env"


NOBODY = r"""
import json, sys
from lockbox import Sandbox
with Sandbox.open(state_dir=sys.argv[1], fs_readable=[sys.prefix]) as box:
    box.run_code("import os\nn = 1")
    kept = box.run_code("n += 1\nn").text
    who = box.run_code("os.getuid()").text
    ctx = box.create_context(env={"PATH": sys.prefix + "/bin:/usr/bin:/bin"})
    png = [r.formats() for r in box.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()", ctx).results]
    slow = box.run_code("while True:\n    pass", timeout=0.3)
    after = box.run_code("n").text
print(json.dumps({"kept": kept, "who": who, "png": png, "slow": slow.error.name, "after": after}))
"""


def test_contexts_work_as_uid_65534():
    need(os.geteuid() == 0, "root (the test re-runs as uid 65534)")
    need(shutil.which("setpriv") is not None, "setpriv (util-linux)")
    need(_has_matplotlib(), "matplotlib in the test venv")
    as_nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    probe = subprocess.run(as_nobody + [sys.executable, "-c", "import lockbox"], capture_output=True)
    need(probe.returncode == 0, f"a Python with lockbox that uid 65534 can run ({sys.executable})")
    root = tempfile.mkdtemp(prefix="lockbox-nobody-code-")
    try:
        os.chown(root, 65534, 65534)
        res = subprocess.run(as_nobody + [sys.executable, "-c", NOBODY, os.path.join(root, "state")],
                             capture_output=True, text=True, cwd=root, timeout=300)
        assert res.returncode == 0, res.stderr
        got = json.loads(res.stdout.strip().splitlines()[-1])
        assert got == {"kept": "2", "who": "65534", "png": [["png", "text"]], "slow": "KeyboardInterrupt",
                       "after": "2"}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
