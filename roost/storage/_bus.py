"""The node bus on SQLite: the processes (nodes) on one store and the messages between them.

Every process that serves clients on a store (``roost app-server``, ``roost serve``) is a *node*
named by its lease owner id (:func:`roost.storage.default_owner`). A message to another node is a
row of ``bus_messages``; the receiver claims its pending rows (``pending -> claimed``, in one
write, so each row is consumed exactly once), handles them and acknowledges (``claimed -> done``).
A sender that gives up cancels a row nobody claimed yet (``pending -> cancelled``), so a late
receiver never acts on it. Replies are messages too (``reply_to`` names the request).

Times are unix seconds (wall clock; PostgreSQL's functions use the database clock). Writers run in
a write transaction (the store's writer); readers on a read connection. The runtime side (wake-up,
dispatch, replies) is :class:`roost.actors.NodeBus`; the PostgreSQL twin is ``_pg_bus``.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import attrs

from roost._json import dumps, loads

from ._rows import new_id

__all__ = [
    "BusMessage",
    "BusNode",
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

#: Columns of ``bus_messages`` in :class:`BusMessage` order.
MESSAGE_COLUMNS = "id, target, sender, kind, body, reply_to, status, created_at, expires_at, claimed_at"
#: Columns of ``bus_nodes`` in :class:`BusNode` order.
NODE_COLUMNS = "node_id, kind, started_at, heartbeat_at"


@attrs.frozen(kw_only=True)
class BusMessage:
    """One message of the node bus.

    Attributes:
        id: ``msg_<hex>``.
        target: the receiving node's id. sender: the sending node's id.
        kind: what it is (the receiver's handler name, e.g. ``thread.input``, ``reply``).
        body: the JSON value it carries.
        reply_to: the id of the request this answers, or None.
        status: ``pending``, ``claimed``, ``done`` or ``cancelled``.
        created_at, expires_at, claimed_at: unix seconds (claimed_at None until claimed).
    """

    id: str
    target: str
    sender: str
    kind: str
    body: Any
    reply_to: str | None
    status: str
    created_at: float
    expires_at: float
    claimed_at: float | None


@attrs.frozen(kw_only=True)
class BusNode:
    """A node on the bus: its id (lease owner), ``kind`` (``app-server``, ``serve``), and unix seconds."""

    node_id: str
    kind: str
    started_at: float
    heartbeat_at: float


def message_from_row(row: Any) -> BusMessage:
    """A :class:`BusMessage` from a row of :data:`MESSAGE_COLUMNS`."""
    return BusMessage(
        id=row[0],
        target=row[1],
        sender=row[2],
        kind=row[3],
        body=loads(row[4]),
        reply_to=row[5],
        status=row[6],
        created_at=float(row[7]),
        expires_at=float(row[8]),
        claimed_at=None if row[9] is None else float(row[9]),
    )


def node_from_row(row: Any) -> BusNode:
    """A :class:`BusNode` from a row of :data:`NODE_COLUMNS`."""
    return BusNode(node_id=row[0], kind=row[1], started_at=float(row[2]), heartbeat_at=float(row[3]))


def encode_body(body: Any) -> str:
    """The stored text of a message body (JSON)."""
    return dumps(body).decode()


def register_bus_node(conn: sqlite3.Connection, node_id: str, kind: str, *, now: float | None = None) -> None:
    """Record (or refresh) node ``node_id`` of ``kind`` as started now (write)."""
    at = time.time() if now is None else now
    conn.execute(
        "INSERT INTO bus_nodes (node_id, kind, started_at, heartbeat_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (node_id) DO UPDATE SET kind = excluded.kind, heartbeat_at = excluded.heartbeat_at",
        (node_id, kind, at, at),
    )


def heartbeat_bus_node(conn: sqlite3.Connection, node_id: str, *, now: float | None = None) -> bool:
    """Mark ``node_id`` alive now (write). Returns False when it is not registered."""
    at = time.time() if now is None else now
    return conn.execute("UPDATE bus_nodes SET heartbeat_at = ? WHERE node_id = ?", (at, node_id)).rowcount > 0


def remove_bus_node(conn: sqlite3.Connection, node_id: str) -> None:
    """Forget ``node_id`` (write; its clean stop). Messages still addressed to it expire."""
    conn.execute("DELETE FROM bus_nodes WHERE node_id = ?", (node_id,))


def list_bus_nodes(conn: sqlite3.Connection) -> list[BusNode]:
    """Every registered node, oldest first (read-only)."""
    rows = conn.execute(f"SELECT {NODE_COLUMNS} FROM bus_nodes ORDER BY started_at, node_id").fetchall()
    return [node_from_row(r) for r in rows]


def get_bus_node(conn: sqlite3.Connection, node_id: str) -> BusNode | None:
    """Node ``node_id``, or None when it is not registered (read-only)."""
    row = conn.execute(f"SELECT {NODE_COLUMNS} FROM bus_nodes WHERE node_id = ?", (node_id,)).fetchone()
    return None if row is None else node_from_row(row)


def post_message(
    conn: sqlite3.Connection,
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
    """Add a pending message for ``target`` (write); return its id.

    Args:
        ttl: seconds the message may wait to be claimed; after that nobody claims it.
        id: the message id (default a fresh ``msg_<hex>``).
    """
    at = time.time() if now is None else now
    message_id = id or new_id("msg")
    conn.execute(
        f"INSERT INTO bus_messages ({MESSAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, NULL)",
        (message_id, target, sender, kind, encode_body(body), reply_to, at, at + ttl),
    )
    return message_id


def has_pending_messages(conn: sqlite3.Connection, target: str, *, now: float | None = None) -> bool:
    """Whether an unexpired pending message waits for ``target`` (read-only; the cheap poll)."""
    at = time.time() if now is None else now
    row = conn.execute(
        "SELECT 1 FROM bus_messages WHERE target = ? AND status = 'pending' AND expires_at > ? LIMIT 1",
        (target, at),
    ).fetchone()
    return row is not None


def claim_messages(
    conn: sqlite3.Connection, target: str, *, limit: int = 64, now: float | None = None
) -> list[BusMessage]:
    """Claim up to ``limit`` unexpired pending messages of ``target``, oldest first (write).

    Each row goes ``pending -> claimed`` in this transaction, so two claimers never get one row.
    """
    at = time.time() if now is None else now
    rows = conn.execute(
        f"UPDATE bus_messages SET status = 'claimed', claimed_at = ? WHERE id IN ("
        "SELECT id FROM bus_messages WHERE target = ? AND status = 'pending' AND expires_at > ? "
        f"ORDER BY created_at, id LIMIT ?) RETURNING {MESSAGE_COLUMNS}",
        (at, target, at, limit),
    ).fetchall()
    return sorted((message_from_row(r) for r in rows), key=lambda m: (m.created_at, m.id))


def ack_message(conn: sqlite3.Connection, message_id: str) -> bool:
    """Mark a claimed message handled (write). Returns False when it was not ``claimed``."""
    cur = conn.execute("UPDATE bus_messages SET status = 'done' WHERE id = ? AND status = 'claimed'", (message_id,))
    return cur.rowcount > 0


def cancel_message(conn: sqlite3.Connection, message_id: str) -> bool:
    """Withdraw a message nobody claimed yet (write). Returns True if it was ``pending`` (now
    ``cancelled``: it will never be handled), False if it was already claimed (or is gone)."""
    cur = conn.execute(
        "UPDATE bus_messages SET status = 'cancelled' WHERE id = ? AND status = 'pending'", (message_id,)
    )
    return cur.rowcount > 0


def get_message(conn: sqlite3.Connection, message_id: str) -> BusMessage | None:
    """Message ``message_id``, or None (read-only)."""
    row = conn.execute(f"SELECT {MESSAGE_COLUMNS} FROM bus_messages WHERE id = ?", (message_id,)).fetchone()
    return None if row is None else message_from_row(row)


def prune_messages(conn: sqlite3.Connection, *, keep: float = 300.0, now: float | None = None) -> int:
    """Delete messages handled or cancelled more than ``keep`` seconds after they were posted,
    and any message ``keep`` seconds past its expiry (write); return how many."""
    at = time.time() if now is None else now
    cur = conn.execute(
        "DELETE FROM bus_messages WHERE (status IN ('done', 'cancelled') AND created_at < ?) OR expires_at < ?",
        (at - keep, at - keep),
    )
    return cur.rowcount
