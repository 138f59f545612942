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
commands go along). Copies are recorded (``tc/NAME/NODE``) and forgotten when the template is
built again through a router."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.parse
from collections.abc import Sequence

from .placement import NodeView, eligible_nodes, place
from .snapshot_copies import Refused, SnapshotCopies
from .wire import Request, e2b_error, json_or_none, lockbox_error

TEMPLATE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
"""The template ids the nodes are asked about when the router does not know them (lockbox-e2b's
``check_name``, without ``/``): a create naming a registry reference
(``docker.io/library/alpine:3``) pays no round of questions."""
MISS_TTL = 30.0
"""How long a name no node knows as a template is not asked about again (a create on a
registry image pays one round of questions per half minute, not one per create)."""


def split_template(name: str) -> tuple[str, str]:
    """A template's id and tag (``latest`` if none), as lockbox-e2b splits a name: at the last
    ``:`` when what follows has no ``/``."""
    tid, sep, tag = name.rpartition(":")
    return (tid, tag) if sep and "/" not in tag else (name, "latest")


def template_id(name: str) -> str:
    """A template's id: its name without the tag (``e2b-demo:v1`` -> ``e2b-demo``)."""
    return split_template(name)[0]


class E2bTemplates(SnapshotCopies):
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
                await self._forget_copies(tid)  # built again: its copies are stale
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
            if home is not None and home is not view and view.node_id not in await self._template_copies(name):
                copies = await self._template_copies(name)
                sources = [v for v in [home, *(self.nodes[n] for n in sorted(copies) if n in self.nodes)]
                           if v.routable]
                if not sources:
                    await req.send(503, {"code": 503, "message": f"template {name}, the build's base, is on node "
                                         f"{home.node_id[:12]}, which cannot take calls now: {home.lost_reason()}"})
                    return
                try:
                    await self._copy_template(name, sources, view)
                except Refused as r:
                    message = r.body.get("message") if isinstance(r.body, dict) else None
                    await req.send(r.status, {"code": r.status, "message": str(message or f"copying {name} failed")})
                    return
        await self._forward(req, view, body=body)

    async def _template_copies(self, name: str) -> set[str]:
        """The nodes template ``name`` (``id:tag``) was copied to."""
        nodes = set(self.template_copies.get(name, ()))
        if self.store is not None:
            prefix = f"tc/{urllib.parse.quote(name, safe='')}/"
            nodes |= {k[len(prefix):] for k in await self._kv(self.store.keys, prefix)}
        return nodes

    async def _forget_copies(self, tid: str) -> None:
        """Forgets every copy of template ``tid``'s tags (it is being built again)."""
        for name in [n for n in self.template_copies if split_template(n)[0] == tid]:
            del self.template_copies[name]
        if self.store is not None:
            for key in await self._kv(self.store.keys, f"tc/{urllib.parse.quote(tid + ':', safe='')}"):
                await self._kv(self.store.delete, key)

    async def _template_target(self, req: Request, image: str, home: NodeView, hint: dict[str, object],
                               e2b: bool) -> NodeView | None:
        """The node a sandbox of template ``image`` goes to: one that has it (``home``, which
        built it, or a copy) and room, the least loaded; else a node placed by load that it
        is copied to first. ``None`` once the client was answered (no node can take it, or
        the copy failed)."""
        tid, tag = split_template(image)
        name = f"{tid}:{tag}"
        copies = await self._template_copies(name)
        holders = [home] + [self.nodes[n] for n in sorted(copies) if n in self.nodes and n != home.node_id]
        allowed = eligible_nodes(self.nodes.values(), hint) if hint else None

        def fits(v: NodeView) -> bool:
            return v.routable and v.load < v.capacity and (allowed is None or v in allowed)

        have = [v for v in holders if fits(v)]
        if have:
            return min(have, key=lambda v: v.load / max(v.capacity, 1))
        sources = [v for v in holders if v.routable]
        if not sources:
            await self._refuse_template(req, e2b, 503, "NODE_UNREACHABLE",
                                        f"template {image} is on node {home.node_id[:12]}"
                                        + (f" and {len(holders) - 1} node(s) it was copied to" if len(holders) > 1
                                           else "") + f", none of which can take calls now: {home.lost_reason()}",
                                        node=home.node_id)
            return None
        others = [v for v in (allowed if allowed is not None else self._node_list()) if fits(v) and v not in holders]
        if not others:  # every node full: a node that has it answers for itself (429)
            answer = [v for v in sources if allowed is None or v in allowed]
            if answer:
                return answer[0]
            await self._refuse_template(req, e2b, 503, "NO_NODE", f"no up fleet node matches the placement "
                                        f"{hint} for template {image}")
            return None
        target = place(others, rng=self.rng) or others[0]
        try:
            await self._copy_template(name, sources, target)
        except Refused as r:
            body = r.body if isinstance(r.body, dict) else {}
            await self._refuse_template(req, e2b, r.status, str(body.get("code", "INTERNAL")),
                                        str(body.get("message", f"copying template {name} failed")),
                                        **(body.get("details") or {}))
            return None
        return target

    async def _refuse_template(self, req: Request, e2b: bool, status: int, code: str, message: str,
                               **details: object) -> None:
        await req.send(*((status, {"code": status, "message": message}) if e2b
                         else lockbox_error(status, code, message, **details)))

    async def _copy_template(self, name: str, sources: Sequence[NodeView], target: NodeView) -> None:
        """Copies template ``name`` (``id:tag``) from the first of ``sources`` to ``target``
        (one copy per template and node at a time: a second create waits, then finds it
        there); ``Refused`` when it fails."""
        key = (f"template:{name}", target.node_id)
        lock = self._copying.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                if target.node_id in await self._template_copies(name):
                    return
                tid, tag = split_template(name)
                path = f"/templates/{urllib.parse.quote(tid, safe='')}/archive?tag={urllib.parse.quote(tag, safe='')}"
                await self._stream_artifact(f"template {name}", sources[0], target, path, path,
                                            content_type="application/x-tar", passed=("lockbox-template-start",))
                self.template_copies.setdefault(name, set()).add(target.node_id)
                if self.store is not None:
                    await self._kv(self.store.put, f"tc/{urllib.parse.quote(name, safe='')}/{target.node_id}",
                                   {"node": target.node_id, "at": time.time()})
        finally:
            if not lock.locked():
                self._copying.pop(key, None)
