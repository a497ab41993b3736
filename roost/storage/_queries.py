"""Narrow queries that the other rooms used to write as SQL of their own (issue 12, "sealed rooms").

Plain functions of a connection, like the data modules beside them: writers run inside a write
transaction (:meth:`StoreWriter.submit` or :meth:`Store.transaction`), readers on a read
connection (:meth:`Store.read`). Grouped by table.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from roost._json import dumps, loads
from roost.model import Thread

from ._rows import utc_now
from ._threads import THREADS

__all__ = [
    "read_snapshot",
    "queued_worker_roots",
    "mark_worker_delivered",
    "first_user_text",
    "latest_run_status",
    "count_turns",
    "chat_ids_with_title",
    "page_threads",
    "chat_threads_with_cwd",
    "adopt_schedule_run",
    "schedule_run_status",
    "memory_value",
    "memory_scope_counts",
    "delete_memory_prefix",
    "scope_has_memory",
]


# -- workers -------------------------------------------------------------------------------------


def queued_worker_roots(conn: sqlite3.Connection) -> list[str]:
    """Return the root thread ids that have queued worker spawns (read-only), each once."""
    return [str(r[0]) for r in conn.execute("SELECT DISTINCT root_thread_id FROM workers WHERE status = 'queued'")]


def mark_worker_delivered(conn: sqlite3.Connection, worker_id: str) -> bool:
    """Set ``delivered`` in a worker's ``result`` JSON once (write).

    Returns:
        True when this call marked it; False when it was already delivered.
    """
    row = conn.execute("SELECT result FROM workers WHERE id = ?", (worker_id,)).fetchone()
    data = loads(row[0]) if row and row[0] else {}
    if data.get("delivered"):
        return False
    data["delivered"] = True
    conn.execute(
        "UPDATE workers SET result = ?, updated_at = ? WHERE id = ?", (dumps(data).decode(), utc_now(), worker_id)
    )
    return True


# -- threads, turns, items, runs -----------------------------------------------------------------


def first_user_text(conn: sqlite3.Connection, thread_id: str) -> str:
    """Return the text of a thread's first user message, or "" (read-only)."""
    row = conn.execute(
        "SELECT text FROM items WHERE thread_id = ? AND type = 'user_message' ORDER BY seq LIMIT 1", (thread_id,)
    ).fetchone()
    return str(row[0] or "") if row else ""


def latest_run_status(conn: sqlite3.Connection, thread_id: str) -> str | None:
    """Return the status of a thread's latest run (by start time), or None without runs (read-only)."""
    row = conn.execute(
        "SELECT status FROM runs WHERE thread_id = ? ORDER BY started_at DESC, rowid DESC LIMIT 1", (thread_id,)
    ).fetchone()
    return str(row[0]) if row else None


def count_turns(conn: sqlite3.Connection, thread_id: str) -> int:
    """Return how many turns a thread has (read-only)."""
    return int(conn.execute("SELECT COUNT(*) FROM turns WHERE thread_id = ?", (thread_id,)).fetchone()[0])


def chat_ids_with_title(conn: sqlite3.Connection, needle: str, *, limit: int) -> list[str]:
    """Return ids of chat threads whose title contains ``needle`` (case-insensitive), most
    recently updated first, at most ``limit`` (read-only)."""
    rows = conn.execute(
        "SELECT id FROM threads WHERE kind = 'chat' AND title IS NOT NULL "
        "AND instr(lower(title), ?) > 0 ORDER BY updated_at DESC LIMIT ?",
        (needle.lower(), limit),
    )
    return [str(r[0]) for r in rows]


def page_threads(
    conn: sqlite3.Connection,
    *,
    archived: bool | None,
    kind: str | None,
    before: tuple[str, str] | None,
    limit: int | None,
) -> list[Thread]:
    """Return threads newest first (``updated_at``, then id, descending), at most ``limit`` (None:
    all), optionally only those ``archived`` (or not), of ``kind``, and strictly before the cursor
    ``before`` = ``(updated_at, id)`` of the last thread of the previous page (read-only)."""
    where: list[str] = ["1"]
    args: list[Any] = []
    if archived is not None:
        where.append("archived = ?")
        args.append(int(archived))
    if kind is not None:
        where.append("kind = ?")
        args.append(kind)
    if before is not None:
        updated, tid = before
        where.append("(updated_at < ? OR (updated_at = ? AND id < ?))")
        args += [updated, updated, tid]
    return THREADS.select(conn, " AND ".join(where), args, order="updated_at DESC, id DESC", limit=limit)


def chat_threads_with_cwd(conn: sqlite3.Connection) -> list[Thread]:
    """Return the visible (unarchived) chat threads that have a cwd, newest first (read-only)."""
    return THREADS.select(
        conn, "archived = 0 AND kind = 'chat' AND cwd IS NOT NULL", (), order="updated_at DESC, id DESC"
    )


# -- schedule runs -------------------------------------------------------------------------------


def adopt_schedule_run(conn: sqlite3.Connection, run_id: str, owner: str) -> None:
    """Make ``owner`` the owner of a schedule run record (write)."""
    conn.execute("UPDATE schedule_runs SET owner = ? WHERE id = ?", (owner, run_id))


def schedule_run_status(conn: sqlite3.Connection, run_id: str) -> str | None:
    """Return a schedule run record's status, or None when there is no such record (read-only)."""
    row = conn.execute("SELECT status FROM schedule_runs WHERE id = ?", (run_id,)).fetchone()
    return None if row is None else str(row[0])


# -- memory --------------------------------------------------------------------------------------


def memory_value(conn: sqlite3.Connection, scope: str, key: str) -> tuple[bool, Any]:
    """Return ``(exists, value)`` of the entry under (scope, key); value None when absent or null (read-only)."""
    row = conn.execute("SELECT value FROM memory WHERE scope = ? AND key = ?", (scope, key)).fetchone()
    if row is None:
        return False, None
    return True, (loads(row[0]) if row[0] else None)


def memory_scope_counts(conn: sqlite3.Connection, prefix: str) -> list[tuple[str, int]]:
    """Return ``(rest of the scope after prefix, entry count)`` for each scope starting with
    ``prefix``, ordered by scope (read-only)."""
    rows = conn.execute(
        "SELECT substr(scope, ?), COUNT(*) FROM memory WHERE substr(scope, 1, ?) = ? GROUP BY scope ORDER BY scope",
        (len(prefix) + 1, len(prefix), prefix),
    ).fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


def delete_memory_prefix(conn: sqlite3.Connection, scope: str, key_prefix: str) -> int:
    """Delete a scope's entries whose key starts with ``key_prefix`` (write); returns how many."""
    return int(
        conn.execute(
            "DELETE FROM memory WHERE scope = ? AND substr(key, 1, ?) = ?", (scope, len(key_prefix), key_prefix)
        ).rowcount
    )


def scope_has_memory(conn: sqlite3.Connection, scope: str) -> bool:
    """Return whether a scope has at least one entry (read-only)."""
    return conn.execute("SELECT 1 FROM memory WHERE scope = ? LIMIT 1", (scope,)).fetchone() is not None


@contextmanager
def read_snapshot(conn: Any) -> Iterator[Any]:
    """Run the block's reads on ``conn`` (a read connection, :meth:`Store.read`) in one
    transaction, so they see one consistent snapshot of the database (SQLite: a deferred read
    transaction; PostgreSQL: one transaction of its default isolation level).

    Yields:
        ``conn``.
    """
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        conn.execute("COMMIT")
