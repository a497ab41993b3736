"""Items (with their gap-free per-thread ``seq`` and full-text search) and held user input.

Writers run inside a write transaction (:meth:`StoreWriter.submit` or :meth:`Store.transaction`);
readers are read-only.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import attrs

from roost.errors import UsageError
from roost.model import HELD_INPUT_KINDS, HeldInput, Item, SearchHit

from ._blobs import externalize, hydrate
from ._rows import TableSpec, new_id, utc_now

__all__ = [
    "append_item",
    "get_item",
    "list_items",
    "update_item",
    "put_item",
    "discard_in_progress_item",
    "search_items",
    "add_held_input",
    "list_held_input",
    "update_held_input",
    "remove_held_input",
]

ITEMS = TableSpec("items", Item, json=frozenset({"payload"}))
HELD = TableSpec("held_input", HeldInput, json=frozenset({"payload"}), bools=frozenset({"held"}))


def append_item(
    conn: sqlite3.Connection,
    thread_id: str,
    *,
    type: str,
    payload: Any = None,
    text: str | None = None,
    turn_id: str | None = None,
    status: str = "completed",
    id: str | None = None,
) -> Item:
    """Append an item to a thread with the next ``seq`` (write).

    ``seq`` is ``max(seq) + 1`` of the thread, computed in the same statement as the insert. Inside
    a ``BEGIN IMMEDIATE`` transaction (the writer's, or :func:`immediate`) no other connection can
    write in between, so sequences are gap-free and unique (enforced by ``UNIQUE(thread_id, seq)``).

    Args:
        thread_id: the thread.
        type: item type (``user_message``, ``agent_message``, ``reasoning``, ``tool_call``...).
        payload: JSON-ready value.
        text: searchable text for the full-text index (``None``: not indexed).
        turn_id: the turn it belongs to.
        status: ``completed`` or a non-terminal status for a checkpointed partial item.
        id: the item id (default: a fresh ``item_...``).

    Returns:
        The stored item, with ``seq`` and ``created_at``.

    Raises:
        Conflict: (through the writer) no such thread or a duplicate id.
    """
    item_id = id or new_id("item")
    created_at = utc_now()
    row = conn.execute(
        """INSERT INTO items (id, thread_id, turn_id, seq, type, status, payload, text, created_at)
           VALUES (?, ?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM items WHERE thread_id = ?),
                   ?, ?, ?, ?, ?)
           RETURNING seq""",
        (
            item_id,
            thread_id,
            turn_id,
            thread_id,
            type,
            status,
            ITEMS.encode({"payload": externalize(conn, payload)})["payload"],
            text,
            created_at,
        ),
    ).fetchone()
    return Item(
        id=item_id,
        thread_id=thread_id,
        seq=row[0],
        type=type,
        turn_id=turn_id,
        status=status,
        payload=payload,
        text=text,
        created_at=created_at,
    )


def put_item(
    conn: sqlite3.Connection,
    thread_id: str,
    *,
    id: str,
    type: str,
    payload: Any = None,
    text: str | None = None,
    turn_id: str | None = None,
    status: str = "completed",
    only_in_progress: bool = False,
) -> Item | None:
    """Store item ``id``: append it (next ``seq``, as :func:`append_item`) or, when it exists,
    replace its ``payload``, ``text`` and ``status`` (its ``seq`` stays) (write).

    Used for items written more than once while they stream (checkpoints of agent text and
    reasoning, DESIGN.md "streamed text is checkpointed") and for their final write, which may
    reach the writer before a checkpoint queued earlier (an urgent end of an interrupted turn).

    Args:
        only_in_progress: a checkpoint: an existing row is changed only while its status is still
            ``in_progress`` (a settled item is never reopened by a late checkpoint).

    Returns:
        The stored item, or None when ``only_in_progress`` left a settled row unchanged.
    """
    guard = " WHERE items.status = 'in_progress'" if only_in_progress else ""
    created_at = utc_now()
    row = conn.execute(
        f"""INSERT INTO items (id, thread_id, turn_id, seq, type, status, payload, text, created_at)
            VALUES (?, ?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM items WHERE thread_id = ?),
                    ?, ?, ?, ?, ?)
            ON CONFLICT(id) DO UPDATE SET payload = excluded.payload, text = excluded.text,
                                          status = excluded.status{guard}
            RETURNING seq, created_at""",
        (
            id,
            thread_id,
            turn_id,
            thread_id,
            type,
            status,
            ITEMS.encode({"payload": payload})["payload"],
            text,
            created_at,
        ),
    ).fetchone()
    if row is None:
        return None
    return Item(
        id=id,
        thread_id=thread_id,
        seq=row[0],
        type=type,
        turn_id=turn_id,
        status=status,
        payload=payload,
        text=text,
        created_at=row[1],
    )


def discard_in_progress_item(conn: sqlite3.Connection, item_id: str) -> bool:
    """Delete item ``item_id`` while it is still ``in_progress`` (write); a settled item is kept.

    For the checkpoint of an item its turn retracted (``item/removed``: a model stream retried
    from its beginning after partial output, app-server-protocol.md "Notifications"). The item is
    the newest of its thread when it streams, so its thread's ``seq`` normally stays gap-free.

    Returns:
        Whether a row was deleted.
    """
    cur = conn.execute("DELETE FROM items WHERE id = ? AND status = 'in_progress'", (item_id,))
    return cur.rowcount > 0


def get_item(conn: sqlite3.Connection, item_id: str) -> Item:
    """Return one item (read-only). Raises NotFound."""
    return _hydrated(conn, ITEMS.get(conn, item_id))


def _hydrated(conn: sqlite3.Connection, item: Item) -> Item:
    """``item`` with its image references' bytes read back (roost/storage/_blobs.py)."""
    payload = hydrate(conn, item.payload)
    return item if payload is item.payload else attrs.evolve(item, payload=payload)


def list_items(
    conn: sqlite3.Connection,
    thread_id: str,
    *,
    after_seq: int = 0,
    limit: int | None = None,
    turn_id: str | None = None,
) -> list[Item]:
    """Return a thread's items with ``seq > after_seq``, in ``seq`` order (read-only)."""
    if turn_id is None:
        items = ITEMS.select(conn, "thread_id = ? AND seq > ?", (thread_id, after_seq), order="seq", limit=limit)
    else:
        items = ITEMS.select(
            conn, "thread_id = ? AND seq > ? AND turn_id = ?", (thread_id, after_seq, turn_id), order="seq", limit=limit
        )
    return [_hydrated(conn, item) for item in items]


def update_item(conn: sqlite3.Connection, item_id: str, **changes: Any) -> Item:
    """Change an item's ``status``, ``payload`` or ``text`` (write; checkpoints of streamed items).

    Raises NotFound; UsageError for ``seq``/``thread_id`` (immutable).
    """
    if {"seq", "thread_id"} & set(changes):
        raise UsageError("an item's seq and thread_id never change")
    if "payload" in changes:
        changes["payload"] = externalize(conn, changes["payload"])
    return _hydrated(conn, ITEMS.update(conn, item_id, changes))


def search_items(
    conn: sqlite3.Connection, query: str, *, thread_id: str | None = None, limit: int = 20
) -> list[SearchHit]:
    """Full-text search (SQLite FTS5) over item text, best match first (read-only).

    Args:
        query: words to find; each is quoted, so FTS5 operators in user input are literal.
        thread_id: search only this thread.
        limit: at most this many hits.
    """
    words = [w.replace('"', '""') for w in query.split()]
    if not words:
        return []
    match = " ".join(f'"{w}"' for w in words)
    sql = """SELECT items.thread_id, items.id, items.seq,
                    snippet(items_fts, 0, '[', ']', '…', 12) AS snip
             FROM items_fts JOIN items ON items.rowid = items_fts.rowid
             WHERE items_fts MATCH ?"""
    params: list[Any] = [match]
    if thread_id is not None:
        sql += " AND items.thread_id = ?"
        params.append(thread_id)
    sql += " ORDER BY rank LIMIT ?"
    params.append(limit)
    return [SearchHit(thread_id=r[0], item_id=r[1], seq=r[2], snippet=r[3]) for r in conn.execute(sql, params)]


def add_held_input(
    conn: sqlite3.Connection,
    thread_id: str,
    *,
    kind: str = "queue",
    payload: Any = None,
    held: bool = False,
    client_id: str | None = None,
    id: str | None = None,
) -> tuple[HeldInput, bool]:
    """Accept user input for a thread at the end of its pending list (write; idempotent).

    Args:
        kind: ``steer`` or ``queue``.
        held: ``True`` to persist it as held work that is not dispatched automatically.
        client_id: idempotency key: a retry with the same (thread, client_id) returns the first row.

    Returns:
        ``(row, created)``: ``created`` is ``False`` when ``client_id`` matched an existing row.

    Raises:
        UsageError: unknown kind.
    """
    if kind not in HELD_INPUT_KINDS:
        raise UsageError(f"held input kind must be one of {HELD_INPUT_KINDS}, not {kind!r}")
    if client_id is not None:
        rows = HELD.select(conn, "thread_id = ? AND client_id = ?", (thread_id, client_id), order="position")
        if rows:
            return rows[0], False
    position = conn.execute(
        "SELECT COALESCE(MAX(position), 0) + 1 FROM held_input WHERE thread_id = ?", (thread_id,)
    ).fetchone()[0]
    row = HeldInput(
        id=id or new_id("input"),
        thread_id=thread_id,
        position=position,
        kind=kind,
        payload=payload,
        held=held,
        client_id=client_id,
        created_at=utc_now(),
    )
    return HELD.insert(conn, row), True


def list_held_input(conn: sqlite3.Connection, thread_id: str, *, held: bool | None = None) -> list[HeldInput]:
    """Return a thread's pending/held input in position order (read-only)."""
    if held is None:
        return HELD.select(conn, "thread_id = ?", (thread_id,), order="position")
    return HELD.select(conn, "thread_id = ? AND held = ?", (thread_id, int(held)), order="position")


def update_held_input(conn: sqlite3.Connection, input_id: str, **changes: Any) -> HeldInput:
    """Change ``payload``, ``kind`` or ``held`` of one input (write). Raises NotFound."""
    if "kind" in changes and changes["kind"] not in HELD_INPUT_KINDS:
        raise UsageError(f"held input kind must be one of {HELD_INPUT_KINDS}")
    return HELD.update(conn, input_id, changes)


def remove_held_input(conn: sqlite3.Connection, input_id: str) -> None:
    """Remove one input (consumed, dequeued or withdrawn) (write). Raises NotFound."""
    HELD.delete(conn, input_id)
