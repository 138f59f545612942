"""A client for ``lockbox serve``: long-lived sandboxes over HTTP (``docs/server.md`` on the
server side).

::

    from lockbox import Client

    client = Client("http://127.0.0.1:7070", token)
    with client.create(workdir="/home/me/repo", max_memory="1G") as box:   # deleted at the end
        sh = box.session("build", cwd="/tmp")
        sh.exec("export A=1")
        print(sh.exec("echo $A").stdout)                      # "1\\n": the session keeps state
        for ev in box.exec_stream("for i in 1 2 3; do echo $i; done"):
            print(ev.event, ev.data)                          # start, stdout..., exit
        p = box.start_process(argv=["python3", "-m", "http.server"])
        print(p.logs().text)                                  # cursor-addressed, bounded logs
        box.files.write("notes.txt", b"hi")
        print(box.changes())                                  # the copy-on-write branch
        print(box.diff("README.md")["hunks"])                 # one file's numbered hunks
        box.commit(only=["src"], hunks={"README.md": [0]}, exclude=["scratch"])

Kept branches of the server's state directory (``lockbox run --workdir --on-exit keep``):
:meth:`Client.branches`, :meth:`Client.branch_diff`, :meth:`Client.branch_commit` (some hunks
of files; the rest kept or dropped), :meth:`Client.branch_abort`.

Every method maps to one route; errors are :class:`~lockbox.errors.ServerError` with the
server's ``code``, ``message``, ``details`` and HTTP ``status``. Streams (``exec_stream``,
``Process.follow``) are iterators of :class:`Event`. :class:`AsyncClient` has the same methods
as coroutines (and async iterators), running the blocking calls in a thread.

Only the standard library is used (``urllib``); PTYs and interactive stdin over WebSocket
are not wrapped (use any WebSocket client on ``Process.pty_url``).
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from ._names import to_json
from ._types import Change, _change
from .code import Context, Execution, _context, _execution, _result
from .code import _error as _execution_error
from .errors import ServerError

__all__ = ["AsyncClient", "Client", "Event", "ExecResult", "Files", "LogChunk", "Process", "RemoteSandbox", "Session"]


Hunks = Mapping[Any, Sequence[int]]
"""Hunks to commit per file: ``{path: [hunk numbers]}`` (numbers as ``diff`` gives them, from
0; ``[]`` leaves the file untouched). A path is a ``str``, ``os.PathLike`` or ``bytes``."""


def _hunks(hunks: Hunks | None) -> list[dict[str, Any]] | None:
    if not hunks:
        return None
    return [{"path": to_json(p), "accept": [int(i) for i in accept]} for p, accept in hunks.items()]


def _selection(only: Sequence[Any] | None, exclude: Sequence[Any] | None, hunks: Hunks | None,
               force: bool) -> dict[str, Any]:
    return _drop_none({"only": [to_json(p) for p in only] if only else None,
                       "exclude": [to_json(p) for p in exclude] if exclude else None,
                       "hunks": _hunks(hunks), "force": force or None})


def _path_query(path: Any) -> dict[str, str]:
    """``?path=`` (or ``?path_bytes=`` for a name that is not UTF-8)."""
    name = to_json(path)
    return {"path": name} if isinstance(name, str) else {"path_bytes": name["bytes"]}


def _bytes(obj: Mapping[str, Any], name: str) -> bytes:
    """Output bytes the server sent once: as text (``name``) or as base64 (``name_b64``)."""
    if name in obj:
        return str(obj[name]).encode("utf-8")
    return base64.b64decode(obj.get(name + "_b64", ""))


@dataclass(frozen=True)
class ExecResult:
    """The result of ``exec``: exact output bytes, exit code (124 when timed out).
    ``stdout_truncated``/``stderr_truncated``: the stream was longer than the server keeps
    for a buffered exec and was cut there (use ``exec_stream`` for large outputs)."""

    exit_code: int
    stdout_bytes: bytes
    stderr_bytes: bytes
    timed_out: bool = False
    duration_ms: float = 0.0
    session: str | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def stdout(self) -> str:
        """stdout decoded as UTF-8 (invalid bytes replaced)."""
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        """stderr decoded as UTF-8 (invalid bytes replaced)."""
        return self.stderr_bytes.decode("utf-8", "replace")


@dataclass(frozen=True)
class Event:
    """One server-sent event: ``event`` name, decoded JSON ``data``, ``id`` (a log cursor)."""

    event: str
    data: Any
    id: str | None = None

    @property
    def bytes(self) -> bytes:
        """The output bytes of a ``stdout``/``stderr``/``pty`` event."""
        if isinstance(self.data, dict):
            return _bytes(self.data, "data")
        return b""


@dataclass(frozen=True)
class LogChunk:
    """A slice of a process's log: ``segments`` from the cursor, ``next`` cursor,
    ``truncated`` (bytes asked for were evicted), ``eof`` (exited, all sent)."""

    segments: list[dict[str, Any]]
    next: int
    truncated: bool
    eof: bool

    @property
    def data(self) -> bytes:
        """Every segment's bytes, in order."""
        return b"".join(_bytes(s, "data") for s in self.segments)

    @property
    def text(self) -> str:
        """:attr:`data` decoded as UTF-8."""
        return self.data.decode("utf-8", "replace")


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else max(0, round(seconds * 1000))


def _drop_none(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


class Client:
    """A connection to ``lockbox serve`` at ``url`` with bearer ``token``."""

    def __init__(self, url: str, token: str, *, timeout: float = 300.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- transport -------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        raw: bytes | None = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        stream: bool = False,
    ) -> Any:
        if query:
            q = {k: ("true" if v is True else "false" if v is False else v) for k, v in query.items() if v is not None}
            path += "?" + urllib.parse.urlencode(q)
        h = {"Authorization": f"Bearer {self.token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        elif raw is not None:
            data = raw
            h["Content-Type"] = "application/octet-stream"
        h.update(headers or {})
        resp, ctype = self._send(method, path, h, data)
        if stream:
            return resp
        with resp:
            payload = resp.read()
        if not payload:
            return None
        if "json" in ctype:
            return json.loads(payload)
        return payload

    def _send(self, method: str, path: str, headers: dict[str, str], data: bytes | None) -> tuple[Any, str]:
        """The transport: sends one request, returns the open response (a context manager
        iterating lines, with ``read()``) and its content type, or raises ``ServerError``."""
        if not self.url.startswith(("http://", "https://")):
            # urllib would also open file: and ftp: URLs.
            raise ValueError(f"a lockbox server's URL starts with http:// or https://, not {self.url!r}")
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)  # noqa: S310 - checked above
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout)  # noqa: S310 - checked above
        except urllib.error.HTTPError as e:
            raise _error(e.code, e.read()) from None
        except urllib.error.URLError as e:
            raise ServerError(f"cannot reach {self.url}: {e.reason}", code="UNREACHABLE", status=0) from None
        return resp, resp.headers.get("Content-Type", "")

    def _events(self, resp: Any) -> Iterator[Event]:
        """Parses ``text/event-stream`` into events until the server ends it."""
        with resp:
            name, ev_id = "message", None
            data: list[str] = []
            for raw_line in resp:
                line = raw_line.decode("utf-8").rstrip("\r\n")
                if not line:
                    if data:
                        text = "\n".join(data)
                        try:
                            value: Any = json.loads(text)
                        except ValueError:
                            value = text
                        yield Event(name, value, ev_id)
                    name, data = "message", []
                    continue
                if line.startswith(":"):
                    continue  # keepalive comment
                key, _, value_s = line.partition(":")
                value_s = value_s[1:] if value_s.startswith(" ") else value_s
                if key == "event":
                    name = value_s
                elif key == "data":
                    data.append(value_s)
                elif key == "id":
                    ev_id = value_s

    # -- sandboxes ------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """``GET /healthz``: ``{status, version}``."""
        return self._request("GET", "/healthz")

    def create(
        self,
        *,
        workdir: str | None = None,
        fs_readable: Sequence[str] | None = None,
        fs_writable: Sequence[str] | None = None,
        net: str | None = None,
        net_allow: Sequence[str] | None = None,
        net_deny: Sequence[str] | None = None,
        max_memory: int | str | None = None,
        max_processes: int | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        on_exit: str | None = None,
        idle_timeout: float | None = None,
        labels: Mapping[str, str] | None = None,
        from_snapshot: str | Mapping[str, Any] | None = None,
        net_ask: bool = False,
        net_ask_timeout: float | None = None,
        image: str | None = None,
        image_pull: str | None = None,
        **more: Any,
    ) -> RemoteSandbox:
        """Creates a sandbox (``POST /v1/sandboxes``); keywords as ``lockbox.Sandbox``'s,
        times in seconds, plus ``on_exit`` (``keep``/``commit``/``abort``), ``idle_timeout``,
        ``labels``, and any other field of the route. ``net_allow``/``net_deny`` are
        destination lists as for ``lockbox.Sandbox`` (the server checks them).
        ``from_snapshot`` (an id, or the dict :meth:`RemoteSandbox.snapshot` returned) starts
        it from that snapshot's files, with this policy; ``workdir`` is then the snapshot's.
        ``net_ask`` (with ``net_allow``): an unlisted destination is asked, not refused (see
        :meth:`RemoteSandbox.approvals`); each question waits ``net_ask_timeout`` seconds
        (default 30) for its answer, then the call is denied. ``image`` (``"busybox:1.36"``,
        ``"oci:/srv/images/app:v1"``): the sandbox runs on that OCI image's userland, pulled
        into the server's store if missing, with its Env and WorkingDir (docs/images.md;
        sessions need ``bash`` in the image). ``image_pull``: when it is pulled, ``"missing"``
        (the default), ``"always"`` (a tag may have moved) or ``"never"`` (not in the store:
        ``IMAGE_NOT_FOUND``)."""
        if net_allow:
            net = {"allow": list(net_allow)}  # type: ignore[assignment]
        elif net_deny:
            net = {"deny": list(net_deny)}  # type: ignore[assignment]
        body = _drop_none({
            "workdir": workdir, "fs_readable": fs_readable, "fs_writable": fs_writable, "net": net,
            "max_memory": max_memory, "max_processes": max_processes, "timeout_ms": _ms(timeout),
            "env": dict(env) if env else None, "on_exit": on_exit, "idle_timeout_ms": _ms(idle_timeout),
            "labels": dict(labels) if labels else None,
            "from_snapshot": (from_snapshot if isinstance(from_snapshot, str) or from_snapshot is None
                              else from_snapshot["id"]),
            "net_ask": net_ask or None, "net_ask_timeout_ms": _ms(net_ask_timeout),
            "image": image, "image_pull": image_pull,
        }) | more
        info = self._request("POST", "/v1/sandboxes", body=body)
        return RemoteSandbox(self, info)

    def sandbox(self, id: str) -> RemoteSandbox:  # noqa: A002 - the server's name
        """A handle on an existing sandbox."""
        return RemoteSandbox(self, self._request("GET", f"/v1/sandboxes/{id}"))

    def branches(self) -> list[dict[str, Any]]:
        """Kept branches of the server's state directory: ``[{"id", "workdir", "state",
        "status", "created", "command", "changes"}]``."""
        return self._request("GET", "/v1/branches")["branches"]

    def branch(self, id: str) -> dict[str, Any]:  # noqa: A002 - the server's name
        """A kept branch and its ``change_list`` (:class:`~lockbox.Change` objects)."""
        info = self._request("GET", f"/v1/branches/{id}")
        info["change_list"] = [_change(c) for c in info["change_list"]]
        return info

    def branch_diff(self, id: str, path: Any) -> dict[str, Any]:  # noqa: A002
        """One path's diff in a kept branch, as :meth:`RemoteSandbox.diff` gives it."""
        return self._request("GET", f"/v1/branches/{id}/diff", query=_path_query(path))

    def branch_commit(self, id: str, *, only: Sequence[Any] | None = None,  # noqa: A002
                      exclude: Sequence[Any] | None = None, hunks: Hunks | None = None,
                      force: bool = False, rest: str = "keep") -> dict[str, Any]:
        """Commits a kept branch, or part of it; ``rest="keep"`` leaves what was not committed
        in the branch, ``"drop"`` removes the branch after. ``{report, remaining}``; raises
        :class:`~lockbox.errors.ServerError` with ``code="CONFLICT"`` when the workdir changed
        under it (unless ``force``) and ``"BAD_HUNK"`` for a hunk number the diff lacks."""
        body = _selection(only, exclude, hunks, force)
        if rest != "keep":
            body["rest"] = rest
        return self._request("POST", f"/v1/branches/{id}/commit", body=body)

    def branch_abort(self, id: str) -> dict[str, Any]:  # noqa: A002
        """Removes a kept branch."""
        return self._request("POST", f"/v1/branches/{id}/abort")

    def snapshots(self) -> list[dict[str, Any]]:
        """Snapshots, oldest first: ``[{"id", "name", "sandbox", "parent", "workdir",
        "created_at", "bytes", "entries"}]`` (see :meth:`RemoteSandbox.snapshot`)."""
        return self._request("GET", "/v1/snapshots")["snapshots"]

    def snapshot(self, id: str) -> dict[str, Any]:  # noqa: A002 - the server's name
        """One snapshot; ``ServerError`` with ``code="SNAPSHOT_NOT_FOUND"`` (404) if there is
        none."""
        return self._request("GET", f"/v1/snapshots/{id}")

    def delete_snapshot(self, id: str) -> None:  # noqa: A002 - the server's name
        """Deletes a snapshot (``SNAPSHOT_IN_USE``, 409, while forks or other snapshots use
        it)."""
        self._request("DELETE", f"/v1/snapshots/{id}")

    def fork(self, snapshot: str | Mapping[str, Any], count: int = 1, *,
             placement: Mapping[str, Any] | None = None) -> list[RemoteSandbox]:
        """Creates ``count`` sandboxes from a snapshot (an id, or the dict
        :meth:`RemoteSandbox.snapshot` returned), with the policy of the sandbox it was taken
        of: each sees exactly the snapshot's files and writes to its own layer, which it
        commits on its own (committing one makes a sibling's commit of the same paths a
        ``CONFLICT`` unless forced). All or none. ``placement`` (a fleet's router only,
        ``{"node", "labels"}`` as for :meth:`create`): the node to fork on, to which the
        router copies the snapshot first if it was taken elsewhere (docs/fleet.md)."""
        sid = _snapshot_id(snapshot)
        body: dict[str, Any] = {"count": count}
        if placement is not None:
            body["placement"] = dict(placement)
        r = self._request("POST", f"/v1/snapshots/{sid}/fork", body=body)
        return [self._sandbox_of(info) for info in r["sandboxes"]]

    def commit_together(self, sandboxes: Sequence[RemoteSandbox | AsyncSandbox | str], *,
                        conflicts: str = "fail", dry_run: bool = False,
                        force: bool = False) -> dict[str, Any]:
        """Commits running sandboxes together, as one transaction, all or none: typically
        forks of one snapshot, or any sandboxes over the same workdir. What each changed over
        the snapshot they share is merged; the snapshot's own changes go in once.
        ``conflicts`` says what happens to a path several of them changed: ``"fail"``
        (refuse: :class:`~lockbox.errors.ServerError` ``CONFLICT``, ``details["conflicts"]``
        naming each path's sandboxes), ``"first_writer_wins"`` / ``"last_writer_wins"`` (the
        first / last sandbox listed that changed it), ``"markers"`` (the first; the others'
        versions are kept as ``PATH.lockbox-<sandbox id>``). A path the workdir changed under
        since a sandbox began is a ``CONFLICT`` unless ``force``. ``dry_run`` reports the
        merged result and changes nothing. Returns ``{"id", "committed", "dry_run",
        "contributions": [{"sandbox", "changes"}], "conflicts": [{"path", "sandboxes",
        "winner"}], "markers", "changes", "report"}`` (changes as
        :class:`~lockbox._types.Change`). The sandboxes keep running, as after
        :meth:`RemoteSandbox.commit`."""
        ids = [s if isinstance(s, str) else s.id for s in sandboxes]
        body = {"kind": "gather", "sandboxes": ids, "conflicts": conflicts,
                "dry_run": dry_run, "force": force}
        r = self._request("POST", "/v1/transactions", body=body)
        r["changes"] = [_change(c) for c in r["changes"]]
        for c in r["contributions"]:
            c["changes"] = [_change(x) for x in c["changes"]]
        return r

    def snapshot_diff(self, snapshot: str | Mapping[str, Any], *, to_snapshot: str | Mapping[str, Any] | None = None,
                      to_sandbox: str | None = None) -> list[Change]:
        """What changed from a snapshot to another snapshot (``to_snapshot``) or to a running
        sandbox as it is now (``to_sandbox``) of the same workdir; with neither, the
        snapshot's own changes against the workdir. :class:`~lockbox.Change` objects, sorted
        by path."""
        query = _drop_none({"to_snapshot": _snapshot_id(to_snapshot) if to_snapshot is not None else None,
                            "to_sandbox": to_sandbox})
        r = self._request("GET", f"/v1/snapshots/{_snapshot_id(snapshot)}/diff", query=query)
        return [_change(c) for c in r["changes"]]

    def _sandbox_of(self, info: dict[str, Any]) -> RemoteSandbox:
        """A handle on a sandbox this client just made."""
        return RemoteSandbox(self, info)

    def list(self, state: str | None = None) -> list[dict[str, Any]]:
        """The sandboxes: running, the server's last ``--keep-stopped`` stopped ones, and
        lost ones; ``state="running"`` (or ``"stopped"``, ``"lost"``) only those."""
        return self._request("GET", "/v1/sandboxes", query={"state": state})["sandboxes"]


def _snapshot_id(snapshot: str | Mapping[str, Any]) -> str:
    """A snapshot's id, given as it or as the dict the server returned."""
    sid = snapshot if isinstance(snapshot, str) else snapshot["id"]
    return urllib.parse.quote(sid, safe="")


class RemoteSandbox:
    """A long-lived sandbox on a server: sessions, exec, processes, files, its branch."""

    def __init__(self, client: Client, info: dict[str, Any]) -> None:
        self.client = client
        self.id: str = info["id"]
        self.info = info
        self.files = Files(self)
        """File operations inside the sandbox (:class:`Files`)."""

    def __repr__(self) -> str:
        return f"RemoteSandbox({self.id!r})"

    def _p(self, rest: str = "") -> str:
        return f"/v1/sandboxes/{self.id}{rest}"

    def refresh(self) -> dict[str, Any]:
        """The sandbox's current info (state, sessions, processes, branch...)."""
        self.info = self.client._request("GET", self._p())
        return self.info

    def session(self, id: str | None = None, *, cwd: str | None = None, env: Mapping[str, str] | None = None) -> Session:  # noqa: A002
        """Creates a persistent shell session (its cwd and exported variables persist)."""
        info = self.client._request("POST", self._p("/sessions"), body=_drop_none({"id": id, "cwd": cwd, "env": dict(env) if env else None}))
        return Session(self, info["id"])

    def exec(
        self,
        command: str,
        *,
        session: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Runs a bash command in a session (the default one unless ``session``)."""
        body = _drop_none({
            "command": command, "session": session, "cwd": cwd, "env": dict(env) if env else None,
            "timeout_ms": _ms(timeout), "stdin_b64": base64.b64encode(stdin).decode() if stdin is not None else None,
        })
        r = self.client._request("POST", self._p("/exec"), body=body)
        return ExecResult(
            exit_code=r["exit_code"], stdout_bytes=_bytes(r, "stdout"), stderr_bytes=_bytes(r, "stderr"),
            timed_out=r.get("timed_out", False), duration_ms=r.get("duration_ms", 0.0), session=r.get("session"),
            stdout_truncated=r.get("stdout_truncated", False), stderr_truncated=r.get("stderr_truncated", False),
        )

    def exec_stream(self, command: str, *, session: str | None = None, cwd: str | None = None,
                    env: Mapping[str, str] | None = None, timeout: float | None = None) -> Iterator[Event]:
        """Runs a command and yields its events as they come: ``start``, ``stdout`` /
        ``stderr`` (``Event.bytes``), then ``exit`` or ``error``."""
        body = _drop_none({"command": command, "session": session, "cwd": cwd,
                           "env": dict(env) if env else None, "timeout_ms": _ms(timeout)})
        return self.client._events(self.client._request("POST", self._p("/exec/stream"), body=body, stream=True))

    def watch(self, path: str, recursive: bool = True) -> Watch:
        """Watches a file or directory: a closable iterator of event dicts, ``{"event":
        "change", "kind": "created"|"modified"|"deleted"|"moved", "path", "is_dir", "from"
        (moved)}``, ``{"event": "overflow", "dropped"}`` (events were dropped; ``dropped``
        None when unknown) and ``{"event": "error", "message"}``. Use it in ``with`` (or call
        ``close()``): closing the connection stops the watch in the sandbox."""
        resp = self.client._request("GET", self._p("/watch"), query={"path": path, "recursive": recursive},
                                    stream=True)
        return Watch(resp, self.client._events(resp))

    def approvals(self, *, after: int = 0, wait: float | None = None) -> list[dict[str, Any]]:
        """The approval questions of a ``net_ask`` sandbox waiting for an answer, oldest
        first: ``{"id", "ts", "kind": "connect"|"send"|"dns", "name", "address", "port",
        "protocol", "pid", "command", "timeout_ms"}`` (docs/security.md "Approvals"). Only
        those with an id above ``after``; with ``wait`` (seconds, at most 60), waits that
        long for one (a long poll)."""
        query: dict[str, Any] = {"after": after}
        if wait:
            query["wait_ms"] = _ms(wait)
        return self.client._request("GET", self._p("/approvals"), query=query)["approvals"]

    def decide(self, question: int | Mapping[str, Any], decision: str) -> dict[str, Any]:
        """Answers an approval question (its id, or the dict :meth:`approvals` gave):
        ``"once"`` (this call), ``"sandbox"`` (this destination or name from now on) or
        ``"deny"``. ``QUESTION_NOT_FOUND`` if it is no longer pending (timed out, its
        caller gone), ``QUESTION_DECIDED`` if it was answered already."""
        qid = question if isinstance(question, int) else question["id"]
        return self.client._request("POST", self._p(f"/approvals/{qid}"), body={"decision": decision})

    def on_ask(self, callback: Any) -> threading.Thread:
        """Answers each approval question with ``callback(question) -> "once" | "sandbox" |
        "deny"``, called in a background (daemon) thread, one question at a time, until the
        sandbox is gone. A callback that raises or returns anything else denies. Returns
        the thread."""
        def serve() -> None:
            last = 0
            while True:
                try:
                    pending = self.approvals(after=last, wait=10)
                except ServerError:
                    return  # the sandbox is gone (or stopped)
                for q in pending:
                    last = max(last, q["id"])
                    try:
                        decision = callback(q)
                    except Exception:
                        decision = "deny"
                    if decision not in ("once", "sandbox", "deny"):
                        decision = "deny"
                    try:
                        self.decide(q["id"], decision)
                    except ServerError:
                        pass  # timed out or its caller went away meanwhile

        thread = threading.Thread(target=serve, name=f"lockbox-ask-{self.id}", daemon=True)
        thread.start()
        return thread

    def audit(self, *, follow: bool = False) -> Any:
        """The network audit log of a ``net_allow``/``net_deny`` sandbox: one dict per
        decision of lockbox's network supervisor, ``{"ts", "sandbox", "kind":
        "connect"|"send"|"dns", "decision": "allowed"|"denied", "reason", "protocol",
        "address", "port", "name", "qtype", "answers", "pid", "command"}`` (fields that do not
        apply are left out; docs/security.md "Audit log"). The last 1,000 as a list; with
        ``follow=True`` a closable iterator of them and then of new ones as they are decided
        (a ``{"kind": "dropped", "count"}`` dict stands for events it was too slow to get)."""
        if not follow:
            return self.client._request("GET", self._p("/audit"), query={"follow": False})["events"]
        resp = self.client._request("GET", self._p("/audit"), stream=True)
        return Audit(resp, self.client._events(resp))

    def start_process(
        self,
        argv: Sequence[str] | None = None,
        *,
        command: str | None = None,
        session: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        log_bytes: int | None = None,
        pty: tuple[int, int] | None = None,
    ) -> Process:
        """Starts a background process (exactly one of ``argv`` and ``command``)."""
        body = _drop_none({
            "argv": list(argv) if argv is not None else None, "command": command, "session": session,
            "cwd": cwd, "env": dict(env) if env else None, "stdin": stdin or None, "log_bytes": log_bytes,
            "pty": {"cols": pty[0], "rows": pty[1]} if pty else None,
        })
        info = self.client._request("POST", self._p("/processes"), body=body)
        return Process(self, info)

    def processes(self) -> list[dict[str, Any]]:
        """Every process of the sandbox."""
        return self.client._request("GET", self._p("/processes"))["processes"]

    def changes(self) -> list[Change]:
        """The changes of the sandbox's copy-on-write branch (sandboxes with a workdir)."""
        r = self.client._request("GET", self._p("/changes"))
        return [_change(c) for c in r["changes"]]

    def review(self) -> tuple[list[Change], str]:
        """The branch's changes as a reviewer sees them, each with the ``digest`` of what it
        holds, and the listing's ``review_token``. Pass either to :meth:`commit` (``review=``)
        so that the commit writes exactly what was shown: anything changed or added since is
        ``STALE_REVIEW`` (409) and nothing is applied."""
        r = self.client._request("GET", self._p("/changes"))
        return [_change(c) for c in r["changes"]], r["review_token"]

    def diff(self, path: Any) -> dict[str, Any]:
        """One path's diff between the workdir and the branch: ``{"path", "kind": "text",
        "hunks": [{"index", "header", "lines": [{"op", "text"}], ...}]}`` or, for binary and
        non-regular files, ``{"path", "kind": "summary", "old", "new"}`` (docs/server.md)."""
        return self.client._request("GET", self._p("/diff"), query=_path_query(path))

    def commit(self, *, only: Sequence[str] | None = None, exclude: Sequence[str] | None = None,
               hunks: Hunks | None = None, force: bool = False,
               review: str | Sequence[Change] | None = None) -> dict[str, Any]:
        """Applies the branch (or part of it: ``only``/``exclude`` paths, and for the files
        in ``hunks`` only those hunks) to the workdir; ``{report, remaining}``. ``review``
        binds the commit to what a reviewer saw (the token or the changes of :meth:`review`,
        or changes whose ``digest`` a diff gave): a path changed or added since is refused
        with ``STALE_REVIEW`` (409) and nothing is applied."""
        body = _selection(only, exclude, hunks, force)
        if isinstance(review, str):
            body["review"] = review
        elif review is not None:
            body["review"] = [{"path": to_json(c.path), "digest": c.digest} for c in review]
        return self.client._request("POST", self._p("/commit"), body=body)

    def abort(self) -> dict[str, Any]:
        """Discards the branch's changes."""
        return self.client._request("POST", self._p("/abort"))

    def snapshot(self, name: str | None = None, *, include_tmp: bool = False) -> dict[str, Any]:
        """Snapshots the sandbox's files (its branch: the workdir as it sees it; with
        ``include_tmp`` its ``/tmp`` too, which forks and restores then find in theirs). Its
        processes are paused while the files are copied and then go on; their memory is not
        part of the snapshot. ``{"id", "name", "sandbox", "parent", "workdir", "created_at",
        "bytes", "entries"}``; ``NO_WORKDIR`` (409) for a sandbox without a workdir."""
        body = _drop_none({"name": name, "include_tmp": include_tmp or None})
        return self.client._request("POST", self._p("/snapshots"), body=body)

    def fork(self, count: int = 1, *, name: str | None = None, include_tmp: bool = False) -> list[RemoteSandbox]:
        """Snapshots the sandbox (:meth:`snapshot`) and creates ``count`` sandboxes from that
        snapshot (:meth:`Client.fork`), in one call. The snapshot stays
        (:meth:`Client.snapshots` lists it; each fork's ``info["snapshot"]`` names it);
        delete it once its forks are gone."""
        body = _drop_none({"count": count, "name": name, "include_tmp": include_tmp or None})
        r = self.client._request("POST", self._p("/fork"), body=body)
        forks = [self.client._sandbox_of(info) for info in r["sandboxes"]]
        for f in forks:
            f.info["snapshot"] = r["snapshot"]
        return forks

    def restore(self, snapshot: str | Mapping[str, Any]) -> dict[str, Any]:
        """Rolls the sandbox back to a snapshot of its workdir (an id, or the dict
        :meth:`snapshot` returned): its processes, sessions and code contexts are stopped,
        its branch discarded, and it starts again (same id) seeing exactly the snapshot's
        files. Processes' memory is not restored. Returns the sandbox's info."""
        body = {"snapshot": _snapshot_id(snapshot)}
        self.info = self.client._request("POST", self._p("/restore"), body=body)
        return self.info
    # -- code contexts (docs/code-contexts.md) ---------------------------------------------

    def create_context(self, language: str = "python", *, id: str | None = None, cwd: str | None = None,  # noqa: A002
                       env: Mapping[str, str] | None = None) -> Context:
        """Creates a code context: a persistent ``python`` or ``bash`` interpreter (started on
        its first run). ``env`` may set ``PATH`` to pick another ``python3``."""
        body = _drop_none({"id": id, "language": language, "cwd": cwd, "env": dict(env) if env else None})
        return _context(self.client._request("POST", self._p("/contexts"), body=body))

    def contexts(self) -> list[Context]:
        """The sandbox's code contexts."""
        return [_context(c) for c in self.client._request("GET", self._p("/contexts"))["contexts"]]

    def delete_context(self, context: Context | str) -> None:
        """Deletes a context, killing its interpreter (``CONTEXT_NOT_FOUND`` if none)."""
        cid = context.id if isinstance(context, Context) else context
        self.client._request("DELETE", self._p(f"/contexts/{urllib.parse.quote(cid, safe='')}"))

    def run_code(self, code: str, context: Context | str | None = None, *, timeout: float | None = None,
                 env: dict[str, str] | None = None, on_stdout: Any = None, on_stderr: Any = None,
                 on_result: Any = None, on_error: Any = None) -> Execution:
        """Runs ``code`` in a context (the sandbox's ``default`` Python context when none is
        given) and returns its :class:`~lockbox.code.Execution`. ``timeout`` (seconds)
        interrupts the code (``KeyboardInterrupt``, state kept; killed after 2 s more, state
        lost). ``env`` sets variables for this run only (they get their earlier values back
        when it ends). The callbacks get output text, :class:`~lockbox.code.Result` s and the
        error as they come (the run is streamed then)."""
        cid = context.id if isinstance(context, Context) else (context or "default")
        path = self._p(f"/contexts/{urllib.parse.quote(cid, safe='')}/run")
        body = _drop_none({"code": code, "timeout_ms": _ms(timeout), "env": env or None})
        if not (on_stdout or on_stderr or on_result or on_error):
            return _execution(self.client._request("POST", path, body=body))
        final: Execution | None = None
        for ev in self.client._events(self.client._request("POST", path + "/stream", body=body, stream=True)):
            if ev.event == "stdout" and on_stdout:
                on_stdout(ev.data["text"])
            elif ev.event == "stderr" and on_stderr:
                on_stderr(ev.data["text"])
            elif ev.event == "result" and on_result:
                on_result(_result(ev.data))
            elif ev.event == "error" and on_error:
                on_error(_execution_error(ev.data))
            elif ev.event == "end":
                final = _execution(ev.data)
        if final is None:
            raise ServerError("the run's stream ended without its result", code="INTERNAL", status=0)
        return final

    def _port(self, info: dict[str, Any]) -> dict[str, Any]:
        info = dict(info)
        if self.client.url.startswith(("http://", "https://")):  # not Sandbox.open's in-process client
            info["url"] = self.client.url + info["path"]
            info["ws_url"] = info["url"].replace("http", "ws", 1)
        if info.get("host_address"):
            info["host_url"] = f"http://{info['host_address']}/"
        return info

    def expose_port(self, port: int, *, host_loopback: bool = False) -> dict[str, Any]:
        """Makes the server listening on ``port`` inside the sandbox reachable:
        ``{"port", "path", "url", "ws_url", "origin", "open_url"}`` — ``url`` is the
        server's authenticated proxy (send the bearer token; the sandboxed server never sees
        it; no cookie comes back; absent on :meth:`lockbox.Sandbox.open`'s sandboxes, which
        have no server); ``origin`` is the port's own origin on the server's ports listener
        (``http://8000-sb-....localhost:PORT``), where a browser gets in by opening
        ``open_url`` (a capability for this port: it sets the port's access cookie) — and with
        ``host_loopback`` also ``"host_address"``/``"host_url"``, a ``127.0.0.1`` port on
        the server's host that forwards without a token. Exposing again is a no-op."""
        info = self.client._request("POST", self._p("/ports"), body={"port": port, "host_loopback": host_loopback})
        return self._port(info)

    def ports(self) -> list[dict[str, Any]]:
        """The exposed ports (as :meth:`expose_port` returns them)."""
        return [self._port(p) for p in self.client._request("GET", self._p("/ports"))["ports"]]

    def unexpose_port(self, port: int) -> None:
        """Stops exposing ``port`` (``PORT_NOT_EXPOSED`` if it was not)."""
        self.client._request("DELETE", self._p(f"/ports/{int(port)}"))

    def delete(self) -> dict[str, Any]:
        """Kills everything in the sandbox and removes it (its ``on_exit`` applies)."""
        return self.client._request("DELETE", self._p())

    def close(self) -> None:
        """Deletes the sandbox unless it is already gone (what leaving ``with`` does)."""
        try:
            self.delete()
        except ServerError as e:
            if e.status != 404:
                raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Session:
    """A persistent shell session of a :class:`RemoteSandbox`."""

    def __init__(self, sandbox: RemoteSandbox, id: str) -> None:  # noqa: A002
        self.sandbox = sandbox
        self.id = id

    def __repr__(self) -> str:
        return f"Session({self.id!r})"

    def exec(self, command: str, **kw: Any) -> ExecResult:
        """Runs a command in this session."""
        return self.sandbox.exec(command, session=self.id, **kw)

    def exec_stream(self, command: str, **kw: Any) -> Iterator[Event]:
        """Streams a command's events in this session."""
        return self.sandbox.exec_stream(command, session=self.id, **kw)

    def close(self) -> None:
        """Ends the session."""
        self.sandbox.client._request("DELETE", self.sandbox._p(f"/sessions/{self.id}"))


class Process:
    """A background process of a :class:`RemoteSandbox`."""

    def __init__(self, sandbox: RemoteSandbox, info: dict[str, Any]) -> None:
        self.sandbox = sandbox
        self.id = str(info["id"])
        self.info_ = info

    def __repr__(self) -> str:
        return f"Process({self.id!r})"

    def _p(self, rest: str = "") -> str:
        return self.sandbox._p(f"/processes/{self.id}{rest}")

    @property
    def pty_url(self) -> str:
        """The WebSocket URL of its PTY (or interactive stdin)."""
        return self.sandbox.client.url.replace("http", "ws", 1) + self._p("/pty")

    def info(self) -> dict[str, Any]:
        """Its current state (running, exit code...)."""
        self.info_ = self.sandbox.client._request("GET", self._p())
        return self.info_

    def logs(self, since: int = 0) -> LogChunk:
        """Its output from cursor ``since`` (read again from ``.next``)."""
        r = self.sandbox.client._request("GET", self._p("/logs"), query={"since": since})
        return LogChunk(r["segments"], r["next"], r.get("truncated", False), r.get("eof", False))

    def follow(self, since: int | None = None) -> Iterator[Event]:
        """Its output as events while it runs (``stdout``/``stderr``/``pty``, then ``eof``);
        each ``Event.id`` is the cursor to resume from."""
        headers = {"Last-Event-ID": str(since)} if since is not None else None
        resp = self.sandbox.client._request("GET", self._p("/logs"), query={"follow": True}, headers=headers, stream=True)
        return self.sandbox.client._events(resp)

    def write(self, data: bytes, *, close: bool = False) -> dict[str, Any]:
        """Writes to its stdin (started with ``stdin=True``); ``close`` closes it after."""
        body = {"data_b64": base64.b64encode(data).decode(), "close": close}
        return self.sandbox.client._request("POST", self._p("/stdin"), body=body)

    def signal(self, sig: str | int) -> dict[str, Any]:
        """Sends a signal (``"TERM"``, ``"INT"``, or a number)."""
        return self.sandbox.client._request("POST", self._p("/signal"), body={"signal": sig})

    def kill(self, grace: float | None = None) -> dict[str, Any]:
        """SIGTERM, ``grace`` seconds, SIGKILL of its whole tree; waits for it."""
        return self.sandbox.client._request("DELETE", self._p(), query={"grace_ms": _ms(grace)})


class Watch:
    """The events of :meth:`RemoteSandbox.watch` (iterate it; ``close()`` or ``with`` ends it)."""

    def __init__(self, resp: Any, events: Iterator[Event]) -> None:
        self._resp = resp
        self._events = events

    def __iter__(self) -> Watch:
        return self

    def __next__(self) -> dict[str, Any]:
        ev = next(self._events)
        data = ev.data if isinstance(ev.data, dict) else {"message": ev.data}
        return {"event": ev.event, **data}

    def close(self) -> None:
        """Stops the watch (closes the connection)."""
        close = getattr(self._events, "close", None)
        if close is not None:
            close()
        self._resp.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Audit(Watch):
    """The events of :meth:`RemoteSandbox.audit` with ``follow=True`` (iterate it;
    ``close()`` or ``with`` ends it): the network event dicts themselves."""

    def __next__(self) -> dict[str, Any]:
        ev = next(self._events)
        return ev.data if isinstance(ev.data, dict) else {"kind": "error", "message": ev.data}

    def __enter__(self) -> Self:
        return self


class Files:
    """Files inside a sandbox: paths absolute inside it or relative to its working directory."""

    def __init__(self, sandbox: RemoteSandbox) -> None:
        self.sandbox = sandbox

    def _req(self, method: str, path: str, **kw: Any) -> Any:
        return self.sandbox.client._request(method, self.sandbox._p(path), **kw)

    def read(self, path: str) -> bytes:
        """The file's bytes."""
        data = self._req("GET", "/files", query={"path": path})
        return data if isinstance(data, bytes) else json.dumps(data).encode() if data is not None else b""

    def write(self, path: str, data: bytes, *, mode: int = 0o644) -> dict[str, Any]:
        """Writes the file atomically (creating parents)."""
        return self._req("PUT", "/files", raw=data, query={"path": path, "mode": f"{mode:o}"})

    def stat(self, path: str) -> dict[str, Any]:
        """The entry's metadata."""
        return self._req("GET", "/fs/stat", query={"path": path})

    def list(self, path: str = ".", *, recursive: bool = False, hidden: bool = False) -> list[dict[str, Any]]:
        """A directory's entries."""
        return self._req("GET", "/fs/list", query={"path": path, "recursive": recursive, "hidden": hidden})["entries"]

    def mkdir(self, path: str, *, parents: bool = False) -> dict[str, Any]:
        """Makes a directory."""
        return self._req("POST", "/fs/mkdir", body={"path": path, "parents": parents})

    def move(self, src: str, dst: str) -> dict[str, Any]:
        """Renames an entry."""
        return self._req("POST", "/fs/move", body={"from": src, "to": dst})

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes an entry."""
        self._req("POST", "/fs/remove", body={"path": path, "recursive": recursive})


def _error(status: int, payload: bytes) -> ServerError:
    """The server's error body (``{code, message, details}``) as a ``ServerError``."""
    try:
        body = json.loads(payload or b"{}")
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    return ServerError(body.get("message") or f"HTTP {status}", code=body.get("code", "HTTP_ERROR"),
                       status=status, details=body.get("details") or {})


@dataclass
class AsyncClient:
    """:class:`Client` for asyncio: ``await client.create(...)`` returns an
    :class:`AsyncSandbox` whose methods are coroutines and whose streams are async
    iterators (the blocking HTTP calls run in a worker thread)."""

    url: str
    token: str
    timeout: float = 300.0
    _sync: Client = field(init=False)

    def __post_init__(self) -> None:
        self._sync = Client(self.url, self.token, timeout=self.timeout)

    async def create(self, **kw: Any) -> AsyncSandbox:
        """See :meth:`Client.create`."""
        return AsyncSandbox(await asyncio.to_thread(self._sync.create, **kw))

    async def list(self, state: str | None = None) -> list[dict[str, Any]]:
        """See :meth:`Client.list`."""
        return await asyncio.to_thread(self._sync.list, state)

    async def branches(self) -> builtins.list[dict[str, Any]]:
        """See :meth:`Client.branches`."""
        return await asyncio.to_thread(self._sync.branches)

    async def branch_diff(self, id: str, path: Any) -> dict[str, Any]:  # noqa: A002
        """See :meth:`Client.branch_diff`."""
        return await asyncio.to_thread(self._sync.branch_diff, id, path)

    async def branch_commit(self, id: str, **kw: Any) -> dict[str, Any]:  # noqa: A002
        """See :meth:`Client.branch_commit`."""
        return await asyncio.to_thread(lambda: self._sync.branch_commit(id, **kw))

    async def branch_abort(self, id: str) -> dict[str, Any]:  # noqa: A002
        """See :meth:`Client.branch_abort`."""
        return await asyncio.to_thread(self._sync.branch_abort, id)

    async def commit_together(self, sandboxes: Sequence[AsyncSandbox | RemoteSandbox | str],
                              **kw: Any) -> dict[str, Any]:
        """See :meth:`Client.commit_together`."""
        return await asyncio.to_thread(lambda: self._sync.commit_together(sandboxes, **kw))


class AsyncSandbox:
    """:class:`RemoteSandbox` for asyncio."""

    def __init__(self, sync: RemoteSandbox) -> None:
        self.sync = sync
        self.id = sync.id

    async def exec(self, command: str, **kw: Any) -> ExecResult:
        """See :meth:`RemoteSandbox.exec`."""
        return await asyncio.to_thread(self.sync.exec, command, **kw)

    async def exec_stream(self, command: str, **kw: Any) -> AsyncIterator[Event]:
        """See :meth:`RemoteSandbox.exec_stream`."""
        it = await asyncio.to_thread(self.sync.exec_stream, command, **kw)
        sentinel = object()
        while True:
            ev = await asyncio.to_thread(next, it, sentinel)
            if ev is sentinel:
                return
            yield ev  # type: ignore[misc]

    async def start_process(self, *args: Any, **kw: Any) -> Process:
        """See :meth:`RemoteSandbox.start_process` (the process handle is synchronous)."""
        return await asyncio.to_thread(self.sync.start_process, *args, **kw)

    async def expose_port(self, port: int, **kw: Any) -> dict[str, Any]:
        """See :meth:`RemoteSandbox.expose_port`."""
        return await asyncio.to_thread(lambda: self.sync.expose_port(port, **kw))

    async def ports(self) -> list[dict[str, Any]]:
        """See :meth:`RemoteSandbox.ports`."""
        return await asyncio.to_thread(self.sync.ports)

    async def approvals(self, **kw: Any) -> list[dict[str, Any]]:
        """See :meth:`RemoteSandbox.approvals`."""
        return await asyncio.to_thread(lambda: self.sync.approvals(**kw))

    async def decide(self, question: int | Mapping[str, Any], decision: str) -> dict[str, Any]:
        """See :meth:`RemoteSandbox.decide`."""
        return await asyncio.to_thread(self.sync.decide, question, decision)

    async def unexpose_port(self, port: int) -> None:
        """See :meth:`RemoteSandbox.unexpose_port`."""
        await asyncio.to_thread(self.sync.unexpose_port, port)

    async def create_context(self, language: str = "python", **kw: Any) -> Context:
        """See :meth:`RemoteSandbox.create_context`."""
        return await asyncio.to_thread(lambda: self.sync.create_context(language, **kw))

    async def contexts(self) -> list[Context]:
        """See :meth:`RemoteSandbox.contexts`."""
        return await asyncio.to_thread(self.sync.contexts)

    async def delete_context(self, context: Context | str) -> None:
        """See :meth:`RemoteSandbox.delete_context`."""
        await asyncio.to_thread(self.sync.delete_context, context)

    async def run_code(self, code: str, context: Context | str | None = None, **kw: Any) -> Execution:
        """See :meth:`RemoteSandbox.run_code` (callbacks run in the worker thread)."""
        return await asyncio.to_thread(lambda: self.sync.run_code(code, context, **kw))

    async def changes(self) -> list[Change]:
        """See :meth:`RemoteSandbox.changes`."""
        return await asyncio.to_thread(self.sync.changes)

    async def review(self) -> tuple[list[Change], str]:
        """See :meth:`RemoteSandbox.review`."""
        return await asyncio.to_thread(self.sync.review)

    async def diff(self, path: Any) -> dict[str, Any]:
        """See :meth:`RemoteSandbox.diff`."""
        return await asyncio.to_thread(self.sync.diff, path)

    async def commit(self, **kw: Any) -> dict[str, Any]:
        """See :meth:`RemoteSandbox.commit`."""
        return await asyncio.to_thread(self.sync.commit, **kw)

    async def abort(self) -> dict[str, Any]:
        """See :meth:`RemoteSandbox.abort`."""
        return await asyncio.to_thread(self.sync.abort)

    async def snapshot(self, name: str | None = None, **kw: Any) -> dict[str, Any]:
        """See :meth:`RemoteSandbox.snapshot`."""
        return await asyncio.to_thread(self.sync.snapshot, name, **kw)

    async def fork(self, count: int = 1, **kw: Any) -> list[AsyncSandbox]:
        """See :meth:`RemoteSandbox.fork`."""
        return [AsyncSandbox(s) for s in await asyncio.to_thread(self.sync.fork, count, **kw)]

    async def restore(self, snapshot: str | Mapping[str, Any]) -> dict[str, Any]:
        """See :meth:`RemoteSandbox.restore`."""
        return await asyncio.to_thread(self.sync.restore, snapshot)

    async def delete(self) -> dict[str, Any]:
        """See :meth:`RemoteSandbox.delete`."""
        return await asyncio.to_thread(self.sync.delete)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.sync.__exit__, *exc)
