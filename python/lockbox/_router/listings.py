"""Listings of every node merged into one: lockbox's lists (each item with its ``node``, and
the fleet's ``nodes``) and E2B's, whose paged ones (``GET /v2/sandboxes``, ``GET /snapshots``:
an :class:`E2bListing` each) are walked across the nodes with a ``nextToken`` of the router's
own (:class:`Cursor`) and pages merged by :func:`merge_pages`."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import urllib.parse
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .forwarding import ForwardingRouter
from .placement import NodeView
from .wire import HttpError, Request, describe_error, json_or_none

E2B_PAGE = 100
"""E2B's largest (and default) page of ``GET /v2/sandboxes`` and ``GET /snapshots`` (its spec's
``limit``)."""
PAGE_ATTEMPTS = 3
"""A page of E2B's listing is made again this many times at most when a node's listing
changed between the two calls that find where the page ends on it."""
MERGED_LISTS = {"/v1/sandboxes", "/v1/snapshots", "/v1/branches", "/v1/transactions", "/v1/journal/runs",
                "/sandboxes", "/v2/sandboxes"}
"""The listings asked of every node and merged (E2B's ``/v2/sandboxes`` page by page)."""
CURSOR_PREFIX = "fleet1."
"""The prefix of the router's own ``nextToken`` (a node's is ``{nanos}.{id}`` for its
sandboxes, a number for its snapshots)."""


@dataclass
class Cursor:
    """Where a walk of E2B's listing through the router stands (its ``nextToken``): the
    ``order`` it was made for, each node's position in its own listing (``""``: from its
    start, a node's own ``x-next-token``: after that item, ``None``: nothing more there),
    the ``boundary`` (``startedAt``, ``sandboxID``) of the last item listed, for the nodes
    nothing was taken from yet (listings by start time only), and the ``listing`` walked."""

    order: str
    nodes: dict[str, str | None] = field(default_factory=dict)
    boundary: tuple[str, str] | None = None
    listing: str = "/v2/sandboxes"
    """The path of the listing walked (:attr:`E2bListing.path`)."""

    def encode(self) -> str:
        raw = json.dumps({"order": self.order, "nodes": self.nodes, "boundary": self.boundary,
                          "listing": self.listing}, separators=(",", ":"), sort_keys=True).encode()
        return CURSOR_PREFIX + base64.urlsafe_b64encode(zlib.compress(raw)).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str, order: str, listing: str = "/v2/sandboxes") -> Cursor:
        """The cursor :meth:`encode` made for ``order`` of ``listing`` (``ValueError`` naming
        what is wrong otherwise)."""
        foreign = ValueError(f"{token[:40]!r} is not one this fleet's routers gave")
        if not token.startswith(CURSOR_PREFIX):
            raise foreign
        body = token[len(CURSOR_PREFIX):]
        try:
            parsed = json.loads(zlib.decompress(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))))
        except (binascii.Error, zlib.error, ValueError):
            raise foreign from None
        nodes = parsed.get("nodes") if isinstance(parsed, dict) else None
        boundary = parsed.get("boundary") if isinstance(parsed, dict) else None
        if not isinstance(nodes, dict) or not all(isinstance(k, str) and (v is None or isinstance(v, str))
                                                  for k, v in nodes.items()):
            raise foreign
        if boundary is not None and not (isinstance(boundary, list) and len(boundary) == 2
                                         and all(isinstance(b, str) for b in boundary)):
            raise foreign
        made_for = parsed.get("listing", "/v2/sandboxes")
        if made_for != listing:
            raise ValueError(f"it was made for GET {made_for}, not GET {listing}")
        if parsed.get("order") != order:
            raise ValueError(f"it was made for order={parsed.get('order')}, not order={order}: keep the order "
                             "while paging")
        return cls(order, nodes, (boundary[0], boundary[1]) if boundary else None, listing)


def sandbox_key(item: Any) -> tuple[str, str]:
    if not isinstance(item, dict):
        return "", ""
    return str(item.get("startedAt", "")), str(item.get("sandboxID", ""))


def no_key(item: Any) -> tuple[str, str]:
    return "", ""


def snapshot_key(item: Any) -> tuple[str, str]:
    return "", str(item.get("snapshotID", "")) if isinstance(item, dict) else ""


@dataclass(frozen=True)
class E2bListing:
    """One of E2B's paged listings, as the router walks it across the nodes: its ``path``,
    the ``key`` that names an item (and, ``by_start_time``, orders each node's listing:
    the pages are merged by it and ``order`` applies; otherwise the fleet's listing is each
    node's in turn, by node id)."""

    path: str
    key: Callable[[Any], tuple[str, str]]
    by_start_time: bool



SANDBOX_LISTING = E2bListing("/v2/sandboxes", sandbox_key, by_start_time=True)
SNAPSHOT_LISTING = E2bListing("/snapshots", snapshot_key, by_start_time=False)
"""E2B's ``GET /snapshots``: a snapshot says nothing of when it was taken (``snapshotID``,
``names``), and each node lists its own in the order they were taken."""


def merge_pages(pages: dict[str, list[Any]], limit: int, *, ascending: bool,
                key: Callable[[Any], tuple[str, str]] = sandbox_key) -> tuple[list[tuple[str, Any]], dict[str, int]]:
    """Merges each node's page of E2B's listing (each in its node's own order, by ``key``:
    start time) into one of at most ``limit`` items, newest first (oldest first if
    ``ascending``): ``(node, item)`` pairs, and how many items of each node's page were
    taken. Only the head of each node's page is ever taken, so what is taken of a node is a
    prefix of its page, and the next page goes on from where it ended. Ties go to the node
    whose id sorts first (so a constant ``key``, ascending, lists node after node)."""
    heads = dict.fromkeys(pages, 0)
    out: list[tuple[str, Any]] = []
    order = sorted(pages)
    while len(out) < limit:
        best: str | None = None
        best_key = ("", "")
        for node in order:
            i = heads[node]
            if i >= len(pages[node]):
                continue
            item_key = key(pages[node][i])
            if best is None or (item_key < best_key if ascending else item_key > best_key):
                best, best_key = node, item_key
        if best is None:
            break
        out.append((best, pages[best][heads[best]]))
        heads[best] += 1
    return out, heads


@dataclass
class Page:
    """A page of E2B's listing through the router: its ``(node, item)`` pairs, where the walk
    goes on, and whether any node has more."""

    items: list[tuple[str, Any]]
    after: Cursor
    more: bool



class Listings(ForwardingRouter):
    """Answers the listings of the whole fleet."""

    async def _list(self, req: Request, *, e2b: bool) -> None:
        if e2b and req.path == SANDBOX_LISTING.path:
            await self._e2b_page(req, SANDBOX_LISTING)
            return
        views = sorted((v for v in self.nodes.values() if v.routable), key=lambda v: v.node_id)
        auth = [("Accept", "application/json")]

        async def one(v: NodeView) -> tuple[NodeView, int, bytes, str | None]:
            try:
                status, _, data = await self._call(v, "GET", req.target, headers=auth)
                return v, status, data, None
            except (OSError, HttpError, TimeoutError, asyncio.IncompleteReadError) as e:
                if not isinstance(e, TimeoutError):
                    v.mark_unreachable(describe_error(e))
                return v, 0, b"", describe_error(e)

        answers = await asyncio.gather(*(one(v) for v in views))
        key: str | None = None
        first: dict[str, Any] = {}
        merged: list[Any] = []
        for v, status, data, _err in answers:
            if status == 0:
                continue
            if status != 200:
                await req.send(status, json_or_none(data) or {"code": "INTERNAL", "message": "bad node reply"})
                return
            got = json_or_none(data)
            items = got if isinstance(got, list) else None
            if isinstance(got, dict):
                first = first or got
                key = next((k for k, val in got.items() if isinstance(val, list)), None)
                items = got[key] if key else None
            for item in items or []:
                if isinstance(item, dict):
                    item["node"] = v.node_id
                merged.append(item)
        down = [v for v in self.nodes.values() if v.lost_reason() is not None]
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(req.target).query)
        if req.path == "/v1/sandboxes" and query.get("state", ["lost"])[0] == "lost":
            for v in down:
                # What the store recorded on the node (every router's creates), or without a
                # store what this router last knew it held.
                held = ([k.split("/", 2)[2] for k in await self._kv(self.store.keys, f"n/{v.node_id}/")]
                        if self.store is not None else sorted(v.held()))
                for sid in held:
                    merged.append({"id": sid, "state": "lost", "node": v.node_id, "reason": v.lost_reason(),
                                   "labels": {}})
            # Those a node came back without: lost, with why (the node may list them lost
            # itself, its earlier server's; the router's reason says more).
            listed = {i["id"]: i for i in merged if isinstance(i, dict) and isinstance(i.get("id"), str)}
            for sid, (node, reason) in (await self._buried()).items():
                if sid in listed:
                    listed[sid].update(state="lost", reason=reason)
                else:
                    merged.append({"id": sid, "state": "lost", "node": node, "reason": reason, "labels": {}})
        if e2b:
            merged.sort(key=lambda s: s.get("startedAt", "") if isinstance(s, dict) else "",
                        reverse=query.get("order", ["desc"])[0] != "asc")
            limit = query.get("limit", [""])[0]
            if limit.isdigit():
                merged = merged[: int(limit)]
            await req.send(200, merged)
            return
        nodes = [{"node_id": v.node_id, "state": "up" if v.lost_reason() is None else v.state,
                  "reason": v.lost_reason()} for v in sorted(self.nodes.values(), key=lambda v: v.node_id)]
        await req.send(200, {**first, key or req.parts[-1]: merged, "nodes": nodes})

    async def _e2b_page(self, req: Request, listing: E2bListing) -> None:
        """``GET /v2/sandboxes`` or ``GET /snapshots``, one page of every node's listing:
        each node is asked for a page from its position in the request's ``nextToken`` (the
        router's own :class:`Cursor`), the pages are merged (:func:`merge_pages`: by start
        time, or node after node), and the reply's ``x-next-token`` says where each node's
        listing goes on (:meth:`_e2b_page_once`)."""
        await req.drain_body()
        split = urllib.parse.urlsplit(req.target)
        query = urllib.parse.parse_qs(split.query)

        async def bad(message: str) -> None:
            await req.send(400, {"code": 400, "message": message})

        text = query.get("limit", [""])[0]
        if text and not (text.isdigit() and 1 <= int(text) <= E2B_PAGE):
            await bad(f"limit: a number from 1 to {E2B_PAGE}, got {text!r}")
            return
        # A listing not by start time has one order: each node's, node after node.
        order = (query.get("order", [""])[0] or "desc") if listing.by_start_time else "asc"
        if order not in ("asc", "desc"):
            await bad(f"order: \"asc\" or \"desc\", got {order!r}")
            return
        token = query.get("nextToken", [""])[0]
        try:
            cursor = (Cursor.decode(token, order, listing.path) if token
                      else Cursor(order, listing=listing.path))
        except ValueError as e:
            await bad(f"nextToken: {e}")
            return
        # The request's filters as the client encoded them, without its paging.
        kept = [p for p in split.query.split("&") if p and p.split("=", 1)[0] not in ("limit", "nextToken")]
        for _ in range(PAGE_ATTEMPTS):
            made = await self._e2b_page_once(listing, cursor, kept, int(text) if text else E2B_PAGE)
            if isinstance(made, tuple):
                await req.send(*made)
                return
            if made is not None:
                for node, item in made.items:
                    if isinstance(item, dict):
                        item["node"] = node
                await req.send(200, [item for _, item in made.items],
                               headers=[("X-Next-Token", made.after.encode())] if made.more else [])
                return
        await req.send(503, {"code": 503, "message": "the fleet's listing kept changing while this page was made: "
                             "ask again"})

    async def _e2b_page_once(self, listing: E2bListing, cursor: Cursor, kept: list[str],
                             limit: int) -> Page | tuple[int, Any] | None:
        """One try at a page of E2B's ``listing`` from ``cursor``: a :class:`Page`;
        ``(status, body)`` for a node's refusal (a bad filter: every node says the same);
        ``None`` if a node's listing changed while the page was made (try again).

        A node's position is its own ``x-next-token`` (a key of its listing, so a sandbox
        made or deleted between pages neither repeats nor hides another): where the page
        ends within a node's page, the node is asked once more for exactly the part taken,
        and its ``x-next-token`` then names the last item taken. Of a node nothing was taken
        from yet, what sorts before the last item listed is left out (made after the walk
        began, as one server leaves it out; a listing not by start time has no such
        boundary: what a node adds goes at the end of its own listing)."""
        ascending = cursor.order == "asc"
        views = sorted((v for v in self.nodes.values()
                        if v.routable and cursor.nodes.get(v.node_id, "") is not None), key=lambda v: v.node_id)

        async def one(v: NodeView, count: int) -> tuple[int, bytes, list[Any], str | None]:
            at = cursor.nodes.get(v.node_id) or ""
            params = [*kept, f"limit={count}"] + ([f"nextToken={urllib.parse.quote(at, safe='')}"] if at else [])
            try:
                status, head, data = await self._call(v, "GET", f"{listing.path}?" + "&".join(params),
                                                      headers=[("Accept", "application/json")])
            except (OSError, HttpError, TimeoutError, asyncio.IncompleteReadError) as e:
                if not isinstance(e, TimeoutError):
                    v.mark_unreachable(describe_error(e))
                return 0, b"", [], None  # left out of this page; its position stays
            items = json_or_none(data) if status == 200 else None
            return status, data, items if isinstance(items, list) else [], head.get("x-next-token") or None

        def listed_already(node: str, item: Any) -> bool:
            if cursor.boundary is None or cursor.nodes.get(node):
                return False
            key = listing.key(item)
            return key >= cursor.boundary if not ascending else key <= cursor.boundary

        answers = dict(zip((v.node_id for v in views), await asyncio.gather(*(one(v, limit) for v in views)),
                           strict=True))
        for status, data, _, _ in answers.values():
            if status not in (0, 200):
                return status, json_or_none(data) or {"code": status, "message": "bad node reply"}
        asked = {n: a[2] for n, a in answers.items() if a[0] == 200}
        fresh = {n: [i for i, item in enumerate(items) if not listed_already(n, item)] for n, items in asked.items()}
        page, taken = merge_pages({n: [asked[n][i] for i in idx] for n, idx in fresh.items()}, limit,
                                  ascending=ascending, key=listing.key if listing.by_start_time else no_key)
        boundary = (listing.key(page[-1][1]) if page else cursor.boundary) if listing.by_start_time else None
        after = Cursor(cursor.order, {**cursor.nodes, **{n: cursor.nodes.get(n, "") for n in asked}}, boundary,
                       listing.path)
        for node, items in asked.items():
            j = taken[node]
            if not j:
                if not fresh[node]:  # all of its page was listed already: past it
                    after.nodes[node] = answers[node][3]
                continue  # else nothing taken: its position stays
            upto = fresh[node][j - 1] + 1  # the prefix of the node's page now listed
            if upto == len(items):
                after.nodes[node] = answers[node][3]  # None: nothing more on this node
                continue
            status, _, again, key = await one(self.nodes[node], upto)
            if status != 200 or key is None or len(again) != upto or listing.key(again[-1]) != listing.key(
                    items[upto - 1]):
                return None
            after.nodes[node] = key
        return Page(page, after, any(after.nodes.get(n) is not None for n in asked))
