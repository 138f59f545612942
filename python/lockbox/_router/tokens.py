"""Scoped tokens through the router (docs/fleet.md, "Scoped tokens"): ``POST /v1/tokens``
mints a node's scoped token on one node (a ``placement`` hint chooses it) and hands the
client a secret of the router's own standing for it; every request with that secret goes to
that node, with the node's secret, and the node enforces the token's ceiling and scope as it
does without a router; ``DELETE /v1/tokens/{id}`` revokes it there.

Why one node per token: a node's scoped token, its ceiling and what it made live in that
node's memory (crates/lockbox-server, ``auth``), and a node takes only its own snapshots into
a token's scope, so a token's sandboxes and snapshots can only be the token's on one node.
Why a secret of the router's own: as with the fleet's token, a client never holds a node's
credential (a node's scoped secret is not accepted by the router, nor the router's by a
node)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
import urllib.parse
from typing import Any

from .forwarding import ForwardingRouter
from .placement import NodeView, eligible_nodes, place
from .wire import Head, HttpError, Request, describe_error, json_or_none, lockbox_error

PREFIX = "lbfs_"
"""Begins every scoped token the routers hand out (to tell it from the fleet's token in logs
and leaks; a node's own scoped tokens have none)."""


def digest(secret: str) -> str:
    """What a scoped token is kept and looked up by (its secret is not kept)."""
    return hashlib.sha256(secret.encode()).hexdigest()


class ScopedTokens(ForwardingRouter):
    """Mints, routes and revokes scoped tokens."""

    async def _scoped_entry(self, head: Head) -> dict[str, Any] | None:
        """The scoped token a request's bearer token is, if it is one the routers minted:
        ``{"id", "node", "secret"}`` (the node's own secret)."""
        auth = head.get("authorization") or ""
        given = auth[7:] if auth.startswith("Bearer ") else ""
        if not given.startswith(PREFIX):
            return None
        key = digest(given)
        entry = self.scoped.get(key)
        if entry is None and self.store is not None:
            entry = await self._kv(self.store.get, f"t/{key}")
            if entry is not None:
                self.scoped[key] = entry
        return entry

    async def _mint(self, req: Request) -> None:
        """``POST /v1/tokens`` (the fleet's token): minted on a node placed as a create is
        (a ``placement`` hint narrows it), answered with the router's own secret for it and
        the ``node`` it is bound to."""
        read = await self._body_and_hint(req)
        if read is None:
            return
        body, _, hint = read
        eligible = eligible_nodes(self.nodes.values(), hint)
        view = place(eligible, rng=self.rng) or (eligible[0] if eligible else None)
        if view is None:
            msg = "no fleet node is up" if not hint else f"no up fleet node matches the placement {json.dumps(hint)}"
            await req.send(*lockbox_error(503, "NO_NODE", msg, placement=hint))
            return

        async def handed_out(status: int, data: bytes, view: NodeView = view) -> bytes | None:
            minted = json_or_none(data)
            if status != 201 or not isinstance(minted, dict) or not isinstance(minted.get("token"), str):
                return None
            secret = PREFIX + secrets.token_hex(32)
            entry = {"id": minted.get("id"), "node": view.node_id, "secret": minted["token"], "at": time.time()}
            key = digest(secret)
            self.scoped[key] = entry
            if self.store is not None:
                await self._kv(self.store.put, f"t/{key}", entry)
                await self._kv(self.store.put, f"k/{entry['id']}", {"key": key, "node": view.node_id})
            return json.dumps({**minted, "token": secret, "node": view.node_id}).encode()

        await self._forward(req, view, body=body, on_reply=handed_out)

    async def _revoke(self, req: Request, token_id: str) -> None:
        """``DELETE /v1/tokens/{id}`` (the fleet's token): revoked on its node, and
        forgotten by the routers."""
        key = next((k for k, e in self.scoped.items() if e.get("id") == token_id), None)
        if key is None and self.store is not None:
            got = await self._kv(self.store.get, f"k/{token_id}")
            key = got["key"] if got else None
        entry = self.scoped.get(key) if key else None
        if key is not None and entry is None and self.store is not None:
            entry = await self._kv(self.store.get, f"t/{key}")
        if key is None or entry is None:
            await req.drain_body()
            await req.send(*lockbox_error(404, "TOKEN_NOT_FOUND", f"no scoped token {token_id} was minted through "
                                           "the fleet's routers", id=token_id))
            return
        await req.drain_body()
        view = self.nodes.get(entry["node"])
        if view is not None and view.routable:
            try:
                status, _, data = await self._call(view, "DELETE", "/v1/tokens/" + urllib.parse.quote(
                    str(entry["id"]), safe=""))
            except (OSError, HttpError, TimeoutError, asyncio.IncompleteReadError) as e:
                status, data = 0, describe_error(e).encode()
            # 404: its server restarted since, and the token went with it.
            if status not in (0, 200, 404):
                answer = json_or_none(data)
                await req.send(status, answer if isinstance(answer, dict) else {
                    "code": "INTERNAL", "message": f"node {view.node_id[:12]} answered {status}", "details": {}})
                return
        # A node that cannot be reached keeps the token only until its server restarts (a
        # node's tokens live in its memory); the routers stop taking it now.
        await self._forget_token(key, token_id)
        await req.send(200, {"revoked": True, "node": entry["node"]})

    async def _forget_token(self, key: str, token_id: str) -> None:
        self.scoped.pop(key, None)
        if self.store is not None:
            await self._kv(self.store.delete, f"t/{key}")
            await self._kv(self.store.delete, f"k/{token_id}")

    async def _as_scoped(self, req: Request, entry: dict[str, Any]) -> None:
        """A request with a scoped token: to the token's node, with the node's own secret
        (the node answers it as a scoped token's: its ceiling, its sandboxes and snapshots
        only, 403 ``FORBIDDEN`` on the operator's routes)."""
        view = self.nodes.get(entry["node"])
        why = view.lost_reason() if view is not None else "the fleet does not list it"
        if view is None or why is not None:
            await req.drain_body()
            lost = view is None or view.state == "lost"
            await req.send(*lockbox_error(410 if lost else 503, "NODE_LOST" if lost else "NODE_UNREACHABLE",
                                           f"scoped token {entry['id']} is bound to node {entry['node'][:12]}: {why}",
                                           id=entry["id"], node=entry["node"], reason=why))
            return
        req.head.put("Authorization", f"Bearer {entry['secret']}")
        parts = req.parts
        what = None  # what the call makes, recorded as the fleet's token's are
        if req.method == "POST" and parts == ["v1", "sandboxes"]:
            what = "create"
        elif req.method == "POST" and len(parts) == 4 and parts[0] == "v1" and parts[3] in ("snapshots", "fork"):
            what = "snapshot" if parts[3] == "snapshots" else "fork"

        async def made(status: int, data: bytes, view: NodeView = view) -> None:
            if status == 201 and what:
                await self._remember(json_or_none(data), view, what)

        await self._forward(req, view, upstream_auth=False, on_reply=made if what else None)
