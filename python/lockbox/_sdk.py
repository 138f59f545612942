"""Sandboxes, commands, pipelines and gathers: the shape of the RFC's Python API, over the
native module (``lockbox-confine`` and ``lockbox-txn``)."""

from __future__ import annotations

import abc
import contextlib
import json
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from . import _lockbox
from ._names import from_json, to_json
from ._types import (
    ConflictPolicy,
    PipelineResult,
    TxnOutcome,
    _outcome,
    _stage,
)
from .errors import ConflictError, PolicyError, StageFailedError, UsageError

if TYPE_CHECKING:
    from .client import AsyncSandbox
    from .local import LocalSandbox

__all__ = [
    "Cmd",
    "Gather",
    "Pipeline",
    "PreparedTxn",
    "Sandbox",
    "Transaction",
    "default_state_dir",
    "recover",
]

PathLike = str | os.PathLike[str]


#: The pre-arm helper's program: the extension module alone, loaded from its file without
#: the rest of this package, then the wheel's ``lockbox`` command. Its spares are forks of it,
#: and each command's ``execve`` tears that copy down: the smaller, the sooner the command
#: runs (docs/benchmarks.md, "Pre-armed starts"). ``sys.orig_argv`` holds this code itself,
#: for the helper's own launcher.
_PRE_ARM_HELPER = (
    "import importlib.util as u, sys; path = sys.argv.pop(1); "
    "spec = u.spec_from_file_location('lockbox._lockbox', path); "
    "m = u.module_from_spec(spec); spec.loader.exec_module(m); "
    "m.enable_pre_arm([sys.executable, '-c', sys.orig_argv[2], path]); m.cli_main(sys.argv)"
)


def _pre_arm_launcher() -> list[str]:
    """The command that starts this SDK's pre-arm helper: this interpreter running the
    wheel's ``lockbox`` from this package's extension (docs/pre-arm.md, "From the Python
    SDK")."""
    module = getattr(_lockbox, "__file__", None)
    return [sys.executable, "-c", _PRE_ARM_HELPER, module] if sys.executable and module else []


_lockbox.enable_pre_arm(_pre_arm_launcher())


def default_state_dir() -> str:
    """lockbox's state directory, as the CLI and ``lockbox serve`` pick it (one rule, in
    Rust): ``$LOCKBOX_STATE_DIR``, else ``/var/lib/lockbox`` for root, else
    ``$XDG_STATE_HOME/lockbox`` or ``~/.local/state/lockbox``."""
    return os.fspath(_lockbox.default_state_dir())


def recover(workdir: PathLike | None = None, *, state_dir: PathLike | None = None) -> dict[str, Any]:
    """Finishes or rolls back transactions interrupted by a crash (of ``workdir``, or of every
    workdir): after their commit point they are applied, before it aborted (a kept prepared
    transaction stays prepared). Returns
    ``{rolled_forward, rolled_back, abandoned, left_prepared, removed, damaged}``. Every commit
    already does this for its own workdir; call it at start-up to clean up the others."""
    state = _abs(state_dir) if state_dir is not None else default_state_dir()
    wd = _abs(workdir) if workdir is not None else None
    report = json.loads(_lockbox.recover(state, wd))
    report["damaged"] = [from_json(p) for p in report.get("damaged", [])]
    return report


def _abs(p: PathLike) -> str:
    return os.path.abspath(os.fspath(p))


def _size(v: int | str | None) -> int | str | None:
    return v if v is None or isinstance(v, int) else str(v)


def _duration(v: float | str | None) -> str | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if v <= 0:
        raise UsageError(f"timeout must be greater than zero, not {v!r}", code="INVALID_POLICY")
    return f"{max(1, round(v * 1000))}ms"


def _net_specs(field: str, specs: Sequence[str]) -> list[str]:
    """Checks each destination spec now (``NetSpec::parse``), so a typo fails where it was
    written, naming the spec."""
    if isinstance(specs, (str, bytes)):
        raise UsageError(f"{field} must be a list of specs, e.g. ['pypi.org:443']", code="INVALID_POLICY")
    out = []
    for spec in specs:
        if not isinstance(spec, str):
            raise UsageError(f"{field}: {spec!r} is not a string", code="INVALID_POLICY")
        problem = _lockbox.net_spec_error(spec)
        if problem is not None:
            raise UsageError(f"{field}: {problem}", code="BAD_NET_SPEC")
        out.append(spec)
    return out


def _net_json(net: str, allow: list[str], deny: list[str]) -> Any:
    if allow:
        return {"allow": allow}
    if deny:
        return {"deny": deny}
    return net


def _ms(v: float | str | None) -> int | None:
    if v is None:
        return None
    if isinstance(v, str):
        return _lockbox.duration_ms(v)
    if v < 0:
        raise UsageError(f"a duration must not be negative, not {v!r}", code="INVALID_POLICY")
    return max(1, round(v * 1000))


def _writable_parts(grants: list[str], workdir: str) -> list[str] | None:
    """The RFC's per-stage ``fs_writable`` inside a transaction's workdir: ``None`` (the
    whole view writable) unless every writable grant that reaches into the workdir lies
    strictly below it — then the stage may write only those parts (relative paths)."""
    root = os.path.realpath(workdir)
    inside = []
    for g in grants:
        real = os.path.realpath(g)
        if _below(root, real):
            return None  # the workdir itself (or a parent) is writable
        if _below(real, root):
            inside.append(os.path.relpath(real, root))
    return inside or None


def _checked_workdir(workdir: PathLike) -> str:
    """The workdir as an absolute path, refused now (before anything runs) when it is not an
    existing directory, as ``lockbox run --workdir`` refuses it."""
    path = _abs(workdir)
    if not os.path.exists(path):
        raise PolicyError(f"workdir {path}: no such directory", code="WORKDIR_NOT_FOUND",
                          exit_code=125, details={"field": "workdir", "path": path})
    if not os.path.isdir(path):
        raise PolicyError(f"workdir {path}: not a directory", code="WORKDIR_NOT_A_DIRECTORY",
                          exit_code=125, details={"field": "workdir", "path": path})
    return path


def _below(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class Sandbox:
    """A sandbox policy: what commands run under it may see and use.

    Nothing runs when you create one; ``cmd()`` makes a command, and commands run alone
    (``.run()``), in pipelines (``a | b | c``) or gathers, with or without a transaction.

    Args:
        workdir: the directory the commands work in (their current directory). In a
            transaction its writes land in copy-on-write layers and reach it only at commit;
            every stage of one transaction must have the same workdir.
        fs_readable: extra host paths visible read-only (``/usr``, ``/bin``, ``/sbin``,
            ``/lib``, ``/lib64`` and ``/etc`` without its secrets are always readable unless
            ``default_reads=False``).
        fs_writable: host paths visible read-write. Outside transactions writes reach the
            host directly. Inside a transaction writes within the workdir go to the
            transaction's layer: the workdir (or a parent) makes all of it writable, paths
            strictly below it restrict the stage to those parts, and with neither the stage
            may write all of it; other writable paths are written directly.
        net_allow: destinations on the host's network the sandbox may reach; everything else
            stays refused (loopback inside the sandbox always works). Each spec is
            ``[tcp://|udp://]HOST:PORTS`` as for ``lockbox run --net-allow``: HOST a name
            or ``*.name`` (its subdomains), resolved by lockbox, the sandbox's DNS resolver,
            when the sandbox asks (other names get NXDOMAIN), an IPv4 address or CIDR block, or
            ``[IPv6]`` / ``[IPv6/prefix]``; PORTS a number, ``A-B`` or ``*``; no scheme
            means TCP and UDP. A bad spec raises :class:`~lockbox.errors.UsageError`
            naming it, here.
        net_deny: the opposite: the host's network except these destinations (and never
            the host's loopback; names resolved once at start, no ``*.`` names). At most
            one of ``net_allow`` and ``net_deny``.
        net: ``"none"`` (loopback only, the default) or ``"host"`` (the host's network);
            leave it at ``"none"`` with ``net_allow``/``net_deny``.
        max_memory: memory limit (bytes, or a size such as ``"512M"``, ``"1G"``).
        max_processes: limit on processes and threads in the sandbox.
        timeout: wall-clock limit in seconds (or a duration such as ``"30s"``); then every
            process in the sandbox is stopped and the exit code is 124.
        env: variables to set.
        env_pass: names of this process's variables to pass through.
        clean_env: start from an empty environment (otherwise ``PATH``, ``LANG``,
            ``LC_ALL``, ``TERM`` are inherited and ``HOME=/tmp``).
        cwd: the current directory inside (default: the workdir).
        max_cpu_time: CPU seconds per process. ``max_open_files``, ``max_file_size``: limits.
        max_inodes: files, directories and symlinks each of the sandbox's own tmpfs mounts
            (``/tmp``, ``/dev/shm``) may hold (default 262144, or one per KiB of
            ``max_memory`` if fewer; docs/security.md).
        default_reads: include the default read-only system paths.
        hostname: the hostname inside.
        kill_grace: seconds between SIGTERM and SIGKILL when stopped.
        state_dir: where transactions keep their layers and records (default:
            :func:`default_state_dir`); its image store holds ``image``.
        image: an OCI image to run on instead of the host's userland (``"busybox:1.36"``,
            ``"oci:/srv/images/app:v1"``), in transactions (``run_transactional``,
            ``prepare``, :class:`Gather`): found in the state directory's image store, or
            pulled into it when missing, and held while the transaction runs; its ``Env``
            and ``User`` apply, the workdir is mounted at its own path and stays the cwd
            (docs/images.md, "Transactions on an image"). ``Pipeline.run()`` without a
            transaction does not take images yet.
    """

    def __init__(
        self,
        workdir: PathLike | None = None,
        *,
        fs_readable: Sequence[PathLike] = (),
        fs_writable: Sequence[PathLike] = (),
        net_allow: Sequence[str] = (),
        net_deny: Sequence[str] = (),
        net: str = "none",
        max_memory: int | str | None = None,
        max_processes: int | None = None,
        timeout: float | str | None = None,
        env: Mapping[str, str] | None = None,
        env_pass: Sequence[str] = (),
        clean_env: bool = False,
        cwd: PathLike | None = None,
        max_cpu_time: float | str | None = None,
        max_open_files: int | None = None,
        max_file_size: int | str | None = None,
        max_inodes: int | None = None,
        default_reads: bool = True,
        hostname: str | None = None,
        kill_grace: float | None = None,
        state_dir: PathLike | None = None,
        image: str | None = None,
    ) -> None:
        if net not in ("none", "host"):
            raise UsageError(f"net must be 'none' or 'host', not {net!r}", code="INVALID_POLICY")
        net_allow, net_deny = _net_specs("net_allow", net_allow), _net_specs("net_deny", net_deny)
        if net_allow and net_deny:
            raise UsageError("give net_allow or net_deny, not both", code="INVALID_POLICY")
        if (net_allow or net_deny) and net != "none":
            which = "net_allow" if net_allow else "net_deny"
            raise UsageError(f"{which} replaces net={net!r}: leave net out", code="INVALID_POLICY")
        self.workdir = _checked_workdir(workdir) if workdir is not None else None
        self.fs_readable = [_abs(p) for p in fs_readable]
        self.fs_writable = [_abs(p) for p in fs_writable]
        self.net_allow = net_allow
        self.net_deny = net_deny
        self.net = net
        self.max_memory = max_memory
        self.max_processes = max_processes
        self.timeout = timeout
        self.env = dict(env or {})
        self.env_pass = list(env_pass)
        self.clean_env = clean_env
        self.cwd = _abs(cwd) if cwd is not None else None
        self.max_cpu_time = max_cpu_time
        self.max_open_files = max_open_files
        self.max_file_size = max_file_size
        self.max_inodes = max_inodes
        self.default_reads = default_reads
        self.hostname = hostname
        self.kill_grace = kill_grace
        self.state_dir = _abs(state_dir) if state_dir is not None else None
        self.image = image
        # Validate now, so a bad keyword fails where it was written.
        _lockbox.check_policy(json.dumps(self.policy()))

    def __repr__(self) -> str:
        return f"Sandbox(workdir={self.workdir!r})"

    def policy(self, *, transaction_workdir: str | None = None) -> dict[str, Any]:
        """The JSON form of the ``lockbox_policy::Policy`` this sandbox stands for (the same
        fields as a ``lockbox run --profile`` file). In a transaction, grants at or below
        its workdir are left to the transaction's copy-on-write view."""
        read = list(self.fs_readable)
        write = list(self.fs_writable)
        cwd = self.cwd or self.workdir
        if transaction_workdir is not None:
            read = [p for p in read if not _below(p, transaction_workdir)]
            write = [p for p in write if not _below(p, transaction_workdir)]
        elif self.workdir is not None and not any(
            _below(self.workdir, p) for p in read + write
        ):
            read.append(self.workdir)
        limits: dict[str, Any] = {}
        if self.max_memory is not None:
            limits["memory"] = _size(self.max_memory)
        if self.max_processes is not None:
            limits["processes"] = self.max_processes
        if self.max_cpu_time is not None:
            limits["cpu_time"] = _duration(self.max_cpu_time)
        if self.max_open_files is not None:
            limits["open_files"] = self.max_open_files
        if self.max_file_size is not None:
            limits["file_size"] = _size(self.max_file_size)
        if self.max_inodes is not None:
            limits["inodes"] = self.max_inodes
        # Paths in lockbox's JSON form: a name that is not UTF-8 is {"bytes": base64}.
        policy: dict[str, Any] = {
            "fs": {"default_reads": self.default_reads, "read": [to_json(p) for p in read],
                   "write": [to_json(p) for p in write]},
            "net": _net_json(self.net, self.net_allow, self.net_deny),
            "limits": limits,
            "env": {"clean": self.clean_env, "set": self.env, "pass": self.env_pass},
        }
        if self.timeout is not None:
            policy["timeout"] = _duration(self.timeout)
        if self.kill_grace is not None:
            policy["kill_grace"] = f"{max(0, round(self.kill_grace * 1000))}ms"
        if cwd is not None:
            policy["cwd"] = to_json(cwd)
        if self.hostname is not None:
            policy["hostname"] = self.hostname
        if self.image is not None:
            policy["image"] = self.image
        return policy

    @classmethod
    def open(
        cls,
        workdir: PathLike | None = None,
        *,
        on_exit: str = "keep",
        idle_timeout: float | None = None,
        labels: Mapping[str, str] | None = None,
        state_dir: PathLike | None = None,
        agent_exe: PathLike | None = None,
        from_snapshot: str | Mapping[str, Any] | None = None,
        net_ask: bool = False,
        net_ask_timeout: float | None = None,
        on_ask: Any = None,
        credentials: Mapping[str, str] | None = None,
        http_auth: Sequence[str] = (),
        http_allow: Sequence[str] = (),
        upstream_ca: PathLike | None = None,
        image: str | None = None,
        image_pull: str | None = None,
        **policy: Any,
    ) -> LocalSandbox:
        """Starts a long-lived sandbox in this process (``lockbox-runtime``) and returns it:
        persistent shell sessions, background processes with streamed logs, files, and (with
        a ``workdir``) a copy-on-write branch to inspect, commit or abort. It has the methods
        of a sandbox of :class:`lockbox.Client` (``lockbox serve``), so the same code runs
        locally and remotely; use it as a context manager (leaving kills it).

        Args:
            workdir: a host directory the sandbox sees through a copy-on-write branch at the
                same path (its current directory); ``changes()``, ``commit()`` and
                ``abort()`` act on the branch.
            on_exit: what closing does with the branch: ``"keep"`` (default, reviewable
                with ``lockbox branch``), ``"commit"`` or ``"abort"``.
            idle_timeout: delete the sandbox after this many seconds without a call.
            labels: free-form labels, returned in its ``info``.
            state_dir: the runtime's state directory (default: a free one of
                ``<default_state_dir()>/sdk/N``; docs/python.md).
            agent_exe: the in-sandbox agent executable (default: ``$LOCKBOX_AGENT``, else the
                one embedded in this package).
            from_snapshot: start from a snapshot's files (its id, or the dict
                ``box.snapshot()`` returned) of this process's runtime: a fork with this
                policy; ``workdir`` may be left out (it is the snapshot's).
            net_ask: with ``net_allow``, a connect, send or DNS query towards a destination
                off the list waits for an answer instead of failing: ``on_ask``'s, or one
                given with ``box.approvals()`` / ``box.decide(id, decision)``
                (docs/security.md "Approvals").
            net_ask_timeout: seconds a question waits for its answer (default 30); then
                the call is denied.
            on_ask: ``fn(question: dict) -> "once" | "sandbox" | "deny"``, called in a
                background thread for each question (see ``RemoteSandbox.on_ask``).
            credentials: ``{"NAME": "env:VAR" | "file:PATH"}``: secrets the sandbox may use
                but never read, read now from this process's environment or files into the
                runtime (this process is the caller, so it may name its own variables; a
                ``lockbox.Client`` names only the server's ``--credential`` registry).
            http_auth: ``"HOST bearer NAME"`` / ``"HOST header HEADER-NAME NAME"`` rules:
                lockbox terminates the sandbox's HTTPS to HOST (allowed by name in
                ``net_allow``) and sets credential NAME on each request
                (docs/security.md "Credentials that never enter the sandbox").
            http_allow: ``"METHOD HOST/PATH-PREFIX"`` rules: on HOST only these requests
                pass (others get 403 from lockbox).
            upstream_ca: a PEM file of CAs also trusted for the real servers of
                intercepted hosts (kept by this process's runtime for later sandboxes too).
            image: an OCI image to run on instead of the host's userland
                (``"busybox:1.36"``, ``"oci:/srv/images/app:v1"``): pulled into the state
                directory's image store if missing, held while the sandbox lives; its Env
                and WorkingDir apply to every session and process (docs/images.md).
                Sessions need ``bash`` in the image.
            image_pull: when ``image`` is pulled: ``"missing"`` (the default), ``"always"``
                or ``"never"`` (an image not in the store is ``IMAGE_NOT_FOUND``).
            **policy: the keywords of :class:`Sandbox` (``fs_readable``, ``net_allow``,
                ``max_memory``, ``timeout`` (the sandbox's whole lifetime), ``env``...);
                ``max_cpu_time`` is not available for long-lived sandboxes.
        """
        from .local import LocalClient

        if policy.get("max_cpu_time") is not None:
            raise UsageError("max_cpu_time is not available for long-lived sandboxes (use timeout= per exec)",
                             code="INVALID_POLICY")
        if on_ask is not None and not net_ask:
            raise UsageError("on_ask answers net_ask's questions: give net_ask=True too", code="INVALID_POLICY")
        sb = cls(workdir, **policy)
        client = LocalClient(state_dir, agent_exe=os.fspath(agent_exe) if agent_exe is not None else None)
        _define_credentials(client, sb, credentials, upstream_ca)
        rules: dict[str, Any] = {}
        if http_auth:
            rules["http_auth"] = [str(r) for r in http_auth]
        if http_allow:
            rules["http_allow"] = [str(r) for r in http_allow]
        if image is not None:
            rules["image"] = image
        if image_pull is not None:
            rules["image_pull"] = image_pull
        box = client.create(**sb._create_body(), on_exit=on_exit,
                            idle_timeout=idle_timeout, labels=labels, from_snapshot=from_snapshot,
                            net_ask=net_ask, net_ask_timeout=net_ask_timeout, **rules)
        if on_ask is not None:
            box.on_ask(on_ask)
        return box

    @classmethod
    async def open_async(cls, workdir: PathLike | None = None, **kw: Any) -> AsyncSandbox:
        """:meth:`open` for asyncio: an :class:`~lockbox.client.AsyncSandbox` (coroutines and
        async iterators, as :class:`lockbox.AsyncClient`'s); the blocking calls run in a
        worker thread and release the GIL."""
        import asyncio

        from .client import AsyncSandbox

        return AsyncSandbox(await asyncio.to_thread(cls.open, workdir, **kw))

    def _create_body(self) -> dict[str, Any]:
        """The fields of ``POST /v1/sandboxes`` for this policy (``open()`` and the server
        share one conversion, ``lockbox-server``'s)."""
        env = dict(self.env)
        for name in self.env_pass:
            if name in os.environ:
                env.setdefault(name, os.environ[name])
        body: dict[str, Any] = {
            "workdir": to_json(self.workdir) if self.workdir is not None else None,
            "fs_readable": self.fs_readable or None,
            "fs_writable": self.fs_writable or None,
            "default_reads": self.default_reads,
            "net": _net_json(self.net, self.net_allow, self.net_deny),
            "max_memory": _size(self.max_memory),
            "max_processes": self.max_processes,
            "max_open_files": self.max_open_files,
            "max_file_size": _size(self.max_file_size),
            "max_inodes": self.max_inodes,
            "timeout_ms": _ms(self.timeout),
            "kill_grace_ms": _ms(self.kill_grace),
            "env": env or None,
            "clean_env": self.clean_env or None,
            "cwd": self.cwd,
            "hostname": self.hostname,
        }
        return {k: v for k, v in body.items() if v is not None}

    def cmd(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        name: str | None = None,
        retries: int = 0,
    ) -> Cmd:
        """A command to run under this sandbox. ``stdin`` feeds the first stage of a
        pipeline; ``retries`` reruns a failed stage of a transaction on a fresh layer."""
        if isinstance(argv, (str, bytes)):
            raise UsageError("argv must be a list of strings, e.g. ['sh', '-c', 'make']")
        return Cmd(self, [os.fspath(a) for a in argv], stdin=stdin, name=name, retries=retries)


class Cmd:
    """A command bound to a :class:`Sandbox`. ``a | b`` makes a :class:`Pipeline`."""

    def __init__(
        self,
        sandbox: Sandbox,
        argv: list[str],
        *,
        stdin: bytes | None = None,
        name: str | None = None,
        retries: int = 0,
    ) -> None:
        if not argv:
            raise UsageError("a command needs at least a program name")
        self.sandbox = sandbox
        self.argv = argv
        self.stdin = stdin
        self.name = name
        self.retries = retries

    def __repr__(self) -> str:
        return f"Cmd({self.argv!r})"

    def __or__(self, other: Cmd | Pipeline) -> Pipeline:
        return Pipeline([self]) | other

    def _spec(self, default_name: str, txn_workdir: str | None) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "name": self.name or default_name,
            "policy": self.sandbox.policy(transaction_workdir=txn_workdir),
            "argv": self.argv,
            "retries": self.retries,
        }
        if txn_workdir is not None:
            writable = _writable_parts(self.sandbox.fs_writable, txn_workdir)
            if writable is not None:
                spec["writable"] = [to_json(p) for p in writable]
        return spec

    def run(self) -> PipelineResult:
        """Runs this command alone, without a transaction."""
        return Pipeline([self]).run()

    def run_transactional(self) -> TxnOutcome:
        """Runs this command as a one-stage transaction over its sandbox's workdir."""
        return Pipeline([self]).run_transactional()

    def dry_run(self) -> TxnOutcome:
        """What this command would change in its workdir; nothing is applied."""
        return Pipeline([self]).dry_run()

    def prepare(self) -> PreparedTxn:
        """Runs this command as a one-stage transaction and keeps its layer (see
        :meth:`Pipeline.prepare`)."""
        return Pipeline([self]).prepare()

    def transaction(self) -> contextlib.AbstractContextManager[Transaction]:
        """A one-stage :meth:`Pipeline.transaction`."""
        return Pipeline([self]).transaction()


class _Txn(abc.ABC):
    """What pipelines and gathers share: the workdir, the state directory, the spec."""

    def _workdir(self, cmds: list[Cmd]) -> str:
        workdirs = {c.sandbox.workdir for c in cmds}
        if None in workdirs:
            raise UsageError("every sandbox of a transaction needs a workdir= (the directory it changes)")
        if len(workdirs) != 1:
            raise UsageError(f"the sandboxes of one transaction must share their workdir, got {sorted(workdirs)}")  # type: ignore[type-var]
        return workdirs.pop()  # type: ignore[return-value]

    def _state_dir(self, cmds: list[Cmd]) -> str:
        dirs = {c.sandbox.state_dir for c in cmds if c.sandbox.state_dir is not None}
        if len(dirs) > 1:
            raise UsageError(f"the sandboxes of one transaction must share their state_dir, got {sorted(dirs)}")
        state = dirs.pop() if dirs else default_state_dir()
        os.makedirs(state, exist_ok=True)
        return state

    @abc.abstractmethod
    def _spec(self) -> tuple[str, bytes | None]:
        """The transaction spec (``lockbox_txn::TxnSpec`` as JSON) and the first stage's
        stdin: :class:`Pipeline` and :class:`Gather` define it."""

    def run_transactional(self) -> TxnOutcome:
        """Runs every stage, then commits all of their writes to the workdir if every stage
        succeeded (and, for a gather, no conflict is left), or none. Stage failures and
        conflicts are reported in the outcome; machinery failures raise
        :class:`~lockbox.errors.TxnError`. The GIL is released while the sandboxes run."""
        spec, stdin = self._spec()
        return _outcome(_lockbox.run_txn(spec, stdin, "run"))

    def dry_run(self) -> TxnOutcome:
        """Runs every stage and reports the union of changes; nothing is committed
        (``abort_reason.reason == "dry_run"``)."""
        spec, stdin = self._spec()
        return _outcome(_lockbox.run_txn(spec, stdin, "dry_run"))

    def prepare(self) -> PreparedTxn:
        """Runs every stage and keeps their layers: the returned :class:`PreparedTxn` must
        be committed or aborted (it aborts, with a ``ResourceWarning``, when garbage
        collected unresolved)."""
        spec, stdin = self._spec()
        return PreparedTxn(_lockbox.prepare_txn(spec, stdin))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """A context manager: call ``txn.run()`` inside, inspect ``txn.changes``, call
        ``txn.commit()`` to ask for the commit. Leaving the block normally commits if
        ``commit()`` was called and aborts otherwise; an exception always aborts."""
        txn = Transaction(self)
        try:
            yield txn
        except BaseException:
            txn._resolve(commit=False)
            raise
        txn._resolve(commit=txn._wants_commit)


class Pipeline(_Txn):
    """Commands that run in order, each reading the previous one's stdout.

    ``run()`` streams them like a shell pipeline, each under its own policy, without a
    transaction. ``run_transactional()``, ``dry_run()``, ``prepare()`` and
    ``transaction()`` run them as one transaction over their shared workdir: stage N sees
    the writes of stages 1..N-1 (read-committed), and all writes commit together or not
    at all.
    """

    def __init__(self, cmds: Sequence[Cmd] = ()) -> None:
        self.cmds: list[Cmd] = list(cmds)
        self.conflict_policy: ConflictPolicy | None = None

    def __repr__(self) -> str:
        return f"Pipeline({self.cmds!r})"

    def __or__(self, other: Cmd | Pipeline) -> Pipeline:
        more = other.cmds if isinstance(other, Pipeline) else [other]
        return Pipeline(self.cmds + list(more))

    def _stdin(self) -> bytes | None:
        for c in self.cmds[1:]:
            if c.stdin is not None:
                raise UsageError(f"only the first stage of a pipeline takes stdin= ({c!r} reads the previous stage)")
        return self.cmds[0].stdin if self.cmds else None

    def _spec(self) -> tuple[str, bytes | None]:
        if not self.cmds:
            raise UsageError("a pipeline needs at least one stage")
        workdir = self._workdir(self.cmds)
        spec = {
            "kind": "pipeline",
            "state_dir": to_json(self._state_dir(self.cmds)),
            "workdir": to_json(workdir),
            "stages": [c._spec(f"stage-{i + 1}", workdir) for i, c in enumerate(self.cmds)],
        }
        return json.dumps(spec), self._stdin()

    def run(self) -> PipelineResult:
        """Runs the stages at once, connected by pipes, each under its own sandbox and
        without a transaction (writes go wherever each policy allows). Returns every
        stage's result and the last stage's stdout."""
        if not self.cmds:
            raise UsageError("a pipeline needs at least one stage")
        if any(c.sandbox.image is not None for c in self.cmds):
            raise UsageError("a stage on an image runs in a transaction (run_transactional(), "
                             "prepare()) or in Sandbox.open(image=...): Pipeline.run() does not "
                             "take images yet")
        stages = [c._spec(f"stage-{i + 1}", None) for i, c in enumerate(self.cmds)]
        text, stdout = _lockbox.run_plain(json.dumps(stages), self._stdin())
        d = json.loads(text)
        return PipelineResult(stages=[_stage(s) for s in d["stages"]], stdout=stdout)


class Gather(_Txn):
    """Named sources that run in parallel on snapshots of the workdir, then an optional
    consumer on their merged writes (reading each source's stdout from
    ``$LOCKBOX_INPUTS/<name>``). Conflicting writes follow the :class:`ConflictPolicy`
    (``FAIL`` by default)."""

    def __init__(self) -> None:
        self.sources: list[tuple[str, Cmd]] = []
        self.consumer_cmd: Cmd | None = None
        self.conflict_policy = ConflictPolicy.FAIL

    def __repr__(self) -> str:
        return f"Gather(sources={[n for n, _ in self.sources]!r})"

    def source(self, name: str, cmd: Cmd) -> Gather:
        """Adds a source (names: letters, digits, ``-``, ``_``, ``.``)."""
        self.sources.append((name, cmd))
        return self

    def consumer(self, cmd: Cmd) -> Gather:
        """Sets the consumer, which runs after the sources on their merged writes."""
        self.consumer_cmd = cmd
        return self

    def with_conflict_policy(self, policy: ConflictPolicy) -> Gather:
        """Sets what happens when sources change the same path."""
        self.conflict_policy = ConflictPolicy(policy)
        return self

    def _spec(self) -> tuple[str, bytes | None]:
        cmds = [c for _, c in self.sources] + ([self.consumer_cmd] if self.consumer_cmd else [])
        if not self.sources:
            raise UsageError("a gather needs at least one source")
        workdir = self._workdir(cmds)
        spec = {
            "kind": "gather",
            "state_dir": to_json(self._state_dir(cmds)),
            "workdir": to_json(workdir),
            "sources": [c._spec(n, workdir) for n, c in self.sources],
            "consumer": self.consumer_cmd._spec("consumer", workdir) if self.consumer_cmd else None,
            "conflict": self.conflict_policy.value,
        }
        return json.dumps(spec), None


class PreparedTxn:
    """A transaction whose stages ran and whose layers are kept; nothing is applied yet.

    Resolve it with :meth:`commit` or :meth:`abort` (or :meth:`keep` it for
    ``lockbox txn commit ID``). Garbage collected unresolved, it aborts and warns with a
    ``ResourceWarning``: a forgotten commit never silently commits.
    """

    def __init__(self, native: Any) -> None:
        self._native = native
        self._outcome = _outcome(native.outcome())

    @property
    def id(self) -> str:
        """The transaction id."""
        return self._outcome.id

    @property
    def stages(self) -> list[Any]:
        """Every stage's :class:`~lockbox.StageResult`."""
        return self._outcome.stages

    @property
    def changes(self) -> list[Any]:
        """The union of changes the commit would apply (:class:`~lockbox.Change`)."""
        return self._outcome.changes

    @property
    def conflicts(self) -> list[Any]:
        """Gather conflicts (:class:`~lockbox.MergeConflict`)."""
        return self._outcome.conflicts

    @property
    def outcome(self) -> TxnOutcome:
        """The outcome so far (after commit/abort: the final one)."""
        return self._outcome

    @property
    def pending(self) -> bool:
        """Neither committed, aborted nor kept yet."""
        return bool(self._native.pending)

    def all_succeeded(self) -> bool:
        """Every stage succeeded and no unresolved conflict is left: commit can apply."""
        return self._outcome.abort_reason is None

    def has_conflicts(self) -> bool:
        """Gather sources changed the same paths."""
        return bool(self._outcome.conflicts)

    def select(self, only: Sequence[str] = (), exclude: Sequence[str] = ()) -> None:
        """Narrows the commit to changes at or below ``only`` paths and not at or below
        ``exclude`` paths (relative to the workdir); the rest is discarded."""
        self._native.select([os.fspath(p) for p in only], [os.fspath(p) for p in exclude])
        self._outcome = _outcome(self._native.outcome())

    def commit(self, *, force: bool = False) -> TxnOutcome:
        """Applies every change to the workdir as one unit. Raises
        :class:`~lockbox.errors.ConflictError` (unresolved conflicts) or
        :class:`~lockbox.errors.StageFailedError` (a stage failed) — and aborts — when it
        cannot commit; :class:`~lockbox.errors.StaleBaseError` when the workdir changed
        under it (unless ``force``)."""
        failed = self._outcome
        reason = failed.abort_reason
        if reason is not None:
            self.abort()
            # The outcome's own summary and exit code (lockbox_txn::TxnOutcome), as the CLI.
            message = f"cannot commit {self.id}: {failed.summary}"
            if reason.reason == "conflicts":
                raise ConflictError(message, code="MERGE_CONFLICT", exit_code=failed.exit_code,
                                    conflicts=failed.conflicts)
            raise StageFailedError(message, code="STAGE_FAILED", exit_code=failed.exit_code,
                                   abort_reason=reason)
        self._outcome = _outcome(self._native.commit(force))
        return self._outcome

    def abort(self) -> TxnOutcome:
        """Discards every change; the workdir is untouched. Aborting twice is harmless."""
        if self._native.pending:
            self._outcome = _outcome(self._native.abort())
        return self._outcome

    def keep(self) -> str:
        """Leaves it prepared in the state directory and returns its id."""
        return str(self._native.keep())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.abort()

    def __del__(self) -> None:
        native = getattr(self, "_native", None)
        if native is not None and native.pending:
            warnings.warn(
                f"lockbox transaction {self._outcome.id} was garbage collected without commit() "
                "or abort(); it was aborted",
                ResourceWarning,
                stacklevel=2,
            )
            with contextlib.suppress(Exception):
                native.abort()


class Transaction:
    """The object of ``with pipeline.transaction() as txn``: ``run()`` it, look at
    ``changes``, ``commit()`` to ask for the commit at the end of the block."""

    def __init__(self, group: _Txn) -> None:
        self._group = group
        self._prepared: PreparedTxn | None = None
        self._wants_commit = False
        self.outcome: TxnOutcome | None = None
        """The final outcome, once the ``with`` block is left."""

    def run(self) -> Transaction:
        """Runs every stage (their writes are kept in layers, nothing is applied)."""
        if self._prepared is not None:
            raise UsageError("this transaction already ran")
        self._prepared = self._group.prepare()
        return self

    def _need(self) -> PreparedTxn:
        if self._prepared is None:
            raise UsageError("call txn.run() first")
        return self._prepared

    @property
    def stages(self) -> list[Any]:
        """Every stage's result."""
        return self._need().stages

    @property
    def changes(self) -> list[Any]:
        """What the commit would apply."""
        return self._need().changes

    @property
    def conflicts(self) -> list[Any]:
        """Gather conflicts."""
        return self._need().conflicts

    def all_succeeded(self) -> bool:
        """Every stage succeeded and no conflict is left."""
        return self._need().all_succeeded()

    def has_conflicts(self) -> bool:
        """Gather sources changed the same paths."""
        return self._need().has_conflicts()

    def commit(self) -> None:
        """Asks for the commit: it happens when the ``with`` block ends without an
        exception."""
        self._need()
        self._wants_commit = True

    def abort(self) -> None:
        """Withdraws a ``commit()`` request: the block's end aborts."""
        self._wants_commit = False

    def _resolve(self, commit: bool) -> None:
        p = self._prepared
        if p is None:
            return
        if commit:
            self.outcome = p.commit()
        else:
            self.outcome = p.abort()


def _define_credentials(client: Any, sb: Sandbox, credentials: Mapping[str, str] | None,
                        upstream_ca: PathLike | None) -> None:
    """Reads ``Sandbox.open``'s ``credentials`` into the local runtime's registry; a
    credential whose variable the sandbox's environment would get is refused."""
    if credentials is None and upstream_ca is None:
        return
    if credentials is not None and not isinstance(credentials, Mapping):
        raise UsageError("credentials: a dict of NAME to 'env:VAR' or 'file:PATH'", code="INVALID_POLICY")
    specs = []
    for name, source in (credentials or {}).items():
        if not isinstance(source, str):
            raise UsageError(f"credentials[{name!r}]: 'env:VAR' or 'file:PATH', not the value itself",
                             code="INVALID_POLICY")
        var = source[4:] if source.startswith("env:") else None
        if var is not None and (var in sb.env_pass or var in sb.env):
            raise UsageError(f"credential {name}: its variable {var} would be given to the sandbox "
                             "(env_pass/env); a credential never enters it", code="INVALID_POLICY")
        specs.append(f"{name}={source}")
    ca = os.fspath(upstream_ca) if upstream_ca is not None else None
    try:
        client._api.define_credentials(specs, ca)
    except ValueError as e:
        raise UsageError(str(e), code="INVALID_POLICY") from None
