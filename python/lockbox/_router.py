"""The fleet's router: one HTTP address for every node's ``lockbox serve`` (issue 31, items
2, 3 and the routing part of 5). See :func:`lockbox.fleet.router` and docs/fleet.md.

A byte-level HTTP/1.1 proxy on asyncio (standard library only): each request head is parsed,
the node that owns the call is picked (by the sandbox id in the path, or E2B's
``E2b-Sandbox-Id`` header), the head is forwarded with the node's token in place of the
fleet's, and the body and the reply are streamed through as they come (chunked replies chunk
by chunk, so SSE events are not held back; a ``101 Switching Protocols`` reply turns the
connection into a byte pipe both ways, so WebSockets pass). Only creates and listings are
read whole: a create to choose its node (power of K choices over the nodes' load) and to
record the new sandbox's node, a listing to merge every node's. Small request bodies are read
first and go over kept-alive connections to the node. MCP tool calls are routed by the
sandbox or snapshot they name; the console logs in with the fleet's token (sessions of the
router's own). Calls to a node found down are answered at once, and those in flight ended; a
node that answers again is checked for what it still holds before calls go to it again
(:meth:`Router._reconcile`). E2B's listing is paged across the nodes (:class:`Cursor`), and
the sandboxes' exposed ports are served on their own origins on a listener of the router's.

Placements (sandbox or snapshot id -> node) live in Ray's GCS key-value store, in the
namespace ``lockbox-fleet:NAMESPACE``: ``c/UUID`` (a create's node, written before the create
is forwarded), ``p/ID`` (a sandbox's or snapshot's node, once the node answered),
``n/NODE/ID`` (the sandboxes of a node), ``g/NODE/ID`` (those a node came back without:
see :meth:`Router._reconcile`), ``h/SNAPSHOT/NODE`` (a snapshot copied to another node),
``s/HASH`` (console sessions). Several routers share them; a router that restarts reads them
again.

A fork (or create, or restore) of a snapshot on a node that lacks it first copies it there:
the snapshot's OCI artifact streams from a node that has it (``GET .../artifact``) into the
target (``PUT .../artifact?digest=``), which checks it against its digest (docs/fleet.md,
"Snapshots on other nodes").
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import hashlib
import hmac
import http
import json
import random
import secrets
import time
import urllib.parse
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Cursor", "K", "NodeView", "Router", "merge_pages", "place"]

K = 3
"""Placement samples this many nodes and takes the least loaded (power of K choices)."""

IMAGE_AFFINITY = 0.25
"""A node that already holds the create's image wins over one up to this much (as a fraction
of capacity) less loaded."""

HOLDERS = 2
"""Besides the K random nodes, placement looks at up to this many nodes that already hold the
create's image (a node pulls an image once: on a skewed workload this cuts pulls many times
over, where the K random nodes alone rarely include a holder; docs/benchmarks.md)."""

HEAD_LIMIT = 64 * 1024
BODY_LIMIT = 16 * 1024 * 1024
CHUNK = 64 * 1024
HEADER_TIMEOUT = 10.0
CONNECT_TIMEOUT = 3.0
CALL_TIMEOUT = 5.0
PROBE_INTERVAL = 1.0
NODES_INTERVAL = 0.5
DEFAULT_MAX_SANDBOXES = 64
SESSION_SECONDS = 12 * 3600
FIRST_SEEN = "first seen by this router"
"""Why a node is checked before the router routes to it (:attr:`NodeView.was_down`) when the
router has only just started."""
SWEEP_INTERVAL = 10.0
SMALL_BODY = 64 * 1024
"""A request body up to this size is read before it is forwarded (so the call can use a
kept-alive connection to the node, and be sent again should that one have closed)."""
E2B_PAGE = 100
"""E2B's largest (and default) page of ``GET /v2/sandboxes`` (its spec's ``limit``)."""
PAGE_ATTEMPTS = 3
"""A page of E2B's listing is made again this many times at most when a node's listing
changed between the two calls that find where the page ends on it."""
POOL_MAX = 64
"""Idle connections kept per node at most."""
POOL_IDLE = 4.0
"""Idle connections to a node are reused for this long (``lockbox serve`` closes them after
``--connection-idle-timeout``, 120 s by default: the router closes first)."""

# E2B's templates that run on the host's userland (crates/lockbox-e2b, HOST_TEMPLATES).
_HOST_TEMPLATES = {"base", "code-interpreter-v1"}
_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade"}
_LISTS = {"/v1/sandboxes", "/v1/snapshots", "/v1/branches", "/v1/transactions", "/v1/journal/runs",
          "/sandboxes", "/v2/sandboxes"}
_BY_ID = {"sandboxes": "/v1/sandboxes/", "snapshots": "/v1/snapshots/", "branches": "/v1/branches/",
          "transactions": "/v1/transactions/", "runs": "/v1/journal/runs/"}
_NOT_FOUND = {"sandboxes": "SANDBOX_NOT_FOUND", "snapshots": "SNAPSHOT_NOT_FOUND", "branches": "BRANCH_NOT_FOUND",
              "transactions": "TXN_NOT_FOUND", "runs": "RUN_NOT_FOUND"}


_ONE = {"sandboxes": "sandbox", "snapshots": "snapshot", "branches": "branch", "transactions": "transaction",
        "runs": "run"}


class HttpError(Exception):
    """A malformed request or reply."""


@dataclass
class Head:
    """An HTTP/1.1 request or status line and its headers, in order."""

    line: str
    headers: list[tuple[str, str]]

    @classmethod
    def parse(cls, raw: bytes) -> Head:
        lines = raw.decode("latin-1").split("\r\n")
        headers = []
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip() or "\n" in line or "\r" in line:
                raise HttpError(f"bad header line {line[:60]!r}")
            headers.append((name, value.strip()))
        return cls(lines[0], headers)

    def get(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def remove(self, *names: str) -> None:
        drop = {n.lower() for n in names}
        self.headers = [(k, v) for k, v in self.headers if k.lower() not in drop]

    def put(self, name: str, value: str) -> None:
        self.remove(name)
        self.headers.append((name, value))

    def encode(self) -> bytes:
        return ("\r\n".join([self.line, *(f"{k}: {v}" for k, v in self.headers)]) + "\r\n\r\n").encode("latin-1")

    def tokens(self, name: str) -> set[str]:
        return {t.strip().lower() for k, v in self.headers if k.lower() == name.lower() for t in v.split(",")}


def _framing(head: Head, *, request: bool, method: str = "GET", status: int = 200) -> int | None:
    """The body's length: ``-1`` chunked, ``None`` until the connection closes, else a
    byte count."""
    if not request and (method == "HEAD" or 100 <= status < 200 or status in (204, 304)):
        return 0
    codings = [c for c in head.tokens("transfer-encoding") if c]
    lengths = {v.strip() for k, v in head.headers if k.lower() == "content-length"}
    if codings:
        # Only plain chunked framing, and never beside a length (no request smuggling).
        if codings != ["chunked"] or (request and lengths):
            raise HttpError(f"unsupported framing: Transfer-Encoding {', '.join(codings)}"
                            + (" with Content-Length" if lengths else ""))
        return -1
    if lengths:
        if len(lengths) > 1 or not next(iter(lengths)).isdigit():
            raise HttpError(f"bad Content-Length {', '.join(sorted(lengths))}")
        return int(next(iter(lengths)))
    return 0 if request else None


async def _copy_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, framing: int | None) -> None:
    """Copies one body as it arrives, framing included (chunk by chunk, flushed)."""
    if framing is None:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        return
    if framing >= 0:
        left = framing
        while left:
            data = await reader.read(min(CHUNK, left))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            writer.write(data)
            await writer.drain()
            left -= len(data)
        return
    while True:
        line = await reader.readuntil(b"\r\n")
        writer.write(line)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise HttpError("bad chunk size") from None
        if size == 0:
            while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                writer.write(trailer)
            writer.write(b"\r\n")
            await writer.drain()
            return
        left = size + 2
        while left:
            data = await reader.read(min(CHUNK, left))
            if not data:
                raise asyncio.IncompleteReadError(b"", left)
            writer.write(data)
            left -= len(data)
        await writer.drain()


async def _read_body(reader: asyncio.StreamReader, framing: int | None, limit: int = BODY_LIMIT) -> bytes:
    """A whole body, de-chunked; ``HttpError`` beyond ``limit`` bytes."""
    if framing is None:
        data = await reader.read(limit + 1)
        while len(data) <= limit and (more := await reader.read(limit + 1 - len(data))):
            data += more
    elif framing >= 0:
        if framing > limit:
            raise HttpError(f"a body of {framing} bytes, more than {limit}")
        return await reader.readexactly(framing)
    else:
        parts = []
        total = 0
        while True:
            line = await reader.readuntil(b"\r\n")
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise HttpError("bad chunk size") from None
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass
                break
            total += size
            if total > limit:
                raise HttpError(f"a body of more than {limit} bytes")
            parts.append((await reader.readexactly(size + 2))[:-2])
        data = b"".join(parts)
    if len(data) > limit:
        raise HttpError(f"a body of more than {limit} bytes")
    return data


def _reply(status: int, body: Any, *, close: bool = False, headers: Sequence[tuple[str, str]] = ()) -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "Status"
    hs = [*headers] if status == 204 else [("Content-Type", "application/json"), *headers,
                                           ("Content-Length", str(len(data)))]
    if close:
        hs.append(("Connection", "close"))
    return Head(f"HTTP/1.1 {status} {reason}", hs).encode() + (b"" if status == 204 else data)


def _lockbox_error(status: int, code: str, message: str, **details: Any) -> tuple[int, dict[str, Any]]:
    return status, {"code": code, "message": message, "details": details}


@dataclass
class NodeView:
    """What a router knows of one node: its server, its state and its load."""

    node_id: str
    state: str = "starting"
    reason: str | None = None
    host: str = ""
    port: int = 0
    token: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    capacity: int = DEFAULT_MAX_SANDBOXES
    load: int = 0
    """Creates this router has in flight to the node, plus its sandboxes: those running at
    the last probe, with those this router made since (answered after that probe began) and
    without those it deleted since. Counted by id, so a probe that did or did not see a
    create or a delete answered while it ran counts it once either way."""
    probed: set[str] = field(default_factory=set)
    probe_started: float = 0.0
    inflight: int = 0
    made: dict[str, float] = field(default_factory=dict)
    """The sandboxes this router made on the node, by id, with when the node answered."""
    deleted: dict[str, float] = field(default_factory=dict)
    """The node's sandboxes this router deleted, by id, with when the node answered."""
    swept: float = 0.0
    absent: set[str] = field(default_factory=set)
    failures: int = 0
    calls: set[asyncio.StreamWriter] = field(default_factory=set)
    """Connections of calls in flight to this node: closed when it is found down, so no
    client waits on a node that will not answer."""

    def mark_unreachable(self, reason: str) -> None:
        self.unreachable = reason
        self.was_down = self.was_down or f"it could not be reached ({reason})"
        self.end_calls()

    def end_calls(self) -> None:
        for w in list(self.calls):
            w.close()
        self.calls.clear()
    images: set[str] = field(default_factory=set)
    unreachable: str | None = None
    was_down: str | None = None
    """Why the node was last down (unreachable, lost, starting, a new server; or
    :data:`FIRST_SEEN`), until the router has checked what it still holds once it answers
    again (:meth:`Router._reconcile`): not routed to meanwhile."""
    ports_host: str = ""
    ports_port: int = 0
    """The node's ports listener (``lockbox serve --ports-listen``); 0: it has none."""
    ports_domain: str = "localhost"

    def recount(self) -> None:
        self.load = self.inflight + len((self.probed | self.made.keys()) - self.deleted.keys())

    def probed_at(self, started: float, running: set[str]) -> None:
        """A probe that began at ``started`` found ``running``: what this router made or
        deleted before then is in that listing."""
        self.probed, self.probe_started = running, started
        self.made = {i: t for i, t in self.made.items() if t > started}
        self.deleted = {i: t for i, t in self.deleted.items() if t > started}
        self.recount()

    def now_made(self, ids: Iterable[str]) -> None:
        now = time.monotonic()
        self.made.update((i, now) for i in ids)
        self.recount()

    def now_deleted(self, sid: str) -> None:
        self.deleted[sid] = time.monotonic()
        self.recount()

    @property
    def routable(self) -> bool:
        return self.state == "up" and self.unreachable is None and self.was_down is None

    def lost_reason(self) -> str | None:
        """Why calls to this node's sandboxes fail now, or ``None``."""
        if self.state == "lost":
            return f"the node was lost: {self.reason or 'it left the Ray cluster'}"
        if self.state != "up":
            return f"the node's server is {self.state}" + (f" ({self.reason})" if self.reason else "")
        if self.unreachable:
            return f"the node's server cannot be reached: {self.unreachable}"
        if self.was_down is not None:
            return f"the node answers again; the router is checking what it still holds ({self.was_down})"
        return None


def place(nodes: Sequence[NodeView], *, image: str | None = None, rng: random.Random | None = None,
          k: int = K, holders: Sequence[NodeView] = ()) -> NodeView | None:
    """Power of K choices: samples ``k`` of ``nodes``, and up to :data:`HOLDERS` of
    ``holders`` (nodes of ``nodes`` that hold ``image``), and of those with room returns the
    one with the lowest load per capacity, a node already holding ``image`` counting
    :data:`IMAGE_AFFINITY` less loaded. ``None`` when no node has room."""
    rng = rng or random.Random()

    def free(n: NodeView) -> bool:
        return n.load < n.capacity

    # Indices, not a copy of a list of every node: a decision costs O(k), not O(nodes).
    sample = [nodes[i] for i in rng.sample(range(len(nodes)), min(k, len(nodes)))]
    if image and holders:
        sample += [holders[i] for i in rng.sample(range(len(holders)), min(HOLDERS, len(holders)))]
    sample = [n for n in sample if free(n)]
    if not sample:  # the sample was full: look at every node
        room = [n for n in nodes if free(n)]
        sample = rng.sample(room, min(k, len(room)))
    if not sample:
        return None

    def score(n: NodeView) -> tuple[float, float]:
        s = n.load / max(n.capacity, 1)
        if image and image in n.images:
            s -= IMAGE_AFFINITY
        return (s, rng.random())

    return min(sample, key=score)


class Store:
    """Placements in Ray's GCS key-value store (blocking calls: run them in a thread)."""

    def __init__(self, namespace: str) -> None:
        from ray.experimental import internal_kv

        self.kv = internal_kv
        self.ns = f"lockbox-fleet:{namespace}".encode()

    def get(self, key: str) -> dict[str, Any] | None:
        raw = self.kv._internal_kv_get(key.encode(), namespace=self.ns)
        return json.loads(raw) if raw else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        self.kv._internal_kv_put(key.encode(), json.dumps(value).encode(), True, namespace=self.ns)

    def delete(self, key: str) -> None:
        self.kv._internal_kv_del(key.encode(), namespace=self.ns)

    def keys(self, prefix: str) -> list[str]:
        return [k.decode() for k in self.kv._internal_kv_list(prefix.encode(), namespace=self.ns)]

    def record(self, node: str, sandboxes: Iterable[str], snapshots: Iterable[str] = ()) -> None:
        """Ids made on ``node``; sandboxes also under ``n/NODE/`` (what a lost node held)."""
        value = {"node": node, "at": time.time()}
        for i in sandboxes:
            self.put(f"p/{i}", value)
            self.put(f"n/{node}/{i}", value)
        for i in snapshots:
            self.put(f"p/{i}", value)

    def forget(self, i: str) -> None:
        got = self.get(f"p/{i}")
        if got:
            self.delete(f"n/{got['node']}/{i}")
            self.delete(f"g/{got['node']}/{i}")
        self.delete(f"p/{i}")

    def bury(self, node: str, sandboxes: Iterable[str], reason: str) -> None:
        """Sandboxes ``node`` came back without: ``p/ID`` says so (``gone``, the reason), and
        ``g/NODE/ID`` lists them (no longer under ``n/NODE/``, what the node holds)."""
        value = {"node": node, "at": time.time(), "gone": reason}
        for i in sandboxes:
            self.put(f"p/{i}", value)
            self.put(f"g/{node}/{i}", value)
            self.delete(f"n/{node}/{i}")


def _made(what: str, reply: Any) -> tuple[list[str], list[str]]:
    """The sandboxes and snapshots a reply says were made: ``create`` (a sandbox, lockbox's
    ``id`` or E2B's ``sandboxID``), ``snapshot`` (a snapshot's ``id``), ``e2b-snapshot``
    (E2B's ``snapshotID``), ``fork`` (its
    ``sandboxes``, and the ``snapshot`` it took, if any)."""
    if not isinstance(reply, dict):
        return [], []
    if what == "create":
        sid = reply.get("id", reply.get("sandboxID"))
        return ([sid] if isinstance(sid, str) else []), []
    if what == "snapshot":
        return [], ([reply["id"]] if isinstance(reply.get("id"), str) else [])
    if what == "e2b-snapshot":
        return [], ([reply["snapshotID"]] if isinstance(reply.get("snapshotID"), str) else [])
    snap = reply.get("snapshot")
    boxes = [b["id"] for b in reply.get("sandboxes") or [] if isinstance(b, dict) and isinstance(b.get("id"), str)]
    return boxes, ([snap["id"]] if isinstance(snap, dict) and isinstance(snap.get("id"), str) else [])


_CURSOR = "fleet1."
"""The prefix of the router's own ``nextToken`` (a node's is ``{nanos}.{id}``)."""


@dataclass
class Cursor:
    """Where a walk of E2B's listing through the router stands (its ``nextToken``): the
    ``order`` it was made for, each node's position in its own listing (``""``: from its
    start, a node's own ``x-next-token``: after that item, ``None``: nothing more there),
    and the ``boundary`` (``startedAt``, ``sandboxID``) of the last item listed, for the
    nodes nothing was taken from yet."""

    order: str
    nodes: dict[str, str | None] = field(default_factory=dict)
    boundary: tuple[str, str] | None = None
    listing: str = "/v2/sandboxes"
    """The path of the listing walked (:attr:`E2bListing.path`)."""

    def encode(self) -> str:
        raw = json.dumps({"order": self.order, "nodes": self.nodes, "boundary": self.boundary,
                          "listing": self.listing}, separators=(",", ":"), sort_keys=True).encode()
        return _CURSOR + base64.urlsafe_b64encode(zlib.compress(raw)).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str, order: str, listing: str = "/v2/sandboxes") -> Cursor:
        """The cursor :meth:`encode` made for ``order`` of ``listing`` (``ValueError`` naming
        what is wrong otherwise)."""
        foreign = ValueError(f"{token[:40]!r} is not one this fleet's routers gave")
        if not token.startswith(_CURSOR):
            raise foreign
        body = token[len(_CURSOR):]
        try:
            parsed = json.loads(zlib.decompress(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))))
        except (binascii.Error, zlib.error, ValueError):
            raise foreign from None
        nodes = parsed.get("nodes") if isinstance(parsed, dict) else None
        boundary = parsed.get("boundary") if isinstance(parsed, dict) else None
        if not isinstance(nodes, dict) or not all(isinstance(k, str) and (v is None or isinstance(v, str))
                                                  for k, v in nodes.items()):
            raise foreign
        if boundary is not None and not (isinstance(boundary, list) and len(boundary) == 2
                                         and all(isinstance(b, str) for b in boundary)):
            raise foreign
        made_for = parsed.get("listing", "/v2/sandboxes")
        if made_for != listing:
            raise ValueError(f"it was made for GET {made_for}, not GET {listing}")
        if parsed.get("order") != order:
            raise ValueError(f"it was made for order={parsed.get('order')}, not order={order}: keep the order "
                             "while paging")
        return cls(order, nodes, (boundary[0], boundary[1]) if boundary else None, listing)


def _page_key(item: Any) -> tuple[str, str]:
    if not isinstance(item, dict):
        return "", ""
    return str(item.get("startedAt", "")), str(item.get("sandboxID", ""))


def _no_key(item: Any) -> tuple[str, str]:
    return "", ""


def _snapshot_key(item: Any) -> tuple[str, str]:
    return "", str(item.get("snapshotID", "")) if isinstance(item, dict) else ""


@dataclass(frozen=True)
class E2bListing:
    """One of E2B's paged listings, as the router walks it across the nodes: its ``path``,
    the ``key`` that names an item (and, ``by_start_time``, orders each node's listing:
    the pages are merged by it and ``order`` applies; otherwise the fleet's listing is each
    node's in turn, by node id)."""

    path: str
    key: Callable[[Any], tuple[str, str]]
    by_start_time: bool


SANDBOX_LISTING = E2bListing("/v2/sandboxes", _page_key, by_start_time=True)
SNAPSHOT_LISTING = E2bListing("/snapshots", _snapshot_key, by_start_time=False)
"""E2B's ``GET /snapshots``: a snapshot says nothing of when it was taken (``snapshotID``,
``names``), and each node lists its own in the order they were taken."""


def merge_pages(pages: dict[str, list[Any]], limit: int, *, ascending: bool,
                key: Callable[[Any], tuple[str, str]] = _page_key) -> tuple[list[tuple[str, Any]], dict[str, int]]:
    """Merges each node's page of E2B's listing (each in its node's own order, by ``key``:
    start time) into one of at most ``limit`` items, newest first (oldest first if
    ``ascending``): ``(node, item)`` pairs, and how many items of each node's page were
    taken. Only the head of each node's page is ever taken, so what is taken of a node is a
    prefix of its page, and the next page goes on from where it ended. Ties go to the node
    whose id sorts first (so a constant ``key``, ascending, lists node after node)."""
    heads = dict.fromkeys(pages, 0)
    out: list[tuple[str, Any]] = []
    order = sorted(pages)
    while len(out) < limit:
        best: str | None = None
        best_key = ("", "")
        for node in order:
            i = heads[node]
            if i >= len(pages[node]):
                continue
            item_key = key(pages[node][i])
            if best is None or (item_key < best_key if ascending else item_key > best_key):
                best, best_key = node, item_key
        if best is None:
            break
        out.append((best, pages[best][heads[best]]))
        heads[best] += 1
    return out, heads


class Router:
    """Serves lockbox's HTTP API (and E2B's) for every node of a fleet.

    ``nodes`` is called (in a thread) every :data:`NODES_INTERVAL` seconds and returns the
    fleet's listing (``lockbox.fleet.Fleet.nodes``); ``token`` is the fleet's token clients
    must send; ``store`` keeps the placements (``None``: in memory only, for tests of the
    proxy alone)."""

    def __init__(self, nodes: Callable[[], list[dict[str, Any]]], token: str, store: Store | None, *,
                 ports_domain: str = "localhost") -> None:
        self._list_nodes = nodes
        if not all(label and label.replace("-", "").isalnum() and label.isascii()
                   for label in ports_domain.split(".")):
            raise ValueError(f"ports_domain: {ports_domain!r} is not a DNS name (letters, digits and '-', labels "
                             "separated by dots)")
        self.ports_domain = ports_domain.lower()
        self.ports_address: tuple[str, int] | None = None
        self.ports_server: asyncio.Server | None = None
        self.token = token.encode()
        self.store = store
        self.nodes: dict[str, NodeView] = {}
        self.cache: dict[str, str] = {}
        self.copies: dict[str, set[str]] = {}
        """Snapshot id -> the nodes this router copied it to (also in the store, ``h/ID/NODE``)."""
        self._copying: dict[tuple[str, str], asyncio.Lock] = {}
        self.sessions: dict[str, tuple[str, float]] = {}
        self.pool: dict[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float, int]]] = {}
        self.rng = random.Random()
        self.server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._nodes_ready = asyncio.Event()
        self._probed = asyncio.Event()
        self.gone: dict[str, tuple[str, str]] = {}
        """Sandboxes a node came back without (id -> node, reason), as far as this router
        knows; the store's ``g/NODE/ID`` are the fleet's."""

    # -- running --------------------------------------------------------------------------

    async def start(self, host: str, port: int, *, ports: tuple[str, int] | None = None) -> tuple[str, int]:
        """Listens on ``host:port`` (0: a free port); returns the address bound. ``ports``:
        also serve the sandboxes' exposed ports on their own origins there
        (``{port}-{sandbox}.{ports_domain}:PORT``, :attr:`ports_address` once bound), as
        ``lockbox serve --ports-listen`` does."""
        self._tasks = [asyncio.create_task(self._watch_nodes()), asyncio.create_task(self._probe())]
        self.server = await asyncio.start_server(functools.partial(self._client, handle=self._handle), host, port,
                                                 limit=HEAD_LIMIT)
        if ports is not None:
            self.ports_server = await asyncio.start_server(functools.partial(self._client, handle=self._ports),
                                                           *ports, limit=HEAD_LIMIT)
            bound = self.ports_server.sockets[0].getsockname()
            self.ports_address = (bound[0], bound[1])
        sock = self.server.sockets[0].getsockname()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._nodes_ready.wait(), 30)
        with contextlib.suppress(TimeoutError):  # each node checked once: it is routed to then
            await asyncio.wait_for(self._probed.wait(), 30)
        return sock[0], sock[1]

    async def close(self) -> None:
        """Stops listening and watching the nodes (calls in flight end as they end)."""
        for t in self._tasks:
            t.cancel()
        for server in (self.server, self.ports_server):
            if server is not None:
                server.close()
        for idle in self.pool.values():
            for _, writer, _, _ in idle:
                writer.close()
        self.pool.clear()

    async def _kv(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def _watch_nodes(self) -> None:
        last_error = ""
        while True:
            try:
                listed = await asyncio.to_thread(self._list_nodes)
            except Exception as e:  # the controller restarting: keep what we know
                listed = None
                why = f"lockbox fleet router: cannot list the fleet's nodes: {type(e).__name__}: {e}"
                if why != last_error:
                    print(why, flush=True)
                last_error = why
            try:
                if listed is not None:
                    self._update_nodes(listed)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                print(f"lockbox fleet router: a bad listing of the fleet's nodes: {_why(e)}", flush=True)
            await asyncio.sleep(NODES_INTERVAL)

    def _update_nodes(self, listed: list[dict[str, Any]]) -> None:
        """Takes in the fleet's listing: states, addresses, tokens, labels, capacities."""
        seen = set()
        for n in listed:
            seen.add(n["node_id"])
            view = self.nodes.setdefault(n["node_id"], NodeView(n["node_id"], was_down=FIRST_SEEN))
            if n.get("state") == "lost" and view.state != "lost":
                view.end_calls()
            view.state, view.reason = n.get("state", "starting"), n.get("reason")
            if view.state != "up":
                view.was_down = view.was_down or view.lost_reason()
            view.labels = dict(n.get("labels") or {})
            view.capacity = int(n.get("max_sandboxes") or DEFAULT_MAX_SANDBOXES)
            if n.get("url"):
                parsed = urllib.parse.urlsplit(n["url"])
                if (parsed.hostname, parsed.port, n.get("token")) != (view.host, view.port, view.token):
                    if view.port:  # not the first server the router sees there
                        view.was_down = "its server restarted"
                    view.host, view.port, view.token = parsed.hostname or "", parsed.port or 80, n["token"]
                    view.unreachable = None  # routed to once a probe has checked what it holds (was_down)
            ports = urllib.parse.urlsplit(n["ports_url"]) if n.get("ports_url") else None
            view.ports_host, view.ports_port = (ports.hostname or "", ports.port or 80) if ports else ("", 0)
            view.ports_domain = str(n.get("ports_domain") or "localhost")
        for node_id, view in self.nodes.items():
            if node_id not in seen:
                view.state, view.reason = "lost", "the fleet no longer lists it"
                view.was_down = view.was_down or view.lost_reason()
        self._nodes_ready.set()

    async def _probe(self) -> None:
        """Each up node's load (its running sandboxes) and images, every second; a node that
        does not answer is unreachable until it does."""
        while True:
            listed = self._nodes_ready.is_set()  # this round sees the fleet's listing
            views = [v for v in self.nodes.values() if v.state == "up"]
            for v, got in zip(views, await asyncio.gather(*(self._probe_one(v) for v in views),
                                                          return_exceptions=True), strict=True):
                if isinstance(got, Exception):
                    print(f"lockbox fleet router: probe of node {v.node_id[:12]}: {_why(got)}", flush=True)
            if listed:
                self._probed.set()
            await asyncio.sleep(PROBE_INTERVAL)

    async def _probe_one(self, view: NodeView) -> None:
        started = time.monotonic()
        try:
            status, _, body = await self._call(view, "GET", "/v1/sandboxes?state=running", timeout=2.0)
            if status != 200:
                raise HttpError(f"GET /v1/sandboxes answered {status}")
            boxes = json.loads(body)["sandboxes"]
        except (OSError, HttpError, TimeoutError, ValueError, KeyError, asyncio.IncompleteReadError) as e:
            # A refused or reset connection says the server is gone; a slow answer (a
            # loaded node) must happen twice in a row.
            view.failures += 1
            if view.failures >= 2 or (isinstance(e, OSError) and not isinstance(e, TimeoutError)):
                view.mark_unreachable(_why(e))
            return
        view.failures = 0
        if view.was_down is not None:
            try:
                await self._reconcile(view, view.was_down)
            except (OSError, HttpError, TimeoutError, ValueError, KeyError, TypeError,
                    asyncio.IncompleteReadError) as e:
                view.unreachable = f"back, but what it holds could not be listed: {_why(e)}"
                return
            view.was_down = None
        view.unreachable = None
        running = {b["id"] for b in boxes if isinstance(b, dict) and isinstance(b.get("id"), str)}
        view.probed_at(started, running)
        for b in boxes:
            image = (b.get("policy") or {}).get("image")
            if image:
                view.images.add(image)
        if self.store is not None and started - view.swept >= SWEEP_INTERVAL:
            view.swept = started
            await self._sweep(view, running)

    async def _sweep(self, view: NodeView, running: set[str]) -> None:
        """Forgets the recorded sandboxes of ``view`` that two sweeps in a row found not
        running (stopped by a timeout, deleted on the node directly): what a lost node's
        listing shows is what it ran. E2B's sandboxes are looked for by their E2B ids, paused
        ones too (a resumed one runs as a lockbox sandbox of another id, a paused one as
        none)."""
        assert self.store is not None
        try:
            recorded = {k.split("/", 2)[2] for k in await self._kv(self.store.keys, f"n/{view.node_id}/")}
            gone = recorded - running
            if gone:
                gone -= await self._e2b_held(view)
            for sid in gone & view.absent:
                self.cache.pop(sid, None)
                await self._kv(self.store.forget, sid)
            view.absent = gone - view.absent
        except Exception as e:  # the store unavailable for a moment: sweep next time
            print(f"lockbox fleet router: sweep of node {view.node_id[:12]}: {_why(e)}", flush=True)

    async def _held(self, view: NodeView) -> set[str]:
        """The sandboxes ``view``'s server holds: lockbox's, running or stopped (not those it
        lists ``lost``: a server before it ran them), and E2B's, running or paused (a paused
        one outlives its server, by the same id)."""
        status, _, body = await self._call(view, "GET", "/v1/sandboxes")
        if status != 200:
            raise HttpError(f"GET /v1/sandboxes answered {status}")
        return {b["id"] for b in json.loads(body)["sandboxes"]
                if isinstance(b, dict) and isinstance(b.get("id"), str) and b.get("state") != "lost"
                } | await self._e2b_held(view)

    async def _e2b_held(self, view: NodeView) -> set[str]:
        """The E2B ids of ``view``'s E2B sandboxes, running and paused (every page)."""
        held: set[str] = set()
        after = ""
        while True:
            status, head, body = await self._call(
                view, "GET", f"/v2/sandboxes?limit={E2B_PAGE}" + (f"&nextToken={urllib.parse.quote(after, safe='')}"
                                                                 if after else ""))
            if status != 200:
                raise HttpError(f"GET /v2/sandboxes answered {status}")
            held |= {b["sandboxID"] for b in json.loads(body) if isinstance(b, dict)
                     and isinstance(b.get("sandboxID"), str)}
            token = head.get("x-next-token") or ""
            if not token or token == after:  # the last page (a node that repeats itself: no loop)
                return held
            after = token

    async def _reconcile(self, view: NodeView, cause: str) -> None:
        """A node answers again (after being unreachable, lost or starting, or with a new
        server): of the sandboxes recorded on it, those it still holds are routed as before;
        those it does not are buried (:meth:`Store.bury`): answered 410 ``SANDBOX_LOST`` and
        listed ``lost``, with the reason, until deleted. Without a store nothing is recorded
        per node: the node's own answers stand."""
        if self.store is None:
            return
        held = await self._held(view)
        recorded = {k.split("/", 2)[2] for k in await self._kv(self.store.keys, f"n/{view.node_id}/")}
        gone = recorded - held
        if not gone:
            return
        reason = (f"node {view.node_id[:12]} did not hold it when a router started" if cause == FIRST_SEEN
                  else f"node {view.node_id[:12]} came back without it ({cause})")
        await self._kv(self.store.bury, view.node_id, sorted(gone), reason)
        for sid in gone:
            self.cache.pop(sid, None)
            self.gone[sid] = (view.node_id, reason)
        view.absent -= gone

    async def _buried(self) -> dict[str, tuple[str, str]]:
        """Every sandbox a node came back without (id -> node, reason), from the store."""
        if self.store is None:
            return {}
        found = {}
        for key in await self._kv(self.store.keys, "g/"):
            _, node, sid = key.split("/", 2)
            if sid not in self.gone:
                got = await self._kv(self.store.get, key)
                if not got:
                    continue
                self.gone[sid] = (node, str(got.get("gone") or "its node came back without it"))
            found[sid] = self.gone[sid]
        for sid in set(self.gone) - set(found):  # deleted through another router
            del self.gone[sid]
        return found

    # -- one node, buffered -----------------------------------------------------------------

    async def _open(self, view: NodeView, *, ports: bool = False) -> tuple[asyncio.StreamReader,
                                                                            asyncio.StreamWriter]:
        """A connection to the node's API (or, with ``ports``, its ports listener)."""
        host, port = (view.ports_host, view.ports_port) if ports else (view.host, view.port)
        try:
            return await asyncio.wait_for(asyncio.open_connection(host, port, limit=HEAD_LIMIT), CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as e:
            if not ports:  # the API down is the node down; its ports listener alone is not
                view.mark_unreachable(_why(e))
            raise

    async def _call(self, view: NodeView, method: str, target: str, *, body: bytes | None = None,
                    headers: Sequence[tuple[str, str]] = (), timeout: float = CALL_TIMEOUT
                    ) -> tuple[int, Head, bytes]:
        """One request to a node with its token; the whole reply."""
        async def go() -> tuple[int, Head, bytes]:
            reader, writer = await self._open(view)
            try:
                hs = [("Host", f"{view.host}:{view.port}"), ("Authorization", f"Bearer {view.token}"),
                      *headers, ("Content-Length", str(len(body or b""))), ("Connection", "close")]
                writer.write(Head(f"{method} {target} HTTP/1.1", hs).encode() + (body or b""))
                await writer.drain()
                head, status = await _response_head(reader)
                return status, head, await _read_body(reader, _framing(head, request=False, method=method,
                                                                      status=status))
            finally:
                writer.close()
        return await asyncio.wait_for(go(), timeout)

    # -- clients ----------------------------------------------------------------------------

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                      handle: Callable[[_Request], Awaitable[None]]) -> None:
        try:
            while True:
                try:
                    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEADER_TIMEOUT)
                except asyncio.LimitOverrunError:
                    writer.write(_reply(431, {"code": "INVALID_REQUEST", "message": "request head over 64 KiB",
                                              "details": {}}, close=True))
                    await writer.drain()
                    return
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    return
                try:
                    head = Head.parse(raw)
                    method, target, version = head.line.split(" ")
                    if not version.startswith("HTTP/1."):
                        raise HttpError(f"{version} is not HTTP/1.x")
                    req = _Request(method, target, head, reader, writer)
                except (HttpError, ValueError) as e:
                    writer.write(_reply(400, {"code": "INVALID_REQUEST", "message": f"bad request head: {e}",
                                              "details": {}}, close=True))
                    await writer.drain()
                    return
                req.keep = version == "HTTP/1.1" and "close" not in head.tokens("connection")
                await handle(req)
                if not req.keep or (not req.body_read and req.framing != 0):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, HttpError, asyncio.LimitOverrunError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def _authorized(self, head: Head, e2b: bool) -> bool:
        auth = head.get("authorization") or ""
        given = auth[7:] if auth.startswith("Bearer ") else None
        if e2b and given is None:
            given = head.get("x-api-key")
        return given is not None and hmac.compare_digest(given.encode(), self.token)

    # -- the console's login: sessions of the router's own, kept in the store ---------------------

    async def _session(self, head: Head) -> tuple[str, str] | None:
        """The console session a request's cookie names (``(session, csrf)``), if valid."""
        session = _cookies(head).get("lockbox_session")
        if not session:
            return None
        key = hashlib.sha256(session.encode()).hexdigest()
        got = self.sessions.get(key)
        if got is None and self.store is not None:
            stored = await self._kv(self.store.get, f"s/{key}")
            got = (stored["csrf"], stored["at"]) if stored else None
        if got is None or time.time() - got[1] > SESSION_SECONDS:
            return None
        self.sessions[key] = got
        return session, got[0]

    def _cookie_refusal(self, req: _Request, csrf: str) -> str | None:
        """Why a request with the console's cookie is refused (as ``lockbox serve`` refuses
        it: another origin, a WebSocket without this origin, a write without the CSRF
        header), or ``None``."""
        origin = req.head.get("origin")
        host = req.head.get("host") or ""
        if origin is not None and origin not in (f"http://{host}", f"https://{host}"):
            return f"the origin {origin} is not this server's"
        if origin is None and req.head.get("upgrade") is not None:
            return "a WebSocket upgrade must carry this server's Origin"
        if (req.head.get("sec-fetch-site") or "none") not in ("same-origin", "none"):
            return "a cross-site request"
        if req.method not in ("GET", "HEAD") and not hmac.compare_digest(
                (req.head.get("x-csrf-token") or "").encode(), csrf.encode()):
            return "X-CSRF-Token is missing or wrong"
        return None

    async def _console(self, req: _Request) -> None:
        """``/ui/login``, ``/ui/logout``, ``/ui/session``, answered by the router itself: the
        console logs in with the fleet's token and then sees every node."""
        if req.path == "/ui/session":
            await req.drain_body()
            if await self._session(req.head):
                await req.send(200, {"authenticated": True})
            else:
                await req.send(*_lockbox_error(401, "UNAUTHORIZED", "no console session"))
            return
        origin = req.head.get("origin")
        host = req.head.get("host") or ""
        if origin is not None and origin not in (f"http://{host}", f"https://{host}"):
            await req.drain_body()
            await req.send(*_lockbox_error(403, "FORBIDDEN", f"the origin {origin} is not this server's"))
            return
        raw = await req.read_body_or_refuse(64 * 1024)
        if raw is None:
            return
        body = _json_or_none(raw)
        clear = [("Set-Cookie", "lockbox_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
                 ("Set-Cookie", "lockbox_csrf=; SameSite=Strict; Path=/; Max-Age=0")]
        if req.path == "/ui/logout":
            got = await self._session(req.head)
            if got:
                key = hashlib.sha256(got[0].encode()).hexdigest()
                self.sessions.pop(key, None)
                if self.store is not None:
                    await self._kv(self.store.delete, f"s/{key}")
            await req.send(204, b"", headers=clear)
            return
        token = body.get("token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self.token):
            await req.send(*_lockbox_error(401, "UNAUTHORIZED", "wrong token: the console of a fleet logs in with "
                                           "the fleet's token"))
            return
        session, csrf = secrets.token_hex(32), secrets.token_hex(32)
        key = hashlib.sha256(session.encode()).hexdigest()
        self.sessions[key] = (csrf, time.time())
        if self.store is not None:
            await self._kv(self.store.put, f"s/{key}", {"csrf": csrf, "at": time.time()})
        await req.send(204, b"", headers=[
            ("Set-Cookie", f"lockbox_session={session}; HttpOnly; SameSite=Strict; Path=/"),
            ("Set-Cookie", f"lockbox_csrf={csrf}; SameSite=Strict; Path=/")])

    async def _handle(self, req: _Request) -> None:
        path = req.path
        if req.head.get("e2b-sandbox-id") is not None:  # E2B's sandbox plane: the sandbox's own token
            sid = (req.head.get("e2b-sandbox-id") or "").strip()
            await self._by_id(req, sid, "sandboxes", flavour="e2b-plane", upstream_auth=False)
            return
        if path == "/healthz":
            await req.drain_body()
            await req.send(200, {"status": "ok", "fleet": True,
                                 "nodes": {n.node_id: n.state for n in self.nodes.values()},
                                 # What placement weighs: each node's running sandboxes as its
                                 # last probe saw them, with this router's creates and deletes since.
                                 "load": {n.node_id: n.load for n in self.nodes.values()}})
            return
        e2b = path.startswith(("/sandboxes", "/v2/", "/v3/", "/templates")) or path in ("/health", "/snapshots")
        if path == "/health":
            await req.drain_body()
            await req.send(200, {"message": "Health check successful"})
            return
        if path in ("/ui/login", "/ui/logout", "/ui/session"):
            await self._console(req)
            return
        if path == "/" or path == "/ui" or path.startswith("/ui/"):  # the console's files: no token
            await self._to_any(req, upstream_auth=False)
            return
        if not self._authorized(req.head, e2b):
            # The console's cookie opens lockbox's /v1 API only (as on one server).
            cookie = not e2b and not req.head.get("authorization") and path.startswith("/v1/")
            got = await self._session(req.head) if cookie else None
            refusal = self._cookie_refusal(req, got[1]) if got else None
            if got and refusal:
                req.keep = False
                await req.send(*_lockbox_error(403, "FORBIDDEN", f"console session: {refusal}"))
                return
            if got is None:
                req.keep = False  # its body is not read
                if e2b:
                    await req.send(401, {"code": 401, "message": "Invalid API key: send the fleet's token as "
                                         "X-API-Key (E2B_API_KEY)"})
                else:
                    await req.send(*_lockbox_error(401, "UNAUTHORIZED", "missing or wrong bearer token: send the "
                                                   "fleet's token (lockbox.fleet.Fleet.token)"))
                return
            # The console's cookie stands for the fleet's token: nodes get their own token.
            req.head.remove("x-csrf-token")
            _drop_cookies(req.head, ("lockbox_session", "lockbox_csrf"))
        parts = [p for p in path.split("/") if p]
        if req.method == "POST" and path in ("/v1/sandboxes", "/sandboxes", "/v2/sandboxes"):
            await self._create(req, e2b=e2b)
        elif req.method == "POST" and len(parts) == 4 and parts[:2] == ["v1", "snapshots"] and parts[3] == "fork":
            await self._fork_snapshot(req, urllib.parse.unquote(parts[2]))
        elif req.method == "GET" and path in _LISTS:
            await self._list(req, e2b=e2b)
        elif req.method == "GET" and path == SNAPSHOT_LISTING.path:
            await self._e2b_page(req, SNAPSHOT_LISTING)
        elif req.method == "DELETE" and len(parts) == 2 and parts[0] == "templates" and _is_snapshot_id(
                urllib.parse.unquote(parts[1])):
            # E2B's Sandbox.delete_snapshot: a snapshot goes to its node (an image template
            # would be refused there: 501, as below).
            await self._by_id(req, urllib.parse.unquote(parts[1]), "snapshots", flavour="e2b")
        elif parts[:1] == ["v1"] and len(parts) >= 3 and parts[1] in _BY_ID:
            await self._by_id(req, urllib.parse.unquote(parts[2]), parts[1], flavour="lockbox")
        elif parts[:2] == ["v1", "journal"] and len(parts) >= 4 and parts[2] == "runs":
            await self._by_id(req, urllib.parse.unquote(parts[3]), "runs", flavour="lockbox")
        elif e2b and "sandboxes" in parts[:2] and len(parts) >= parts.index("sandboxes") + 2:
            sid = urllib.parse.unquote(parts[parts.index("sandboxes") + 1])
            await self._by_id(req, sid, "sandboxes", flavour="e2b")
        elif req.method == "POST" and path == "/v1/transactions":
            await self._transaction(req)
        elif path == "/mcp" and req.method == "POST":
            await self._mcp(req)
        elif path.startswith("/v1/tokens") or path.startswith(("/v3/templates", "/v2/templates", "/templates")):
            await req.drain_body()
            what = "E2B templates" if e2b else "scoped tokens"
            message = f"{what} are not served by the fleet's router yet: use a node's own server (docs/fleet.md)"
            if e2b:
                await req.send(501, {"code": 501, "message": message})
            else:
                await req.send(*_lockbox_error(501, "NOT_SUPPORTED", message, what=path))
        else:  # the API's description and the like: the same on every node
            await self._to_any(req)

    # -- exposed ports on their own origins ---------------------------------------------------

    def _ports_reply(self, sid: str, data: bytes) -> bytes | None:
        """A node's ``.../ports`` reply (one port, or ``{"ports": [...]}``) with each port's
        ``origin`` and ``open_url`` on the router's ports listener, which a client that
        reaches only the router can use (none without one: the node's own would name a
        listener such a client may not reach)."""
        got = _json_or_none(data)
        ports = got.get("ports") if isinstance(got, dict) and "ports" in got else [got]
        if not isinstance(ports, list):
            return None
        for p in ports:
            if not isinstance(p, dict) or not isinstance(p.get("port"), int):
                continue
            if self.ports_address is None:
                p.pop("origin", None)
                p.pop("open_url", None)
                continue
            if "origin" not in p:
                continue  # the node has no ports listener: nothing to reach
            origin = f"http://{p['port']}-{sid}.{self.ports_domain}:{self.ports_address[1]}"
            p["origin"] = origin
            if isinstance(p.get("open_url"), str):
                node_url = urllib.parse.urlsplit(p["open_url"])
                p["open_url"] = origin + node_url.path + (f"?{node_url.query}" if node_url.query else "")
        return json.dumps(got).encode()

    async def _ports(self, req: _Request) -> None:
        """A request to the router's ports listener: ``Host`` names the port and the sandbox
        (``{port}-{sandbox}.{ports_domain}``); it goes to the node's ports listener, which
        checks the port's access (its cookie, its ``open_url`` key, or a bearer token: the
        fleet's, which becomes the node's) as it does without a router."""
        host = req.head.get("host") or ""
        target = _port_target(host, self.ports_domain)
        if target is None:
            await req.drain_body()
            where = f"{{port}}-{{sandbox}}.{self.ports_domain}:{self.ports_address[1] if self.ports_address else ''}"
            await req.send(*_lockbox_error(404, "NOT_FOUND", f"host {host!r} names no port: each exposed port is "
                                           f"served at {where}", host=host))
            return
        port, sid = target
        auth = req.head.get("authorization")
        fleet = auth is not None and self._authorized(req.head, False)
        if auth is not None and not fleet:
            req.keep = False
            await req.send(*_lockbox_error(401, "UNAUTHORIZED", "the bearer token is wrong: send the fleet's token, "
                                           "or open the port's open_url"))
            return
        # Without the fleet's token, an id the router does not know is not looked up on
        # every node (as for E2B's sandbox plane).
        view = await self._node_of(sid, "sandboxes", ask=fleet)
        if view is None:
            await req.drain_body()
            await req.send(*_lockbox_error(404, "SANDBOX_NOT_FOUND", f"no fleet node has sandbox {sid}", id=sid))
            return
        buried = self.gone.get(sid)
        why = buried[1] if buried else view.lost_reason()
        if why is not None or not view.ports_port:
            await req.drain_body()
            if why is None:
                await req.send(*_lockbox_error(404, "NOT_FOUND", f"sandbox {sid}'s node {view.node_id[:12]} serves "
                                               "no ports on their own origins (lockbox serve --ports-listen off)",
                                               id=sid, node=view.node_id))
            elif buried or view.state != "up":
                await req.send(*_lockbox_error(410, "SANDBOX_LOST", f"sandbox {sid} was on node {view.node_id[:12]}: "
                                               f"{why}", id=sid, node=view.node_id, reason=why))
            else:
                await req.send(*_lockbox_error(503, "NODE_UNREACHABLE", f"sandbox {sid} is on node "
                                               f"{view.node_id[:12]}: {why}", id=sid, node=view.node_id, reason=why))
            return
        req.head.put("Host", f"{port}-{sid}.{view.ports_domain}:{view.ports_port}")
        await self._forward(req, view, upstream_auth=fleet, ports=True)

    async def _to_any(self, req: _Request, *, upstream_auth: bool = True) -> None:
        view = self._any_node()
        if view is None:
            await req.drain_body()
            await req.send(*_lockbox_error(503, "NO_NODE", "no fleet node is up"))
            return
        await self._forward(req, view, upstream_auth=upstream_auth)

    def _any_node(self) -> NodeView | None:
        up = sorted((v for v in self.nodes.values() if v.routable), key=lambda v: v.node_id)
        return up[0] if up else None

    # -- forwarding -------------------------------------------------------------------------

    async def _forward(self, req: _Request, view: NodeView, *, upstream_auth: bool = True, body: bytes | None = None,
                       on_reply: Callable[[int, bytes], Awaitable[bytes | None]] | None = None,
                       unreachable: Callable[[str], Awaitable[None]] | None = None,
                       on_head: Callable[[Head], Awaitable[None]] | None = None, ports: bool = False) -> bool:
        """Sends the request to ``view`` and streams its reply back. ``body``: the request's
        body, already read (else a small one is read first, a larger one streamed from the
        client). ``on_reply``: the reply is read whole and given to it before it is sent on
        (for a 2xx), and what it returns, if anything, is sent in its place. ``ports``: to the
        node's ports listener rather than its API (never over a kept-alive connection).
        Returns ``False`` if the node could not be reached (``unreachable`` then
        answered the client, given the reason; by default a 503).

        A request whose body is in hand goes over a kept-alive connection to the node when
        one is idle (:data:`POOL_IDLE` seconds at most), and is sent again on a new one if
        that connection turns out closed before any reply byte (the node closed it while
        idle). Streamed bodies and upgrades get a connection of their own."""
        upgrade = "upgrade" in req.head.tokens("connection") and req.head.get("upgrade") is not None
        if (body is None and not upgrade and req.framing is not None and 0 <= req.framing <= SMALL_BODY
                and not req.expects_continue):
            try:
                body = await req.read_body(SMALL_BODY)
            except (HttpError, asyncio.IncompleteReadError):
                req.keep = False
                return True
        reusable = body is not None and not upgrade and not ports
        head = Head(req.head.line, list(req.head.headers))
        head.remove(*(_HOP - {"upgrade"} if upgrade else _HOP))
        if upstream_auth:
            head.remove("authorization", "x-api-key")
            head.put("Authorization", f"Bearer {view.token}")
        if body is not None:
            head.remove("transfer-encoding", "content-length", "expect")
            head.put("Content-Length", str(len(body)))
        head.put("Connection", "Upgrade" if upgrade else "keep-alive" if reusable else "close")
        encoded = head.encode() + (body or b"")
        sending: asyncio.Task[None] | None = None
        for attempt in (0, 1):
            conn = self._pooled(view) if reusable and attempt == 0 else None
            if conn is None:
                try:
                    conn = await self._open(view, ports=ports)
                except (OSError, TimeoutError) as e:
                    reason = _why(e)
                    if body is None:
                        req.keep = False
                    if unreachable is not None:
                        await unreachable(f"the node's server cannot be reached: {reason}")
                    else:
                        await req.send(*_lockbox_error(503, "NODE_UNREACHABLE", f"node {view.node_id[:12]}'s server "
                                                       f"cannot be reached: {reason}", node=view.node_id,
                                                       reason=reason))
                    return False
                fresh = True
            else:
                fresh = False
            up_reader, up_writer = conn
            view.calls.add(up_writer)
            try:
                up_writer.write(encoded)
                if body is None:
                    req.body_read = True
                    sending = asyncio.create_task(_copy_body(req.reader, up_writer, req.framing))
                await up_writer.drain()
                first = await _response_head(up_reader)
            except (OSError, asyncio.IncompleteReadError) as e:
                up_writer.close()
                view.calls.discard(up_writer)
                if not fresh:
                    continue  # a kept-alive connection the node had closed: once more, on a new one
                return await self._ended(req, view, e, unreachable, sending)
            except (HttpError, asyncio.LimitOverrunError) as e:
                up_writer.close()
                view.calls.discard(up_writer)
                return await self._ended(req, view, e, unreachable, sending)
            break
        else:  # pragma: no cover - the second attempt always uses a fresh connection
            return True
        keep_upstream = False
        try:
            reply, status = first
            while status != 101 and 100 <= status < 200:
                req.writer.write(reply.encode())  # 100 Continue and the like
                await req.writer.drain()
                reply, status = await _response_head(up_reader)
            if status == 101:
                req.keep = False
                req.answered = True
                req.writer.write(reply.encode())
                await req.writer.drain()
                await _pipe(req.reader, req.writer, up_reader, up_writer)
                return True
            if on_head is not None:
                await on_head(reply)
            req.answered = True
            framing = _framing(reply, request=False, method=req.method, status=status)
            node_keeps = "close" not in reply.tokens("connection")
            reply.remove(*_HOP)
            if framing is None:
                req.keep = False
            if on_reply is not None and 200 <= status < 300 and "event-stream" not in (reply.get("content-type") or ""):
                data = await _read_body(up_reader, framing)
                data = await on_reply(status, data) or data
                reply.remove("transfer-encoding", "content-length")
                reply.put("Content-Length", str(len(data)))
                if not req.keep:
                    reply.put("Connection", "close")
                req.writer.write(reply.encode() + data)
                await req.writer.drain()
            else:
                if not req.keep:
                    reply.put("Connection", "close")
                req.writer.write(reply.encode())
                await _copy_body(up_reader, req.writer, framing)
            if sending is not None:
                if not sending.done():
                    # The node answered before reading the whole body: the client's
                    # connection cannot be reused (where its next request starts is unknown).
                    sending.cancel()
                    req.keep = False
                else:
                    with contextlib.suppress(Exception):
                        sending.result()
            keep_upstream = reusable and node_keeps and framing is not None and not up_reader.at_eof()
            return True
        except (OSError, HttpError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            return await self._ended(req, view, e, unreachable, None)
        finally:
            if sending is not None and not sending.done():
                sending.cancel()
            view.calls.discard(up_writer)
            idle = self.pool.setdefault(view.node_id, [])
            if keep_upstream and len(idle) < POOL_MAX:
                idle.append((up_reader, up_writer, time.monotonic(), view.port))
            else:
                up_writer.close()

    def _pooled(self, view: NodeView) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """An idle kept-alive connection to ``view``'s server, if one is fresh enough."""
        idle = self.pool.get(view.node_id) or []
        now = time.monotonic()
        while idle:
            reader, writer, since, port = idle.pop()
            if now - since < POOL_IDLE and port == view.port and not reader.at_eof():
                return reader, writer
            writer.close()
        return None

    async def _ended(self, req: _Request, view: NodeView, e: BaseException,
                     unreachable: Callable[[str], Awaitable[None]] | None,
                     sending: asyncio.Task[None] | None) -> bool:
        """The node's server ended a call before answering it whole."""
        if sending is not None and not sending.done():
            sending.cancel()
        req.keep = False
        reason = f"the node's server ended the call: {_why(e)}"
        if not req.answered and unreachable is not None:
            await unreachable(reason)
        if not req.answered:
            await req.send(*_lockbox_error(503, "NODE_UNREACHABLE", f"node {view.node_id[:12]}: {reason}",
                                           node=view.node_id, reason=reason))
        return True

    # -- by id --------------------------------------------------------------------------------

    async def _node_of(self, sid: str, kind: str, *, ask: bool = True) -> NodeView | None:
        """The node that holds ``sid``: this router's cache, the store, else (with ``ask``)
        every node asked, and the answer recorded."""
        node = self.cache.get(sid)
        if node is None and self.store is not None:
            got = await self._kv(self.store.get, f"p/{sid}")
            node = got["node"] if got else None
            if got and got.get("gone"):
                self.gone[sid] = (got["node"], str(got["gone"]))
        if node is None and not ask:
            return None
        if node is None:
            probe = _BY_ID[kind] + urllib.parse.quote(sid, safe="")
            views = [v for v in self.nodes.values() if v.routable]

            async def asked(v: NodeView) -> NodeView | None:
                try:
                    status, _, _ = await self._call(v, "GET", probe, timeout=3.0)
                except (OSError, HttpError, TimeoutError, asyncio.IncompleteReadError):
                    return None
                return v if status == 200 else None

            found = [v for v in await asyncio.gather(*(asked(v) for v in views)) if v is not None]
            if not found:
                return None
            node = found[0].node_id
            if self.store is not None:
                await self._kv(self.store.record, node, *(([sid], []) if kind == "sandboxes" else ([], [sid])))
        self.cache[sid] = node
        return self.nodes.setdefault(node, NodeView(node, state="lost", reason="the fleet does not list it"))

    async def _by_id(self, req: _Request, sid: str, kind: str, *, flavour: str, upstream_auth: bool = True) -> None:
        # E2B's sandbox plane is not authenticated by the fleet's token (the node checks the
        # sandbox's own): it does not get to make the router ask every node.
        view = await self._node_of(sid, kind, ask=flavour != "e2b-plane")
        if view is None:
            await req.drain_body()
            if flavour == "e2b-plane":
                await req.send(502, {"code": 502, "message": f"The sandbox {sid} was not found"})
            elif flavour == "e2b":
                await req.send(404, {"code": 404, "message": f"{_ONE[kind]} \"{sid}\" was not found"})
            else:
                await req.send(*_lockbox_error(404, _NOT_FOUND[kind], f"no fleet node has {_ONE[kind]} {sid}", id=sid))
            return
        buried = self.gone.get(sid) if kind == "sandboxes" else None
        why = buried[1] if buried else view.lost_reason()

        async def refuse(reason: str) -> None:
            await req.drain_body()
            lost = buried is not None or view.state != "up"
            why = reason if buried else f"its node {view.node_id[:12]} is unavailable ({reason})"
            if flavour == "e2b-plane":
                await req.send(502, {"code": 502, "message": f"The sandbox {sid} was not found: {why}"})
            elif flavour == "e2b":
                await req.send(404 if lost else 503, {"code": 404 if lost else 503, "message":
                                                      f"{_ONE[kind]} \"{sid}\" was not found: {why}"})
            elif lost:
                await req.send(*_lockbox_error(410, {"sandboxes": "SANDBOX_LOST", "snapshots": "SNAPSHOT_LOST"}.get(
                                               kind, "NODE_LOST"),
                                               f"{_ONE[kind]} {sid} was on node {view.node_id[:12]}: {reason}",
                                               id=sid, node=view.node_id, reason=reason))
            else:
                await req.send(*_lockbox_error(503, "NODE_UNREACHABLE", f"{_ONE[kind]} {sid} is on node "
                                               f"{view.node_id[:12]}: {reason}", id=sid, node=view.node_id,
                                               reason=reason))

        deleting = req.method == "DELETE" and len(req.parts) in (2, 3) and kind == "sandboxes" and flavour != "e2b-plane"
        if why is not None and deleting and (buried is not None or view.state == "lost"):
            await self._delete_lost(req, sid, view, why, e2b=flavour == "e2b")
            return
        if why is not None:
            await refuse(why)
            return

        async def forgotten(status: int, data: bytes) -> None:
            if 200 <= status < 300 and kind == "sandboxes":
                view.now_deleted(sid)
            self.cache.pop(sid, None)
            if self.store is not None:
                await self._kv(self.store.forget, sid)

        parts = req.parts
        what = ("snapshot" if parts[-1] == "snapshots" and kind == "sandboxes" else "fork"
                if parts[-1] == "fork" else None) if flavour == "lockbox" and len(parts) == 4 else None
        if flavour == "e2b" and parts[2:] == ["snapshots"]:  # E2B's create_snapshot
            what = "e2b-snapshot"

        async def made(status: int, data: bytes) -> None:
            if status == 201 and what:
                await self._remember(_json_or_none(data), view, what)

        async def through_router(status: int, data: bytes) -> bytes | None:
            return self._ports_reply(sid, data)

        on_reply: Callable[[int, bytes], Awaitable[bytes | None]] | None = None
        if req.method == "DELETE" and len(parts) in (3, 2):  # /v1/sandboxes/ID, /sandboxes/ID
            on_reply = forgotten
        elif req.method == "POST" and what:
            on_reply = made
        elif (flavour == "lockbox" and kind == "sandboxes" and req.method in ("GET", "POST") and len(parts) == 4
              and parts[3] == "ports"):
            on_reply = through_router
        body: bytes | None = None
        on_head: Callable[[Head], Awaitable[None]] | None = None
        if flavour == "lockbox" and kind == "sandboxes" and req.method == "POST" and parts[3:] == ["restore"]:
            # A snapshot of another node is copied to the sandbox's first.
            body = await req.read_body_or_refuse()
            if body is None:
                return
            parsed = _json_or_none(body)
            snap = parsed.get("snapshot") if isinstance(parsed, dict) else None
            if isinstance(snap, str) and snap:
                copy = await self._snapshot_on(req, snap, view)
                if copy is None:
                    return
                on_head = _copy_header(copy)
        elif kind == "snapshots" and req.method == "DELETE" and len(parts) in (2, 3):
            # Its copies on other nodes first (a copy in use there is refused, 409); then
            # its own node: E2B's DELETE /templates/ID is forwarded (the node answers it in
            # E2B's terms), lockbox's made here.
            try:
                await self._delete_copies(sid, view)
            except _Refused as r:
                await req.drain_body()
                await req.send(r.status, {"code": r.status, "message": r.body.get("message", "")}
                               if flavour == "e2b" and isinstance(r.body, dict) else r.body)
                return
            if flavour == "lockbox":
                await self._delete_snapshot(req, sid, view)
                return
        await self._forward(req, view, upstream_auth=upstream_auth, on_reply=on_reply,
                            unreachable=refuse, body=body, on_head=on_head)

    async def _delete_lost(self, req: _Request, sid: str, view: NodeView, reason: str, *, e2b: bool) -> None:
        """``DELETE`` of a sandbox its node came back without, or of one on a lost node: the
        router forgets it (it is no longer listed ``lost``), and a node that answers is told
        to forget its own record of it too."""
        await req.drain_body()
        self.gone.pop(sid, None)
        self.cache.pop(sid, None)
        if self.store is not None:
            await self._kv(self.store.forget, sid)
        if view.routable:  # best effort: the node may list it lost itself
            with contextlib.suppress(OSError, HttpError, TimeoutError, asyncio.IncompleteReadError):
                await self._call(view, "DELETE", "/v1/sandboxes/" + urllib.parse.quote(sid, safe=""))
        if e2b:  # E2B's kill of a sandbox that was not running: the SDK's kill() says False
            await req.send(404, {"code": 404, "message": f"sandbox \"{sid}\" was not found: {reason}"})
        else:
            await req.send(200, {"id": sid, "state": "lost", "node": view.node_id, "reason": reason, "labels": {}})

    async def _remember(self, reply: Any, view: NodeView, what: str) -> None:
        sandboxes, snapshots = _made(what, reply)
        view.now_made(sandboxes)
        for i in sandboxes + snapshots:
            self.cache[i] = view.node_id
        if (sandboxes or snapshots) and self.store is not None:
            await self._kv(self.store.record, view.node_id, sandboxes, snapshots)

    async def _transaction(self, req: _Request) -> None:
        """``POST /v1/transactions``: on the node of its sandboxes (they must share one)."""
        body = await req.read_body_or_refuse()
        if body is None:
            return
        parsed = _json_or_none(body)
        ids = parsed.get("sandboxes") if isinstance(parsed, dict) else None
        views = [await self._node_of(i, "sandboxes") for i in ids] if isinstance(ids, list) and all(
            isinstance(i, str) for i in ids) else []
        nodes = {v.node_id for v in views if v is not None}
        if len(nodes) > 1:
            await req.send(*_lockbox_error(400, "INVALID_REQUEST", "sandboxes: a transaction's sandboxes must be on "
                                           "one node; these are on " + ", ".join(sorted(n[:12] for n in nodes)),
                                           field="sandboxes"))
            return
        view = next((v for v in views if v is not None), None) or self._any_node()
        if view is None:
            await req.send(*_lockbox_error(503, "NO_NODE", "no fleet node is up"))
            return
        await self._forward(req, view, body=body)

    async def _mcp(self, req: _Request) -> None:
        """``POST /mcp`` (stateless JSON-RPC, docs/mcp.md): a tool call naming a sandbox or a
        snapshot goes to its node, ``create_sandbox`` to a placed one (and is recorded),
        ``list_sandboxes`` and ``list_snapshots`` to every node (merged, each item with its
        node); anything else (``initialize``, ``tools/list``, ``ping``) to any node."""
        body = await req.read_body_or_refuse()
        if body is None:
            return
        msg = _json_or_none(body)
        params = msg.get("params") if isinstance(msg, dict) and msg.get("method") == "tools/call" else None
        name = params.get("name") if isinstance(params, dict) else None
        args = params.get("arguments") if isinstance(params, dict) else None
        args = args if isinstance(args, dict) else {}
        rpc_id = msg.get("id") if isinstance(msg, dict) else None

        async def tool_error(code: str, message: str, **details: Any) -> None:
            structured = {"code": code, "message": message, "details": details}
            await req.send(200, {"jsonrpc": "2.0", "id": rpc_id, "result": {
                "content": [{"type": "text", "text": f"{code}: {message}"}], "structuredContent": structured,
                "isError": True}})

        if name in ("list_sandboxes", "list_snapshots"):
            await self._mcp_list(req, body, rpc_id, "sandboxes" if name == "list_sandboxes" else "snapshots")
            return
        sid = args.get("sandbox_id") if isinstance(args.get("sandbox_id"), str) else None
        snap = args.get("snapshot_id") if isinstance(args.get("snapshot_id"), str) else None
        view: NodeView | None
        if sid or snap:
            kind, key = ("sandboxes", sid) if sid else ("snapshots", snap)
            assert key is not None
            view = await self._node_of(key, kind)
            if view is None:
                await tool_error(_NOT_FOUND[kind], f"no fleet node has {_ONE[kind]} {key}", id=key)
                return
            buried = self.gone.get(key) if kind == "sandboxes" else None
            why = buried[1] if buried else view.lost_reason()
            if why is not None:
                await tool_error("SANDBOX_LOST" if buried or view.state != "up" else "NODE_UNREACHABLE",
                                 f"{_ONE[kind]} {key} is on node {view.node_id[:12]}: {why}", id=key,
                                 node=view.node_id, reason=why)
                return
        else:
            up = [v for v in self.nodes.values() if v.routable]
            image = args.get("image") if name == "create_sandbox" and isinstance(args.get("image"), str) else None
            view = (place(up, image=image, rng=self.rng, holders=holding(up, image))
                    if name == "create_sandbox" else self._any_node())
            if view is None:
                await tool_error("NO_NODE", "no fleet node is up (or every one is full)")
                return
        chosen = view

        async def note(status: int, data: bytes) -> None:
            reply = _json_or_none(data)
            result = reply.get("result") if isinstance(reply, dict) else None
            if isinstance(result, dict) and not result.get("isError") and name in (
                    "create_sandbox", "snapshot", "fork"):
                await self._remember(result.get("structuredContent"), chosen,
                                     "create" if name == "create_sandbox" else str(name))
            elif name == "delete_sandbox" and sid and isinstance(result, dict) and not result.get("isError"):
                chosen.now_deleted(sid)
                self.cache.pop(sid, None)
                if self.store is not None:
                    await self._kv(self.store.forget, sid)

        if name == "create_sandbox":
            async with self._placing(chosen, args.get("image") if isinstance(args.get("image"), str) else None) as p:
                p.reached = await self._forward(req, chosen, body=body, on_reply=note)
        else:
            await self._forward(req, chosen, body=body, on_reply=note)

    async def _mcp_list(self, req: _Request, body: bytes, rpc_id: Any, key: str) -> None:
        views = sorted((v for v in self.nodes.values() if v.routable), key=lambda v: v.node_id)
        merged: list[Any] = []

        async def one(v: NodeView) -> tuple[NodeView, Any]:
            try:
                status, _, data = await self._call(v, "POST", "/mcp", body=body, headers=[
                    ("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")])
            except (OSError, HttpError, TimeoutError, asyncio.IncompleteReadError) as e:
                if not isinstance(e, TimeoutError):
                    v.mark_unreachable(_why(e))
                return v, None
            return v, _json_or_none(data) if status == 200 else None

        for v, reply in await asyncio.gather(*(one(v) for v in views)):
            result = reply.get("result") if isinstance(reply, dict) else None
            if isinstance(result, dict) and result.get("isError"):
                await req.send(200, reply)  # a bad argument: every node says the same
                return
            items = (result or {}).get("structuredContent", {}).get(key) if isinstance(result, dict) else None
            for item in items or []:
                if isinstance(item, dict):
                    item["node"] = v.node_id
                merged.append(item)
        structured = {key: merged}
        await req.send(200, {"jsonrpc": "2.0", "id": rpc_id, "result": {
            "content": [{"type": "text", "text": json.dumps(structured, indent=2)}],
            "structuredContent": structured, "isError": False}})

    # -- creates ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _placing(self, view: NodeView, image: str | None) -> AsyncIterator[_Placing]:
        """A create sent to ``view``: recorded in the store before it is sent (``c/UUID``,
        removed once the node answered and the new ids were recorded), and counted in the
        node's load meanwhile."""
        intent = f"c/{uuid.uuid4()}"
        if self.store is not None:
            await self._kv(self.store.put, intent, {"node": view.node_id, "at": time.time(), "image": image})
        view.inflight += 1
        view.recount()
        placing = _Placing()
        try:
            yield placing
        finally:
            view.inflight -= 1
            view.recount()
            if self.store is not None:
                await self._kv(self.store.delete, intent)

    async def _create(self, req: _Request, *, e2b: bool) -> None:
        body = await req.read_body_or_refuse()
        if body is None:
            return
        parsed = _json_or_none(body) if body.strip() else {}
        hint: dict[str, Any] = {}
        image: str | None = None
        if isinstance(parsed, dict):
            if not e2b and "placement" in parsed:
                hint = parsed.pop("placement") or {}
                problem = _bad_hint(hint)
                if problem:
                    await req.send(*_lockbox_error(400, "INVALID_REQUEST", problem[1], field=problem[0]))
                    return
                body = json.dumps(parsed).encode()
            image = parsed.get("templateID") if e2b else parsed.get("image")
            if not isinstance(image, str) or (e2b and image in _HOST_TEMPLATES):
                image = None
        snapshot = parsed.get("from_snapshot") if isinstance(parsed, dict) and not e2b else None
        if isinstance(snapshot, str) and snapshot:
            # A sandbox of a snapshot: on a node that has it, or one it is copied to.
            view = await self._snapshot_target(req, snapshot, hint, 1)
            if view is None:
                return
            copy = await self._snapshot_on(req, snapshot, view)
            if copy is None:
                return

            async def remembered(status: int, data: bytes, view: NodeView = view) -> None:
                await self._remember(_json_or_none(data), view, "create")

            async with self._placing(view, image) as placing:
                placing.reached = await self._forward(req, view, body=body, on_reply=remembered,
                                                      on_head=_copy_header(copy))
            return
        eligible = eligible_nodes(self.nodes.values(), hint)
        if not eligible:
            known = {v.node_id: v.lost_reason() or "up" for v in self.nodes.values()}
            msg = "no fleet node is up" if not hint else f"no up fleet node matches the placement {json.dumps(hint)}"
            if e2b:
                await req.send(503, {"code": 503, "message": msg})
            else:
                await req.send(*_lockbox_error(503, "NO_NODE", msg, placement=hint, nodes=known))
            return
        while eligible:
            view = place(eligible, image=image, rng=self.rng, holders=holding(eligible, image)) or min(
                eligible, key=lambda v: v.load / max(v.capacity, 1))
            async def recorded(status: int, data: bytes, view: NodeView = view) -> None:
                await self._remember(_json_or_none(data), view, "create")

            async def no_answer(reason: str) -> None:
                return None

            async with self._placing(view, image) as placing:
                placing.reached = await self._forward(req, view, body=body, on_reply=recorded,
                                                      unreachable=no_answer)
            if placing.reached:
                return
            eligible.remove(view)  # the next choice, among the others
        message = "no fleet node could be reached for the create"
        if e2b:
            await req.send(503, {"code": 503, "message": message})
        else:
            await req.send(*_lockbox_error(503, "NO_NODE", message))

    # -- snapshots on other nodes (issue 31 item 4) -------------------------------------------

    async def _fork_snapshot(self, req: _Request, sid: str) -> None:
        """``POST /v1/snapshots/{id}/fork``: on the snapshot's node, or (a ``placement``
        hint naming others, its node full or gone) on a node it is copied to first."""
        body = await req.read_body_or_refuse()
        if body is None:
            return
        parsed = _json_or_none(body) if body.strip() else {}
        hint: dict[str, Any] = {}
        if isinstance(parsed, dict) and "placement" in parsed:
            hint = parsed.pop("placement") or {}
            problem = _bad_hint(hint)
            if problem:
                await req.send(*_lockbox_error(400, "INVALID_REQUEST", problem[1], field=problem[0]))
                return
            body = json.dumps(parsed).encode()
        count = parsed.get("count", 1) if isinstance(parsed, dict) else 1
        count = count if isinstance(count, int) and count > 0 else 1
        view = await self._snapshot_target(req, sid, hint, count)
        if view is None:
            return
        copy = await self._snapshot_on(req, sid, view)
        if copy is None:
            return

        async def made(status: int, data: bytes, view: NodeView = view) -> None:
            if status == 201:
                await self._remember(_json_or_none(data), view, "fork")

        await self._forward(req, view, body=body, on_reply=made, on_head=_copy_header(copy))

    async def _holders(self, sid: str) -> list[str]:
        """The nodes known to have snapshot ``sid``: the node it was taken on (or first
        found on), then those it was copied to."""
        home = self.cache.get(sid)
        if home is None and self.store is not None:
            got = await self._kv(self.store.get, f"p/{sid}")
            home = got["node"] if got else None
        copies = set(self.copies.get(sid, ()))
        if self.store is not None:
            copies |= {k.rsplit("/", 1)[1] for k in await self._kv(self.store.keys, f"h/{sid}/")}
        return ([home] if home else []) + sorted(copies - {home})

    async def _snapshot_target(self, req: _Request, sid: str, hint: dict[str, Any], count: int) -> NodeView | None:
        """The node a sandbox of snapshot ``sid`` goes to: one the hint names (a holder of
        the snapshot first); without a hint, its own node while that one is up and has room,
        else an up holder with room, else a node it is copied to. ``None`` once the client
        was answered (404 unknown snapshot, 503 no node)."""
        if await self._node_of(sid, "snapshots") is None:
            await req.send(*_lockbox_error(404, "SNAPSHOT_NOT_FOUND", f"no fleet node has snapshot {sid}", id=sid))
            return None
        holders = await self._holders(sid)

        def room(v: NodeView) -> bool:
            return v.load + count <= v.capacity

        views = [self.nodes[h] for h in holders if h in self.nodes]
        if hint:
            eligible = eligible_nodes(self.nodes.values(), hint)
            if not eligible:
                await req.send(*_lockbox_error(503, "NO_NODE", f"no up fleet node matches the placement "
                                               f"{json.dumps(hint)}", placement=hint))
                return None
            have = [v for v in eligible if v.node_id in holders and room(v)]
            if have:
                return min(have, key=lambda v: v.load / max(v.capacity, 1))
            return place(eligible, rng=self.rng) or min(eligible, key=lambda v: v.load / max(v.capacity, 1))
        up = [v for v in views if v.routable and room(v)]
        if up:
            return up[0]
        others = [v for v in self.nodes.values() if v.routable and v.node_id not in holders]
        if any(v.routable for v in views) and others:  # its nodes are full: copy it to another
            return place(others, rng=self.rng) or min(others, key=lambda v: v.load / max(v.capacity, 1))
        if any(v.routable for v in views):  # full, and no other node: the node says so
            return next(v for v in views if v.routable)
        await self._snapshot_gone(req, sid, views)
        return None

    async def _snapshot_gone(self, req: _Request, sid: str, views: Sequence[NodeView]) -> None:
        """Answers that no node holding ``sid`` can be reached: 410 ``SNAPSHOT_LOST`` when
        every one is lost, else 503 ``NODE_UNREACHABLE``."""
        home = views[0] if views else None
        reasons = {v.node_id: v.lost_reason() or "up" for v in views}
        lost = all(v.state != "up" for v in views)
        where = f"node {home.node_id[:12]}" if home else "no node"
        copies = f" (and the {len(views) - 1} node(s) it was copied to)" if len(views) > 1 else ""
        reason = home.lost_reason() if home else None
        if lost:
            await req.send(*_lockbox_error(410, "SNAPSHOT_LOST", f"snapshot {sid} was on {where}{copies}, now lost: "
                                           f"{reason}; no node has a copy", id=sid,
                                           node=home.node_id if home else None, reason=reason, nodes=reasons))
        else:
            await req.send(*_lockbox_error(503, "NODE_UNREACHABLE", f"snapshot {sid} is on {where}{copies}, which "
                                           f"cannot be reached now: {reason}", id=sid,
                                           node=home.node_id if home else None, reason=reason, nodes=reasons))

    async def _snapshot_on(self, req: _Request, sid: str, target: NodeView) -> str | None:
        """Makes sure ``target`` has snapshot ``sid`` (and the snapshots it lies on):
        ``"home"`` (taken there), ``"cached"`` (copied there before), ``"copied"`` (now, from
        a node that has it: each snapshot's artifact streamed from that node's ``GET
        .../artifact`` into ``target``'s ``PUT .../artifact?digest=``, which checks it).
        ``None`` once the client was answered with why not."""
        if await self._node_of(sid, "snapshots") is None:
            await req.send(*_lockbox_error(404, "SNAPSHOT_NOT_FOUND", f"no fleet node has snapshot {sid}", id=sid))
            return None
        holders = await self._holders(sid)
        if holders and holders[0] == target.node_id:
            return "home"
        # One copy of a snapshot to a node at a time: a second fork waits, then finds it cached.
        key = (sid, target.node_id)
        lock = self._copying.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                return await self._copy_snapshot(sid, target, holders)
        except _Refused as r:
            await req.send(r.status, r.body)
            return None
        finally:
            if not lock.locked():
                self._copying.pop(key, None)

    async def _copy_snapshot(self, sid: str, target: NodeView, holders: Sequence[str]) -> str:
        status, _, _ = await self._snapshot_call(target, "GET", sid)
        if status == 200:
            await self._copied(sid, target)
            return "cached"
        sources = [self.nodes[h] for h in holders if h in self.nodes and self.nodes[h].routable]
        if not sources:
            views = [self.nodes[h] for h in holders if h in self.nodes]
            reasons = {v.node_id: v.lost_reason() or "up" for v in views}
            lost = bool(views) and all(v.state != "up" for v in views)
            home = views[0] if views else None
            raise _Refused(*_lockbox_error(
                410 if lost else 503, "SNAPSHOT_LOST" if lost else "NODE_UNREACHABLE",
                f"snapshot {sid} cannot be copied to node {target.node_id[:12]}: "
                + ("every node that had it is lost" if lost else "no node that has it can be reached now"),
                id=sid, node=home.node_id if home else None, reason=home.lost_reason() if home else None,
                nodes=reasons))
        source = sources[0]
        # The snapshots it lies on, nearest first, down to one the target has.
        chain = [sid]
        info = await self._snapshot_info(source, sid)
        parent = info.get("parent")
        while isinstance(parent, str) and parent and len(chain) <= 128:
            status, _, _ = await self._snapshot_call(target, "GET", parent)
            if status == 200:
                break
            chain.append(parent)
            parent = (await self._snapshot_info(source, parent)).get("parent")
        for one in reversed(chain):
            await self._stream_snapshot(one, source, target)
        await self._copied(sid, target)
        return "copied"

    async def _copied(self, sid: str, target: NodeView) -> None:
        self.copies.setdefault(sid, set()).add(target.node_id)
        if self.store is not None:
            await self._kv(self.store.put, f"h/{sid}/{target.node_id}", {"node": target.node_id, "at": time.time()})

    async def _snapshot_call(self, view: NodeView, method: str, sid: str) -> tuple[int, Head, bytes]:
        try:
            return await self._call(view, method, "/v1/snapshots/" + urllib.parse.quote(sid, safe=""))
        except (OSError, HttpError, TimeoutError, asyncio.IncompleteReadError) as e:
            raise _Refused(*_lockbox_error(503, "NODE_UNREACHABLE", f"node {view.node_id[:12]}'s server cannot be "
                                           f"reached: {_why(e)}", node=view.node_id, reason=_why(e))) from None

    async def _snapshot_info(self, view: NodeView, sid: str) -> dict[str, Any]:
        status, _, data = await self._snapshot_call(view, "GET", sid)
        got = _json_or_none(data)
        if status != 200 or not isinstance(got, dict):
            raise _Refused(status or 502, got if isinstance(got, dict) else {
                "code": "INTERNAL", "message": f"node {view.node_id[:12]}: a bad answer for snapshot {sid}",
                "details": {}})
        return got

    async def _stream_snapshot(self, sid: str, source: NodeView, target: NodeView) -> None:
        """Streams snapshot ``sid``'s artifact from ``source`` into ``target``, chunk by
        chunk (the router holds one chunk at a time): ``target`` checks it against the
        digest ``source`` named it by, and keeps nothing unless it matches."""
        path = "/v1/snapshots/" + urllib.parse.quote(sid, safe="") + "/artifact"

        def refused(node: NodeView, e: BaseException) -> _Refused:
            return _Refused(*_lockbox_error(503, "NODE_UNREACHABLE", f"copying snapshot {sid} from node "
                                            f"{source.node_id[:12]} to node {target.node_id[:12]}: node "
                                            f"{node.node_id[:12]}: {_why(e)}", id=sid, node=node.node_id,
                                            reason=_why(e)))

        try:
            src_r, src_w = await self._open(source)
        except (OSError, TimeoutError) as e:
            raise refused(source, e) from None
        source.calls.add(src_w)
        dst_w: asyncio.StreamWriter | None = None
        try:
            try:
                src_w.write(Head(f"GET {path} HTTP/1.1", [
                    ("Host", f"{source.host}:{source.port}"), ("Authorization", f"Bearer {source.token}"),
                    ("Connection", "close")]).encode())
                await src_w.drain()
                head, status = await _response_head(src_r)
                framing = _framing(head, request=False, status=status)
                if status != 200:
                    data = await _read_body(src_r, framing)
                    raise _Refused(status, _json_or_none(data) or {"code": "INTERNAL", "message": f"node "
                                   f"{source.node_id[:12]} answered {status} for {path}", "details": {}})
            except (OSError, HttpError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
                raise refused(source, e) from None
            digest = head.get("docker-content-digest") or ""
            try:
                dst_r, dst_w = await self._open(target)
            except (OSError, TimeoutError) as e:
                raise refused(target, e) from None
            target.calls.add(dst_w)
            length = [("Content-Length", str(framing))] if framing is not None and framing >= 0 else [
                ("Transfer-Encoding", "chunked")]
            dst_w.write(Head(f"PUT {path}?digest={urllib.parse.quote(digest, safe=':')} HTTP/1.1", [
                ("Host", f"{target.host}:{target.port}"), ("Authorization", f"Bearer {target.token}"),
                ("Content-Type", "application/vnd.oci.image.layout.v1+tar"), *length,
                ("Connection", "close")]).encode())

            async def send_body() -> None:
                assert dst_w is not None
                if framing is None:  # until the source closes: sent on in chunks
                    while data := await src_r.read(CHUNK):
                        dst_w.write(b"%x\r\n%s\r\n" % (len(data), data))
                        await dst_w.drain()
                    dst_w.write(b"0\r\n\r\n")
                else:
                    await _copy_body(src_r, dst_w, framing)
                await dst_w.drain()

            async def read_answer() -> tuple[int, bytes]:
                reply, got = await _response_head(dst_r)
                return got, await _read_body(dst_r, _framing(reply, request=False, method="PUT", status=got))

            # The target's answer is read while the body goes: a target that refuses the
            # artifact early (its manifest's digest, a missing parent) answers before it has
            # read it all, and closes.
            sending, answering = asyncio.create_task(send_body()), asyncio.create_task(read_answer())
            try:
                await asyncio.wait({sending, answering}, return_when=asyncio.FIRST_COMPLETED)
                if sending.done() and not answering.done():
                    cut = sending.exception()
                    if isinstance(cut, (HttpError, asyncio.IncompleteReadError)):
                        # The source's stream was cut: the target gets no end of body, and
                        # refuses it.
                        dst_w.close()
                        raise refused(source, cut)
                try:
                    got, data = await answering
                except (OSError, HttpError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
                    raise refused(target, e) from None
            finally:
                for t in (sending, answering):
                    if not t.done():
                        t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await sending
            if got not in (200, 201):
                answer = _json_or_none(data)
                if isinstance(answer, dict) and isinstance(answer.get("message"), str):
                    answer["message"] = (f"copying snapshot {sid} from node {source.node_id[:12]} to node "
                                         f"{target.node_id[:12]}: {answer['message']}")
                    details = answer.get("details")
                    answer["details"] = {**(details if isinstance(details, dict) else {}),
                                         "from": source.node_id, "to": target.node_id}
                raise _Refused(got, answer if isinstance(answer, dict) else {
                    "code": "INTERNAL", "message": f"node {target.node_id[:12]} answered {got}", "details": {}})
        finally:
            source.calls.discard(src_w)
            src_w.close()
            if dst_w is not None:
                target.calls.discard(dst_w)
                dst_w.close()

    async def _delete_copies(self, sid: str, home: NodeView) -> None:
        """Deletes snapshot ``sid`` on every up node it was copied to (not ``home``, its
        own); ``_Refused`` with a node's refusal (a copy in use there: 409), the rest kept."""
        holders = await self._holders(sid)
        for view in [self.nodes[h] for h in holders[1:] if h in self.nodes and self.nodes[h].routable]:
            await self._delete_on(view, sid)
            self.copies.get(sid, set()).discard(view.node_id)
            if self.store is not None:
                await self._kv(self.store.delete, f"h/{sid}/{view.node_id}")

    async def _delete_on(self, view: NodeView, sid: str) -> None:
        """``DELETE /v1/snapshots/{sid}`` on ``view`` (gone already is fine); ``_Refused``
        with its refusal, naming the node."""
        status, _, data = await self._snapshot_call(view, "DELETE", sid)
        if status not in (204, 404):
            answer = _json_or_none(data)
            if isinstance(answer, dict) and isinstance(answer.get("details"), dict):
                answer["details"]["node"] = view.node_id
            raise _Refused(status, answer if isinstance(answer, dict) else {
                "code": "INTERNAL", "message": f"node {view.node_id[:12]} answered {status}", "details": {}})

    async def _delete_snapshot(self, req: _Request, sid: str, home: NodeView) -> None:
        """``DELETE /v1/snapshots/{id}`` on its own node, once its copies are gone
        (:meth:`_delete_copies`)."""
        await req.drain_body()
        try:
            await self._delete_on(home, sid)
        except _Refused as r:
            await req.send(r.status, r.body)
            return
        self.cache.pop(sid, None)
        if self.store is not None:
            await self._kv(self.store.forget, sid)
        await req.send(204, b"")

    # -- listings ---------------------------------------------------------------------------

    async def _e2b_page(self, req: _Request, listing: E2bListing) -> None:
        """``GET /v2/sandboxes`` or ``GET /snapshots``, one page of every node's listing:
        each node is asked for a page from its position in the request's ``nextToken`` (the
        router's own :class:`Cursor`), the pages are merged (:func:`merge_pages`: by start
        time, or node after node), and the reply's ``x-next-token`` says where each node's
        listing goes on (:meth:`_e2b_page_once`)."""
        await req.drain_body()
        split = urllib.parse.urlsplit(req.target)
        query = urllib.parse.parse_qs(split.query)

        async def bad(message: str) -> None:
            await req.send(400, {"code": 400, "message": message})

        text = query.get("limit", [""])[0]
        if text and not (text.isdigit() and 1 <= int(text) <= E2B_PAGE):
            await bad(f"limit: a number from 1 to {E2B_PAGE}, got {text!r}")
            return
        # A listing not by start time has one order: each node's, node after node.
        order = (query.get("order", [""])[0] or "desc") if listing.by_start_time else "asc"
        if order not in ("asc", "desc"):
            await bad(f"order: \"asc\" or \"desc\", got {order!r}")
            return
        token = query.get("nextToken", [""])[0]
        try:
            cursor = (Cursor.decode(token, order, listing.path) if token
                      else Cursor(order, listing=listing.path))
        except ValueError as e:
            await bad(f"nextToken: {e}")
            return
        # The request's filters as the client encoded them, without its paging.
        kept = [p for p in split.query.split("&") if p and p.split("=", 1)[0] not in ("limit", "nextToken")]
        for _ in range(PAGE_ATTEMPTS):
            made = await self._e2b_page_once(listing, cursor, kept, int(text) if text else E2B_PAGE)
            if isinstance(made, tuple):
                await req.send(*made)
                return
            if made is not None:
                for node, item in made.items:
                    if isinstance(item, dict):
                        item["node"] = node
                await req.send(200, [item for _, item in made.items],
                               headers=[("X-Next-Token", made.after.encode())] if made.more else [])
                return
        await req.send(503, {"code": 503, "message": "the fleet's listing kept changing while this page was made: "
                             "ask again"})

    async def _e2b_page_once(self, listing: E2bListing, cursor: Cursor, kept: list[str],
                             limit: int) -> _Page | tuple[int, Any] | None:
        """One try at a page of E2B's ``listing`` from ``cursor``: a :class:`_Page`;
        ``(status, body)`` for a node's refusal (a bad filter: every node says the same);
        ``None`` if a node's listing changed while the page was made (try again).

        A node's position is its own ``x-next-token`` (a key of its listing, so a sandbox
        made or deleted between pages neither repeats nor hides another): where the page
        ends within a node's page, the node is asked once more for exactly the part taken,
        and its ``x-next-token`` then names the last item taken. Of a node nothing was taken
        from yet, what sorts before the last item listed is left out (made after the walk
        began, as one server leaves it out; a listing not by start time has no such
        boundary: what a node adds goes at the end of its own listing)."""
        ascending = cursor.order == "asc"
        views = sorted((v for v in self.nodes.values()
                        if v.routable and cursor.nodes.get(v.node_id, "") is not None), key=lambda v: v.node_id)

        async def one(v: NodeView, count: int) -> tuple[int, bytes, list[Any], str | None]:
            at = cursor.nodes.get(v.node_id) or ""
            params = [*kept, f"limit={count}"] + ([f"nextToken={urllib.parse.quote(at, safe='')}"] if at else [])
            try:
                status, head, data = await self._call(v, "GET", f"{listing.path}?" + "&".join(params),
                                                      headers=[("Accept", "application/json")])
            except (OSError, HttpError, TimeoutError, asyncio.IncompleteReadError) as e:
                if not isinstance(e, TimeoutError):
                    v.mark_unreachable(_why(e))
                return 0, b"", [], None  # left out of this page; its position stays
            items = _json_or_none(data) if status == 200 else None
            return status, data, items if isinstance(items, list) else [], head.get("x-next-token") or None

        def listed_already(node: str, item: Any) -> bool:
            if cursor.boundary is None or cursor.nodes.get(node):
                return False
            key = listing.key(item)
            return key >= cursor.boundary if not ascending else key <= cursor.boundary

        answers = dict(zip((v.node_id for v in views), await asyncio.gather(*(one(v, limit) for v in views)),
                           strict=True))
        for status, data, _, _ in answers.values():
            if status not in (0, 200):
                return status, _json_or_none(data) or {"code": status, "message": "bad node reply"}
        asked = {n: a[2] for n, a in answers.items() if a[0] == 200}
        fresh = {n: [i for i, item in enumerate(items) if not listed_already(n, item)] for n, items in asked.items()}
        page, taken = merge_pages({n: [asked[n][i] for i in idx] for n, idx in fresh.items()}, limit,
                                  ascending=ascending, key=listing.key if listing.by_start_time else _no_key)
        boundary = (listing.key(page[-1][1]) if page else cursor.boundary) if listing.by_start_time else None
        after = Cursor(cursor.order, {**cursor.nodes, **{n: cursor.nodes.get(n, "") for n in asked}}, boundary,
                       listing.path)
        for node, items in asked.items():
            j = taken[node]
            if not j:
                if not fresh[node]:  # all of its page was listed already: past it
                    after.nodes[node] = answers[node][3]
                continue  # else nothing taken: its position stays
            upto = fresh[node][j - 1] + 1  # the prefix of the node's page now listed
            if upto == len(items):
                after.nodes[node] = answers[node][3]  # None: nothing more on this node
                continue
            status, _, again, key = await one(self.nodes[node], upto)
            if status != 200 or key is None or len(again) != upto or listing.key(again[-1]) != listing.key(
                    items[upto - 1]):
                return None
            after.nodes[node] = key
        return _Page(page, after, any(after.nodes.get(n) is not None for n in asked))

    async def _list(self, req: _Request, *, e2b: bool) -> None:
        if e2b and req.path == SANDBOX_LISTING.path:
            await self._e2b_page(req, SANDBOX_LISTING)
            return
        views = sorted((v for v in self.nodes.values() if v.routable), key=lambda v: v.node_id)
        auth = [("Accept", "application/json")]

        async def one(v: NodeView) -> tuple[NodeView, int, bytes, str | None]:
            try:
                status, _, data = await self._call(v, "GET", req.target, headers=auth)
                return v, status, data, None
            except (OSError, HttpError, TimeoutError, asyncio.IncompleteReadError) as e:
                if not isinstance(e, TimeoutError):
                    v.mark_unreachable(_why(e))
                return v, 0, b"", _why(e)

        answers = await asyncio.gather(*(one(v) for v in views))
        key: str | None = None
        first: dict[str, Any] = {}
        merged: list[Any] = []
        for v, status, data, _err in answers:
            if status == 0:
                continue
            if status != 200:
                await req.send(status, _json_or_none(data) or {"code": "INTERNAL", "message": "bad node reply"})
                return
            got = _json_or_none(data)
            items = got if isinstance(got, list) else None
            if isinstance(got, dict):
                first = first or got
                key = next((k for k, val in got.items() if isinstance(val, list)), None)
                items = got[key] if key else None
            for item in items or []:
                if isinstance(item, dict):
                    item["node"] = v.node_id
                merged.append(item)
        down = [v for v in self.nodes.values() if v.lost_reason() is not None]
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(req.target).query)
        if req.path == "/v1/sandboxes" and self.store is not None and query.get("state", ["lost"])[0] == "lost":
            for v in down:
                for k in await self._kv(self.store.keys, f"n/{v.node_id}/"):
                    sid = k.split("/", 2)[2]
                    merged.append({"id": sid, "state": "lost", "node": v.node_id, "reason": v.lost_reason(),
                                   "labels": {}})
            # Those a node came back without: lost, with why (the node may list them lost
            # itself, its earlier server's; the router's reason says more).
            listed = {i["id"]: i for i in merged if isinstance(i, dict) and isinstance(i.get("id"), str)}
            for sid, (node, reason) in (await self._buried()).items():
                if sid in listed:
                    listed[sid].update(state="lost", reason=reason)
                else:
                    merged.append({"id": sid, "state": "lost", "node": node, "reason": reason, "labels": {}})
        if e2b:
            merged.sort(key=lambda s: s.get("startedAt", "") if isinstance(s, dict) else "",
                        reverse=query.get("order", ["desc"])[0] != "asc")
            limit = query.get("limit", [""])[0]
            if limit.isdigit():
                merged = merged[: int(limit)]
            await req.send(200, merged)
            return
        nodes = [{"node_id": v.node_id, "state": "up" if v.lost_reason() is None else v.state,
                  "reason": v.lost_reason()} for v in sorted(self.nodes.values(), key=lambda v: v.node_id)]
        await req.send(200, {**first, key or req.parts[-1]: merged, "nodes": nodes})


def _cookies(head: Head) -> dict[str, str]:
    jar: dict[str, str] = {}
    for k, v in head.headers:
        if k.lower() == "cookie":
            for part in v.split(";"):
                name, sep, value = part.strip().partition("=")
                if sep:
                    jar.setdefault(name, value)
    return jar


def _drop_cookies(head: Head, names: Sequence[str]) -> None:
    kept = [f"{k}={v}" for k, v in _cookies(head).items() if k not in names]
    head.remove("cookie")
    if kept:
        head.put("Cookie", "; ".join(kept))


def _is_snapshot_id(text: str) -> bool:
    """Whether ``text`` can be a snapshot's id (1-64 of ``[A-Za-z0-9._-]``, not starting with
    ``.``: lockbox-cow's ``check_id``); an E2B template's name with a tag or a namespace
    cannot."""
    return 0 < len(text) <= 64 and not text.startswith(".") and text.isascii() and all(
        c.isalnum() or c in "._-" for c in text)


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


def _bad_hint(hint: Any) -> tuple[str, str] | None:
    if not isinstance(hint, dict):
        return "placement", "placement: an object {\"node\", \"labels\"}"
    for k in hint:
        if k not in ("node", "labels"):
            return f"placement.{k}", f"placement.{k}: unknown field (node, labels)"
    if "node" in hint and not isinstance(hint["node"], str):
        return "placement.node", "placement.node: a node id (or its first characters)"
    labels = hint.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        return "placement.labels", "placement.labels: an object of strings"
    return None


def eligible_nodes(nodes: Iterable[NodeView], hint: dict[str, Any]) -> list[NodeView]:
    """The nodes a create may be placed on: the routable ones, and of those the ones the
    placement ``hint`` (``node``, ``labels``) names, if any."""
    if not hint:
        return [v for v in nodes if v.routable]
    return [v for v in nodes if v.routable and _matches(v, hint)]


def holding(nodes: Sequence[NodeView], image: str | None) -> list[NodeView]:
    """The nodes of ``nodes`` that already hold ``image`` (none without one)."""
    return [v for v in nodes if image in v.images] if image else []


def _matches(view: NodeView, hint: dict[str, Any]) -> bool:
    node = hint.get("node")
    if node and not view.node_id.startswith(node):
        return False
    return all(view.labels.get(k) == v for k, v in (hint.get("labels") or {}).items())


def _port_target(host: str, domain: str) -> tuple[int, str] | None:
    """The port and sandbox a ``Host`` of the router's ports listener names
    (``{port}-{sandbox}.{domain}[:PORT]``), as ``lockbox serve``'s ports listener reads it."""
    name, sep, tail = host.rpartition(":")
    name = (name if sep and tail.isdigit() else host).lower()
    label, dot, rest = name.partition(".")
    port, dash, sid = label.partition("-")
    if not dot or rest != domain or not dash or not sid or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    return int(port), sid


def _why(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "no answer in time"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


async def _response_head(reader: asyncio.StreamReader) -> tuple[Head, int]:
    head = Head.parse(await reader.readuntil(b"\r\n\r\n"))
    try:
        return head, int(head.line.split(" ", 2)[1])
    except (IndexError, ValueError):
        raise HttpError(f"bad status line {head.line[:60]!r}") from None


async def _pipe(cr: asyncio.StreamReader, cw: asyncio.StreamWriter, ur: asyncio.StreamReader,
                uw: asyncio.StreamWriter) -> None:
    """Bytes both ways until either side closes (an upgraded connection)."""
    async def one(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(CHUNK):
                w.write(data)
                await w.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                w.close()

    tasks = [asyncio.create_task(one(cr, uw)), asyncio.create_task(one(ur, cw))]
    _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()


@dataclass
class _Placing:
    reached: bool = False


@dataclass
class _Page:
    """A page of E2B's listing through the router: its ``(node, item)`` pairs, where the walk
    goes on, and whether any node has more."""

    items: list[tuple[str, Any]]
    after: Cursor
    more: bool


COPY_HEADER = "Lockbox-Snapshot-Copy"
"""Set on the answer to a fork, create or restore of a snapshot through the router: ``home``
(the snapshot's own node), ``cached`` (a copy made there before) or ``copied`` (now)."""


def _copy_header(copy: str) -> Callable[[Head], Awaitable[None]]:
    async def put(head: Head) -> None:
        head.put(COPY_HEADER, copy)
    return put


class _Refused(Exception):
    """An answer for the client (a node's refusal, or why no node can do it)."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(status)
        self.status, self.body = status, body


class _Request:
    """One request of a client connection: its head, and the connection to read its body
    from and answer on."""

    def __init__(self, method: str, target: str, head: Head, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.method, self.target, self.head = method, target, head
        self.path = urllib.parse.urlsplit(target).path or "/"
        self.parts = [p for p in self.path.split("/") if p]
        self.reader, self.writer = reader, writer
        self.framing = _framing(head, request=True)
        self.keep = True
        self.answered = False
        self.body_read = False

    @property
    def expects_continue(self) -> bool:
        return "100-continue" in self.head.tokens("expect")

    async def drain_body(self) -> None:
        """Reads (and drops) the request's body, so the connection can take the next one;
        a client waiting for ``100 Continue`` is not asked for it (the connection closes
        after the answer instead)."""
        if self.body_read:
            return
        self.body_read = True
        if self.expects_continue and self.framing != 0:
            self.keep = False
            return
        try:
            await _read_body(self.reader, self.framing, limit=BODY_LIMIT)
        except (HttpError, asyncio.IncompleteReadError):
            self.keep = False

    async def read_body(self, limit: int = BODY_LIMIT) -> bytes:
        """The request's whole body (``HttpError`` beyond ``limit``), after telling a client
        that waits for it to go on."""
        self.body_read = True
        if self.expects_continue and self.framing != 0:
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await self.writer.drain()
        return await _read_body(self.reader, self.framing, limit)

    async def read_body_or_refuse(self, limit: int = BODY_LIMIT) -> bytes | None:
        """:meth:`read_body`, or ``None`` once a body beyond ``limit`` has been answered with
        413 (the connection then closes: the rest of the body is unread)."""
        try:
            return await self.read_body(limit)
        except HttpError as e:
            self.keep = False
            await self.send(*_lockbox_error(413, "PAYLOAD_TOO_LARGE", str(e)))
            return None

    async def send(self, status: int, body: Any, *, headers: Sequence[tuple[str, str]] = ()) -> None:
        self.answered = True
        self.writer.write(_reply(status, body, close=not self.keep, headers=headers))
        await self.writer.drain()
