"""Type stubs of the native module ``lockbox._lockbox`` (PyO3). Use the public API in
``lockbox``; these functions take and return the JSON forms the Python half builds."""

import os
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeAlias, final

__all__ = [
    "Journal",
    "LocalApi",
    "LocalBody",
    "PreparedTxn",
    "Process",
    "Run",
    "__version__",
    "check_policy",
    "cli_main",
    "default_state_dir",
    "duration_ms",
    "enable_pre_arm",
    "error_codes",
    "net_spec_error",
    "open_journal",
    "open_local",
    "prepare_txn",
    "recover",
    "run_plain",
    "run_txn",
    "spawn",
]

__version__: str

_Outcome: TypeAlias = tuple[str, bytes | None, str | None]

def check_policy(json: str) -> str:
    """Validates a policy (JSON form of ``lockbox_policy::Policy``); returns it normalised."""

def net_spec_error(spec: str) -> str | None:
    """Why ``spec`` is not a network destination spec (the message names it), or ``None``."""

def run_txn(spec: str, stdin: bytes | None = None, mode: str = "run") -> _Outcome:
    """Runs a transaction spec (``mode``: ``"run"`` or ``"dry_run"``); GIL released."""

def prepare_txn(spec: str, stdin: bytes | None = None) -> PreparedTxn:
    """Runs every stage of a transaction spec and keeps the layers."""

def cli_main(argv: list[str]) -> NoReturn:
    """Runs the `lockbox` command with `argv` and exits the process with its status."""
    ...

def enable_pre_arm(launcher: list[str]) -> None:
    """Lets this process use (and start) a pre-arm helper of this build; `launcher` runs
    the wheel's `lockbox` command."""

def error_codes() -> list[tuple[str, str]]:
    """Every error code lockbox has, with its family (policy, setup, cow, txn, journal, runtime, server)."""
    ...

def default_state_dir() -> str:
    """lockbox's state directory when none is given (`$LOCKBOX_STATE_DIR`, root: `/var/lib/lockbox`, else the XDG state directory + `lockbox`)."""
    ...

def recover(state_dir: str, workdir: str | None = None) -> str:
    """Rolls interrupted transactions forward or back; returns the report as JSON."""

def run_plain(stages: str, stdin: bytes | None = None) -> tuple[str, bytes]:
    """Runs stages as a streaming pipeline without a transaction."""

def spawn(
    policy: str,
    argv: list[str],
    stdin: str = "null",
    stdout: str = "null",
    stderr: str = "null",
    result_pipe: bool = False,
    state_dir: str | os.PathLike[str] | None = None,
) -> Process:
    """Starts one sandbox; stdio modes are ``"null"``, ``"pipe"`` or ``"inherit"``; a
    policy's ``image`` comes from ``state_dir``'s image store (pulled when missing)."""

def open_journal(url: str) -> Journal:
    """Opens a journal (``sqlite:PATH``, ``file:DIR``, ``postgres://...``)."""

# PyO3 classes cannot be subclassed.
@final
class PreparedTxn:
    """A prepared transaction (native)."""

    @property
    def id(self) -> str | None: ...
    @property
    def pending(self) -> bool: ...
    def outcome(self) -> _Outcome: ...
    def select(self, only: list[str], exclude: list[str]) -> None: ...
    def commit(self, force: bool = False) -> _Outcome: ...
    def abort(self) -> _Outcome: ...
    def keep(self) -> str: ...

@final
class Process:
    """A running sandbox (native); dropping it kills everything in it."""

    stdin_fd: int | None
    stdout_fd: int | None
    stderr_fd: int | None
    result_fd: int | None
    result_child_fd: int | None
    @property
    def pid(self) -> int: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def outcome(self) -> str | None: ...
    @property
    def elapsed(self) -> float: ...
    def wait(self, timeout: float | None = None, watch_result: bool = False) -> str: ...
    def unwatch_result(self) -> None: ...
    def stop(self, grace: float | None = None, timed_out: bool = False) -> str: ...

@final
class Journal:
    """A journal over one storage (native)."""

    def start(self, run_id: str, version: str | None = None, metadata: str | None = None) -> Run: ...
    def resume(self, run_id: str, value: str) -> None: ...
    def cancel(self, run_id: str, reason: str) -> None: ...
    def fork(
        self, run_id: str, step: str | None = None, offset: int | None = None, new_run_id: str | None = None
    ) -> str: ...
    def list(self) -> list[str]: ...
    def status(self, run_id: str) -> str: ...
    def entries(self, run_id: str, offset: int = 0) -> str: ...

@final
class Run:
    """One session of a run (native)."""

    @property
    def id(self) -> str: ...
    @property
    def session(self) -> int: ...
    @property
    def prefix(self) -> str: ...
    def record(self, name: str, func: Callable[[], Any], journal_errors: bool = False) -> Any: ...
    def record_async(
        self, name: str, func: Callable[[], Awaitable[Any]], journal_errors: bool = False
    ) -> Awaitable[Any]: ...
    def parallel(self, branches: list[tuple[str, Callable[[Run], Any]]]) -> dict[str, Any]: ...
    def parallel_async(
        self, branches: list[tuple[str, Callable[[Run], Awaitable[Any]]]]
    ) -> Awaitable[dict[str, Any]]: ...
    def suspend(self, event: str, payload: str | None = None) -> str | None: ...
    def complete(self, value: str) -> None: ...
    def fail(self, error: str) -> None: ...
    def cancel(self, reason: str) -> None: ...

def duration_ms(text: str) -> int:
    """A duration (``"500ms"``, ``"2m"``) in milliseconds; ``PolicyError`` naming it otherwise."""

def open_local(state_dir: str, slots: bool, agent_exe: str | None = None) -> LocalApi:
    """Opens a ``lockbox-runtime`` on ``state_dir`` (with ``slots``: the first free of
    ``state_dir/0``, ``/1``, ...) and ``lockbox serve``'s router over it, in this process."""

@final
class LocalApi:
    """``lockbox serve``'s API in process (see ``lockbox.local``)."""

    @property
    def token(self) -> str:
        """The bearer token requests must carry."""
    @property
    def state_dir(self) -> str:
        """The state directory the runtime holds."""
    def define_credentials(self, specs: list[str], upstream_ca: str | None = None) -> None:
        """Reads ``NAME=env:VAR`` / ``NAME=file:PATH`` credentials into the runtime's
        registry (``ValueError`` naming the credential and its source, never the value)."""
    def request(self, method: str, uri: str, headers: list[tuple[str, str]], body: bytes | None = None) -> tuple[int, str, LocalBody]:
        """One request: ``(status, content type, body)``; releases the GIL."""
    def shutdown(self) -> None:
        """Deletes every sandbox of the runtime."""

@final
class LocalBody:
    """A response body."""

    def next_chunk(self) -> bytes | None:
        """The next chunk, ``None`` at the end; releases the GIL while waiting."""
    def read_all(self) -> bytes:
        """Every remaining byte."""
    def close(self) -> None:
        """Drops the stream."""
