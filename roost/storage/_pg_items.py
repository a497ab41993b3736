"""Items and held input on PostgreSQL: the functions of :mod:`roost.storage._items`, with the
same arguments, results and errors, on a ``psycopg.Connection``.

Gap-free ``seq`` (and held-input ``position``): SQLite gets it from its single write lock; here
an append takes a transaction-scoped advisory lock on its thread
(``pg_advisory_xact_lock``, https://www.postgresql.org/docs/15/functions-admin.html) before it
computes ``max + 1``, so appenders of one thread on any node serialise and those of different
threads do not. Full-text search uses the generated ``items.text_search`` column
(``to_tsvector('simple', text)``), ``plainto_tsquery`` (operators in user input are literal),
``ts_rank`` and ``ts_headline`` with ``[``/``]`` marks, like SQLite's snippet.
"""

from __future__ import annotations

from typing import Any

import attrs
import psycopg

from roost.errors import UsageError
from roost.model import HELD_INPUT_KINDS, HeldInput, Item, SearchHit

from . import _items
from ._blobs import externalize
from ._items import HELD, ITEMS, _hydrated
from ._pg_rows import PgTableSpec
from ._rows import new_id, utc_now

__all__ = [
    "append_item",
    "put_item",
    "get_item",
    "list_items",
    "update_item",
    "search_items",
    "add_held_input",
    "list_held_input",
    "update_held_input",
    "remove_held_input",
]

_ITEMS = PgTableSpec(ITEMS.table, Item, json=ITEMS.json)
_HELD = PgTableSpec(HELD.table, HeldInput, json=HELD.json, bools=HELD.bools)


def _lock_thread(conn: psycopg.Connection, what: str, thread_id: str) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"roost.{what}:{thread_id}",))


def append_item(
    conn: psycopg.Connection,
    thread_id: str,
    *,
    type: str,
    payload: Any = None,
    text: str | None = None,
    turn_id: str | None = None,
    status: str = "completed",
    id: str | None = None,
) -> Item:
    """Append an item with the thread's next ``seq`` (write); see :func:`roost.storage.append_item`.

    Raises:
        Conflict: no such thread, or a duplicate id.
    """
    item_id = id or new_id("item")
    created_at = utc_now()
    with conn.transaction():
        _lock_thread(conn, "items", thread_id)
        seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM items WHERE thread_id = %s", (thread_id,)).fetchone()
        assert seq is not None
        item = Item(
            id=item_id,
            thread_id=thread_id,
            seq=seq[0],
            type=type,
            turn_id=turn_id,
            status=status,
            payload=externalize(conn, payload),
            text=text,
            created_at=created_at,
        )
        _ITEMS.insert(conn, item)
        return attrs.evolve(item, payload=payload)


def put_item(conn: psycopg.Connection, thread_id: str, *, id: str, **fields: Any) -> Item | None:
    """Append or replace item ``id`` (write); see :func:`roost.storage.put_item` (the same
    statement, run under the thread's append lock so ``seq`` stays gap-free and unique)."""
    with conn.transaction():
        _lock_thread(conn, "items", thread_id)
        return _items.put_item(conn, thread_id, id=id, **fields)


def get_item(conn: psycopg.Connection, item_id: str) -> Item:
    """Return one item (its image references hydrated). Raises NotFound."""
    return _hydrated(conn, _ITEMS.get(conn, item_id))


def list_items(
    conn: psycopg.Connection,
    thread_id: str,
    *,
    after_seq: int = 0,
    limit: int | None = None,
    turn_id: str | None = None,
) -> list[Item]:
    """Return a thread's items with ``seq > after_seq``, in ``seq`` order."""
    if turn_id is None:
        items = _ITEMS.select(conn, "thread_id = %s AND seq > %s", (thread_id, after_seq), order="seq", limit=limit)
    else:
        where = "thread_id = %s AND seq > %s AND turn_id = %s"
        items = _ITEMS.select(conn, where, (thread_id, after_seq, turn_id), order="seq", limit=limit)
    return [_hydrated(conn, item) for item in items]


def update_item(conn: psycopg.Connection, item_id: str, **changes: Any) -> Item:
    """Change an item's ``status``, ``payload`` or ``text`` (write). Raises NotFound, UsageError."""
    if {"seq", "thread_id"} & set(changes):
        raise UsageError("an item's seq and thread_id never change")
    if "payload" in changes:
        changes["payload"] = externalize(conn, changes["payload"])
    return _hydrated(conn, _ITEMS.update(conn, item_id, changes))


def search_items(
    conn: psycopg.Connection, query: str, *, thread_id: str | None = None, limit: int = 20
) -> list[SearchHit]:
    """Full-text search over item text, best match first (see the module docstring)."""
    if not query.split():
        return []
    sql = """SELECT thread_id, id, seq,
                    ts_headline('simple', text, q, 'StartSel="[", StopSel="]", MaxWords=12, MinWords=3')
             FROM items, plainto_tsquery('simple', %s) AS q
             WHERE text_search @@ q"""
    params: list[Any] = [query]
    if thread_id is not None:
        sql += " AND thread_id = %s"
        params.append(thread_id)
    sql += " ORDER BY ts_rank(text_search, q) DESC, seq LIMIT %s"
    params.append(limit)
    rows = conn.execute(sql, params).fetchall()
    return [SearchHit(thread_id=r[0], item_id=r[1], seq=r[2], snippet=r[3]) for r in rows]


def add_held_input(
    conn: psycopg.Connection,
    thread_id: str,
    *,
    kind: str = "queue",
    payload: Any = None,
    held: bool = False,
    client_id: str | None = None,
    id: str | None = None,
) -> tuple[HeldInput, bool]:
    """Accept user input at the end of a thread's pending list (write; idempotent by
    ``client_id``); see :func:`roost.storage.add_held_input`. Raises UsageError (unknown kind)."""
    if kind not in HELD_INPUT_KINDS:
        raise UsageError(f"held input kind must be one of {HELD_INPUT_KINDS}, not {kind!r}")
    with conn.transaction():
        _lock_thread(conn, "held_input", thread_id)
        if client_id is not None:
            rows = _HELD.select(conn, "thread_id = %s AND client_id = %s", (thread_id, client_id), order="position")
            if rows:
                return rows[0], False
        position = conn.execute(
            "SELECT COALESCE(MAX(position), 0) + 1 FROM held_input WHERE thread_id = %s", (thread_id,)
        ).fetchone()
        assert position is not None
        row = HeldInput(
            id=id or new_id("input"),
            thread_id=thread_id,
            position=position[0],
            kind=kind,
            payload=payload,
            held=held,
            client_id=client_id,
            created_at=utc_now(),
        )
        return _HELD.insert(conn, row), True


def list_held_input(conn: psycopg.Connection, thread_id: str, *, held: bool | None = None) -> list[HeldInput]:
    """Return a thread's pending/held input in position order."""
    if held is None:
        return _HELD.select(conn, "thread_id = %s", (thread_id,), order="position")
    return _HELD.select(conn, "thread_id = %s AND held = %s", (thread_id, int(held)), order="position")


def update_held_input(conn: psycopg.Connection, input_id: str, **changes: Any) -> HeldInput:
    """Change ``payload``, ``kind`` or ``held`` of one input (write). Raises NotFound, UsageError."""
    if "kind" in changes and changes["kind"] not in HELD_INPUT_KINDS:
        raise UsageError(f"held input kind must be one of {HELD_INPUT_KINDS}")
    return _HELD.update(conn, input_id, changes)


def remove_held_input(conn: psycopg.Connection, input_id: str) -> None:
    """Remove one input (write). Raises NotFound."""
    _HELD.delete(conn, input_id)
