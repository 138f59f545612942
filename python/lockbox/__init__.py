"""lockbox: run untrusted, AI-written code confined on Linux, without privilege.

A thin Python layer over lockbox's Rust crates:

- :class:`Sandbox` (a policy), :meth:`Sandbox.cmd` (a command), ``a | b | c``
  (:class:`Pipeline`) and :class:`Gather`, run alone or as all-or-nothing transactions
  (``run_transactional()``, ``dry_run()``, ``prepare()``, ``transaction()``);
- :meth:`Sandbox.open`: a long-lived sandbox in this process (sessions, processes, files,
  its copy-on-write branch), with the methods of :class:`Client`'s (``lockbox serve``);
- :mod:`lockbox.journal`: a durable step journal (record/replay of an agent's steps);
- :mod:`lockbox.executor`: run a Python function in a sandboxed interpreter
  (``@sandbox_run``, :class:`~lockbox.executor.SandboxExecutor`,
  :class:`~lockbox.executor.SandboxPool`); :mod:`lockbox.ray` runs it on Ray workers;
- :mod:`lockbox.errors`: the exceptions.

Example::

    from lockbox import Sandbox
    box = Sandbox(workdir="/tmp/repo", timeout=30)
    out = (box.cmd(["sh", "-c", "echo hi > a.txt"]) | box.cmd(["cat", "a.txt"])).run_transactional()
    assert out.committed and out.stdout == b"hi\\n"
"""

from . import errors
from ._lockbox import __version__
from ._names import quote as quote_name
from ._sdk import Cmd, Gather, Pipeline, PreparedTxn, Sandbox, Transaction, default_state_dir, recover
from ._types import (
    AbortReason,
    Change,
    ConflictPolicy,
    DryRunOutcome,
    Marker,
    MergeConflict,
    PipelineResult,
    StageResult,
    TxnOutcome,
)
from .client import AsyncClient, Client
from .code import Context, Execution, ExecutionError, Logs, Result
from .errors import (
    CommitError,
    ConflictError,
    LockboxError,
    PolicyError,
    SetupError,
    TxnError,
    UnsupportedError,
)
from .local import LocalClient, LocalSandbox

__all__ = [
    "AbortReason",
    "AsyncClient",
    "Change",
    "Client",
    "Cmd",
    "CommitError",
    "ConflictError",
    "ConflictPolicy",
    "Context",
    "DryRunOutcome",
    "Execution",
    "ExecutionError",
    "Gather",
    "LocalClient",
    "LocalSandbox",
    "LockboxError",
    "Logs",
    "Marker",
    "MergeConflict",
    "Pipeline",
    "PipelineResult",
    "PolicyError",
    "PreparedTxn",
    "Result",
    "Sandbox",
    "SetupError",
    "StageResult",
    "Transaction",
    "TxnError",
    "TxnOutcome",
    "UnsupportedError",
    "__version__",
    "default_state_dir",
    "errors",
    "quote_name",
    "recover",
]
