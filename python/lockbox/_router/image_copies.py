"""Images one node made (an E2B template it built, an image a sandbox of it committed) that
a create needs on another node: the create goes to a node that has the image with room (the
one that made it, or one it was copied to), else to one placed by load that it is copied to
first: the archive ``GET`` from a node that has it is streamed through the router into the
other's ``PUT``, which checks its digest (``snapshot_copies._stream_artifact``). Copies are
recorded (``tc/NAME/NODE`` for templates, ``ic/REFERENCE/NODE`` for images), so every router
uses them."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

from .placement import NodeView, eligible_nodes, place
from .snapshot_copies import Refused, SnapshotCopies
from .wire import HttpError, Request, lockbox_error

NOT_HELD_FOR = 10.0
"""Seconds a router takes an image no node's store had from outside a registry for one each
node pulls (:meth:`ImageCopies._local_holder`)."""


def split_template(name: str) -> tuple[str, str]:
    """A template's id and tag (``latest`` if none), as lockbox-e2b splits a name: at the last
    ``:`` when what follows has no ``/``."""
    tid, sep, tag = name.rpartition(":")
    return (tid, tag) if sep and "/" not in tag else (name, "latest")


def normalized_reference(name: str) -> str | None:
    """An image name as lockbox's store records it (Docker's rules: ``app:2`` ->
    ``docker.io/library/app:2``, ``latest`` when no tag); ``None`` for what is no registry
    reference (``oci:DIR``, an archive, an empty name)."""
    if not name or name.startswith(("oci:", "oci-archive:", "docker-archive:")) or any(c.isspace() for c in name):
        return None
    first, slash, rest = name.partition("/")
    if not slash:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    elif first == "index.docker.io":
        name = f"docker.io/{rest}"
    last = name.rsplit("/", 1)[1]
    if "@" not in last and ":" not in last:
        name += ":latest"
    return name


@dataclass(frozen=True)
class Movable:
    """An image a create may need on another node: an E2B template's tag (``id:tag``) or an
    image of a node's store (its normalised reference)."""

    kind: str
    name: str

    @staticmethod
    def template(name: str) -> Movable:
        tid, tag = split_template(name)
        return Movable("template", f"{tid}:{tag}")

    @staticmethod
    def image(reference: str) -> Movable:
        return Movable("image", reference)

    @property
    def prefix(self) -> str:
        """Its copies' keys in the store: ``PREFIX/NAME/NODE``."""
        return "tc" if self.kind == "template" else "ic"

    @property
    def path(self) -> str:
        """Its archive's route on a node (``GET``; ``PUT`` with ``digest=``)."""
        if self.kind == "template":
            tid, tag = split_template(self.name)
            return f"/templates/{urllib.parse.quote(tid, safe='')}/archive?tag={urllib.parse.quote(tag, safe='')}"
        return f"/v1/images/archive?reference={urllib.parse.quote(self.name, safe='')}"

    @property
    def passed(self) -> tuple[str, ...]:
        """Headers of the archive's ``GET`` reply that go on with its ``PUT``."""
        return ("lockbox-template-start",) if self.kind == "template" else ()


class ImageCopies(SnapshotCopies):
    """Places creates of images one node made, copying them where needed."""

    async def _copies_of(self, m: Movable) -> set[str]:
        """The nodes ``m`` was copied to."""
        nodes = set(self.image_copies.get(f"{m.prefix}:{m.name}", ()))
        if self.store is not None:
            prefix = f"{m.prefix}/{urllib.parse.quote(m.name, safe='')}/"
            nodes |= {k[len(prefix):] for k in await self._kv(self.store.keys, prefix)}
        return nodes

    async def _holders_of(self, m: Movable, home: NodeView) -> list[NodeView]:
        """The nodes that have ``m``: ``home``, which made it, then those it was copied to."""
        copies = await self._copies_of(m)
        return [home] + [self.nodes[n] for n in sorted(copies) if n in self.nodes and n != home.node_id]

    async def _image_home(self, image: str) -> tuple[Movable, NodeView] | None:
        """The node that made image ``image`` (a sandbox's ``commit-image`` through a
        router: this router's cache, else the store), if any; else, for an image no sandbox
        of the fleet runs, a node whose store has it from anywhere but a registry (built with
        ``lockbox image build`` or loaded on its machine, outside any server), which the
        nodes are asked about (:meth:`_local_holder`)."""
        reference = normalized_reference(image)
        if reference is None:
            return None
        node = self.image_homes.get(reference)
        if node is None and self.store is not None:
            got = await self._kv(self.store.get, f"im/{urllib.parse.quote(reference, safe='')}")
            node = got["node"] if got else None
        view = self.nodes.get(node) if node else None
        if view is None and not self.holders.get(image):
            view = await self._local_holder(reference)
        return (Movable.image(reference), view) if view is not None else None

    async def _local_holder(self, reference: str) -> NodeView | None:
        """The least loaded up node whose store has image ``reference`` not from a registry
        (``HEAD /v1/images/archive``: its ``Lockbox-Image-Source`` is then not the image's
        own name), recorded as the node that made it; ``None`` if none has (an image each
        node pulls from its registry, as before). A name no node has is not asked about again
        for :data:`NOT_HELD_FOR` seconds: a burst of creates of a new registry image pays
        one round of questions."""
        now = time.monotonic()
        if self.not_held.get(reference, 0.0) > now:
            return None
        views = [v for v in self.nodes.values() if v.routable]
        path = f"/v1/images/archive?reference={urllib.parse.quote(reference, safe='')}"

        async def ask(v: NodeView) -> bool:
            try:
                status, head, _ = await self._call(v, "HEAD", path, timeout=2.0)
            except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError, HttpError):
                return False
            return status == 200 and head.get("lockbox-image-source") not in (None, reference)

        answers = await asyncio.gather(*(ask(v) for v in views))
        holders = [v for v, has in zip(views, answers, strict=True) if has]
        if not holders:
            self.not_held[reference] = now + NOT_HELD_FOR
            return None
        home = min(holders, key=lambda v: v.load / max(v.capacity, 1))
        await self._made_images(home.node_id, [reference])
        return home

    async def _made_images(self, node: str, references: Sequence[str]) -> None:
        """Images ``node`` made (a commit's ``references``): their creates go there, or
        where they are copied; earlier copies of those names are stale."""
        for reference in references:
            self.image_homes[reference] = node
            self.image_copies.pop(f"ic:{reference}", None)
            if self.store is not None:
                quoted = urllib.parse.quote(reference, safe="")
                await self._kv(self.store.put, f"im/{quoted}", {"node": node, "at": time.time()})
                for key in await self._kv(self.store.keys, f"ic/{quoted}/"):
                    await self._kv(self.store.delete, key)

    async def _target_for(self, req: Request, m: Movable, home: NodeView, hint: dict[str, object],
                          e2b: bool) -> NodeView | None:
        """The node a sandbox of ``m`` goes to: one that has it (``home``, which made it, or
        a copy) and room, the least loaded; else a node placed by load that it is copied to
        first. ``None`` once the client was answered (no node can take it, or the copy
        failed)."""
        holders = await self._holders_of(m, home)
        allowed = eligible_nodes(self.nodes.values(), hint) if hint else None

        def fits(v: NodeView) -> bool:
            return v.routable and v.load < v.capacity and (allowed is None or v in allowed)

        have = [v for v in holders if fits(v)]
        if have:
            return min(have, key=lambda v: v.load / max(v.capacity, 1))
        sources = [v for v in holders if v.routable]
        if not sources:
            await self._refuse_create(req, e2b, 503, "NODE_UNREACHABLE",
                                      f"{m.kind} {m.name} is on node {home.node_id[:12]}"
                                      + (f" and {len(holders) - 1} node(s) it was copied to" if len(holders) > 1
                                         else "") + f", none of which can take calls now: {home.lost_reason()}",
                                      node=home.node_id)
            return None
        others = [v for v in (allowed if allowed is not None else self._node_list()) if fits(v) and v not in holders]
        if not others:  # every node full: a node that has it answers for itself (429)
            answer = [v for v in sources if allowed is None or v in allowed]
            if answer:
                return answer[0]
            await self._refuse_create(req, e2b, 503, "NO_NODE", f"no up fleet node matches the placement "
                                      f"{hint} for {m.kind} {m.name}")
            return None
        target = place(others, rng=self.rng) or others[0]
        try:
            await self._copy(m, sources, target)
        except Refused as r:
            body = r.body if isinstance(r.body, dict) else {}
            await self._refuse_create(req, e2b, r.status, str(body.get("code", "INTERNAL")),
                                      str(body.get("message", f"copying {m.kind} {m.name} failed")),
                                      **(body.get("details") or {}))
            return None
        return target

    async def _refuse_create(self, req: Request, e2b: bool, status: int, code: str, message: str,
                             **details: object) -> None:
        await req.send(*((status, {"code": status, "message": message}) if e2b
                         else lockbox_error(status, code, message, **details)))

    async def _copy(self, m: Movable, sources: Sequence[NodeView], target: NodeView) -> None:
        """Copies ``m`` from the first of ``sources`` to ``target`` (one copy per image and
        node at a time: a second create waits, then finds it there); ``Refused`` when it
        fails."""
        key = (f"{m.prefix}:{m.name}", target.node_id)
        lock = self._copying.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                if target.node_id in await self._copies_of(m):
                    return
                await self._stream_artifact(f"{m.kind} {m.name}", sources[0], target, m.path, m.path,
                                            content_type="application/x-tar", passed=m.passed)
                self.image_copies.setdefault(f"{m.prefix}:{m.name}", set()).add(target.node_id)
                if self.store is not None:
                    await self._kv(self.store.put, f"{m.prefix}/{urllib.parse.quote(m.name, safe='')}/{target.node_id}",
                                   {"node": target.node_id, "at": time.time()})
        finally:
            if not lock.locked():
                self._copying.pop(key, None)
