"""The node bus: the processes (nodes) on one store and the messages between them, on both backends.

Every process that serves clients on a store (``roost app-server``, ``roost serve``) is a *node*
named by its lease owner id (:func:`roost.storage.default_owner`). A message to another node is a
row of ``bus_messages``; the receiver claims its pending rows (``pending -> claimed``, in one
write, so each row is consumed exactly once), handles them and acknowledges (``claimed -> done``).
A sender that gives up cancels a row nobody claimed yet (``pending -> cancelled``), so a late
receiver never acts on it. Replies are messages too (``reply_to`` names the request).

One implementation serves SQLite and PostgreSQL (one statement text, :mod:`._portable`). What
differs is a small dialect:

* **Clock.** Times are unix seconds on the database's clock (:func:`._portable.now_sql`: SQLite's
  ``julianday('now')``, PostgreSQL's ``clock_timestamp()``), written and compared in SQL: heartbeats, expiry and
  a node's age never use a node's own clock (clocks of hosts differ). An explicit ``now`` overrides
  it (tests).
* **Order.** Messages are claimed oldest first: by ``created_at``, then (SQLite, whose clock steps
  in milliseconds) by insertion (``rowid``); PostgreSQL's clock (``clock_timestamp()``) advances
  between two inserts, also within one transaction.
* **Claiming.** On PostgreSQL :func:`claim_messages` locks the rows it takes ``FOR UPDATE SKIP
  LOCKED`` (https://www.postgresql.org/docs/15/sql-select.html#SQL-FOR-UPDATE-SHARE): two claimers
  of one target never get the same row and never wait on each other; SQLite's write lock
  serialises claimers.
* **Wake-up.** On PostgreSQL :func:`post_message` also sends ``NOTIFY roost_bus`` (``pg_notify``)
  with the payload ``"<target> <message id>"`` (ids only, far under the 8000-byte limit), delivered
  when the transaction commits (https://www.postgresql.org/docs/15/sql-notify.html); a receiver
  listens with :class:`roost.storage._pg_bus.PgBusListener`. SQLite nodes poll. The row is always
  read from the table, so a lost notification only delays a message until the next poll.

Writers run in a write transaction (the store's writer); readers on a read connection. The
runtime side (wake-up, dispatch, replies) is :class:`roost.actors.NodeBus`.
"""

from __future__ import annotations

from typing import Any

import attrs

from roost._json import dumps, loads

from ._portable import at_sql, execute, is_sqlite
from ._rows import new_id

#: The operations of the node bus (:class:`roost.storage.BusStore`), one function each below.
BUS_OPERATIONS = (
    "register_bus_node",
    "heartbeat_bus_node",
    "remove_bus_node",
    "list_bus_nodes",
    "get_bus_node",
    "prune_bus_nodes",
    "post_message",
    "has_pending_messages",
    "claim_messages",
    "ack_message",
    "cancel_message",
    "get_message",
    "prune_messages",
)

__all__ = ["BusMessage", "BusNode", "BusOperations", "BUS_OPERATIONS", "CHANNEL", *BUS_OPERATIONS]

#: The PostgreSQL LISTEN/NOTIFY channel of the bus.
CHANNEL = "roost_bus"
#: Columns of ``bus_messages`` in :class:`BusMessage` order.
MESSAGE_COLUMNS = "id, target, sender, kind, body, reply_to, status, created_at, expires_at, claimed_at"
#: Columns of ``bus_nodes`` in :class:`BusNode` order (the age is computed on the database clock).
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
    """A node on the bus: its id (lease owner), ``kind`` (``app-server``, ``serve``), its start and
    last heartbeat (unix seconds, database clock), and ``age``: seconds since that heartbeat on the
    database's clock when it was read (what liveness is judged on)."""

    node_id: str
    kind: str
    started_at: float
    heartbeat_at: float
    age: float


def _message(row: Any) -> BusMessage:
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


def _node(row: Any) -> BusNode:
    return BusNode(node_id=row[0], kind=row[1], started_at=float(row[2]), heartbeat_at=float(row[3]), age=float(row[4]))


def register_bus_node(conn: Any, node_id: str, kind: str, *, now: float | None = None) -> None:
    """Record (or refresh) node ``node_id`` of ``kind`` as started now (write)."""
    at, args = at_sql(conn, now)
    execute(
        conn,
        f"INSERT INTO bus_nodes (node_id, kind, started_at, heartbeat_at) VALUES (?, ?, {at}, {at}) "
        "ON CONFLICT (node_id) DO UPDATE SET kind = excluded.kind, heartbeat_at = excluded.heartbeat_at",
        (node_id, kind, *args, *args),
    )


def heartbeat_bus_node(conn: Any, node_id: str, *, now: float | None = None) -> bool:
    """Mark ``node_id`` alive now (write). Returns False when it is not registered."""
    at, args = at_sql(conn, now)
    cur = execute(conn, f"UPDATE bus_nodes SET heartbeat_at = {at} WHERE node_id = ?", (*args, node_id))
    return bool(cur.rowcount > 0)


def remove_bus_node(conn: Any, node_id: str) -> None:
    """Forget ``node_id`` (write; its clean stop). Messages still addressed to it expire."""
    execute(conn, "DELETE FROM bus_nodes WHERE node_id = ?", (node_id,))


def _select_nodes(conn: Any, where: str, params: tuple[Any, ...]) -> list[BusNode]:
    at, args = at_sql(conn, None)
    rows = execute(
        conn,
        f"SELECT {NODE_COLUMNS}, {at} - heartbeat_at FROM bus_nodes {where} ORDER BY started_at, node_id",
        (*args, *params),
    ).fetchall()
    return [_node(r) for r in rows]


def list_bus_nodes(conn: Any) -> list[BusNode]:
    """Every registered node, oldest first (read-only)."""
    return _select_nodes(conn, "", ())


def get_bus_node(conn: Any, node_id: str) -> BusNode | None:
    """Node ``node_id``, or None when it is not registered (read-only)."""
    nodes = _select_nodes(conn, "WHERE node_id = ?", (node_id,))
    return nodes[0] if nodes else None


def prune_bus_nodes(conn: Any, *, keep: float, now: float | None = None) -> int:
    """Delete the nodes whose last heartbeat is more than ``keep`` seconds old on the database clock
    (write; nodes that died without their clean stop); return how many. A pruned node is not alive,
    as it was not before; one that comes back registers again at its next heartbeat."""
    at, args = at_sql(conn, now)
    return int(execute(conn, f"DELETE FROM bus_nodes WHERE heartbeat_at < {at} - ?", (*args, keep)).rowcount)


def post_message(
    conn: Any,
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
    """Add a pending message for ``target`` (write); return its id. On PostgreSQL also notify
    :data:`CHANNEL` (delivered on commit).

    Args:
        ttl: seconds the message may wait to be claimed; after that nobody claims it.
        id: the message id (default a fresh ``msg_<hex>``).
    """
    at, args = at_sql(conn, now)
    message_id = id or new_id("msg")
    execute(
        conn,
        f"INSERT INTO bus_messages ({MESSAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, 'pending', {at}, {at} + ?, NULL)",
        (message_id, target, sender, kind, dumps(body).decode(), reply_to, *args, *args, ttl),
    )
    if not is_sqlite(conn):
        execute(conn, "SELECT pg_notify(?, ?)", (CHANNEL, f"{target} {message_id}"))
    return message_id


def has_pending_messages(conn: Any, target: str, *, now: float | None = None) -> bool:
    """Whether an unexpired pending message waits for ``target`` (read-only; the cheap poll)."""
    at, args = at_sql(conn, now)
    row = execute(
        conn,
        f"SELECT 1 FROM bus_messages WHERE target = ? AND status = 'pending' AND expires_at > {at} LIMIT 1",
        (target, *args),
    ).fetchone()
    return row is not None


def claim_messages(conn: Any, target: str, *, limit: int = 64, now: float | None = None) -> list[BusMessage]:
    """Claim up to ``limit`` unexpired pending messages of ``target``, oldest first (write).

    Each row goes ``pending -> claimed`` in this transaction, so two claimers never get one row
    (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; SQLite: its write lock).
    """
    at, args = at_sql(conn, now)
    # ties of created_at (SQLite's clock has millisecond steps) go by insertion: SQLite's rowid
    tie, lock = ("rowid", "") if is_sqlite(conn) else ("id", " FOR UPDATE SKIP LOCKED")
    rows = execute(
        conn,
        f"UPDATE bus_messages SET status = 'claimed', claimed_at = {at} WHERE id IN ("
        f"SELECT id FROM bus_messages WHERE target = ? AND status = 'pending' AND expires_at > {at} "
        f"ORDER BY created_at, {tie} LIMIT ?{lock}) RETURNING {MESSAGE_COLUMNS}, {tie}",
        (*args, target, *args, limit),
    ).fetchall()
    return [_message(r) for r in sorted(rows, key=lambda r: (float(r[7]), r[10]))]


def ack_message(conn: Any, message_id: str) -> bool:
    """Mark a claimed message handled (write). Returns False when it was not ``claimed``."""
    cur = execute(conn, "UPDATE bus_messages SET status = 'done' WHERE id = ? AND status = 'claimed'", (message_id,))
    return bool(cur.rowcount > 0)


def cancel_message(conn: Any, message_id: str) -> bool:
    """Withdraw a message nobody claimed yet (write). Returns True if it was ``pending`` (now
    ``cancelled``: it will never be handled), False if it was already claimed (or is gone)."""
    cur = execute(
        conn, "UPDATE bus_messages SET status = 'cancelled' WHERE id = ? AND status = 'pending'", (message_id,)
    )
    return bool(cur.rowcount > 0)


def get_message(conn: Any, message_id: str) -> BusMessage | None:
    """Message ``message_id``, or None (read-only)."""
    row = execute(conn, f"SELECT {MESSAGE_COLUMNS} FROM bus_messages WHERE id = ?", (message_id,)).fetchone()
    return None if row is None else _message(row)


def prune_messages(conn: Any, *, keep: float = 300.0, now: float | None = None) -> int:
    """Delete messages handled or cancelled more than ``keep`` seconds after they were posted,
    and any message ``keep`` seconds past its expiry (write); return how many."""
    at, args = at_sql(conn, now)
    cur = execute(
        conn,
        f"DELETE FROM bus_messages WHERE (status IN ('done', 'cancelled') AND created_at < {at} - ?)"
        f" OR expires_at < {at} - ?",
        (*args, keep, *args, keep),
    )
    return int(cur.rowcount)


class BusOperations:
    """The node bus operations as store methods (staticmethods: the connection comes first), for
    both :class:`roost.storage.Store` and :class:`roost.storage.PostgresStore`."""

    register_bus_node = staticmethod(register_bus_node)
    heartbeat_bus_node = staticmethod(heartbeat_bus_node)
    remove_bus_node = staticmethod(remove_bus_node)
    list_bus_nodes = staticmethod(list_bus_nodes)
    get_bus_node = staticmethod(get_bus_node)
    prune_bus_nodes = staticmethod(prune_bus_nodes)
    post_message = staticmethod(post_message)
    has_pending_messages = staticmethod(has_pending_messages)
    claim_messages = staticmethod(claim_messages)
    ack_message = staticmethod(ack_message)
    cancel_message = staticmethod(cancel_message)
    get_message = staticmethod(get_message)
    prune_messages = staticmethod(prune_messages)
