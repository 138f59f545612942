"""Run a Python function inside a lockbox sandbox, in a separate interpreter.

::

    from lockbox.executor import sandbox_run, SandboxExecutor, SandboxPool

    @sandbox_run(timeout=5)
    def score(program: str) -> float:
        ...                                   # runs sandboxed; no network, no host files

    res = score("...")                        # an ExecutionResult
    if res.ok: print(res.result)
    else: print(res.status, res.error)        # "error" (with .traceback), "timeout", "crashed"

    pool = SandboxPool(4, timeout=5)          # pre-started sandboxed interpreters
    res = pool.secure_execute(score.__wrapped__, "...")

How it works. The function and its arguments are pickled — by value with ``cloudpickle``
(a dependency of lockbox; so functions and classes of your own modules and ``__main__``
need not be importable inside), or with the standard ``pickle`` for another interpreter
(``python=``; by reference: their module must be importable by the sandboxed interpreter). A sandbox (:class:`lockbox.Sandbox`
policy: no network, only the interpreter's own directories readable, a private ``/tmp``)
runs the interpreter — by default this process's (``sys.executable``; its prefix and
site-packages are made visible read-only), or ``python=`` (e.g. ``/usr/bin/python3``).
The payload goes in through stdin; the result comes back through a pipe the parent owns,
and the parent wakes up on either the result, the sandbox's end or the deadline:

- ``ok``: the function returned; ``result`` holds the value;
- ``error``: it raised (``error`` is ``"Type: message"``, ``traceback`` the remote
  traceback), or its result could not be pickled, or exceeded ``max_result_bytes``;
- ``timeout``: the deadline passed; everything in the sandbox was killed;
- ``crashed``: the interpreter died without a result (signal, ``os._exit``, out of
  memory); reported as soon as it happens, never after waiting for the timeout.

After every call the whole sandbox is killed (it is a pid namespace: children, daemons
and grandchildren die with it). Results are unpickled with a restricted unpickler that
accepts plain data only (containers, numbers, strings, bytes, dates, ...): a result is
untrusted data, and unpickling arbitrary classes would run code in *this* process. Pass
``trusted_results=True`` to accept any class.
"""

from __future__ import annotations

import concurrent.futures
import copy
import functools
import io
import json
import os
import pickle
import queue
import site
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Self

import cloudpickle as _cloudpickle  # a dependency: pickles functions and classes by value

from . import _lockbox
from ._bootstrap import SOURCE
from ._sdk import Sandbox
from .errors import CrashedError, RemoteError, TimeoutError, UsageError  # noqa: A004 - lockbox's own, a subclass of LockboxError

__all__ = [
    "DEFAULT_MAX_RESULT_BYTES",
    "ExecutionResult",
    "SandboxExecutor",
    "SandboxPool",
    "sandbox_run",
    "wait_for_cleanup",
]

#: Largest result accepted by default (64 MiB); a bigger one is an ``error``.
DEFAULT_MAX_RESULT_BYTES = 64 << 20

Status = Literal["ok", "error", "timeout", "crashed"]


@dataclass
class ExecutionResult:
    """How a sandboxed call ended (``status``: ``ok``, ``error``, ``timeout``, ``crashed``).

    ``result`` is the value (``ok``); ``error`` a one-line ``"Type: message"`` and
    ``traceback`` the remote traceback (``error``); ``exit_code``/``signal`` how the
    interpreter ended when it ended by itself; ``duration`` the wall time in seconds.
    """

    status: Status
    result: Any = None
    error: str | None = None
    traceback: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        """The function returned a value."""
        return self.status == "ok"

    def unwrap(self) -> Any:
        """The value, or raises :class:`~lockbox.errors.RemoteError`,
        :class:`~lockbox.errors.TimeoutError` or :class:`~lockbox.errors.CrashedError`."""
        if self.status == "ok":
            return self.result
        if self.status == "timeout":
            raise TimeoutError(f"sandboxed call timed out after {self.duration:.3f}s",
                               code="EXEC_TIMEOUT", result=self)
        if self.status == "crashed":
            how = f"signal {self.signal}" if self.signal else f"exit code {self.exit_code}"
            raise CrashedError(f"sandboxed interpreter died without a result ({how})",
                               code="EXEC_CRASHED", result=self)
        raise RemoteError(f"sandboxed call raised {self.error}", code="EXEC_ERROR", result=self)


_SAFE_CLASSES = {
    ("builtins", n) for n in
    ("set", "frozenset", "complex", "bytearray", "slice", "range", "tuple", "list", "dict",
     "str", "bytes", "int", "float", "bool", "getattr")
} | {
    ("collections", "OrderedDict"), ("collections", "deque"), ("collections", "defaultdict"),
    ("collections", "Counter"), ("datetime", "date"), ("datetime", "datetime"),
    ("datetime", "time"), ("datetime", "timedelta"), ("datetime", "timezone"),
    ("decimal", "Decimal"), ("fractions", "Fraction"), ("uuid", "UUID"),
    ("copyreg", "_reconstructor"), ("builtins", "object"),
}
_SAFE_CLASSES.discard(("builtins", "getattr"))


class _PlainUnpickler(pickle.Unpickler):
    """Refuses every class outside plain data: unpickling a result must not run code."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_CLASSES:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"result holds {module}.{name}, which is not plain data; "
            "pass trusted_results=True to accept any class"
        )


def _loads(data: bytes, trusted: bool) -> Any:
    if trusted:
        return pickle.loads(data)
    return _PlainUnpickler(io.BytesIO(data)).load()


def _interpreter_reads(python: str) -> list[str]:
    """What the interpreter needs to see: its prefixes and site-packages (and lockbox's
    own directory, so decorated methods of pickled classes resolve)."""
    paths: list[str] = []
    if python == sys.executable:
        paths += [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
        paths += site.getsitepackages()
        paths.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths.append(os.path.dirname(os.path.realpath(python)))
    paths.append(os.path.dirname(os.path.abspath(python)))
    seen: list[str] = []
    for p in paths:
        p = os.path.abspath(p)
        if os.path.exists(p) and p not in seen and not any(p == s or p.startswith(s + "/") for s in seen):
            seen.append(p)
    return seen


class _Spec:
    """What every sandboxed interpreter of an executor shares."""

    def __init__(
        self,
        *,
        sandbox: Sandbox | None,
        python: str | None,
        pickler: str | None,
        output: str,
        extra_reads: list[str],
    ) -> None:
        base = sandbox or Sandbox()
        if base.image is not None and python is None:
            # This process's interpreter is a host path: the image's root does not have it.
            raise UsageError("an executor on an image needs python=, the image's interpreter "
                             "(such as /usr/local/bin/python3)")
        self.python = os.path.abspath(python or sys.executable)
        if pickler is None:
            pickler = "cloudpickle" if self.python == os.path.abspath(sys.executable) else "pickle"
        if pickler not in ("cloudpickle", "pickle"):
            raise UsageError(f"pickler must be 'cloudpickle' or 'pickle', not {pickler!r}")
        if output not in ("devnull", "inherit"):
            raise UsageError(f"output must be 'devnull' or 'inherit', not {output!r}")
        self.pickler = pickler
        self.output = output
        policy = base.policy()
        # On an image the interpreter is the image's: the host's directories of it are not
        # granted (a grant would be mounted over the image's own path).
        interpreter = [] if base.image is not None else _interpreter_reads(self.python)
        policy["fs"]["read"] = list(policy["fs"]["read"]) + interpreter + extra_reads
        policy["env"]["set"] = {**policy["env"]["set"], "LOCKBOX_IN_SANDBOX": "1",
                                "PYTHONDONTWRITEBYTECODE": "1"}
        policy.setdefault("cwd", "/tmp")
        # The executor keeps the deadline itself (per call, from when the payload is sent).
        policy.pop("timeout", None)
        self.policy = json.dumps(policy)
        self.state_dir = base.state_dir

    def spawn(self) -> Any:
        """Starts one sandboxed interpreter waiting for its payload."""
        stdio = "inherit" if self.output == "inherit" else "null"
        return _lockbox.spawn(
            self.policy,
            [self.python, "-I", "-c", SOURCE, "{result_fd}", self.pickler, self.output],
            "pipe", stdio, stdio, True, self.state_dir,
        )

    def dumps(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
        if self.pickler == "cloudpickle":
            _register_by_value(fn)
            data = _cloudpickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        else:
            data = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        return struct.pack(">Q", len(data)) + data


def _register_by_value(fn: Any) -> None:
    """Pickle the caller's own module by value: it is usually not importable inside."""
    target = getattr(fn, "func", fn)  # functools.partial
    target = getattr(target, "__func__", target)  # bound method
    name = getattr(target, "__module__", None)
    mod = sys.modules.get(name or "")
    if name is None or mod is None or name in ("__main__", "builtins") or name.startswith("lockbox"):
        return
    path = getattr(mod, "__file__", None) or ""
    roots = [p for p in [*site.getsitepackages(), sys.base_prefix, sys.prefix] if p]
    if path and not any(os.path.abspath(path).startswith(os.path.abspath(r) + "/") for r in roots):
        _cloudpickle.register_pickle_by_value(mod)


def _write_all(fd: int, data: bytes) -> None:
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except OSError:
        pass  # the interpreter died; the wait loop reports it
    finally:
        os.close(fd)


class _Reaper:
    """Kills finished sandboxes off the caller's path: once a result arrived, tearing the
    sandbox down (every process in it, its namespaces) costs the caller nothing."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Any, int]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def kill(self, proc: Any, fd: int) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lockbox-reaper", daemon=True)
                self._thread.start()
        self._queue.put((proc, fd))

    def _run(self) -> None:
        while True:
            proc, fd = self._queue.get()
            try:
                proc.stop(0.0)
            except Exception:
                pass
            finally:
                os.close(fd)
                self._queue.task_done()

    def join(self) -> None:
        """Waits until every handed-over sandbox is dead."""
        self._queue.join()


_reaper = _Reaper()


def wait_for_cleanup() -> None:
    """Blocks until every sandbox of a finished call is dead (they are killed in the
    background once their result arrived)."""
    _reaper.join()


def _wait_ready(proc: Any, timeout: float) -> bool:
    """Waits for the interpreter's ready byte; False if it died or took too long."""
    deadline = time.monotonic() + timeout
    while True:
        why = proc.wait(max(0.0, deadline - time.monotonic()), watch_result=True)
        if why != "result":
            return False
        try:
            return os.read(proc.result_fd, 1) == b"R"
        except BlockingIOError:
            continue


def _decode_result(status: bytes, data: bytes, trusted: bool, elapsed: float) -> ExecutionResult:
    """The result of the runner's frame (status ``o`` or ``e``, see ``_bootstrap``)."""
    if status == b"o":
        try:
            value = _loads(data, trusted)
        except Exception as e:
            return ExecutionResult("error", error=f"{type(e).__name__}: {e}", duration=elapsed)
        return ExecutionResult("ok", result=value, duration=elapsed)
    info = _PlainUnpickler(io.BytesIO(data)).load()
    return ExecutionResult("error", error=f"{info['type']}: {info['message']}",
                           traceback=info["traceback"], duration=elapsed)


def _run_call(
    proc: Any,
    payload: bytes,
    timeout: float | None,
    max_result: int,
    trusted: bool,
    ready_consumed: bool = False,
) -> ExecutionResult:
    """Sends ``payload`` to a started interpreter and supervises it to the end; the
    sandbox is dead when this returns."""
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    rfd = proc.result_fd
    os.set_blocking(rfd, False)
    if len(payload) <= 32 << 10:
        _write_all(proc.stdin_fd, payload)  # fits the pipe's buffer: cannot block
    else:
        threading.Thread(target=_write_all, args=(proc.stdin_fd, payload), daemon=True).start()
    buf = bytearray()
    header = 9
    ready_seen = [ready_consumed]

    def frame() -> tuple[bytes, bytes] | None:
        if len(buf) < header:
            return None
        (n,) = struct.unpack(">Q", buf[1:header])
        if len(buf) >= header + n:
            return bytes(buf[:1]), bytes(buf[header:header + n])
        return None

    def drain() -> bool:
        """Reads what is there; False at end of file."""
        while True:
            try:
                chunk = os.read(rfd, 1 << 20)
            except BlockingIOError:
                return True
            if not chunk:
                return False
            buf.extend(chunk)
            if not ready_seen[0] and buf:
                del buf[:1]  # the interpreter's ready byte
                ready_seen[0] = True
            if len(buf) > header + max_result:
                return False

    try:
        done = None
        while done is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            why = proc.wait(left, watch_result=True)
            if why == "result":
                if not drain():
                    proc.unwatch_result()
                done = frame()
                if (done is None and len(buf) > header + max_result) or (len(buf) >= header and struct.unpack(">Q", buf[1:header])[0] > max_result):
                    return ExecutionResult("error", error=f"ResultTooLarge: the result exceeds max_result_bytes={max_result}",
                                           duration=time.monotonic() - started)
            elif why == "deadline":
                proc.stop(0.0, timed_out=True)
                return ExecutionResult("timeout", duration=time.monotonic() - started)
            else:  # exited
                drain()
                done = frame()
                if done is None:
                    o = json.loads(proc.outcome or "{}")
                    return ExecutionResult("crashed", exit_code=o.get("exit_code"), signal=o.get("signal"),
                                           duration=time.monotonic() - started)
        status, data = done
        return _decode_result(status, data, trusted, time.monotonic() - started)
    finally:
        # Timeouts and crashes were stopped above, so the tree is dead when they return.
        _reaper.kill(proc, rfd)


class SandboxExecutor:
    """Runs functions (or methods of a copy of ``worker``) in a fresh sandboxed interpreter
    per call.

    Args:
        worker: an object whose methods ``secure_execute("name", ...)`` calls (on a copy).
        timeout: seconds per call (``None``: no limit).
        policy: the :class:`lockbox.Sandbox` to run in (default: ``Sandbox()``: no
            network, system directories read-only); the interpreter's directories are added
            read-only. Its ``timeout`` is ignored (use ``timeout=``). A ``Sandbox(image=REF)``
            runs the calls on that OCI image (from its ``state_dir``'s image store, pulled
            when missing): give ``python=`` the image's interpreter; the function must be
            importable there, or plain data pickled by value (``pickle`` by default, as for
            any other interpreter).
        python: the interpreter (default ``sys.executable``; required on an image).
        pickler: ``"cloudpickle"`` (default when ``python`` is this interpreter) or
            ``"pickle"`` (default for another interpreter, which may lack cloudpickle).
        max_result_bytes: larger results are an ``error``.
        output: ``"devnull"`` (default) or ``"inherit"`` for the function's stdout/stderr
            (flushed before the result is sent, so nothing printed is lost to the kill).
        trusted_results: unpickle results of any class (see the module doc).
        extra_reads: more host paths to make readable.
    """

    def __init__(
        self,
        worker: Any = None,
        *,
        timeout: float | None = None,
        policy: Sandbox | None = None,
        python: str | None = None,
        pickler: str | None = None,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        output: str = "devnull",
        trusted_results: bool = False,
        extra_reads: list[str] | None = None,
    ) -> None:
        self.worker = worker
        self.timeout = timeout
        self.max_result_bytes = max_result_bytes
        self.trusted_results = trusted_results
        self._spec = _Spec(sandbox=policy, python=python, pickler=pickler, output=output,
                           extra_reads=[os.path.abspath(p) for p in extra_reads or []])

    def _target(self, fn: Callable[..., Any] | str) -> Callable[..., Any]:
        if isinstance(fn, str):
            if self.worker is None:
                raise UsageError("secure_execute('name') needs SandboxExecutor(worker)")
            clone = copy.copy(self.worker)
            with _suppress_attr():
                clone._bypass_sandbox = True
            method = getattr(type(clone), fn, None)
            method = getattr(method, "__wrapped__", method)
            if method is None:
                raise UsageError(f"{type(clone).__name__} has no method {fn!r}")
            return functools.partial(method, clone)
        return fn

    def secure_execute(self, fn: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> ExecutionResult:
        """Runs ``fn(*args, **kwargs)`` (or ``worker.fn(...)`` on a copy when ``fn`` is a
        method name) in a new sandboxed interpreter; the GIL is released while waiting."""
        return self.execute_payload(self.payload(fn, *args, **kwargs))

    def payload(self, fn: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> bytes:
        """The framed, pickled call (what :meth:`execute_payload` runs; the Ray backend
        ships it to a worker)."""
        return self._spec.dumps(self._target(fn), args, kwargs)

    def execute_payload(self, payload: bytes) -> ExecutionResult:
        """Runs a call made by :meth:`payload` in a new sandboxed interpreter."""
        proc = self._spec.spawn()
        return _run_call(proc, payload, self.timeout, self.max_result_bytes, self.trusted_results)


_SPAWNER: concurrent.futures.ThreadPoolExecutor | None = None


def _spawner() -> concurrent.futures.ThreadPoolExecutor:
    global _SPAWNER
    if _SPAWNER is None:
        _SPAWNER = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lockbox-spawner")
    return _SPAWNER


def _discard(proc: Any) -> None:
    proc.stop(0.0)
    os.close(proc.stdin_fd)
    os.close(proc.result_fd)


class _suppress_attr:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> bool:
        return exc_type is not None and issubclass(exc_type, AttributeError)


class SandboxPool(SandboxExecutor):
    """A warm pool: ``size`` sandboxed interpreters started ahead of time, each waiting
    for one call. A call takes a ready interpreter (so it pays no start-up), and the used
    sandbox is killed and replaced in the background: no state leaks from one call to the
    next. Same arguments as :class:`SandboxExecutor`; use as a context manager or
    :meth:`close` it.
    """

    def __init__(self, size: int = 2, worker: Any = None, **kw: Any) -> None:
        if size < 1:
            raise UsageError("a pool needs at least one interpreter")
        super().__init__(worker, **kw)
        self.size = size
        self._ready: queue.Queue[Any] = queue.Queue()
        self._closed = False
        self._lock = threading.Lock()
        self._pending: list[concurrent.futures.Future[None]] = []
        for _ in range(size):
            self._refill()

    def _start_one(self) -> None:
        proc = self._spec.spawn()

        def when_ready() -> None:
            # Only interpreters that finished starting are handed out: that is the warmth.
            if not _wait_ready(proc, 120) or self._closed:
                _discard(proc)
            else:
                self._ready.put(proc)

        threading.Thread(target=when_ready, daemon=True).start()

    def _refill(self) -> None:
        # A sandbox dies with the thread that started it (PR_SET_PDEATHSIG), so every
        # start happens on the long-lived spawner thread, never on a short-lived one.
        fut = _spawner().submit(self._start_one)
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()] + [fut]

    def execute_payload(self, payload: bytes) -> ExecutionResult:
        """Runs a call made by :meth:`payload` in a pre-started sandboxed interpreter."""
        if self._closed:
            raise UsageError("this SandboxPool is closed")
        proc = self._ready.get()
        try:
            return _run_call(proc, payload, self.timeout, self.max_result_bytes,
                             self.trusted_results, ready_consumed=True)
        finally:
            # Replace it after the call, so the new interpreter's start-up does not compete
            # with the call for the CPU.
            if not self._closed:
                self._refill()

    def wait_ready(self, poll: float = 0.01) -> None:
        """Blocks until all ``size`` interpreters are started and ready (after a burst of
        calls, each replacement takes a sandbox start)."""
        while self._ready.qsize() < self.size and not self._closed:
            time.sleep(poll)

    def close(self) -> None:
        """Kills every waiting interpreter."""
        self._closed = True
        with self._lock:
            pending = list(self._pending)
        concurrent.futures.wait(pending)
        while True:
            try:
                _discard(self._ready.get_nowait())
            except queue.Empty:
                break

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            self.close()


def sandbox_run(
    func: Callable[..., Any] | None = None,
    *,
    timeout: float | None = None,
    policy: Sandbox | None = None,
    sandbox_type: str = "process",
    pool: SandboxExecutor | None = None,
    **executor_kw: Any,
) -> Any:
    """Decorator: each call of the function (or method) runs in a sandboxed interpreter
    and returns an :class:`ExecutionResult`.

    ``sandbox_type="process"`` runs it on this machine (a fresh sandbox per call, or the
    given ``pool``); ``"ray"`` on a Ray worker that runs it in a lockbox sandbox on its node
    (see :mod:`lockbox.ray`). A method runs on a copy of its object (``_bypass_sandbox`` is
    set on the copy, so calls from inside run directly). Other keyword arguments go to
    :class:`SandboxExecutor`.
    """
    if sandbox_type not in ("process", "ray"):
        raise UsageError(f"sandbox_type must be 'process' or 'ray', not {sandbox_type!r}")

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        is_method = "." in f.__qualname__ and "<locals>" not in f.__qualname__.rsplit(".", 1)[0].split(".")[-1:]
        state: dict[str, Any] = {}

        def executor() -> Any:
            if pool is not None:
                return pool
            if "ex" not in state:
                if sandbox_type == "ray":
                    from .ray import RaySandboxPool

                    state["ex"] = RaySandboxPool(1, timeout=timeout, policy=policy, **executor_kw)
                else:
                    state["ex"] = SandboxExecutor(timeout=timeout, policy=policy, **executor_kw)
            return state["ex"]

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if os.environ.get("LOCKBOX_IN_SANDBOX") == "1":
                return f(*args, **kwargs)
            if is_method and args and getattr(args[0], "_bypass_sandbox", False):
                return f(*args, **kwargs)
            if is_method and args:
                clone = copy.copy(args[0])
                with _suppress_attr():
                    clone._bypass_sandbox = True
                return executor().secure_execute(functools.partial(f, clone), *args[1:], **kwargs)
            return executor().secure_execute(f, *args, **kwargs)

        return wrapper

    if func is not None:
        return decorate(func)
    return decorate
