"""The router's watch over its nodes: the fleet's listing taken in (states, addresses,
tokens), each up node probed every second (its load and images; unreachable when it does not
answer), and a node that comes back checked for what it still holds before calls go to it
again (the sandboxes it came back without are buried: 410 ``SANDBOX_LOST``, listed lost, with
why); recorded sandboxes a node no longer runs are swept from the store."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from typing import Any

from .forwarding import ForwardingRouter
from .listings import E2B_PAGE
from .placement import DEFAULT_MAX_SANDBOXES, FIRST_SEEN, NodeView
from .wire import HttpError, describe_error, json_or_none

PROBE_INTERVAL = 1.0
NODES_INTERVAL = 0.5
SWEEP_INTERVAL = 10.0


class NodeWatch(ForwardingRouter):
    """Keeps each :class:`NodeView` up to date."""

    async def _watch_nodes(self) -> None:
        last_error = ""
        while True:
            try:
                listed = await asyncio.to_thread(self._list_nodes)
            except Exception as e:  # the controller restarting: keep what we know
                listed = None
                why = f"lockbox fleet router: cannot list the fleet's nodes: {type(e).__name__}: {e}"
                if why != last_error:
                    print(why, flush=True)
                last_error = why
            try:
                if listed is not None:
                    self._update_nodes(listed)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                print(f"lockbox fleet router: a bad listing of the fleet's nodes: {describe_error(e)}", flush=True)
            await asyncio.sleep(NODES_INTERVAL)

    def _update_nodes(self, listed: list[dict[str, Any]]) -> None:
        """Takes in the fleet's listing: states, addresses, tokens, labels, capacities."""
        seen = set()
        for n in listed:
            seen.add(n["node_id"])
            view = self.nodes.setdefault(n["node_id"], NodeView(n["node_id"], was_down=FIRST_SEEN))
            if n.get("state") == "lost" and view.state != "lost":
                view.end_calls()
            view.state, view.reason = n.get("state", "starting"), n.get("reason")
            if view.state != "up":
                view.was_down = view.was_down or view.lost_reason()
            view.labels = dict(n.get("labels") or {})
            view.capacity = int(n.get("max_sandboxes") or DEFAULT_MAX_SANDBOXES)
            if n.get("url"):
                parsed = urllib.parse.urlsplit(n["url"])
                if (parsed.hostname, parsed.port, n.get("token")) != (view.host, view.port, view.token):
                    if view.port:  # not the first server the router sees there
                        view.was_down = "its server restarted"
                    view.host, view.port, view.token = parsed.hostname or "", parsed.port or 80, n["token"]
                    view.unreachable = None  # routed to once a probe has checked what it holds (was_down)
            ports = urllib.parse.urlsplit(n["ports_url"]) if n.get("ports_url") else None
            view.ports_host, view.ports_port = (ports.hostname or "", ports.port or 80) if ports else ("", 0)
            view.ports_domain = str(n.get("ports_domain") or "localhost")
        for node_id, view in self.nodes.items():
            if node_id not in seen:
                view.state, view.reason = "lost", "the fleet no longer lists it"
                view.was_down = view.was_down or view.lost_reason()
        self._nodes_ready.set()

    async def _probe(self) -> None:
        """Each up node's load (its running sandboxes) and images, every second; a node that
        does not answer is unreachable until it does."""
        while True:
            listed = self._nodes_ready.is_set()  # this round sees the fleet's listing
            views = [v for v in self.nodes.values() if v.state == "up"]
            for v, got in zip(views, await asyncio.gather(*(self._probe_one(v) for v in views),
                                                          return_exceptions=True), strict=True):
                if isinstance(got, Exception):
                    print(f"lockbox fleet router: probe of node {v.node_id[:12]}: {describe_error(got)}", flush=True)
            if listed:
                self._probed.set()
            await asyncio.sleep(PROBE_INTERVAL)

    async def _probe_one(self, view: NodeView) -> None:
        started = time.monotonic()
        try:
            # The server's instance first: one that restarted at the same address with the
            # same token (a pod's container restarted) held none of what it held before.
            status, _, body = await self._call(view, "GET", "/healthz", timeout=2.0)
            health = json_or_none(body) if status == 200 else None
            instance = health.get("instance") if isinstance(health, dict) else None
            if isinstance(instance, str):  # (an older server tells none)
                if view.instance is not None and instance != view.instance:
                    view.was_down = view.was_down or "its server restarted"
                view.instance = instance
            status, _, body = await self._call(view, "GET", "/v1/sandboxes?state=running", timeout=2.0)
            if status != 200:
                raise HttpError(f"GET /v1/sandboxes answered {status}")
            boxes = json.loads(body)["sandboxes"]
        except (OSError, HttpError, TimeoutError, ValueError, KeyError, asyncio.IncompleteReadError) as e:
            # A refused or reset connection says the server is gone; a slow answer (a
            # loaded node) must happen twice in a row.
            view.failures += 1
            if view.failures >= 2 or (isinstance(e, OSError) and not isinstance(e, TimeoutError)):
                view.mark_unreachable(describe_error(e))
            return
        view.failures = 0
        if view.was_down is not None:
            try:
                await self._reconcile(view, view.was_down)
            except (OSError, HttpError, TimeoutError, ValueError, KeyError, TypeError,
                    asyncio.IncompleteReadError) as e:
                view.unreachable = f"back, but what it holds could not be listed: {describe_error(e)}"
                return
            view.was_down = None
        view.unreachable = None
        running = {b["id"] for b in boxes if isinstance(b, dict) and isinstance(b.get("id"), str)}
        view.probed_at(started, running)
        for b in boxes:
            image = (b.get("policy") or {}).get("image")
            if image and image not in view.images:
                view.images.add(image)
                self.holders.setdefault(image, []).append(view)
        if self.store is not None and started - view.swept >= SWEEP_INTERVAL:
            view.swept = started
            await self._sweep(view, running)

    async def _sweep(self, view: NodeView, running: set[str]) -> None:
        """Forgets the recorded sandboxes of ``view`` that two sweeps in a row found not
        running (stopped by a timeout, deleted on the node directly): what a lost node's
        listing shows is what it ran. E2B's sandboxes are looked for by their E2B ids, paused
        ones too (a resumed one runs as a lockbox sandbox of another id, a paused one as
        none)."""
        assert self.store is not None
        try:
            recorded = {k.split("/", 2)[2] for k in await self._kv(self.store.keys, f"n/{view.node_id}/")}
            gone = recorded - running
            if gone:
                gone -= await self._e2b_held(view)
            for sid in gone & view.absent:
                self.cache.pop(sid, None)
                await self._kv(self.store.forget, sid)
            view.absent = gone - view.absent
        except Exception as e:  # the store unavailable for a moment: sweep next time
            print(f"lockbox fleet router: sweep of node {view.node_id[:12]}: {describe_error(e)}", flush=True)

    async def _held(self, view: NodeView) -> set[str]:
        """The sandboxes ``view``'s server holds: lockbox's, running or stopped (not those it
        lists ``lost``: a server before it ran them), and E2B's, running or paused (a paused
        one outlives its server, by the same id)."""
        status, _, body = await self._call(view, "GET", "/v1/sandboxes")
        if status != 200:
            raise HttpError(f"GET /v1/sandboxes answered {status}")
        return {b["id"] for b in json.loads(body)["sandboxes"]
                if isinstance(b, dict) and isinstance(b.get("id"), str) and b.get("state") != "lost"
                } | await self._e2b_held(view)

    async def _e2b_held(self, view: NodeView) -> set[str]:
        """The E2B ids of ``view``'s E2B sandboxes, running and paused (every page)."""
        held: set[str] = set()
        after = ""
        while True:
            status, head, body = await self._call(
                view, "GET", f"/v2/sandboxes?limit={E2B_PAGE}" + (f"&nextToken={urllib.parse.quote(after, safe='')}"
                                                                 if after else ""))
            if status != 200:
                raise HttpError(f"GET /v2/sandboxes answered {status}")
            held |= {b["sandboxID"] for b in json.loads(body) if isinstance(b, dict)
                     and isinstance(b.get("sandboxID"), str)}
            token = head.get("x-next-token") or ""
            if not token or token == after:  # the last page (a node that repeats itself: no loop)
                return held
            after = token

    async def _reconcile(self, view: NodeView, cause: str) -> None:
        """A node answers again (after being unreachable, lost or starting, or with a new
        server): of the sandboxes recorded on it, those it still holds are routed as before;
        those it does not are buried (:meth:`Store.bury`): answered 410 ``SANDBOX_LOST`` and
        listed ``lost``, with the reason, until deleted. Without a store nothing is recorded
        per node: the node's own answers stand."""
        if self.store is None:
            return
        held = await self._held(view)
        recorded = {k.split("/", 2)[2] for k in await self._kv(self.store.keys, f"n/{view.node_id}/")}
        gone = recorded - held
        if not gone:
            return
        reason = (f"node {view.node_id[:12]} did not hold it when a router started" if cause == FIRST_SEEN
                  else f"node {view.node_id[:12]} came back without it ({cause})")
        await self._kv(self.store.bury, view.node_id, sorted(gone), reason)
        for sid in gone:
            self.cache.pop(sid, None)
            self.gone[sid] = (view.node_id, reason)
        view.absent -= gone
