"""Creates through the router: a new sandbox placed on a node (:func:`place`, a hint, the
snapshot it starts from), the intent recorded before it is sent, and the new id's node once
the node answered; a node that cannot be reached is left out and the next choice taken."""

from __future__ import annotations

import contextlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from .image_copies import Movable
from .placement import NodeView, eligible_nodes, holding, place
from .snapshot_copies import copy_header, is_snapshot_id
from .templates import E2bTemplates
from .wire import Request, e2b_error, json_or_none, lockbox_error

# E2B's templates that run on the host's userland (crates/lockbox-e2b, HOST_TEMPLATES).
HOST_TEMPLATES = {"base", "code-interpreter-v1"}
GENERATED_SNAPSHOT_ID = re.compile(r"s[0-9a-f]+-[0-9a-f]+-[0-9a-f]+")
"""The ids lockbox gives snapshots (lockbox-cow's ``SnapshotId::generate``; a copy keeps its
id): an E2B template of this shape that the router does not know is looked for on every node,
any other is taken for an image without asking them (a create on an image pays no round of
questions)."""


@dataclass
class Placing:
    reached: bool = False



class Creates(E2bTemplates):
    """Places and records new sandboxes."""

    @contextlib.asynccontextmanager
    async def _placing(self, view: NodeView, image: str | None) -> AsyncIterator[Placing]:
        """A create sent to ``view``: recorded in the store before it is sent (``c/UUID``,
        removed once the node answered and the new ids were recorded), and counted in the
        node's load meanwhile."""
        intent = f"c/{uuid.uuid4()}"
        if self.store is not None:
            await self._kv(self.store.put, intent, {"node": view.node_id, "at": time.time(), "image": image})
        view.inflight += 1
        view.recount()
        placing = Placing()
        try:
            yield placing
        finally:
            view.inflight -= 1
            view.recount()
            if self.store is not None:
                await self._kv(self.store.delete, intent)

    async def _create_on(self, req: Request, view: NodeView, body: bytes, image: str | None) -> bool:
        """Sends the create to ``view`` and records what it made; ``False`` if the node
        could not be reached (nothing was answered: the caller tries another)."""
        async def recorded(status: int, data: bytes) -> None:
            await self._remember(json_or_none(data), view, "create")

        async def no_answer(reason: str) -> None:
            return None

        async with self._placing(view, image) as placing:
            placing.reached = await self._forward(req, view, body=body, on_reply=recorded, unreachable=no_answer)
        return placing.reached

    async def _snapshot_template(self, template: str) -> bool:
        """Whether E2B's ``templateID`` names a snapshot of the fleet (lockbox-e2b takes a
        snapshot's id as a template: ``Sandbox.create(template=snapshot_id)``): one this
        router or the store knows, or one of a snapshot id's shape that a node has (every
        node asked; the answer recorded). A snapshot's *name* is not looked for: the node the
        create is placed on resolves it, as before."""
        if not is_snapshot_id(template):
            return False
        ask = GENERATED_SNAPSHOT_ID.fullmatch(template) is not None
        return await self._node_of(template, "snapshots", ask=ask) is not None

    async def _create(self, req: Request, *, e2b: bool) -> None:
        read = await self._body_and_hint(req, hints=not e2b)
        if read is None:
            return
        body, parsed, hint = read
        image: str | None = None
        if isinstance(parsed, dict):
            image = parsed.get("templateID") if e2b else parsed.get("image")
            if not isinstance(image, str) or (e2b and image in HOST_TEMPLATES):
                image = None
        snapshot = parsed.get("from_snapshot") if isinstance(parsed, dict) and not e2b else None
        if e2b and image is not None and await self._snapshot_template(image):
            # E2B's Sandbox.create(template=SNAPSHOT_ID): as lockbox's from_snapshot, and
            # the router's own refusals in E2B's shape.
            snapshot, image = image, None
            req.error_shape = e2b_error
        if isinstance(snapshot, str) and snapshot:
            # A sandbox of a snapshot: on a node that has it, or one it is copied to.
            placed = await self._place_from_snapshot(req, snapshot, hint, 1)
            if placed is None:
                return
            view, copy = placed

            async def remembered(status: int, data: bytes, view: NodeView = view) -> None:
                await self._remember(json_or_none(data), view, "create")

            async with self._placing(view, image) as placing:
                placing.reached = await self._forward(req, view, body=body, on_reply=remembered,
                                                      on_head=copy_header(copy))
            return
        # A template built on a node (E2B's Template.build, through a router or not), or an
        # image a sandbox committed there, is in that node's store only: its sandboxes go
        # where it is, or where it is copied first. E2B's creates ask the nodes about a
        # template the router does not know; lockbox's `image` ones do not (a registry image).
        home = await self._template_node(image, ask=e2b) if image is not None else None
        movable = Movable.template(image) if home is not None and image is not None else None
        if home is None and image is not None:  # an image a sandbox committed on a node
            made = await self._image_home(image)
            movable, home = made if made is not None else (None, None)
        tried: list[NodeView] = []
        if home is None and not hint:
            # The common create, in O(K): a sample of every node (`place` leaves out those
            # that cannot take it) and of the image's holders, as the probes listed them.
            first = place(self._node_list(), image=image, rng=self.rng, holders=self.holders.get(image or "", ()))
            if first is not None:
                if await self._create_on(req, first, body, image):
                    return
                tried.append(first)  # unreachable: the next choice, among the others
        eligible = [v for v in eligible_nodes(self.nodes.values(), hint) if v not in tried]
        if home is not None and movable is not None:
            target = await self._target_for(req, movable, home, hint, e2b)
            if target is None:
                return
            eligible = [target]
        if not eligible:
            known = {v.node_id: v.lost_reason() or "up" for v in self.nodes.values()}
            msg = "no fleet node is up" if not hint else f"no up fleet node matches the placement {json.dumps(hint)}"
            if e2b:
                await req.send(503, {"code": 503, "message": msg})
            else:
                await req.send(*lockbox_error(503, "NO_NODE", msg, placement=hint, nodes=known))
            return
        while eligible:
            view = place(eligible, image=image, rng=self.rng, holders=holding(eligible, image)) or min(
                eligible, key=lambda v: v.load / max(v.capacity, 1))
            if await self._create_on(req, view, body, image):
                return
            eligible.remove(view)  # the next choice, among the others
        message = "no fleet node could be reached for the create"
        if e2b:
            await req.send(503, {"code": 503, "message": message})
        else:
            await req.send(*lockbox_error(503, "NO_NODE", message))
