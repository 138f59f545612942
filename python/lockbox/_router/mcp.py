"""MCP through the router (stateless JSON-RPC over HTTP, docs/mcp.md): a tool call naming a
sandbox or a snapshot goes to its node, ``create_sandbox`` to a placed one, the listing tools
to every node (merged), anything else to any node. ``fork`` and ``restore`` of a snapshot
another node holds copy it there first, into that node's MCP scope, and only a snapshot in
the MCP scope of a node that holds it: an agent reaches through the router no snapshot it
could not reach on one node."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from .creates import Creates
from .forwarding import NOT_FOUND, ONE
from .placement import NodeView, holding, place
from .snapshot_copies import Refused, copy_header
from .wire import Head, HttpError, Request, describe_error, json_or_none


def mcp_tool_error(rpc_id: Any) -> Callable[[int, dict[str, Any]], tuple[int, Any]]:
    """The router's own lockbox errors as MCP tool errors (``isError``, text ``CODE:
    message``, ``structuredContent`` the error), as a node answers a failed tool call."""
    def shape(status: int, error: dict[str, Any]) -> tuple[int, Any]:
        code, message = str(error.get("code", "")), str(error.get("message", ""))
        details = error.get("details") if isinstance(error.get("details"), dict) else {}
        structured = {"code": code, "message": message, "details": details}
        return 200, {"jsonrpc": "2.0", "id": rpc_id, "result": {
            "content": [{"type": "text", "text": f"{code}: {message}"}], "structuredContent": structured,
            "isError": True}}
    return shape


class McpCalls(Creates):
    """Routes MCP's tool calls."""

    async def _mcp(self, req: Request) -> None:
        """``POST /mcp`` (stateless JSON-RPC, docs/mcp.md): a tool call naming a sandbox or a
        snapshot goes to its node, ``create_sandbox`` to a placed one (and is recorded),
        ``list_sandboxes`` and ``list_snapshots`` to every node (merged, each item with its
        node); anything else (``initialize``, ``tools/list``, ``ping``) to any node."""
        body = await req.read_body_or_refuse()
        if body is None:
            return
        msg = json_or_none(body)
        params = msg.get("params") if isinstance(msg, dict) and msg.get("method") == "tools/call" else None
        name = params.get("name") if isinstance(params, dict) else None
        args = params.get("arguments") if isinstance(params, dict) else None
        args = args if isinstance(args, dict) else {}
        rpc_id = msg.get("id") if isinstance(msg, dict) else None

        if name is not None:  # a tool call: the router's own refusals are tool errors
            req.error_shape = mcp_tool_error(rpc_id)

        async def tool_error(code: str, message: str, **details: Any) -> None:
            await req.send(*mcp_tool_error(rpc_id)(0, {"code": code, "message": message, "details": details}))

        if name in ("list_sandboxes", "list_snapshots"):
            await self._mcp_list(req, body, rpc_id, "sandboxes" if name == "list_sandboxes" else "snapshots")
            return
        sid = args.get("sandbox_id") if isinstance(args.get("sandbox_id"), str) else None
        snap = args.get("snapshot_id") if isinstance(args.get("snapshot_id"), str) else None
        view: NodeView | None
        on_head: Callable[[Head], Awaitable[None]] | None = None
        if name == "fork" and snap:
            count = args.get("count", 1)
            placed = await self._mcp_fork_node(req, snap, count if isinstance(count, int) and count > 0 else 1)
            if placed is None:
                return
            view, on_head = placed
        elif sid or snap:
            kind, key = ("sandboxes", sid) if sid else ("snapshots", snap)
            assert key is not None
            view = await self._node_of(key, kind)
            if view is None:
                await tool_error(NOT_FOUND[kind], f"no fleet node has {ONE[kind]} {key}", id=key)
                return
            buried = self.gone.get(key) if kind == "sandboxes" else None
            why = buried[1] if buried else view.lost_reason()
            if why is not None:
                # As REST through the router answers (by_id): what went with a lost node.
                lost = buried is not None or view.state != "up"
                await tool_error(("SANDBOX_LOST" if kind == "sandboxes" else "SNAPSHOT_LOST") if lost
                                 else "NODE_UNREACHABLE",
                                 f"{ONE[kind]} {key} is on node {view.node_id[:12]}: {why}", id=key,
                                 node=view.node_id, reason=why)
                return
            if name == "restore" and sid and snap:
                copy = await self._mcp_snapshot_on(req, snap, view)
                if copy is None:
                    return
                on_head = copy_header(copy)
            elif name == "delete_snapshot" and snap and await self._mcp_scope_has(view, snap):
                # The agent's on its own node: its copies on other nodes go first, as
                # DELETE /v1/snapshots/{id} through the router (one in use there: refused,
                # the rest kept); then the node's own delete answers the call.
                try:
                    await self._delete_copies(snap, view)
                except Refused as r:
                    await req.send(r.status, r.body)
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
            reply = json_or_none(data)
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
            elif name == "delete_snapshot" and snap and isinstance(result, dict) and not result.get("isError"):
                self.cache.pop(snap, None)
                if self.store is not None:
                    await self._kv(self.store.forget, snap)

        if name == "create_sandbox":
            async with self._placing(chosen, args.get("image") if isinstance(args.get("image"), str) else None) as p:
                p.reached = await self._forward(req, chosen, body=body, on_reply=note)
        else:
            await self._forward(req, chosen, body=body, on_reply=note, on_head=on_head)

    async def _mcp_fork_node(self, req: Request, snap: str,
                             count: int) -> tuple[NodeView, Callable[[Head], Awaitable[None]] | None] | None:
        """The node an MCP ``fork`` of ``count`` sandboxes of snapshot ``snap`` runs on, as
        lockbox's fork without a hint is placed (its own node while it has room, else one
        it is copied to), with the snapshot in that node's MCP scope (:meth:`_mcp_snapshot_on`).
        ``None`` once the client was answered."""
        if await self._node_of(snap, "snapshots") is None:
            await req.send(*self._no_snapshot(snap))
            return None
        target = await self._snapshot_target(req, snap, {}, count)
        if target is None:
            return None
        copy = await self._mcp_snapshot_on(req, snap, target)
        return None if copy is None else (target, copy_header(copy))

    async def _mcp_snapshot_on(self, req: Request, snap: str, target: NodeView) -> str | None:
        """Makes sure snapshot ``snap`` is in ``target``'s MCP scope before an MCP ``fork``
        or ``restore`` of it runs there: on its own node the node decides (``"home"``: its
        scope is what its ``/mcp`` took); elsewhere only a snapshot the MCP scope of a node
        that holds it has (asked of that node's ``list_snapshots``, never taken on the id
        alone) is copied there, into its MCP scope, and any other is the node's own
        ``SNAPSHOT_NOT_FOUND``. ``None`` once the client was answered."""
        known = await self._node_of(snap, "snapshots")
        holders = await self._holders(snap) if known is not None else []
        if not holders or holders[0] == target.node_id:
            return "home"  # unknown to the fleet too: the node answers as it does
        views = [self.nodes[h] for h in holders if h in self.nodes and self.nodes[h].routable]
        seen = await asyncio.gather(*(self._mcp_scope_has(v, snap) for v in views))
        scoped = [v.node_id for v, has in zip(views, seen, strict=True) if has]
        if not views:  # no node that holds it can be asked: why (lost, unreachable)
            await self._snapshot_gone(req, snap, [self.nodes[h] for h in holders if h in self.nodes])
            return None
        if target.node_id in scoped:
            return "cached"
        if not scoped:
            await req.send(*self._no_snapshot(snap))
            return None
        return await self._snapshot_on(req, snap, target, scope="mcp", sources=scoped)

    @staticmethod
    def _no_snapshot(snap: str) -> tuple[int, dict[str, Any]]:
        """A node's own answer for a snapshot that is not the agent's (lockbox-server's
        ``Scope::snapshot``)."""
        return 404, {"code": "SNAPSHOT_NOT_FOUND", "message": f"no snapshot {snap}", "details": {"id": snap}}

    async def _mcp_scope_has(self, view: NodeView, snap: str) -> bool:
        """Whether snapshot ``snap`` is in ``view``'s MCP scope: its ``/mcp``'s
        ``list_snapshots`` (with the node's token: the scope the fleet's token works in)
        lists it."""
        call = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                           "params": {"name": "list_snapshots", "arguments": {}}}).encode()
        try:
            status, _, data = await self._call(view, "POST", "/mcp", body=call, headers=[
                ("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")])
        except (OSError, HttpError, TimeoutError, asyncio.IncompleteReadError):
            return False
        reply = json_or_none(data) if status == 200 else None
        result = reply.get("result") if isinstance(reply, dict) else None
        content = result.get("structuredContent") if isinstance(result, dict) else None
        items = content.get("snapshots") if isinstance(content, dict) else None
        return any(isinstance(i, dict) and i.get("id") == snap for i in items or [])

    async def _mcp_list(self, req: Request, body: bytes, rpc_id: Any, key: str) -> None:
        views = sorted((v for v in self.nodes.values() if v.routable), key=lambda v: v.node_id)
        merged: list[Any] = []

        async def one(v: NodeView) -> tuple[NodeView, Any]:
            try:
                status, _, data = await self._call(v, "POST", "/mcp", body=body, headers=[
                    ("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")])
            except (OSError, HttpError, TimeoutError, asyncio.IncompleteReadError) as e:
                if not isinstance(e, TimeoutError):
                    v.mark_unreachable(describe_error(e))
                return v, None
            return v, json_or_none(data) if status == 200 else None

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
