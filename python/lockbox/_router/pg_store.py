"""Placements in PostgreSQL (:class:`PgStore`), for routers that run without Ray (on
Kubernetes: ``python -m lockbox.fleet router --nodes-dns``). Several routers given the same
database and namespace share them, as routers on Ray share its GCS. Needs ``psycopg`` 3
(``pip install 'psycopg[binary]'``)."""

from __future__ import annotations

import threading
from typing import Any

from .store import Store, StoreUnavailable

TABLE = "lockbox_fleet_placements"
# COLLATE "C": a prefix LIKE can then use the primary key's index.
SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
  namespace text NOT NULL,
  key text COLLATE "C" NOT NULL,
  value jsonb NOT NULL,
  PRIMARY KEY (namespace, key)
)"""


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class PgStore(Store):
    """Placements in the table ``lockbox_fleet_placements`` of the database at ``url``
    (``postgres://USER@HOST:PORT/DB``; made if missing), under ``namespace``. One connection,
    shared by the router's threads; a dropped one is opened again once per call."""

    def __init__(self, url: str, namespace: str) -> None:
        try:
            import psycopg
        except ImportError as e:
            raise RuntimeError("a PostgreSQL placement store needs psycopg 3: pip install 'psycopg[binary]'") from e
        from psycopg.types.json import Jsonb

        self._psycopg, self._jsonb = psycopg, Jsonb
        self.url, self.namespace = url, namespace
        self._lock = threading.Lock()
        self._conn: Any = None
        with self._lock:
            try:
                self._connect().execute(SCHEMA)
            except psycopg.errors.UniqueViolation:
                pass  # another router made it at the same moment

    def _connect(self) -> Any:
        try:
            self._conn = self._psycopg.connect(self.url, autocommit=True, connect_timeout=5)
        except self._psycopg.Error as e:
            raise StoreUnavailable(f"PostgreSQL at {_redacted(self.url)}: {' '.join(str(e).split())}") from e
        return self._conn

    def _run(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        psycopg = self._psycopg
        with self._lock:
            for attempt in (1, 2):
                conn = self._conn if self._conn is not None and not self._conn.closed else self._connect()
                try:
                    cur = conn.execute(sql, args)
                    return cur.fetchall() if cur.description else []
                except psycopg.OperationalError as e:
                    self._conn = None  # the server restarted or the network dropped: once more
                    if attempt == 2:
                        raise StoreUnavailable(f"PostgreSQL at {_redacted(self.url)}: {' '.join(str(e).split())}") from e
            return []

    def get(self, key: str) -> dict[str, Any] | None:
        rows = self._run(f"SELECT value FROM {TABLE} WHERE namespace = %s AND key = %s", (self.namespace, key))
        return rows[0][0] if rows else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        self._run(f"INSERT INTO {TABLE} (namespace, key, value) VALUES (%s, %s, %s) "
                  "ON CONFLICT (namespace, key) DO UPDATE SET value = EXCLUDED.value",
                  (self.namespace, key, self._jsonb(value)))

    def delete(self, key: str) -> None:
        self._run(f"DELETE FROM {TABLE} WHERE namespace = %s AND key = %s", (self.namespace, key))

    def keys(self, prefix: str) -> list[str]:
        rows = self._run(f"SELECT key FROM {TABLE} WHERE namespace = %s AND key LIKE %s ESCAPE '\\' ORDER BY key",
                         (self.namespace, _like_prefix(prefix)))
        return [r[0] for r in rows]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _redacted(url: str) -> str:
    """``url`` without its password, for messages."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
