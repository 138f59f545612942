"""The exceptions of lockbox, in one small hierarchy.

Every exception raised by the SDK for a lockbox failure is a :class:`LockboxError`. Each
carries the Rust error's stable ``code`` (for example ``"STALE_BASE"``), its ``message``, the
``exit_code`` the ``lockbox`` CLI would use for it, and ``details`` (a dict of extra fields).

A stage that fails, or gather sources that conflict, are *not* exceptions when you call
``run_transactional()``: they are reported in the returned :class:`~lockbox.TxnOutcome`.
Exceptions mean the machinery itself failed, or you asked for something impossible
(committing a transaction that cannot commit, replaying a journal with other steps, ...).

::

    LockboxError
    ├── PolicyError (also ValueError)        a sandbox policy no sandbox can honour
    ├── SetupError                           a sandbox could not be set up (exit 125)
    ├── UnsupportedError (NotImplementedError)  a feature this build does not have yet
    ├── TxnError                             the transaction machinery failed
    │   ├── UsageError (also ValueError)     bad transaction (no stages, unknown id, state)
    │   ├── BusyError                        another transaction holds the workdir lock
    │   ├── ConflictError                    unresolved gather conflicts (commit refused)
    │   └── CommitError                      nothing, or (after the commit point) all, applied
    │       ├── StageFailedError             commit of a transaction whose stage failed
    │       ├── StaleBaseError               the workdir changed under the transaction
    │       └── StaleReviewError             the branch changed since the review a commit names
    ├── JournalError                         the step journal refused or failed
    │   ├── ReplayMismatch                   the code made other calls than the journal has
    │   ├── VersionMismatch / MetadataMismatch
    │   ├── Fenced                           a newer session of the run took over
    │   ├── TerminalRun                      the run is finished
    │   ├── NotSerializable (also TypeError) a step value is not JSON-serialisable
    │   ├── StepFailed                       a step's exception was journaled (journal_errors=True)
    │   ├── RunNotFound / RunExists / StepTooLarge / StorageError
    ├── ServerError                          an error answered by ``lockbox serve`` (``status``)
    └── ExecutorError                        a sandboxed function did not return a value
        ├── RemoteError                      it raised (``traceback`` holds the remote one)
        ├── TimeoutError (also builtins.TimeoutError)  it ran out of time
        └── CrashedError                     it died without a result (signal, exit, OOM)
"""

from __future__ import annotations

import builtins
import json
from typing import Any

__all__ = [
    "BusyError",
    "CommitError",
    "ConflictError",
    "CrashedError",
    "ExecutorError",
    "Fenced",
    "JournalError",
    "LockboxError",
    "MetadataMismatch",
    "NotSerializable",
    "PolicyError",
    "RemoteError",
    "ReplayMismatch",
    "RunExists",
    "RunNotFound",
    "ServerError",
    "SetupError",
    "StageFailedError",
    "StaleBaseError",
    "StaleReviewError",
    "StepFailed",
    "StepTooLarge",
    "StorageError",
    "TerminalRun",
    "TimeoutError",
    "TxnError",
    "UnsupportedError",
    "UsageError",
    "VersionMismatch",
]


class LockboxError(Exception):
    """Base class of every lockbox error.

    Attributes:
        message: the human-readable message (also ``str(err)``).
        code: the stable machine-readable code of the Rust error (``"STALE_BASE"``, ...).
        exit_code: the exit code the ``lockbox`` CLI uses for this error, if any.
        details: extra fields (a dict; empty when there are none).
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "LOCKBOX_ERROR",
        exit_code: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.exit_code = exit_code
        self.details = details or {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code!r})"


class PolicyError(LockboxError, ValueError):
    """A sandbox policy that no sandbox can honour (bad size, relative path, ...)."""


class SetupError(LockboxError):
    """A sandbox could not be set up (missing kernel feature, bad path, ...); exit code 125.

    ``details["hint"]`` holds a hint when lockbox has one.
    """


class UnsupportedError(LockboxError, NotImplementedError):
    """A feature that this version of lockbox does not implement yet."""


class TxnError(LockboxError):
    """The transaction machinery failed (store, stdio, lock, commit)."""


class UsageError(TxnError, ValueError):
    """A transaction that cannot run: no stages, bad source name, unknown id, wrong state."""


class BusyError(TxnError):
    """Another transaction holds the workdir's lock (exit code 5)."""


class ConflictError(TxnError):
    """Gather sources changed the same paths under ``ConflictPolicy.FAIL``; nothing applied.

    ``conflicts`` lists the :class:`~lockbox.MergeConflict` s.
    """

    def __init__(self, message: str, *, conflicts: list[Any] | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.conflicts = conflicts or []


class CommitError(TxnError):
    """A commit failed. Before the commit point nothing was applied; after it (code
    ``TXN_APPLY``) the transaction is durable and ``lockbox txn recover`` finishes it."""


class StageFailedError(CommitError):
    """``commit()`` of a transaction whose stage failed: nothing was applied.

    ``abort_reason`` is the :class:`~lockbox.AbortReason`.
    """

    def __init__(self, message: str, *, abort_reason: Any = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.abort_reason = abort_reason


class StaleBaseError(CommitError):
    """Paths the transaction changes were changed in the workdir since it began (exit 5)."""


class StaleReviewError(CommitError):
    """A commit that follows a review would write what the review did not show: a path
    changed since, or added after it (exit 5). ``details["paths"]`` names them when known;
    nothing was applied: review again."""


class JournalError(LockboxError):
    """The step journal refused an operation or its storage failed.

    ``details["transient"]`` is true when retrying may help (storage unavailable, ...).
    """


class ReplayMismatch(JournalError):
    """A replayed run called a different step than the journal holds at that position."""


class VersionMismatch(JournalError):
    """The run was started with another ``version``."""


class MetadataMismatch(JournalError):
    """The run was started with other ``metadata``."""


class Fenced(JournalError):
    """A newer session of the run took over; this one may no longer write."""


class TerminalRun(JournalError):
    """The run is completed, failed or cancelled."""


class NotSerializable(JournalError, TypeError):
    """A step's value (or a payload) is not JSON-serialisable; nothing was journaled."""


class StepFailed(JournalError):
    """A step raised and ``journal_errors=True`` journaled it; a replay raises it again.

    ``details`` holds ``step``, ``type`` (the exception's qualified name) and ``message``.
    """


class RunNotFound(JournalError):
    """No run with this id."""


class RunExists(JournalError):
    """A run with this id exists already (``fork`` target)."""


class StepTooLarge(JournalError):
    """A step's encoded value exceeds the journal's entry bound."""


class StorageError(JournalError):
    """The journal's storage (SQLite, files, PostgreSQL) failed."""


class ServerError(LockboxError):
    """An error answered by ``lockbox serve``: ``code``, ``message``, ``details`` as sent,
    and the HTTP ``status`` (0 when the server could not be reached)."""

    def __init__(self, message: str, *, status: int = 0, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.status = status


class ExecutorError(LockboxError):
    """A sandboxed function did not return a value. ``result`` is the
    :class:`~lockbox.executor.ExecutionResult`."""

    def __init__(self, message: str, *, result: Any = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.result = result


class RemoteError(ExecutorError):
    """The function raised inside the sandbox; ``traceback`` is the remote traceback text."""

    @property
    def traceback(self) -> str:
        """The remote traceback, formatted."""
        return getattr(self.result, "traceback", None) or ""


class TimeoutError(ExecutorError, builtins.TimeoutError):  # noqa: A001
    """The function ran out of time; everything in its sandbox was killed."""


class CrashedError(ExecutorError):
    """The sandboxed interpreter died without a result (signal, exit, out of memory)."""


_BY_CODE: dict[str, type[LockboxError]] = {
    "TXN_USAGE": UsageError,
    "INVALID_TXN_ID": UsageError,
    "TXN_NOT_FOUND": UsageError,
    "TXN_WRONG_STATE": UsageError,
    "WORKDIR_BUSY": BusyError,
    "STALE_BASE": StaleBaseError,
    "STALE_REVIEW": StaleReviewError,
    "TXN_APPLY": CommitError,
    "REPLAY_MISMATCH": ReplayMismatch,
    "VERSION_MISMATCH": VersionMismatch,
    "METADATA_MISMATCH": MetadataMismatch,
    "FENCED": Fenced,
    "TERMINAL_RUN": TerminalRun,
    "NOT_SERIALIZABLE": NotSerializable,
    "ENCODE_VALUE": NotSerializable,
    "STEP_FAILED": StepFailed,
    "RUN_NOT_FOUND": RunNotFound,
    "RUN_EXISTS": RunExists,
    "STEP_TOO_LARGE": StepTooLarge,
}

_BY_FAMILY: dict[str, type[LockboxError]] = {
    "policy": PolicyError,
    "setup": SetupError,
    "txn": TxnError,
    "journal": JournalError,
}


def _from_rust(
    family: str, code: str, message: str, exit_code: int | None, details: str
) -> LockboxError:
    """Builds the exception for an error of the native module (called from Rust)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        if family == "setup" and code in {"BAD_SIZE", "BAD_DURATION", "RELATIVE_PATH",
                                          "RESERVED_PATH", "BAD_ENV", "INVALID_POLICY", "BAD_PROFILE"}:
            cls = PolicyError
        elif family == "journal" and code.startswith("STORAGE"):
            cls = StorageError
        elif family == "txn" and exit_code == 4:
            cls = CommitError
        else:
            cls = _BY_FAMILY.get(family, LockboxError)
    parsed = json.loads(details) if details else None
    return cls(message, code=code, exit_code=exit_code,
               details=parsed if isinstance(parsed, dict) else {})
