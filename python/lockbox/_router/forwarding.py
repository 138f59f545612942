"""A router's state, and how it reaches one node: a client's request forwarded and its reply
streamed back (over kept-alive connections when its body is small), the router's own buffered
calls, and the node that holds an id (this router's cache, the store, else every node asked).
Every other part of the router (``lockbox._router.*``) is a mixin of :class:`ForwardingRouter`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import random
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .placement import NodeView, bad_hint
from .store import Store, StoreUnavailable, made_ids
from .wire import (
    HEAD_LIMIT,
    HOP_HEADERS,
    Head,
    HttpError,
    Request,
    body_framing,
    copy_body,
    describe_error,
    json_or_none,
    lockbox_error,
    pipe_both_ways,
    read_body,
    read_response_head,
)

CONNECT_TIMEOUT = 3.0
CALL_TIMEOUT = 5.0
SIGNED_LOOKUPS = 8
"""Signed file URLs looked up at once (each asks every node, and comes without the fleet's
token)."""
SMALL_BODY = 64 * 1024
"""A request body up to this size is read before it is forwarded (so the call can use a
kept-alive connection to the node, and be sent again should that one have closed)."""
POOL_MAX = 64
"""Idle connections kept per node at most."""
POOL_IDLE = 4.0
"""Idle connections to a node are reused for this long (``lockbox serve`` closes them after
``--connection-idle-timeout``, 120 s by default: the router closes first)."""
# The kinds of ids a call may name (a path's collection): where a node answers for one, the
# error code of an unknown one, and its name in messages.
BY_ID = {"sandboxes": "/v1/sandboxes/", "snapshots": "/v1/snapshots/", "branches": "/v1/branches/",
         "transactions": "/v1/transactions/", "runs": "/v1/journal/runs/", "templates": "/templates/aliases/"}
NOT_FOUND = {"sandboxes": "SANDBOX_NOT_FOUND", "snapshots": "SNAPSHOT_NOT_FOUND", "branches": "BRANCH_NOT_FOUND",
             "transactions": "TXN_NOT_FOUND", "runs": "RUN_NOT_FOUND"}
ONE = {"sandboxes": "sandbox", "snapshots": "snapshot", "branches": "branch", "transactions": "transaction",
       "runs": "run", "templates": "template"}


def dns_name(name: str, what: str) -> str:
    """``name`` lowercased, if it is a DNS name; ``ValueError`` naming ``what`` if not."""
    if not all(label and label.replace("-", "").isalnum() and label.isascii() for label in name.split(".")):
        raise ValueError(f"{what}: {name!r} is not a DNS name (letters, digits and '-', labels separated by dots)")
    return name.lower()


@functools.cache
def _dropped(upgrade: bool, upstream_auth: bool, body: bool) -> frozenset[str]:
    """The client's headers a forwarded request leaves out: its connection's own (but
    ``Upgrade`` on an upgrade), the credentials the node's token replaces, and the framing of
    a body the router read (sent with a length of its own)."""
    drop = set(HOP_HEADERS - {"upgrade"} if upgrade else HOP_HEADERS)
    if upstream_auth:
        drop |= {"authorization", "x-api-key"}
    if body:
        drop |= {"transfer-encoding", "content-length", "expect"}
    return frozenset(drop)


class ForwardingRouter:
    """The state every part of the router shares, and its calls to one node."""

    def __init__(self, nodes: Callable[[], list[dict[str, Any]]], token: str, store: Store | None, *,
                 ports_domain: str = "localhost", e2b_domain: str | None = None) -> None:
        self._list_nodes = nodes
        self.ports_domain = dns_name(ports_domain, "ports_domain")
        # As lockbox serve --e2b-domain: trimmed of spaces and dots, lowercased; empty is none.
        e2b_domain = (e2b_domain or "").strip().strip(".")
        self.e2b_domain = dns_name(e2b_domain, "e2b_domain") if e2b_domain else None
        """E2B's sandbox host form, ``{port}-{sandboxID}.{e2b_domain}`` (``E2B_DOMAIN``
        without ``E2B_SANDBOX_URL``); ``None``: E2B's sandbox plane is routed by the SDK's
        ``E2b-Sandbox-Id`` header only."""
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
        self.scoped: dict[str, dict[str, Any]] = {}
        """Scoped tokens minted through this router or looked up in the store (the hash of
        the router's secret -> ``{"id", "node", "secret"}``); the store's ``t/HASH``."""
        self.pool: dict[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float, int]]] = {}
        self.rng = random.Random()
        self.holders: dict[str, list[NodeView]] = {}
        """Image -> the nodes whose probes listed a sandbox of it (placement's affinity)."""
        self._listed: list[NodeView] = []
        self.template_misses: dict[str, float] = {}
        """Names no node knew as a template, with when they were asked about (``templates``)."""
        self.image_copies: dict[str, set[str]] = {}
        """``tc:TEMPLATE`` or ``ic:REFERENCE`` -> the nodes this router copied it to (``image_copies``)."""
        self.image_homes: dict[str, str] = {}
        """Image reference -> the node a sandbox committed it on, or whose store had it from
        outside a registry (``image_copies``)."""
        self.not_held: dict[str, float] = {}
        """Image references no node's store had from outside a registry -> until when
        (``time.monotonic``) that answer stands (``image_copies``)."""
        self.server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._nodes_ready = asyncio.Event()
        self._probed = asyncio.Event()
        self.gone: dict[str, tuple[str, str]] = {}
        """Sandboxes a node came back without (id -> node, reason), as far as this router
        knows; the store's ``g/NODE/ID`` are the fleet's."""
        self.signed_lookups = asyncio.Semaphore(SIGNED_LOOKUPS)
        """Signed file URLs being looked up at once (``ById._signed_url_sandbox``): they come
        without the fleet's token, and each asks every node."""

    async def _body_and_hint(self, req: Request, *, hints: bool = True,
                             ) -> tuple[bytes, Any, dict[str, Any]] | None:
        """A create-like request's body read whole, its JSON (``{}`` when empty, ``None`` when
        not JSON) and, with ``hints``, its ``placement`` hint taken out (the body then goes on
        without it); ``None`` once a body too large or a bad hint has been answered."""
        body = await req.read_body_or_refuse()
        if body is None:
            return None
        parsed = json_or_none(body) if body.strip() else {}
        hint: dict[str, Any] = {}
        if hints and isinstance(parsed, dict) and "placement" in parsed:
            hint = parsed.pop("placement") or {}
            problem = bad_hint(hint)
            if problem:
                await req.send(*lockbox_error(400, "INVALID_REQUEST", problem[1], field=problem[0]))
                return None
            body = json.dumps(parsed).encode()
        return body, parsed, hint

    def _node_list(self) -> list[NodeView]:
        """Every node the router knows, as a list (made again only when one is added: the
        router forgets none)."""
        if len(self._listed) != len(self.nodes):
            self._listed = list(self.nodes.values())
        return self._listed

    async def _kv(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A call to the placement store, in a thread; whatever it fails with is
        :class:`StoreUnavailable` (answered 503 ``STORE_UNAVAILABLE``)."""
        try:
            return await asyncio.to_thread(fn, *args)
        except StoreUnavailable:
            raise
        except Exception as e:
            raise StoreUnavailable(f"the placement store: {type(e).__name__}: {e}") from e

    async def _record(self, node: str, sandboxes: list[str], snapshots: list[str]) -> None:
        """Ids a node made, recorded once it answered: a store that does not answer then does
        not turn the node's answer into an error (this router keeps them in its cache, and
        another finds them by asking every node)."""
        try:
            await self._kv(self.store.record, node, sandboxes, snapshots)  # type: ignore[union-attr]
        except StoreUnavailable as e:
            print(f"lockbox fleet router: not recorded ({', '.join(sandboxes + snapshots)} on node {node[:12]}): {e}",
                  flush=True)

    def _authorized(self, head: Head, e2b: bool) -> bool:
        auth = head.get("authorization") or ""
        given = auth[7:] if auth.startswith("Bearer ") else None
        if e2b and given is None:
            given = head.get("x-api-key")
        return given is not None and hmac.compare_digest(given.encode(), self.token)

    async def _open(self, view: NodeView, *, ports: bool = False) -> tuple[asyncio.StreamReader,
                                                                            asyncio.StreamWriter]:
        """A connection to the node's API (or, with ``ports``, its ports listener)."""
        host, port = (view.ports_host, view.ports_port) if ports else (view.host, view.port)
        try:
            return await asyncio.wait_for(asyncio.open_connection(host, port, limit=HEAD_LIMIT), CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as e:
            if not ports:  # the API down is the node down; its ports listener alone is not
                view.mark_unreachable(describe_error(e))
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
                head, status = await read_response_head(reader)
                return status, head, await read_body(reader, body_framing(head, request=False, method=method,
                                                                      status=status))
            finally:
                writer.close()
        return await asyncio.wait_for(go(), timeout)

    async def _forward(self, req: Request, view: NodeView, *, upstream_auth: bool = True, body: bytes | None = None,
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
        # The client's headers less those of its connection (and the credentials and framing
        # the router replaces), in one pass; then the router's own.
        drop = _dropped(upgrade, upstream_auth, body is not None)
        head = Head(req.head.line, [(k, v) for k, v in req.head.headers if k.lower() not in drop])
        if upstream_auth:
            head.headers.append(("Authorization", f"Bearer {view.token}"))
        if body is not None:
            head.headers.append(("Content-Length", str(len(body))))
        head.headers.append(("Connection", "Upgrade" if upgrade else "keep-alive" if reusable else "close"))
        encoded = head.encode() + (body or b"")
        sending: asyncio.Task[None] | None = None
        for attempt in (0, 1):
            conn = self._pooled(view) if reusable and attempt == 0 else None
            if conn is None:
                try:
                    conn = await self._open(view, ports=ports)
                except (OSError, TimeoutError) as e:
                    reason = describe_error(e)
                    if body is None:
                        req.keep = False
                    if unreachable is not None:
                        await unreachable(f"the node's server cannot be reached: {reason}")
                    else:
                        await req.send(*lockbox_error(503, "NODE_UNREACHABLE", f"node {view.node_id[:12]}'s server "
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
                    sending = asyncio.create_task(copy_body(req.reader, up_writer, req.framing))
                await up_writer.drain()
                first = await read_response_head(up_reader)
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
                reply, status = await read_response_head(up_reader)
            if status == 101:
                req.keep = False
                req.answered = True
                req.writer.write(reply.encode())
                await req.writer.drain()
                await pipe_both_ways(req.reader, req.writer, up_reader, up_writer)
                return True
            if on_head is not None:
                await on_head(reply)
            req.answered = True
            framing = body_framing(reply, request=False, method=req.method, status=status)
            node_keeps = "close" not in reply.tokens("connection")
            reply.remove(*HOP_HEADERS)
            if framing is None:
                req.keep = False
            if on_reply is not None and 200 <= status < 300 and "event-stream" not in (reply.get("content-type") or ""):
                data = await read_body(up_reader, framing)
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
                if framing is not None and 0 <= framing <= SMALL_BODY:
                    # A small reply leaves in one write, head and body together: one send and
                    # one wake-up of the client rather than two (docs/benchmarks.md).
                    encoded_reply = reply.encode()
                    try:
                        data = await up_reader.readexactly(framing)
                    except asyncio.IncompleteReadError as e:
                        req.writer.write(encoded_reply + e.partial)  # as much as streaming it would have passed on
                        raise
                    req.writer.write(encoded_reply + data)
                    await req.writer.drain()
                else:
                    req.writer.write(reply.encode())
                    await copy_body(up_reader, req.writer, framing)
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

    async def _ended(self, req: Request, view: NodeView, e: BaseException,
                     unreachable: Callable[[str], Awaitable[None]] | None,
                     sending: asyncio.Task[None] | None) -> bool:
        """The node's server ended a call before answering it whole."""
        if sending is not None and not sending.done():
            sending.cancel()
        req.keep = False
        reason = f"the node's server ended the call: {describe_error(e)}"
        if not req.answered and unreachable is not None:
            await unreachable(reason)
        if not req.answered:
            await req.send(*lockbox_error(503, "NODE_UNREACHABLE", f"node {view.node_id[:12]}: {reason}",
                                           node=view.node_id, reason=reason))
        return True

    async def _to_any(self, req: Request, *, upstream_auth: bool = True) -> None:
        view = self._any_node()
        if view is None:
            await req.drain_body()
            await req.send(*lockbox_error(503, "NO_NODE", "no fleet node is up"))
            return
        await self._forward(req, view, upstream_auth=upstream_auth)

    def _any_node(self) -> NodeView | None:
        up = sorted((v for v in self.nodes.values() if v.routable), key=lambda v: v.node_id)
        return up[0] if up else None

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
            probe = BY_ID[kind] + urllib.parse.quote(sid, safe="")
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
                await self._record(node, *(([sid], []) if kind == "sandboxes" else ([], [sid])))
        self.cache[sid] = node
        # Not setdefault: its default, a NodeView, would be built on every call.
        view = self.nodes.get(node)
        if view is None:
            view = self.nodes[node] = NodeView(node, state="lost", reason="the fleet does not list it")
        return view

    async def _remember(self, reply: Any, view: NodeView, what: str) -> None:
        sandboxes, snapshots = made_ids(what, reply)
        view.now_made(sandboxes)
        for i in sandboxes + snapshots:
            self.cache[i] = view.node_id
        if (sandboxes or snapshots) and self.store is not None:
            await self._record(view.node_id, sandboxes, snapshots)

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
