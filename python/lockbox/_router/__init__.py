"""The fleet's router: one HTTP address for every node's ``lockbox serve`` (issue 31, items
2, 3 and the routing part of 5). See :func:`lockbox.fleet.router` and docs/fleet.md.

A byte-level HTTP/1.1 proxy on asyncio (standard library only): each request head is parsed,
the node that owns the call is picked (by the sandbox id in the path, or E2B's
``E2b-Sandbox-Id`` header), the head is forwarded with the node's token in place of the
fleet's, and the body and the reply are streamed through as they come (chunked replies chunk
by chunk, so SSE events are not held back; a ``101 Switching Protocols`` reply turns the
connection into a byte pipe both ways, so WebSockets pass). Only creates and listings are
read whole: a create to choose its node (power of K choices over the nodes' load) and to
record the new sandbox's node, a listing to merge every node's.

Brief overview: :class:`Router` (``router``) is the whole router, made of one part per
concept, each a mixin of ``forwarding.ForwardingRouter`` (the shared state, and forwarding a
call to one node):

- ``wire``: HTTP/1.1 heads, body framing, the router's replies, a client's request;
- ``placement``: :class:`NodeView` and :func:`place` (standard library only: the placement
  benchmark loads it by path);
- ``store``: :class:`Store`, the placements, over Ray's GCS (:class:`RayStore`) or
  PostgreSQL (``pg_store``: :class:`PgStore`);
- ``node_watch``: the fleet's listing, probes, and a node that comes back checked for what it
  still holds (:meth:`Router._reconcile`);
- ``by_id``: calls on one sandbox, snapshot, branch, transaction or run;
- ``creates``: placing and recording new sandboxes;
- ``snapshot_copies``: snapshots forked on other nodes, copied there first;
- ``templates``: E2B's template builds, on the template's node;
- ``image_copies``: creates of an image one node made (a template, a committed image), where
  it is or where it is copied first;
- ``listings``: merged listings, E2B's paged across the nodes (:class:`Cursor`,
  :func:`merge_pages`);
- ``ports``: exposed ports on their own origins;
- ``console``: the console's login with the fleet's token;
- ``mcp``: MCP's tool calls;
- ``tokens``: scoped tokens, each bound to one node.

- ``dns_nodes``: :class:`DnsNodes`, the fleet's nodes from a DNS name (Kubernetes), for a
  router without Ray.

Not here: starting routers and nodes (``lockbox.fleet``), anything a node's server decides.

Placements (sandbox or snapshot id -> node) live in Ray's GCS key-value store, in the
namespace ``lockbox-fleet:NAMESPACE`` (or, for routers without Ray, in PostgreSQL's table
``lockbox_fleet_placements`` under that namespace): ``c/UUID`` (a create's node, written before the create
is forwarded), ``p/ID`` (a sandbox's or snapshot's node, once the node answered),
``n/NODE/ID`` (the sandboxes of a node), ``g/NODE/ID`` (those a node came back without:
see :meth:`Router._reconcile`), ``h/SNAPSHOT/NODE`` (a snapshot copied to another node),
``s/HASH`` (console sessions), ``t/HASH`` and ``k/TOKEN_ID`` (scoped tokens: see
``tokens``), ``im/REFERENCE`` (an image a sandbox committed on a node), ``tc/TEMPLATE/NODE``
and ``ic/REFERENCE/NODE`` (a template or image copied to another node). Several routers share them; a router that restarts reads them
again.
"""

from .dns_nodes import DnsNodes
from .listings import Cursor, E2bListing, merge_pages
from .pg_store import PgStore
from .placement import K, NodeView, place
from .router import Router
from .store import RayStore, Store, StoreUnavailable

__all__ = ["Cursor", "DnsNodes", "E2bListing", "K", "NodeView", "PgStore", "RayStore", "Router", "Store", "StoreUnavailable",
           "merge_pages", "place"]
