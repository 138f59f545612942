"""E2B's template builds through the router: a build goes to one node (the one that built the
template before, else one placed by load), and every later call of that template (its files'
upload links and uploads, the build, its status, its tags and alias) goes there too. The
template's node is recorded with the router's other placements (``p/TEMPLATE_ID``); one the
router does not know (built on a node directly, or before a router without a store
restarted) is found by asking every node's ``GET /templates/aliases/ID``.

A sandbox of the template goes to a node that has its image with room: the one that built
it, or one it was copied to; when none has room, to a node placed by load, which the
template is copied to first (``GET /templates/ID/archive?tag=T`` of a node that has it,
streamed into the other's ``PUT``, which checks the archive's digest; the template's start
commands go along: ``image_copies``). Copies are recorded (``tc/NAME/NODE``) and forgotten
when the template is built again through a router."""

from __future__ import annotations

import re
import time
import urllib.parse

from .image_copies import ImageCopies, Movable, split_template
from .placement import NodeView, eligible_nodes, place
from .snapshot_copies import Refused
from .wire import Request, e2b_error, json_or_none

TEMPLATE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
"""The template ids the nodes are asked about when the router does not know them (lockbox-e2b's
``check_name``, without ``/``): a create naming a registry reference
(``docker.io/library/alpine:3``) pays no round of questions."""
MISS_TTL = 30.0
"""How long a name no node knows as a template is not asked about again (a create on a
registry image pays one round of questions per half minute, not one per create)."""


def template_id(name: str) -> str:
    """A template's id: its name without the tag (``e2b-demo:v1`` -> ``e2b-demo``)."""
    return split_template(name)[0]


class E2bTemplates(ImageCopies):
    """Routes E2B's template calls to the template's node, and copies templates to others."""

    async def _template_node(self, name: str, *, ask: bool) -> NodeView | None:
        """The node that built the template ``name`` (with or without its tag): this router's
        cache, the store, else (with ``ask``, and not asked in the last :data:`MISS_TTL`
        seconds) every node. ``None`` if it is not a template the fleet built."""
        tid = template_id(name)
        missed = self.template_misses.get(tid)
        ask = ask and TEMPLATE_NAME.fullmatch(tid) is not None and (
            missed is None or time.monotonic() - missed > MISS_TTL)
        view = await self._node_of(tid, "templates", ask=ask)
        if view is None and ask:
            self.template_misses[tid] = time.monotonic()
        return view

    async def _request_build(self, req: Request) -> None:
        """``POST /v3/templates`` ``{name, tags}``: to the node that built the template
        before, if it can take calls, else to one placed by load; the template's node is
        recorded from the node's answer (its ``templateID``)."""
        body = await req.read_body_or_refuse()
        if body is None:
            return
        parsed = json_or_none(body)
        name = parsed.get("name") if isinstance(parsed, dict) else None
        view = await self._template_node(name, ask=False) if isinstance(name, str) else None
        if view is None or not view.routable:
            eligible = eligible_nodes(self.nodes.values(), {})
            view = place(eligible, rng=self.rng) if eligible else None
            if view is None and eligible:
                view = min(eligible, key=lambda v: v.load / max(v.capacity, 1))
        if view is None:
            await req.send(503, {"code": 503, "message": "no fleet node is up to build the template"})
            return
        chosen = view

        async def built(status: int, data: bytes) -> None:
            got = json_or_none(data)
            tid = got.get("templateID") if isinstance(got, dict) else None
            if isinstance(tid, str) and tid:
                self.cache[tid] = chosen.node_id
                self.template_misses.pop(tid, None)
                await self._forget_template_copies(tid)  # built again: its copies are stale
                if self.store is not None:
                    await self._record(chosen.node_id, [], [tid])

        await self._forward(req, view, body=body, on_reply=built)

    async def _start_build(self, req: Request, tid: str) -> None:
        """``POST /v2/templates/{id}/builds/{build}``: to the template's node; a build
        ``fromTemplate`` another template that node does not have copies that one there
        first (a template's base is an image of the node's own store)."""
        body = await req.read_body_or_refuse()
        if body is None:
            return
        req.error_shape = e2b_error
        view = await self._template_node(tid, ask=True)
        if view is None:
            await req.send(404, {"code": 404, "message": f"template \"{tid}\" was not found"})
            return
        if not view.routable:
            await req.send(503, {"code": 503, "message": f"template {tid} is on node {view.node_id[:12]}, which "
                                 f"cannot take calls now: {view.lost_reason()}"})
            return
        parsed = json_or_none(body)
        base = parsed.get("fromTemplate") if isinstance(parsed, dict) else None
        if isinstance(base, str) and base:
            bid, btag = split_template(base)
            home = await self._template_node(bid, ask=True)
            name = f"{bid}:{btag}"
            movable = Movable.template(name)
            holders = await self._holders_of(movable, home) if home is not None else []
            if home is not None and view not in holders:
                sources = [v for v in holders if v.routable]
                if not sources:
                    await req.send(503, {"code": 503, "message": f"template {name}, the build's base, is on node "
                                         f"{home.node_id[:12]}, which cannot take calls now: {home.lost_reason()}"})
                    return
                try:
                    await self._copy(movable, sources, view)
                except Refused as r:
                    message = r.body.get("message") if isinstance(r.body, dict) else None
                    await req.send(r.status, {"code": r.status, "message": str(message or f"copying {name} failed")})
                    return
        await self._forward(req, view, body=body)

    async def _forget_template_copies(self, tid: str) -> None:
        """Forgets every copy of template ``tid``'s tags (it is being built again)."""
        for key in [k for k in self.image_copies if k.startswith("tc:") and split_template(k[3:])[0] == tid]:
            del self.image_copies[key]
        if self.store is not None:
            for key in await self._kv(self.store.keys, f"tc/{urllib.parse.quote(tid + ':', safe='')}"):
                await self._kv(self.store.delete, key)
