"""Threads, turns and runs on PostgreSQL: the functions of :mod:`roost.storage._threads`, with
the same arguments, results and errors, on a ``psycopg.Connection``.

Ordering: SQLite breaks ties of equal timestamps by ``rowid`` (insertion order); PostgreSQL has
none, so ties are broken by ``id`` here (timestamps have microseconds, so ties are rare).
"""

from __future__ import annotations

from typing import Any

import psycopg

from roost.errors import UsageError
from roost.model import THREAD_KINDS, Run, Thread, Turn

from ._pg_rows import PgTableSpec
from ._rows import new_id, utc_now
from ._threads import RUNS, THREADS, TURNS

__all__ = [
    "create_thread",
    "get_thread",
    "list_threads",
    "update_thread",
    "delete_thread",
    "create_turn",
    "get_turn",
    "list_turns",
    "update_turn",
    "create_run",
    "get_run",
    "list_runs",
    "update_run",
    "first_user_text",
    "latest_run_status",
    "count_turns",
    "chat_ids_with_title",
    "page_threads",
    "chat_threads_with_cwd",
]

_THREADS = PgTableSpec(THREADS.table, Thread, json=THREADS.json, bools=THREADS.bools, touch=THREADS.touch)
_TURNS = PgTableSpec(TURNS.table, Turn, json=TURNS.json)
_RUNS = PgTableSpec(RUNS.table, Run, json=RUNS.json)
_TERMINAL = ("completed", "interrupted", "failed")


def create_thread(conn: psycopg.Connection, *, kind: str = "chat", id: str | None = None, **fields: Any) -> Thread:
    """Insert a thread (write); see :func:`roost.storage.create_thread`. Raises UsageError, Conflict."""
    if kind not in THREAD_KINDS:
        raise UsageError(f"thread kind must be one of {THREAD_KINDS}, not {kind!r}")
    now = utc_now()
    return _THREADS.insert(conn, Thread(id=id or new_id("thr"), kind=kind, created_at=now, updated_at=now, **fields))


def get_thread(conn: psycopg.Connection, thread_id: str) -> Thread:
    """Return one thread. Raises NotFound."""
    return _THREADS.get(conn, thread_id)


def list_threads(
    conn: psycopg.Connection,
    *,
    archived: bool | None = False,
    kind: str | None = None,
    parent_thread_id: str | None = None,
    updated_before: str | None = None,
    limit: int = 100,
) -> list[Thread]:
    """Return threads, most recently updated first; see :func:`roost.storage.list_threads`."""
    where: list[str] = ["TRUE"]
    params: list[Any] = []
    for column, value in (
        ("archived", None if archived is None else int(archived)),
        ("kind", kind),
        ("parent_thread_id", parent_thread_id),
    ):
        if value is not None:
            where.append(f"{column} = %s")
            params.append(value)
    if updated_before is not None:
        where.append("updated_at < %s")
        params.append(updated_before)
    return _THREADS.select(conn, " AND ".join(where), params, order="updated_at DESC, id DESC", limit=limit)


def update_thread(conn: psycopg.Connection, thread_id: str, **changes: Any) -> Thread:
    """Change thread fields (write); ``updated_at`` is refreshed. Raises NotFound, UsageError."""
    if "kind" in changes and changes["kind"] not in THREAD_KINDS:
        raise UsageError(f"thread kind must be one of {THREAD_KINDS}")
    return _THREADS.update(conn, thread_id, changes)


def delete_thread(conn: psycopg.Connection, thread_id: str) -> None:
    """Delete a thread and (cascade) what belongs to it (write). Raises NotFound."""
    _THREADS.delete(conn, thread_id)


def create_turn(
    conn: psycopg.Connection,
    thread_id: str,
    *,
    id: str | None = None,
    status: str = "running",
    run_id: str | None = None,
) -> Turn:
    """Insert a turn of a thread (write). Raises Conflict (no such thread)."""
    turn = Turn(id=id or new_id("turn"), thread_id=thread_id, status=status, run_id=run_id, started_at=utc_now())
    return _TURNS.insert(conn, turn)


def get_turn(conn: psycopg.Connection, turn_id: str) -> Turn:
    """Return one turn. Raises NotFound."""
    return _TURNS.get(conn, turn_id)


def list_turns(conn: psycopg.Connection, thread_id: str, *, status: str | None = None) -> list[Turn]:
    """Return a thread's turns, oldest first."""
    if status is None:
        return _TURNS.select(conn, "thread_id = %s", (thread_id,), order="started_at, id")
    return _TURNS.select(conn, "thread_id = %s AND status = %s", (thread_id, status), order="started_at, id")


def update_turn(conn: psycopg.Connection, turn_id: str, **changes: Any) -> Turn:
    """Change turn fields (write); a terminal ``status`` stamps ``completed_at``. Raises NotFound, UsageError."""
    if changes.get("status") in _TERMINAL:
        changes.setdefault("completed_at", utc_now())
    return _TURNS.update(conn, turn_id, changes)


def create_run(
    conn: psycopg.Connection,
    *,
    thread_id: str | None = None,
    id: str | None = None,
    kind: str = "turn",
    status: str = "running",
    owner: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Run:
    """Insert a run (write); ``started_at`` is now."""
    run = Run(
        id=id or new_id("run"),
        thread_id=thread_id,
        kind=kind,
        status=status,
        owner=owner,
        started_at=utc_now(),
        metadata=metadata or {},
    )
    return _RUNS.insert(conn, run)


def get_run(conn: psycopg.Connection, run_id: str) -> Run:
    """Return one run. Raises NotFound."""
    return _RUNS.get(conn, run_id)


def list_runs(conn: psycopg.Connection, *, thread_id: str | None = None, status: str | None = None) -> list[Run]:
    """Return runs, oldest first, optionally of one thread and/or status."""
    where: list[str] = ["TRUE"]
    params: list[Any] = []
    for column, value in (("thread_id", thread_id), ("status", status)):
        if value is not None:
            where.append(f"{column} = %s")
            params.append(value)
    return _RUNS.select(conn, " AND ".join(where), params, order="started_at, id")


def update_run(conn: psycopg.Connection, run_id: str, **changes: Any) -> Run:
    """Change run fields (write); a terminal ``status`` stamps ``completed_at``."""
    if changes.get("status") in _TERMINAL:
        changes.setdefault("completed_at", utc_now())
    return _RUNS.update(conn, run_id, changes)


# -- the thread queries of :mod:`roost.storage._queries` -----------------------------------------


def first_user_text(conn: psycopg.Connection, thread_id: str) -> str:
    """Return the text of a thread's first user message, or ""."""
    row = conn.execute(
        "SELECT text FROM items WHERE thread_id = %s AND type = 'user_message' ORDER BY seq LIMIT 1", (thread_id,)
    ).fetchone()
    return str(row[0] or "") if row else ""


def latest_run_status(conn: psycopg.Connection, thread_id: str) -> str | None:
    """Return the status of a thread's latest run (by start time), or None without runs."""
    row = conn.execute(
        "SELECT status FROM runs WHERE thread_id = %s ORDER BY started_at DESC, id DESC LIMIT 1", (thread_id,)
    ).fetchone()
    return str(row[0]) if row else None


def count_turns(conn: psycopg.Connection, thread_id: str) -> int:
    """Return how many turns a thread has."""
    row = conn.execute("SELECT COUNT(*) FROM turns WHERE thread_id = %s", (thread_id,)).fetchone()
    return int(row[0]) if row else 0


def chat_ids_with_title(conn: psycopg.Connection, needle: str, *, limit: int) -> list[str]:
    """Return ids of chat threads whose title contains ``needle`` (case-insensitive), most
    recently updated first, at most ``limit``."""
    rows = conn.execute(
        "SELECT id FROM threads WHERE kind = 'chat' AND title IS NOT NULL"
        " AND strpos(lower(title), %s) > 0 ORDER BY updated_at DESC LIMIT %s",
        (needle.lower(), limit),
    ).fetchall()
    return [str(r[0]) for r in rows]


def page_threads(
    conn: psycopg.Connection,
    *,
    archived: bool | None,
    kind: str | None,
    before: tuple[str, str] | None,
    limit: int | None,
) -> list[Thread]:
    """Return threads newest first, strictly before the cursor ``(updated_at, id)``; see
    :func:`roost.storage.page_threads`."""
    where: list[str] = ["TRUE"]
    args: list[Any] = []
    if archived is not None:
        where.append("archived = %s")
        args.append(int(archived))
    if kind is not None:
        where.append("kind = %s")
        args.append(kind)
    if before is not None:
        where.append("(updated_at, id) < (%s, %s)")
        args += list(before)
    return _THREADS.select(conn, " AND ".join(where), args, order="updated_at DESC, id DESC", limit=limit)


def chat_threads_with_cwd(conn: psycopg.Connection) -> list[Thread]:
    """Return the visible (unarchived) chat threads that have a cwd, newest first."""
    return _THREADS.select(
        conn, "archived = 0 AND kind = 'chat' AND cwd IS NOT NULL", (), order="updated_at DESC, id DESC"
    )
