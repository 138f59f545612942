"""Code contexts: persistent interpreters in a sandbox (``docs/code-contexts.md``).

::

    with Sandbox.open() as box:
        box.run_code("x = 41")
        ex = box.run_code("x + 1")
        print(ex.text)                       # "42": the value of the last expression
        ex = box.run_code("import sys; print('hi'); 1/0")
        print(ex.logs.stdout, ex.error.name)  # ['hi\\n'] ZeroDivisionError

:class:`Execution` has the shape E2B's and Cloudflare's code interpreters use: ``results``
(each a :class:`Result` with ``.text``, ``.html``, ``.png``, ... and ``.formats()``),
``logs`` (``stdout`` and ``stderr`` chunks), ``error`` (``name``, ``value``, ``traceback``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Context", "Execution", "ExecutionError", "Logs", "Result"]

_NAMES = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


@dataclass
class Result:
    """One rich result: the last expression's value (``is_main_result``), a ``display()``
    call or a matplotlib figure. Binary formats (``png``, ``jpeg``, ``pdf``) are base64
    text, as in E2B; :meth:`png_bytes` decodes."""

    data: dict[str, Any]
    is_main_result: bool = False

    def __getattr__(self, name: str) -> Any:
        for mime, short in _NAMES.items():
            if short == name:
                return self.data.get(mime)
        raise AttributeError(name)

    def formats(self) -> list[str]:
        """The formats present, by short name (``text``, ``html``, ``png``, ...; other MIME
        types as they are)."""
        return [_NAMES.get(m, m) for m in self.data]

    def png_bytes(self) -> bytes | None:
        """The PNG, decoded."""
        import base64

        png = self.data.get("image/png")
        return base64.b64decode(png) if png else None

    def __repr__(self) -> str:
        return f"Result({', '.join(self.formats())}{', main' if self.is_main_result else ''})"


@dataclass
class Logs:
    """Output chunks, in the order they were read."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass
class ExecutionError:
    """What the code raised (Python's exception class name, message and traceback), or why
    the run ended: ``KeyboardInterrupt`` (timeout, state kept), ``Timeout`` (interpreter
    killed, state lost), ``InterpreterDied`` (it crashed, state lost), ``ExitCode`` (bash)."""

    name: str
    value: str
    traceback: str = ""


@dataclass
class Execution:
    """The outcome of :meth:`~lockbox.client.RemoteSandbox.run_code`."""

    context: str
    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: ExecutionError | None = None
    exit_code: int | None = None
    timed_out: bool = False
    state_lost: bool = False
    """The interpreter ended in this run: the context's variables are gone."""
    truncated: bool = False
    duration_ms: int = 0

    @property
    def text(self) -> str | None:
        """The main result's ``text/plain`` (the last expression's value), if any."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @property
    def stdout(self) -> str:
        """All of stdout."""
        return "".join(self.logs.stdout)

    @property
    def stderr(self) -> str:
        """All of stderr."""
        return "".join(self.logs.stderr)


@dataclass
class Context:
    """A code context (a persistent interpreter) of a sandbox."""

    id: str
    language: str
    created_at: str = ""
    cwd: str | None = None
    pid: int | None = None
    runs: int = 0
    restarts: int = 0


def _result(d: dict[str, Any]) -> Result:
    return Result(data=dict(d.get("data") or {}), is_main_result=bool(d.get("is_main_result")))


def _error(d: dict[str, Any] | None) -> ExecutionError | None:
    if not d:
        return None
    return ExecutionError(d.get("name", ""), d.get("value", ""), d.get("traceback", ""))


def _execution(d: dict[str, Any]) -> Execution:
    logs = d.get("logs") or {}
    return Execution(
        context=d.get("context", ""),
        results=[_result(r) for r in d.get("results") or []],
        logs=Logs(list(logs.get("stdout") or []), list(logs.get("stderr") or [])),
        error=_error(d.get("error")),
        exit_code=d.get("exit_code"),
        timed_out=bool(d.get("timed_out")),
        state_lost=bool(d.get("state_lost")),
        truncated=bool(d.get("truncated")),
        duration_ms=int(d.get("duration_ms") or 0),
    )


def _context(d: dict[str, Any]) -> Context:
    return Context(id=d["id"], language=d["language"], created_at=d.get("created_at", ""), cwd=d.get("cwd"),
                   pid=d.get("pid"), runs=d.get("runs", 0), restarts=d.get("restarts", 0))
