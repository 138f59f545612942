"""Snapshots on other nodes (issue 31 item 4): a fork, create or restore of a snapshot on a
node that lacks it first copies it there (its OCI artifact streamed from a node that has it
into the target, which checks it against its digest, parents first), and a snapshot is
deleted on every node that has it, its copies first."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .forwarding import ForwardingRouter
from .placement import NodeView, eligible_nodes, place
from .wire import (
    CHUNK,
    Head,
    HttpError,
    Request,
    body_framing,
    copy_body,
    describe_error,
    json_or_none,
    lockbox_error,
    read_body,
    read_response_head,
)


class Refused(Exception):
    """An answer for the client (a node's refusal, or why no node can do it)."""

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(status)
        self.status, self.body = status, body



COPY_HEADER = "Lockbox-Snapshot-Copy"
"""Set on the answer to a fork, create or restore of a snapshot through the router: ``home``
(the snapshot's own node), ``cached`` (a copy made there before) or ``copied`` (now)."""


SCOPE_HEADER = "Lockbox-Snapshot-Scope"
"""Sent with ``PUT .../artifact`` when a copy is made for an MCP ``fork`` or ``restore``:
``mcp`` puts it in the target's MCP scope (docs/fleet.md, "MCP's fork and restore")."""


def copy_header(copy: str) -> Callable[[Head], Awaitable[None]]:
    async def put(head: Head) -> None:
        head.put(COPY_HEADER, copy)
    return put


def is_snapshot_id(text: str) -> bool:
    """Whether ``text`` can be a snapshot's id (1-64 of ``[A-Za-z0-9._-]``, not starting with
    ``.``: lockbox-cow's ``check_id``); an E2B template's name with a tag or a namespace
    cannot."""
    return 0 < len(text) <= 64 and not text.startswith(".") and text.isascii() and all(
        c.isalnum() or c in "._-" for c in text)



class SnapshotCopies(ForwardingRouter):
    """Forks, copies and deletes snapshots across the nodes."""

    async def _fork_snapshot(self, req: Request, sid: str) -> None:
        """``POST /v1/snapshots/{id}/fork``: on the snapshot's node, or (a ``placement``
        hint naming others, its node full or gone) on a node it is copied to first."""
        read = await self._body_and_hint(req)
        if read is None:
            return
        body, parsed, hint = read
        count = parsed.get("count", 1) if isinstance(parsed, dict) else 1
        count = count if isinstance(count, int) and count > 0 else 1
        placed = await self._place_from_snapshot(req, sid, hint, count)
        if placed is None:
            return
        view, copy = placed

        async def made(status: int, data: bytes, view: NodeView = view) -> None:
            if status == 201:
                await self._remember(json_or_none(data), view, "fork")

        await self._forward(req, view, body=body, on_reply=made, on_head=copy_header(copy))

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

    async def _place_from_snapshot(self, req: Request, sid: str, hint: dict[str, Any],
                                   count: int) -> tuple[NodeView, str] | None:
        """The node ``count`` sandboxes of snapshot ``sid`` go to (:meth:`_snapshot_target`),
        with the snapshot there (:meth:`_snapshot_on`): the node and how it got the snapshot.
        ``None`` once the client has been answered."""
        view = await self._snapshot_target(req, sid, hint, count)
        if view is None:
            return None
        copy = await self._snapshot_on(req, sid, view)
        if copy is None:
            return None
        return view, copy

    async def _snapshot_target(self, req: Request, sid: str, hint: dict[str, Any], count: int) -> NodeView | None:
        """The node a sandbox of snapshot ``sid`` goes to: one the hint names (a holder of
        the snapshot first); without a hint, its own node while that one is up and has room,
        else an up holder with room, else a node it is copied to. ``None`` once the client
        was answered (404 unknown snapshot, 503 no node)."""
        if await self._node_of(sid, "snapshots") is None:
            await req.send(*lockbox_error(404, "SNAPSHOT_NOT_FOUND", f"no fleet node has snapshot {sid}", id=sid))
            return None
        holders = await self._holders(sid)

        def room(v: NodeView) -> bool:
            return v.load + count <= v.capacity

        views = [self.nodes[h] for h in holders if h in self.nodes]
        if hint:
            eligible = eligible_nodes(self.nodes.values(), hint)
            if not eligible:
                await req.send(*lockbox_error(503, "NO_NODE", f"no up fleet node matches the placement "
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

    async def _snapshot_gone(self, req: Request, sid: str, views: Sequence[NodeView]) -> None:
        """Answers that no node holding ``sid`` can be reached: 410 ``SNAPSHOT_LOST`` when
        every one is lost, else 503 ``NODE_UNREACHABLE``."""
        home = views[0] if views else None
        reasons = {v.node_id: v.lost_reason() or "up" for v in views}
        lost = all(v.state != "up" for v in views)
        where = f"node {home.node_id[:12]}" if home else "no node"
        copies = f" (and the {len(views) - 1} node(s) it was copied to)" if len(views) > 1 else ""
        reason = home.lost_reason() if home else None
        if lost:
            await req.send(*lockbox_error(410, "SNAPSHOT_LOST", f"snapshot {sid} was on {where}{copies}, now lost: "
                                           f"{reason}; no node has a copy", id=sid,
                                           node=home.node_id if home else None, reason=reason, nodes=reasons))
        else:
            await req.send(*lockbox_error(503, "NODE_UNREACHABLE", f"snapshot {sid} is on {where}{copies}, which "
                                           f"cannot be reached now: {reason}", id=sid,
                                           node=home.node_id if home else None, reason=reason, nodes=reasons))

    async def _snapshot_on(self, req: Request, sid: str, target: NodeView, *, scope: str | None = None,
                           sources: Sequence[str] | None = None) -> str | None:
        """Makes sure ``target`` has snapshot ``sid`` (and the snapshots it lies on):
        ``"home"`` (taken there), ``"cached"`` (copied there before), ``"copied"`` (now, from
        a node that has it: each snapshot's artifact streamed from that node's ``GET
        .../artifact`` into ``target``'s ``PUT .../artifact?digest=``, which checks it).
        ``scope`` (``"mcp"``): ``sid`` is put in that scope of ``target`` too, even where it
        is (sent with ``Lockbox-Snapshot-Scope``, which a node that has it takes without
        reading the artifact); ``sources``: the only nodes to copy from (else every node
        that has it). ``None`` once the client was answered with why not."""
        if await self._node_of(sid, "snapshots") is None:
            await req.send(*lockbox_error(404, "SNAPSHOT_NOT_FOUND", f"no fleet node has snapshot {sid}", id=sid))
            return None
        holders = await self._holders(sid)
        if holders and holders[0] == target.node_id and scope is None:
            return "home"
        # One copy of a snapshot to a node at a time: a second fork waits, then finds it cached.
        key = (sid, target.node_id)
        lock = self._copying.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                copy = await self._copy_snapshot(sid, target, holders if sources is None else sources, scope)
                return "home" if holders and holders[0] == target.node_id else copy
        except Refused as r:
            await req.send(r.status, r.body)
            return None
        finally:
            if not lock.locked():
                self._copying.pop(key, None)

    async def _copy_snapshot(self, sid: str, target: NodeView, holders: Sequence[str],
                             scope: str | None = None) -> str:
        status, _, _ = await self._snapshot_call(target, "GET", sid)
        if status == 200 and scope is None:
            await self._copied(sid, target)
            return "cached"
        sources = [self.nodes[h] for h in holders if h in self.nodes and self.nodes[h].routable]
        if not sources:
            views = [self.nodes[h] for h in holders if h in self.nodes]
            reasons = {v.node_id: v.lost_reason() or "up" for v in views}
            lost = bool(views) and all(v.state != "up" for v in views)
            home = views[0] if views else None
            raise Refused(*lockbox_error(
                410 if lost else 503, "SNAPSHOT_LOST" if lost else "NODE_UNREACHABLE",
                f"snapshot {sid} cannot be copied to node {target.node_id[:12]}: "
                + ("every node that had it is lost" if lost else "no node that has it can be reached now"),
                id=sid, node=home.node_id if home else None, reason=home.lost_reason() if home else None,
                nodes=reasons))
        source = sources[0]
        if status == 200:  # there already: only the scope is asked for (nothing is read)
            await self._stream_snapshot(sid, source, target, scope=scope)
            await self._copied(sid, target)
            return "cached"
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
            await self._stream_snapshot(one, source, target, scope=scope if one == sid else None)
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
            raise Refused(*lockbox_error(503, "NODE_UNREACHABLE", f"node {view.node_id[:12]}'s server cannot be "
                                           f"reached: {describe_error(e)}", node=view.node_id, reason=describe_error(e))) from None

    async def _snapshot_info(self, view: NodeView, sid: str) -> dict[str, Any]:
        status, _, data = await self._snapshot_call(view, "GET", sid)
        got = json_or_none(data)
        if status != 200 or not isinstance(got, dict):
            raise Refused(status or 502, got if isinstance(got, dict) else {
                "code": "INTERNAL", "message": f"node {view.node_id[:12]}: a bad answer for snapshot {sid}",
                "details": {}})
        return got

    async def _stream_snapshot(self, sid: str, source: NodeView, target: NodeView, *,
                               scope: str | None = None) -> None:
        """Streams snapshot ``sid``'s artifact from ``source`` into ``target``
        (:meth:`_stream_artifact`). ``scope``: sent as ``Lockbox-Snapshot-Scope``."""
        path = "/v1/snapshots/" + urllib.parse.quote(sid, safe="") + "/artifact"
        await self._stream_artifact(f"snapshot {sid}", source, target, path, path,
                                    content_type="application/vnd.oci.image.layout.v1+tar",
                                    headers=[(SCOPE_HEADER, scope)] if scope else [])

    async def _stream_artifact(self, what: str, source: NodeView, target: NodeView, get_path: str, put_path: str,
                               *, content_type: str, headers: Sequence[tuple[str, str]] = (),
                               passed: Sequence[str] = ()) -> None:
        """Streams ``GET get_path`` of ``source`` into ``PUT put_path`` (with ``digest=``,
        the digest ``source`` named it by) of ``target``, chunk by chunk (the router holds
        one chunk at a time): ``target`` checks it against that digest, and keeps nothing
        unless it matches. ``headers``: sent to ``target`` too; ``passed``: headers of
        ``source``'s reply sent on to ``target``. ``Refused`` (naming both nodes) when it
        fails; ``what`` names the thing in messages."""
        path = get_path

        def refused(node: NodeView, e: BaseException) -> Refused:
            return Refused(*lockbox_error(503, "NODE_UNREACHABLE", f"copying {what} from node "
                                            f"{source.node_id[:12]} to node {target.node_id[:12]}: node "
                                            f"{node.node_id[:12]}: {describe_error(e)}", node=node.node_id,
                                            reason=describe_error(e)))

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
                head, status = await read_response_head(src_r)
                framing = body_framing(head, request=False, status=status)
                if status != 200:
                    data = await read_body(src_r, framing)
                    raise Refused(status, json_or_none(data) or {"code": "INTERNAL", "message": f"node "
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
            sep = "&" if "?" in put_path else "?"
            kept = [(name, value) for name in passed if (value := head.get(name)) is not None]
            dst_w.write(Head(f"PUT {put_path}{sep}digest={urllib.parse.quote(digest, safe=':')} HTTP/1.1", [
                ("Host", f"{target.host}:{target.port}"), ("Authorization", f"Bearer {target.token}"),
                ("Content-Type", content_type), *length, *headers, *kept, ("Connection", "close")]).encode())

            async def send_body() -> None:
                assert dst_w is not None
                if framing is None:  # until the source closes: sent on in chunks
                    while data := await src_r.read(CHUNK):
                        dst_w.write(b"%x\r\n%s\r\n" % (len(data), data))
                        await dst_w.drain()
                    dst_w.write(b"0\r\n\r\n")
                else:
                    await copy_body(src_r, dst_w, framing)
                await dst_w.drain()

            async def read_answer() -> tuple[int, bytes]:
                reply, got = await read_response_head(dst_r)
                return got, await read_body(dst_r, body_framing(reply, request=False, method="PUT", status=got))

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
                answer = json_or_none(data)
                if isinstance(answer, dict) and isinstance(answer.get("message"), str):
                    answer["message"] = (f"copying {what} from node {source.node_id[:12]} to node "
                                         f"{target.node_id[:12]}: {answer['message']}")
                    details = answer.get("details")
                    answer["details"] = {**(details if isinstance(details, dict) else {}),
                                         "from": source.node_id, "to": target.node_id}
                raise Refused(got, answer if isinstance(answer, dict) else {
                    "code": "INTERNAL", "message": f"node {target.node_id[:12]} answered {got}", "details": {}})
        finally:
            source.calls.discard(src_w)
            src_w.close()
            if dst_w is not None:
                target.calls.discard(dst_w)
                dst_w.close()

    async def _delete_copies(self, sid: str, home: NodeView) -> None:
        """Deletes snapshot ``sid`` on every up node it was copied to (not ``home``, its
        own); ``Refused`` with a node's refusal (a copy in use there: 409), the rest kept."""
        holders = await self._holders(sid)
        for view in [self.nodes[h] for h in holders[1:] if h in self.nodes and self.nodes[h].routable]:
            await self._delete_on(view, sid)
            self.copies.get(sid, set()).discard(view.node_id)
            if self.store is not None:
                await self._kv(self.store.delete, f"h/{sid}/{view.node_id}")

    async def _delete_on(self, view: NodeView, sid: str) -> None:
        """``DELETE /v1/snapshots/{sid}`` on ``view`` (gone already is fine); ``Refused``
        with its refusal, naming the node."""
        status, _, data = await self._snapshot_call(view, "DELETE", sid)
        if status not in (204, 404):
            answer = json_or_none(data)
            if isinstance(answer, dict) and isinstance(answer.get("details"), dict):
                answer["details"]["node"] = view.node_id
            raise Refused(status, answer if isinstance(answer, dict) else {
                "code": "INTERNAL", "message": f"node {view.node_id[:12]} answered {status}", "details": {}})

    async def _delete_snapshot(self, req: Request, sid: str, home: NodeView) -> None:
        """``DELETE /v1/snapshots/{id}`` on its own node, once its copies are gone
        (:meth:`_delete_copies`)."""
        await req.drain_body()
        try:
            await self._delete_on(home, sid)
        except Refused as r:
            await req.send(r.status, r.body)
            return
        self.cache.pop(sid, None)
        if self.store is not None:
            await self._kv(self.store.forget, sid)
        await req.send(204, b"")
