"""E2B's template builds through the router: a build goes to one node (the one that built the
template before, else one placed by load), and every later call of that template (its files'
upload links and uploads, the build, its status, its tags and alias) goes there too, as do
the sandboxes created from it, which run on the image the build made on that node. The
template's node is recorded with the router's other placements (``p/TEMPLATE_ID``); one the
router does not know (built on a node directly, or before a router without a store
restarted) is found by asking every node's ``GET /templates/aliases/ID``. Templates are not
copied to other nodes: a template's sandboxes wait for its node (503 when it is down)."""

from __future__ import annotations

import re
import time

from .forwarding import ForwardingRouter
from .placement import NodeView, eligible_nodes, place
from .wire import Request, json_or_none

TEMPLATE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
"""What a built template's id looks like (lockbox-e2b's ``check_name``, lowercase): anything
else a create names (a registry reference: ``docker.io/library/alpine:3``) is not asked
about."""
MISS_TTL = 30.0
"""How long a name no node knows as a template is not asked about again (a create on a
registry image pays one round of questions per half minute, not one per create)."""


def template_id(name: str) -> str:
    """A template's id: its name without the tag (``e2b-demo:v1`` -> ``e2b-demo``)."""
    return name.split(":", 1)[0]


class E2bTemplates(ForwardingRouter):
    """Routes E2B's template calls to the template's node."""

    async def _template_node(self, name: str, *, ask: bool) -> NodeView | None:
        """The node that built the template ``name`` (with or without its tag): this router's
        cache, the store, else (with ``ask``, and not asked in the last :data:`MISS_TTL`
        seconds) every node. ``None`` if it is not a template the fleet built."""
        tid = template_id(name)
        if not TEMPLATE_NAME.fullmatch(tid):
            return None
        missed = self.template_misses.get(tid)
        ask = ask and (missed is None or time.monotonic() - missed > MISS_TTL)
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
                if self.store is not None:
                    await self._record(chosen.node_id, [], [tid])

        await self._forward(req, view, body=body, on_reply=built)
