"""The value types of transactions: outcomes, stage results, changes, conflicts."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from ._names import from_json, quote

__all__ = [
    "AbortReason",
    "Change",
    "ConflictPolicy",
    "DryRunOutcome",
    "Marker",
    "MergeConflict",
    "PipelineResult",
    "StageResult",
    "TxnOutcome",
]


class ConflictPolicy(enum.Enum):
    """What a gather does when two sources change the same path.

    ``FAIL`` (the default) aborts the transaction and lists the conflicts;
    ``FIRST_WRITER_WINS`` / ``LAST_WRITER_WINS`` keep the earlier / later declared source's
    version; ``MARKERS`` keeps the first source's version at the path and every other
    source's as ``PATH.lockbox-<source>``.
    """

    FAIL = "fail"
    FIRST_WRITER_WINS = "first-writer-wins"
    LAST_WRITER_WINS = "last-writer-wins"
    MARKERS = "markers"


@dataclass(frozen=True)
class Change:
    """One path a transaction changes (or, for a dry run, would change).

    ``kind`` is ``"added"``, ``"modified"``, ``"deleted"`` or ``"type_changed"``;
    ``path`` is relative to the workdir (a ``str`` as ``os.fsdecode`` gives it: a name that
    is not UTF-8 holds lone surrogates, and ``os.fsencode(path)`` is its exact bytes);
    ``file_type`` is ``"file"``, ``"dir"``, ``"symlink"`` or ``"special"``. ``str(change)``
    is the ``--dry-run`` line, the path quoted if it holds control characters or bytes that
    are not UTF-8 (:func:`lockbox.quote_name`).
    """

    kind: str
    path: str
    file_type: str = "file"
    size: int = 0
    mode: int = 0
    #: What a reviewer was shown at this path (``sha256:...``; from ``RemoteSandbox.review``):
    #: a commit naming it writes this content or nothing.
    digest: str | None = None

    @property
    def letter(self) -> str:
        """The one-letter code of ``lockbox ... --dry-run``: ``A``, ``M``, ``D`` or ``T``."""
        return {"added": "A", "modified": "M", "deleted": "D", "type_changed": "T"}[self.kind]

    def __str__(self) -> str:
        return f"{self.letter} {quote(self.path)}"


@dataclass(frozen=True)
class MergeConflict:
    """A path changed by more than one gather source (``stages``, in declaration order)."""

    path: str
    stages: list[str]


@dataclass(frozen=True)
class Marker:
    """A losing version kept under another name by ``ConflictPolicy.MARKERS``."""

    path: str
    kept_as: str
    source: str


@dataclass(frozen=True)
class AbortReason:
    """Why a transaction did not commit.

    ``reason`` is one of ``"stage_failed"``, ``"outside_writable"``, ``"timed_out"``,
    ``"setup_failed"``, ``"conflicts"``, ``"dry_run"`` or ``"aborted"``; ``stage``/``name``
    say which stage (for the first four), ``exit_code`` its exit code, ``message`` the setup
    error, ``count`` the number of conflicting paths, ``paths`` what a stage restricted by
    ``fs_writable`` changed outside its writable parts (file modes, times: writes themselves
    fail with ``EACCES``).
    """

    reason: str
    stage: int | None = None
    name: str | None = None
    exit_code: int | None = None
    message: str | None = None
    count: int | None = None
    paths: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.paths is not None and not isinstance(self.paths, tuple):
            object.__setattr__(self, "paths", tuple(self.paths))

    def __str__(self) -> str:
        if self.reason == "stage_failed":
            return f"stage {self.name} failed with exit code {self.exit_code}"
        if self.reason == "outside_writable":
            return f"stage {self.name} changed paths outside its fs_writable: {', '.join(map(quote, self.paths or ()))}"
        if self.reason == "timed_out":
            return f"stage {self.name} timed out"
        if self.reason == "setup_failed":
            return f"stage {self.name} could not be set up: {self.message}"
        if self.reason == "conflicts":
            return f"{self.count} conflicting path(s)"
        if self.reason == "dry_run":
            return "dry run"
        return "aborted"


@dataclass(frozen=True)
class StageResult:
    """How one stage ended.

    ``exit_code`` follows ``lockbox run``: the command's own, ``128+N`` when killed by signal
    ``N``, ``124`` timeout, ``125`` setup failure, ``127`` not found. ``stderr`` holds its
    standard error (for transactional runs the last 8 KiB).
    """

    name: str
    exit_code: int
    signal: int | None = None
    timed_out: bool = False
    duration: float = 0.0
    stderr: str = ""
    stdout_len: int = 0
    setup_error: str | None = None
    attempts: int = 1
    #: It ran in a sandbox the pre-arm helper had set up beforehand (docs/pre-arm.md).
    pre_armed: bool = False

    @property
    def succeeded(self) -> bool:
        """Exited 0 in time."""
        return self.exit_code == 0 and not self.timed_out and self.setup_error is None


@dataclass
class PipelineResult:
    """What a non-transactional ``Pipeline.run()`` (or ``Cmd.run()``) did."""

    stages: list[StageResult]
    stdout: bytes = b""

    @property
    def returncode(self) -> int:
        """The last stage's exit code (like a shell pipeline without ``pipefail``)."""
        return self.stages[-1].exit_code if self.stages else 0

    @property
    def succeeded(self) -> bool:
        """Every stage exited 0 in time."""
        return all(s.succeeded for s in self.stages)


@dataclass
class TxnOutcome:
    """What a transaction did. ``stages`` holds every stage that ran, also when it aborted.

    ``changes`` is the union of changes (what was, or for a dry run would be, committed);
    ``conflicts`` the gather conflicts (resolved or not); ``abort_reason`` is ``None`` when
    it committed. ``stdout`` is the last stage's (the consumer's) standard output.
    """

    committed: bool
    stages: list[StageResult]
    changes: list[Change]
    conflicts: list[MergeConflict]
    abort_reason: AbortReason | None
    id: str = ""
    markers: list[Marker] = field(default_factory=list)
    exit_code: int = 0
    stdout: bytes = b""
    #: What happened, for people (the CLI's summary line: ``not committed: stage 2 exited
    #: 127: sh: ruff: not found``).
    summary: str = ""

    def all_succeeded(self) -> bool:
        """Every stage exited 0 in time."""
        return all(s.succeeded for s in self.stages)


#: The outcome of ``dry_run()``: a :class:`TxnOutcome` with ``committed=False`` and
#: ``abort_reason.reason == "dry_run"``.
DryRunOutcome = TxnOutcome


def _stage(d: dict[str, Any]) -> StageResult:
    return StageResult(
        name=d.get("name", ""),
        exit_code=d["exit_code"],
        signal=d.get("signal"),
        timed_out=d.get("timed_out", False),
        duration=d.get("duration", 0.0),
        stderr=d.get("stderr_tail", d.get("stderr", "")),
        stdout_len=d.get("stdout_len", 0),
        setup_error=d.get("setup_error"),
        attempts=d.get("attempts", 1),
        pre_armed=d.get("pre_armed", False),
    )


def _change(c: dict[str, Any]) -> Change:
    """A change from its JSON form (paths as ``lockbox_policy::name`` encodes them)."""
    mode = c.get("mode", 0)  # octal text from the HTTP API ("0644"), a number from the CLI's JSON
    return Change(kind=c["kind"], path=from_json(c["path"]), file_type=c.get("file_type", "file"),
                  size=c.get("size", 0), mode=int(mode, 8) if isinstance(mode, str) else mode,
                  digest=c.get("digest"))


def _outcome(raw: tuple[str, bytes | None, str | None]) -> TxnOutcome:
    text, stdout, stdout_path = raw
    d = json.loads(text)
    if stdout is None and stdout_path is not None:
        with open(stdout_path, "rb") as f:
            stdout = f.read()
    reason = d.get("abort_reason")
    if reason and reason.get("paths") is not None:
        reason = {**reason, "paths": [from_json(p) for p in reason["paths"]]}
    return TxnOutcome(
        committed=d["committed"],
        stages=[_stage(s) for s in d["stages"]],
        changes=[_change(c) for c in d["changes"]],
        conflicts=[MergeConflict(path=from_json(c["path"]), stages=list(c["stages"])) for c in d["conflicts"]],
        abort_reason=AbortReason(**reason) if reason else None,
        id=d["id"],
        markers=[Marker(path=from_json(m["path"]), kept_as=from_json(m["kept_as"]), source=m["source"])
                 for m in d.get("markers", [])],
        exit_code=d.get("exit_code", 0),
        stdout=stdout or b"",
        summary=d.get("summary", ""),
    )
