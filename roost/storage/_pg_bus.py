"""The node bus on PostgreSQL: the contract of :mod:`roost.storage._bus`, plus a wake-up.

Same rows, same states (``pending -> claimed -> done``, ``pending -> cancelled``). Differences:

* **Clock.** Times default to the database's clock (``extract(epoch FROM now())``), so expiry and
  heartbeats compare on one clock across hosts; an explicit ``now`` overrides it (tests).
* **Claiming.** :func:`claim_messages` locks the rows it takes with ``FOR UPDATE SKIP LOCKED``
  (https://www.postgresql.org/docs/15/sql-select.html#SQL-FOR-UPDATE-SHARE): two claimers of one
  target never get the same row and never wait on each other.
* **Wake-up.** :func:`post_message` also sends ``NOTIFY roost_bus`` (``pg_notify``) with the payload
  ``"<target> <message id>"`` (ids only, far under the 8000-byte limit), delivered when the
  transaction commits (https://www.postgresql.org/docs/15/sql-notify.html). A receiver listens with
  :class:`PgBusListener`; the row is always read from the table, so a lost notification only
  delays a message until the receiver's next poll.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from ._bus import MESSAGE_COLUMNS, NODE_COLUMNS, BusMessage, BusNode, encode_body, message_from_row, node_from_row
from ._pg_connect import connect_pg, translate_pg_error
from ._rows import new_id

__all__ = [
    "CHANNEL",
    "PgBusListener",
    "register_bus_node",
    "heartbeat_bus_node",
    "remove_bus_node",
    "list_bus_nodes",
    "get_bus_node",
    "post_message",
    "has_pending_messages",
    "claim_messages",
    "ack_message",
    "cancel_message",
    "get_message",
    "prune_messages",
]

#: The LISTEN/NOTIFY channel of the bus.
CHANNEL = "roost_bus"
_NOW = "extract(epoch FROM now())::float8"


def _now(now: float | None) -> tuple[str, tuple]:
    """SQL for "now" and its parameters: the database clock, or an explicit ``now``."""
    return ("%s::float8", (now,)) if now is not None else (_NOW, ())


def register_bus_node(conn: psycopg.Connection, node_id: str, kind: str, *, now: float | None = None) -> None:
    """See :func:`roost.storage._bus.register_bus_node`."""
    at, args = _now(now)
    conn.execute(
        f"INSERT INTO bus_nodes (node_id, kind, started_at, heartbeat_at) VALUES (%s, %s, {at}, {at}) "
        "ON CONFLICT (node_id) DO UPDATE SET kind = excluded.kind, heartbeat_at = excluded.heartbeat_at",
        (node_id, kind, *args, *args),
    )


def heartbeat_bus_node(conn: psycopg.Connection, node_id: str, *, now: float | None = None) -> bool:
    """See :func:`roost.storage._bus.heartbeat_bus_node`."""
    at, args = _now(now)
    cur = conn.execute(f"UPDATE bus_nodes SET heartbeat_at = {at} WHERE node_id = %s", (*args, node_id))
    return cur.rowcount > 0


def remove_bus_node(conn: psycopg.Connection, node_id: str) -> None:
    """See :func:`roost.storage._bus.remove_bus_node`."""
    conn.execute("DELETE FROM bus_nodes WHERE node_id = %s", (node_id,))


def list_bus_nodes(conn: psycopg.Connection) -> list[BusNode]:
    """See :func:`roost.storage._bus.list_bus_nodes`."""
    rows = conn.execute(f"SELECT {NODE_COLUMNS} FROM bus_nodes ORDER BY started_at, node_id").fetchall()
    return [node_from_row(r) for r in rows]


def get_bus_node(conn: psycopg.Connection, node_id: str) -> BusNode | None:
    """See :func:`roost.storage._bus.get_bus_node`."""
    row = conn.execute(f"SELECT {NODE_COLUMNS} FROM bus_nodes WHERE node_id = %s", (node_id,)).fetchone()
    return None if row is None else node_from_row(row)


def post_message(
    conn: psycopg.Connection,
    *,
    target: str,
    sender: str,
    kind: str,
    body: Any,
    reply_to: str | None = None,
    ttl: float = 60.0,
    id: str | None = None,
    now: float | None = None,
) -> str:
    """See :func:`roost.storage._bus.post_message`; also notifies ``roost_bus`` (on commit)."""
    at, args = _now(now)
    message_id = id or new_id("msg")
    conn.execute(
        f"INSERT INTO bus_messages ({MESSAGE_COLUMNS}) "
        f"VALUES (%s, %s, %s, %s, %s, %s, 'pending', {at}, {at} + %s, NULL)",
        (message_id, target, sender, kind, encode_body(body), reply_to, *args, *args, ttl),
    )
    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{target} {message_id}"))
    return message_id


def has_pending_messages(conn: psycopg.Connection, target: str, *, now: float | None = None) -> bool:
    """See :func:`roost.storage._bus.has_pending_messages`."""
    at, args = _now(now)
    row = conn.execute(
        f"SELECT 1 FROM bus_messages WHERE target = %s AND status = 'pending' AND expires_at > {at} LIMIT 1",
        (target, *args),
    ).fetchone()
    return row is not None


def claim_messages(
    conn: psycopg.Connection, target: str, *, limit: int = 64, now: float | None = None
) -> list[BusMessage]:
    """See :func:`roost.storage._bus.claim_messages` (rows locked ``FOR UPDATE SKIP LOCKED``)."""
    at, args = _now(now)
    rows = conn.execute(
        f"UPDATE bus_messages SET status = 'claimed', claimed_at = {at} WHERE id IN ("
        f"SELECT id FROM bus_messages WHERE target = %s AND status = 'pending' AND expires_at > {at} "
        f"ORDER BY created_at, id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING {MESSAGE_COLUMNS}",
        (*args, target, *args, limit),
    ).fetchall()
    return sorted((message_from_row(r) for r in rows), key=lambda m: (m.created_at, m.id))


def ack_message(conn: psycopg.Connection, message_id: str) -> bool:
    """See :func:`roost.storage._bus.ack_message`."""
    cur = conn.execute("UPDATE bus_messages SET status = 'done' WHERE id = %s AND status = 'claimed'", (message_id,))
    return cur.rowcount > 0


def cancel_message(conn: psycopg.Connection, message_id: str) -> bool:
    """See :func:`roost.storage._bus.cancel_message`."""
    cur = conn.execute(
        "UPDATE bus_messages SET status = 'cancelled' WHERE id = %s AND status = 'pending'", (message_id,)
    )
    return cur.rowcount > 0


def get_message(conn: psycopg.Connection, message_id: str) -> BusMessage | None:
    """See :func:`roost.storage._bus.get_message`."""
    row = conn.execute(f"SELECT {MESSAGE_COLUMNS} FROM bus_messages WHERE id = %s", (message_id,)).fetchone()
    return None if row is None else message_from_row(row)


def prune_messages(conn: psycopg.Connection, *, keep: float = 300.0, now: float | None = None) -> int:
    """See :func:`roost.storage._bus.prune_messages`."""
    at, args = _now(now)
    cur = conn.execute(
        "DELETE FROM bus_messages WHERE (status IN ('done', 'cancelled') AND created_at < "
        f"{at} - %s) OR expires_at < {at} - %s",
        (*args, keep, *args, keep),
    )
    return cur.rowcount


class PgBusListener:
    """A dedicated connection that ``LISTEN``s on the bus channel for one node.

    :meth:`wait` blocks (run it in a worker thread) until a notification for ``node_id`` arrives
    or ``timeout`` passes. :meth:`close` is idempotent and safe while a :meth:`wait` runs in
    another thread (the waiting thread closes the connection when its wait returns).

    Raises (constructor, :meth:`wait`): DatabaseUnreachable and the other errors of
    :func:`roost.storage._pg_connect.translate_pg_error`.
    """

    def __init__(self, url: str, node_id: str) -> None:
        self.node_id = node_id
        self._url = url
        self._conn = connect_pg(url)
        self._lock = threading.Lock()
        self._closed = False
        self._conn.execute(f"LISTEN {CHANNEL}")

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a notification addressed to this node.

        Returns:
            True when one arrived (claim now), False on timeout or after :meth:`close`.
        """
        with self._lock:
            if self._closed:
                return False
            try:
                for note in self._conn.notifies(timeout=timeout):
                    if note.payload.split(" ", 1)[0] == self.node_id:
                        return True
                return False
            except psycopg.Error as exc:
                raise translate_pg_error(exc, self._url) from exc
            finally:
                if self._closed:
                    self._conn.close()

    def close(self) -> None:
        """Stop listening and close the connection (idempotent)."""
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._conn.close()
            finally:
                self._lock.release()
