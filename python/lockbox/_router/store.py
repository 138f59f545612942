"""Placements (the keys are listed in ``lockbox._router``'s docstring) over a key-value
store: :class:`Store` records, forgets and buries them; :class:`RayStore` keeps them in Ray's
GCS, ``pg_store.PgStore`` in PostgreSQL (routers without Ray). And what a node's reply says
was made (:func:`made_ids`), which is what gets recorded."""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Iterable
from typing import Any


class StoreUnavailable(Exception):
    """The placement store did not answer (the router answers 503 ``STORE_UNAVAILABLE``)."""


class Store(abc.ABC):
    """What the router records, over four calls a key-value store gives (``get``, ``put``,
    ``delete``, ``keys`` by prefix), which each backend (:class:`RayStore`, ``PgStore``)
    defines. Blocking calls: the router runs them in a thread."""

    @abc.abstractmethod
    def get(self, key: str) -> dict[str, Any] | None:
        """The value at ``key``, if any."""

    @abc.abstractmethod
    def put(self, key: str, value: dict[str, Any]) -> None:
        """Sets ``key`` to ``value``."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Removes ``key`` (none is fine)."""

    @abc.abstractmethod
    def keys(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix``."""

    def record(self, node: str, sandboxes: Iterable[str], snapshots: Iterable[str] = ()) -> None:
        """Ids made on ``node``; sandboxes also under ``n/NODE/`` (what a lost node held)."""
        value = {"node": node, "at": time.time()}
        for i in sandboxes:
            self.put(f"p/{i}", value)
            self.put(f"n/{node}/{i}", value)
        for i in snapshots:
            self.put(f"p/{i}", value)

    def forget(self, i: str) -> None:
        got = self.get(f"p/{i}")
        if got:
            self.delete(f"n/{got['node']}/{i}")
            self.delete(f"g/{got['node']}/{i}")
        self.delete(f"p/{i}")

    def bury(self, node: str, sandboxes: Iterable[str], reason: str) -> None:
        """Sandboxes ``node`` came back without: ``p/ID`` says so (``gone``, the reason), and
        ``g/NODE/ID`` lists them (no longer under ``n/NODE/``, what the node holds)."""
        value = {"node": node, "at": time.time(), "gone": reason}
        for i in sandboxes:
            self.put(f"p/{i}", value)
            self.put(f"g/{node}/{i}", value)
            self.delete(f"n/{node}/{i}")


class RayStore(Store):
    """Placements in Ray's GCS key-value store, namespace ``lockbox-fleet:NAMESPACE``."""

    def __init__(self, namespace: str) -> None:
        from ray.experimental import internal_kv

        self.kv = internal_kv
        self.ns = f"lockbox-fleet:{namespace}".encode()

    def get(self, key: str) -> dict[str, Any] | None:
        raw = self.kv._internal_kv_get(key.encode(), namespace=self.ns)
        return json.loads(raw) if raw else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        self.kv._internal_kv_put(key.encode(), json.dumps(value).encode(), True, namespace=self.ns)

    def delete(self, key: str) -> None:
        self.kv._internal_kv_del(key.encode(), namespace=self.ns)

    def keys(self, prefix: str) -> list[str]:
        return [k.decode() for k in self.kv._internal_kv_list(prefix.encode(), namespace=self.ns)]


def made_ids(what: str, reply: Any) -> tuple[list[str], list[str]]:
    """The sandboxes and snapshots a reply says were made: ``create`` (a sandbox, lockbox's
    ``id`` or E2B's ``sandboxID``), ``snapshot`` (a snapshot's ``id``), ``e2b-snapshot``
    (E2B's ``snapshotID``), ``fork`` (its
    ``sandboxes``, and the ``snapshot`` it took, if any)."""
    if not isinstance(reply, dict):
        return [], []
    if what == "create":
        sid = reply.get("id", reply.get("sandboxID"))
        return ([sid] if isinstance(sid, str) else []), []
    if what == "snapshot":
        return [], ([reply["id"]] if isinstance(reply.get("id"), str) else [])
    if what == "e2b-snapshot":
        return [], ([reply["snapshotID"]] if isinstance(reply.get("snapshotID"), str) else [])
    snap = reply.get("snapshot")
    boxes = [b["id"] for b in reply.get("sandboxes") or [] if isinstance(b, dict) and isinstance(b.get("id"), str)]
    return boxes, ([snap["id"]] if isinstance(snap, dict) and isinstance(snap.get("id"), str) else [])
