"""MCP through the router (stateless JSON-RPC over HTTP, docs/mcp.md): a tool call naming a
sandbox or a snapshot goes to its node, ``create_sandbox`` to a placed one, the listing tools
to every node (merged), anything else to any node."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from .creates import Creates
from .forwarding import NOT_FOUND, ONE
from .placement import NodeView, holding, place
from .wire import HttpError, Request, describe_error, json_or_none


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
                await tool_error(NOT_FOUND[kind], f"no fleet node has {ONE[kind]} {key}", id=key)
                return
            buried = self.gone.get(key) if kind == "sandboxes" else None
            why = buried[1] if buried else view.lost_reason()
            if why is not None:
                await tool_error("SANDBOX_LOST" if buried or view.state != "up" else "NODE_UNREACHABLE",
                                 f"{ONE[kind]} {key} is on node {view.node_id[:12]}: {why}", id=key,
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

        if name == "create_sandbox":
            async with self._placing(chosen, args.get("image") if isinstance(args.get("image"), str) else None) as p:
                p.reached = await self._forward(req, chosen, body=body, on_reply=note)
        else:
            await self._forward(req, chosen, body=body, on_reply=note)

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
