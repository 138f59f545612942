"""Where a create goes: :class:`NodeView` (what a router knows of one node: its server, state
and load) and :func:`place` (power of K choices, with image affinity), with the placement
hint's checks. Standard library only: ``bench/fleet/placement.py`` loads this file by path
(no Ray, no extension)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

K = 3
"""Placement samples this many nodes and takes the least loaded (power of K choices)."""
IMAGE_AFFINITY = 0.25
"""A node that already holds the create's image wins over one up to this much (as a fraction
of capacity) less loaded."""
HOLDERS = 2
"""Besides the K random nodes, placement looks at up to this many nodes that already hold the
create's image (a node pulls an image once: on a skewed workload this cuts pulls many times
over, where the K random nodes alone rarely include a holder; docs/benchmarks.md)."""
DEFAULT_MAX_SANDBOXES = 64
FIRST_SEEN = "first seen by this router"
"""Why a node is checked before the router routes to it (:attr:`NodeView.was_down`) when the
router has only just started."""


@dataclass
class NodeView:
    """What a router knows of one node: its server, its state and its load."""

    node_id: str
    state: str = "starting"
    reason: str | None = None
    host: str = ""
    port: int = 0
    token: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    capacity: int = DEFAULT_MAX_SANDBOXES
    load: int = 0
    """Creates this router has in flight to the node, plus its sandboxes: those running at
    the last probe, with those this router made since (answered after that probe began) and
    without those it deleted since. Counted by id, so a probe that did or did not see a
    create or a delete answered while it ran counts it once either way."""
    probed: set[str] = field(default_factory=set)
    probe_started: float = 0.0
    inflight: int = 0
    made: dict[str, float] = field(default_factory=dict)
    """The sandboxes this router made on the node, by id, with when the node answered."""
    deleted: dict[str, float] = field(default_factory=dict)
    """The node's sandboxes this router deleted, by id, with when the node answered."""
    swept: float = 0.0
    absent: set[str] = field(default_factory=set)
    failures: int = 0
    calls: set[asyncio.StreamWriter] = field(default_factory=set)
    """Connections of calls in flight to this node: closed when it is found down, so no
    client waits on a node that will not answer."""

    def mark_unreachable(self, reason: str) -> None:
        self.unreachable = reason
        self.was_down = self.was_down or f"it could not be reached ({reason})"
        self.end_calls()

    def end_calls(self) -> None:
        for w in list(self.calls):
            w.close()
        self.calls.clear()
    images: set[str] = field(default_factory=set)
    unreachable: str | None = None
    was_down: str | None = None
    """Why the node was last down (unreachable, lost, starting, a new server; or
    :data:`FIRST_SEEN`), until the router has checked what it still holds once it answers
    again (:meth:`Router._reconcile`): not routed to meanwhile."""
    ports_host: str = ""
    ports_port: int = 0
    """The node's ports listener (``lockbox serve --ports-listen``); 0: it has none."""
    ports_domain: str = "localhost"
    instance: str | None = None
    """The node's server process as its ``/healthz`` last told (a new one: it restarted)."""

    def held(self) -> set[str]:
        """The node's sandboxes as this router knows them: those running at the last probe,
        with those it made since and without those it deleted since."""
        return (self.probed | self.made.keys()) - self.deleted.keys()

    def recount(self) -> None:
        self.load = self.inflight + len(self.held())

    def probed_at(self, started: float, running: set[str]) -> None:
        """A probe that began at ``started`` found ``running``: what this router made or
        deleted before then is in that listing."""
        self.probed, self.probe_started = running, started
        self.made = {i: t for i, t in self.made.items() if t > started}
        self.deleted = {i: t for i, t in self.deleted.items() if t > started}
        self.recount()

    def now_made(self, ids: Iterable[str]) -> None:
        now = time.monotonic()
        self.made.update((i, now) for i in ids)
        self.recount()

    def now_deleted(self, sid: str) -> None:
        self.deleted[sid] = time.monotonic()
        self.recount()

    @property
    def routable(self) -> bool:
        return self.state == "up" and self.unreachable is None and self.was_down is None

    def lost_reason(self) -> str | None:
        """Why calls to this node's sandboxes fail now, or ``None``."""
        if self.state == "lost":
            return f"the node was lost: {self.reason or 'it left the Ray cluster'}"
        if self.state != "up":
            return f"the node's server is {self.state}" + (f" ({self.reason})" if self.reason else "")
        if self.unreachable:
            return f"the node's server cannot be reached: {self.unreachable}"
        if self.was_down is not None:
            return f"the node answers again; the router is checking what it still holds ({self.was_down})"
        return None


def place(nodes: Sequence[NodeView], *, image: str | None = None, rng: random.Random | None = None,
          k: int = K, holders: Sequence[NodeView] = ()) -> NodeView | None:
    """Power of K choices: samples ``k`` of ``nodes``, and up to :data:`HOLDERS` of
    ``holders`` (nodes of ``nodes`` that hold ``image``), and of those with room returns the
    one with the lowest load per capacity, a node already holding ``image`` counting
    :data:`IMAGE_AFFINITY` less loaded. ``None`` when no node has room."""
    rng = rng or random.Random()

    def free(n: NodeView) -> bool:
        return n.load < n.capacity and n.routable

    # Indices, not a copy of a list of every node: a decision costs O(k), not O(nodes).
    sample = [nodes[i] for i in _indices(rng, len(nodes), k)]
    if image and holders:
        sample += [holders[i] for i in _indices(rng, len(holders), HOLDERS)]
    sample = [n for n in sample if free(n)]
    if not sample:  # the sample was full: look at every node
        room = [n for n in nodes if free(n)]
        sample = rng.sample(room, min(k, len(room)))
    if not sample:
        return None

    def score(n: NodeView) -> tuple[float, float]:
        s = n.load / max(n.capacity, 1)
        if image and image in n.images:
            s -= IMAGE_AFFINITY
        return (s, rng.random())

    return min(sample, key=score)


def _indices(rng: random.Random, n: int, k: int) -> list[int]:
    """``min(k, n)`` distinct indices below ``n``, at random: every one when ``n <= k``,
    else drawn one by one (a draw that repeats is drawn again; ``random.sample`` costs
    several times more for the few of a decision)."""
    if n <= k:
        return list(range(n))
    rand = rng.random
    picked: list[int] = []
    while len(picked) < k:
        i = int(rand() * n)
        if i not in picked:
            picked.append(i)
    return picked


def eligible_nodes(nodes: Iterable[NodeView], hint: dict[str, Any]) -> list[NodeView]:
    """The nodes a create may be placed on: the routable ones, and of those the ones the
    placement ``hint`` (``node``, ``labels``) names, if any."""
    if not hint:
        return [v for v in nodes if v.routable]
    return [v for v in nodes if v.routable and matches(v, hint)]


def holding(nodes: Sequence[NodeView], image: str | None) -> list[NodeView]:
    """The nodes of ``nodes`` that already hold ``image`` (none without one)."""
    return [v for v in nodes if image in v.images] if image else []


def matches(view: NodeView, hint: dict[str, Any]) -> bool:
    node = hint.get("node")
    if node and not view.node_id.startswith(node):
        return False
    return all(view.labels.get(k) == v for k, v in (hint.get("labels") or {}).items())


def bad_hint(hint: Any) -> tuple[str, str] | None:
    if not isinstance(hint, dict):
        return "placement", "placement: an object {\"node\", \"labels\"}"
    for k in hint:
        if k not in ("node", "labels"):
            return f"placement.{k}", f"placement.{k}: unknown field (node, labels)"
    if "node" in hint and not isinstance(hint["node"], str):
        return "placement.node", "placement.node: a node id (or its first characters)"
    labels = hint.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        return "placement.labels", "placement.labels: an object of strings"
    return None
