"""Calls on one sandbox, snapshot, branch, transaction or run, routed to the node that holds
it: refused at once (503, or 410 once its node is lost or came back without it) when that
node cannot take them, recorded or forgotten as they make or delete things; a transaction on
the node of its sandboxes."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import Awaitable, Callable

from .forwarding import NOT_FOUND, ONE
from .image_copies import ImageCopies
from .placement import NodeView
from .ports import ExposedPorts
from .snapshot_copies import Refused, copy_header
from .wire import Head, HttpError, Request, json_or_none, lockbox_error


class ById(ImageCopies, ExposedPorts):
    """Routes calls by the id they name."""

    async def _signed_url_sandbox(self, req: Request) -> str | None:
        """The sandbox a signed file URL without routing headers is for: made for
        ``E2B_SANDBOX_URL``, it names none, and the node whose sandbox's access token signed
        it says which (``GET /lockbox/signed-url-sandbox``; the node checks the signature
        again, with its expiry and path, when it gets the URL itself). Every node is asked at
        once, by at most ``forwarding.SIGNED_LOOKUPS`` lookups at a time."""
        probe = "/lockbox/signed-url-sandbox?" + urllib.parse.urlencode({"method": req.method, "url": req.target})

        async def asked(v: NodeView) -> tuple[str, NodeView] | None:
            try:
                status, _, body = await self._call(v, "GET", probe, timeout=3.0)
            except (OSError, HttpError, TimeoutError, asyncio.IncompleteReadError):
                return None
            reply = json_or_none(body) if status == 200 else None
            sid = reply.get("sandboxID") if isinstance(reply, dict) else None
            return (sid, v) if isinstance(sid, str) else None

        async with self.signed_lookups:
            found = [f for f in await asyncio.gather(*(asked(v) for v in self.nodes.values() if v.routable)) if f]
        if not found:
            return None
        sid, view = found[0]
        self.cache[sid] = view.node_id
        return sid

    async def _by_id(self, req: Request, sid: str, kind: str, *, flavour: str, upstream_auth: bool = True,
                     ask: bool = True) -> None:
        # E2B's sandbox plane is not authenticated by the fleet's token (the node checks the
        # sandbox's own): it does not get to make the router ask every node (nor, with
        # ``ask`` false, does a template's upload URL).
        view = await self._node_of(sid, kind, ask=ask and flavour != "e2b-plane")
        if view is None:
            await req.drain_body()
            if flavour == "e2b-plane":
                await req.send(502, {"code": 502, "message": f"The sandbox {sid} was not found"})
            elif flavour == "e2b":
                await req.send(404, {"code": 404, "message": f"{ONE[kind]} \"{sid}\" was not found"})
            else:
                await req.send(*lockbox_error(404, NOT_FOUND[kind], f"no fleet node has {ONE[kind]} {sid}", id=sid))
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
                                                      f"{ONE[kind]} \"{sid}\" was not found: {why}"})
            elif lost:
                await req.send(*lockbox_error(410, {"sandboxes": "SANDBOX_LOST", "snapshots": "SNAPSHOT_LOST"}.get(
                                               kind, "NODE_LOST"),
                                               f"{ONE[kind]} {sid} was on node {view.node_id[:12]}: {reason}",
                                               id=sid, node=view.node_id, reason=reason))
            else:
                await req.send(*lockbox_error(503, "NODE_UNREACHABLE", f"{ONE[kind]} {sid} is on node "
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
                await self._remember(json_or_none(data), view, what)

        async def committed(status: int, data: bytes) -> None:
            got = json_or_none(data)
            refs = got.get("references") if isinstance(got, dict) else None
            if status == 201 and isinstance(refs, list):
                await self._made_images(view.node_id, [r for r in refs if isinstance(r, str)])

        async def through_router(status: int, data: bytes) -> bytes | None:
            return self._ports_reply(sid, data)

        on_reply: Callable[[int, bytes], Awaitable[bytes | None]] | None = None
        if req.method == "DELETE" and len(parts) in (3, 2) and kind != "templates":  # /v1/sandboxes/ID, /sandboxes/ID
            on_reply = forgotten
        elif req.method == "POST" and what:
            on_reply = made
        elif flavour == "lockbox" and kind == "sandboxes" and req.method == "POST" and parts[3:] == ["commit-image"]:
            on_reply = committed
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
            parsed = json_or_none(body)
            snap = parsed.get("snapshot") if isinstance(parsed, dict) else None
            if isinstance(snap, str) and snap:
                copy = await self._snapshot_on(req, snap, view)
                if copy is None:
                    return
                on_head = copy_header(copy)
        elif kind == "snapshots" and req.method == "DELETE" and len(parts) in (2, 3):
            # Its copies on other nodes first (a copy in use there is refused, 409); then
            # its own node: E2B's DELETE /templates/ID is forwarded (the node answers it in
            # E2B's terms), lockbox's made here.
            try:
                await self._delete_copies(sid, view)
            except Refused as r:
                await req.drain_body()
                await req.send(r.status, {"code": r.status, "message": r.body.get("message", "")}
                               if flavour == "e2b" and isinstance(r.body, dict) else r.body)
                return
            if flavour == "lockbox":
                await self._delete_snapshot(req, sid, view)
                return
        await self._forward(req, view, upstream_auth=upstream_auth, on_reply=on_reply,
                            unreachable=refuse, body=body, on_head=on_head)

    async def _delete_lost(self, req: Request, sid: str, view: NodeView, reason: str, *, e2b: bool) -> None:
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

    async def _transaction(self, req: Request) -> None:
        """``POST /v1/transactions``: on the node of its sandboxes (they must share one)."""
        body = await req.read_body_or_refuse()
        if body is None:
            return
        parsed = json_or_none(body)
        ids = parsed.get("sandboxes") if isinstance(parsed, dict) else None
        views = [await self._node_of(i, "sandboxes") for i in ids] if isinstance(ids, list) and all(
            isinstance(i, str) for i in ids) else []
        nodes = {v.node_id for v in views if v is not None}
        if len(nodes) > 1:
            await req.send(*lockbox_error(400, "INVALID_REQUEST", "sandboxes: a transaction's sandboxes must be on "
                                           "one node; these are on " + ", ".join(sorted(n[:12] for n in nodes)),
                                           field="sandboxes"))
            return
        view = next((v for v in views if v is not None), None) or self._any_node()
        if view is None:
            await req.send(*lockbox_error(503, "NO_NODE", "no fleet node is up"))
            return
        await self._forward(req, view, body=body)
