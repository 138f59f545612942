"""The fleet's router as one object: :class:`Router` listens, reads each client's requests
and sends each where it goes (:meth:`Router._handle`, the table of routes); the parts it
combines each own one concept (see ``lockbox._router``)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import urllib.parse
from collections.abc import Awaitable, Callable

from .by_id import ById
from .console import ConsoleLogin, drop_cookies
from .creates import HOST_TEMPLATES
from .forwarding import BY_ID
from .listings import MERGED_LISTS, SNAPSHOT_LISTING, Listings
from .mcp import McpCalls
from .node_watch import NodeWatch
from .snapshot_copies import is_snapshot_id
from .store import StoreUnavailable
from .templates import template_id
from .tokens import ScopedTokens
from .wire import HEAD_LIMIT, HEADER_TIMEOUT, Head, HttpError, Request, encode_reply, lockbox_error


class Router(Listings, NodeWatch, ById, McpCalls, ConsoleLogin, ScopedTokens):
    """Serves lockbox's HTTP API (and E2B's) for every node of a fleet.

    ``nodes`` is called (in a thread) every :data:`NODES_INTERVAL` seconds and returns the
    fleet's listing (``lockbox.fleet.Fleet.nodes``); ``token`` is the fleet's token clients
    must send; ``store`` keeps the placements (``None``: in memory only, for tests of the
    proxy alone)."""

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

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                      handle: Callable[[Request], Awaitable[None]]) -> None:
        try:
            while True:
                try:
                    # asyncio.timeout, not wait_for: on 3.11 wait_for runs the read in a task of
                    # its own, two more turns of the event loop on every request (docs/benchmarks.md).
                    async with asyncio.timeout(HEADER_TIMEOUT):
                        raw = await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:
                    writer.write(encode_reply(431, {"code": "INVALID_REQUEST", "message": "request head over 64 KiB",
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
                    req = Request(method, target, head, reader, writer)
                except (HttpError, ValueError) as e:
                    writer.write(encode_reply(400, {"code": "INVALID_REQUEST", "message": f"bad request head: {e}",
                                              "details": {}}, close=True))
                    await writer.drain()
                    return
                req.keep = version == "HTTP/1.1" and "close" not in head.tokens("connection")
                try:
                    await handle(req)
                except StoreUnavailable as e:
                    # Nothing was sent to a node on a placement the store could not keep.
                    print(f"lockbox fleet router: {req.method} {req.path}: {e}", flush=True)
                    if not req.answered:
                        req.keep = False
                        await req.send(*lockbox_error(503, "STORE_UNAVAILABLE", str(e)))
                    return
                if not req.keep or (not req.body_read and req.framing != 0):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, HttpError, asyncio.LimitOverrunError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _handle(self, req: Request) -> None:
        path = req.path
        plane = e2b_host_target(req.head.get("host") or "", self.e2b_domain) if (
            self.e2b_domain and req.head.get("e2b-sandbox-id") is None) else None
        if plane is not None:
            # E2B's host form names the sandbox and port: the node is told in the SDK's
            # headers (it needs no --e2b-domain of its own).
            req.head.put("E2b-Sandbox-Id", plane[1])
            req.head.put("E2b-Sandbox-Port", str(plane[0]))
        if req.head.get("e2b-sandbox-id") is None and plane is None and req.path == "/files" and \
                req.method in ("GET", "POST") and "signature" in urllib.parse.parse_qs(
                    urllib.parse.urlsplit(req.target).query):
            # A signed file URL made for E2B_SANDBOX_URL names no sandbox: its signature does.
            sid = await self._signed_url_sandbox(req)
            if sid is None:
                await req.drain_body()
                await req.send(401, {"code": 401, "message": "invalid signature: no sandbox of the fleet "
                                                             "signed this file URL"})
                return
            req.head.put("E2b-Sandbox-Id", sid)
            req.head.put("E2b-Sandbox-Port", "49983")
        if req.head.get("e2b-sandbox-id") is not None:  # E2B's sandbox plane: the sandbox's own token
            sid = (req.head.get("e2b-sandbox-id") or "").strip()
            await self._by_id(req, sid, "sandboxes", flavour="e2b-plane", upstream_auth=False)
            return
        if req.method == "PUT" and len(req.parts) == 5 and req.parts[0] == "templates" and req.parts[2] == "files":
            # The E2B SDK's upload of a template's files, to the one-time URL the template's
            # node gave (no API key: that node checks the URL's token).
            await self._by_id(req, template_id(urllib.parse.unquote(req.parts[1])), "templates", flavour="e2b",
                              upstream_auth=False, ask=False)
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
            # A scoped token the routers minted: everything to its node (not E2B's API,
            # which takes no scoped token on one server either).
            scoped = None if e2b else await self._scoped_entry(req.head)
            if scoped is not None:
                await self._as_scoped(req, scoped)
                return
            # The console's cookie opens lockbox's /v1 API only (as on one server).
            cookie = not e2b and not req.head.get("authorization") and path.startswith("/v1/")
            got = await self._session(req.head) if cookie else None
            refusal = self._cookie_refusal(req, got[1]) if got else None
            if got and refusal:
                req.keep = False
                await req.send(*lockbox_error(403, "FORBIDDEN", f"console session: {refusal}"))
                return
            if got is None:
                req.keep = False  # its body is not read
                if e2b:
                    await req.send(401, {"code": 401, "message": "Invalid API key: send the fleet's token as "
                                         "X-API-Key (E2B_API_KEY)"})
                else:
                    await req.send(*lockbox_error(401, "UNAUTHORIZED", "missing or wrong bearer token: send the "
                                                   "fleet's token (lockbox.fleet.Fleet.token)"))
                return
            # The console's cookie stands for the fleet's token: nodes get their own token.
            req.head.remove("x-csrf-token")
            drop_cookies(req.head, ("lockbox_session", "lockbox_csrf"))
        parts = req.parts
        if req.method == "POST" and path in ("/v1/sandboxes", "/sandboxes", "/v2/sandboxes"):
            await self._create(req, e2b=e2b)
        elif req.method == "POST" and len(parts) == 4 and parts[:2] == ["v1", "snapshots"] and parts[3] == "fork":
            await self._fork_snapshot(req, urllib.parse.unquote(parts[2]))
        elif req.method == "GET" and path in MERGED_LISTS:
            await self._list(req, e2b=e2b)
        elif req.method == "GET" and path == SNAPSHOT_LISTING.path:
            await self._e2b_page(req, SNAPSHOT_LISTING)
        elif req.method == "DELETE" and len(parts) == 2 and parts[0] == "templates" and is_snapshot_id(
                urllib.parse.unquote(parts[1])):
            # E2B's Sandbox.delete_snapshot: a snapshot goes to its node (an image template
            # would be refused there: 501, as below).
            await self._by_id(req, urllib.parse.unquote(parts[1]), "snapshots", flavour="e2b")
        elif parts[:1] == ["v1"] and len(parts) >= 3 and parts[1] in BY_ID:
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
        elif req.method == "POST" and path == "/v1/tokens":
            await self._mint(req)
        elif req.method == "DELETE" and len(parts) == 3 and parts[:2] == ["v1", "tokens"]:
            await self._revoke(req, urllib.parse.unquote(parts[2]))
        elif req.method == "DELETE" and len(parts) == 2 and parts[0] == "templates":
            await self._to_any(req)  # a template that is no snapshot: every node answers 501 alike
        elif req.method == "POST" and path == "/v3/templates":
            await self._request_build(req)
        elif req.method == "POST" and len(parts) == 5 and parts[:2] == ["v2", "templates"] and parts[3] == "builds":
            await self._start_build(req, template_id(urllib.parse.unquote(parts[2])))
        elif len(parts) == 3 and parts[:2] == ["templates", "aliases"] and template_id(
                urllib.parse.unquote(parts[2])) in HOST_TEMPLATES:
            await self._to_any(req)  # every node has them
        elif len(parts) == 3 and parts[:2] == ["templates", "aliases"]:
            await self._by_id(req, template_id(urllib.parse.unquote(parts[2])), "templates", flavour="e2b")
        elif (parts[:1] == ["templates"] and len(parts) >= 2) or (parts[:2] == ["v2", "templates"] and len(parts) >= 3):
            # A template's files, build, status and tags: on the node that builds it.
            tid = urllib.parse.unquote(parts[1] if parts[0] == "templates" else parts[2])
            await self._by_id(req, template_id(tid), "templates", flavour="e2b")
        else:  # the API's description and the like: the same on every node
            await self._to_any(req)


def e2b_host_target(host: str, domain: str) -> tuple[int, str] | None:
    """The port and E2B sandbox a ``Host`` of E2B's form ``{port}-{sandboxID}.{domain}[:PORT]``
    names, read as ``lockbox serve --e2b-domain`` reads it (crates/lockbox-e2b, ``target_of``):
    a trailing ``:digits`` dropped, then ``.{domain}`` (exactly) and the label before it split
    at its first ``-`` into a port (0-65535) and the sandbox (the rest). ``None``: not that
    form (the request is then an API request, as on one server)."""
    name, sep, tail = host.rpartition(":")
    if sep and all(c in "0123456789" for c in tail):
        host = name
    if not host.endswith("." + domain):
        return None
    port, dash, sandbox = host[: -len(domain) - 1].partition("-")
    if not dash or not re.fullmatch(r"\+?[0-9]+", port) or int(port) > 65535:
        return None
    return int(port), sandbox
