"""Threads, turns and runs: plain functions that take a connection.

Writers (``create_*``, ``update_*``, ``delete_*``) are meant to run inside a write transaction:
pass them to :meth:`StoreWriter.submit` (``await store.writer.submit(create_thread, ...)``) or call
them under :meth:`Store.transaction`. Readers (``get_*``, ``list_*``) are read-only and fast; call
them on a :meth:`Store.read` connection.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from roost.errors import UsageError
from roost.model import THREAD_KINDS, Run, Thread, Turn

from ._rows import TableSpec, new_id, utc_now

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
]

THREADS = TableSpec(
    "threads",
    Thread,
    json=frozenset({"metadata"}),
    bools=frozenset({"pinned", "archived"}),
    touch="updated_at",
)
TURNS = TableSpec("turns", Turn, json=frozenset({"error", "usage"}))
RUNS = TableSpec("runs", Run, json=frozenset({"error", "metadata"}))


def create_thread(conn: sqlite3.Connection, *, kind: str = "chat", id: str | None = None, **fields: Any) -> Thread:
    """Insert a thread (write).

    Args:
        kind: ``chat``, ``orchestration`` or ``worker``.
        id: the thread id (default: a fresh ``thr_...``).
        **fields: any other :class:`~roost.model.Thread` field (``title``, ``cwd``, ``model``...).

    Returns:
        The stored thread, with ``created_at``/``updated_at`` set.

    Raises:
        UsageError: unknown kind. Conflict: the id exists (via the writer).
    """
    if kind not in THREAD_KINDS:
        raise UsageError(f"thread kind must be one of {THREAD_KINDS}, not {kind!r}")
    now = utc_now()
    thread = Thread(id=id or new_id("thr"), kind=kind, created_at=now, updated_at=now, **fields)
    return THREADS.insert(conn, thread)


def get_thread(conn: sqlite3.Connection, thread_id: str) -> Thread:
    """Return one thread (read-only). Raises NotFound."""
    return THREADS.get(conn, thread_id)


def list_threads(
    conn: sqlite3.Connection,
    *,
    archived: bool | None = False,
    kind: str | None = None,
    parent_thread_id: str | None = None,
    updated_before: str | None = None,
    limit: int = 100,
) -> list[Thread]:
    """Return threads, most recently updated first (read-only).

    Args:
        archived: only archived (``True``), only unarchived (``False``) or both (``None``).
        kind: only this kind.
        parent_thread_id: only children of this thread.
        updated_before: paging cursor: only threads whose ``updated_at`` is earlier.
        limit: at most this many.
    """
    where: list[str] = ["1"]
    params: list[Any] = []
    if archived is not None:
        where.append("archived = ?")
        params.append(int(archived))
    if kind is not None:
        where.append("kind = ?")
        params.append(kind)
    if parent_thread_id is not None:
        where.append("parent_thread_id = ?")
        params.append(parent_thread_id)
    if updated_before is not None:
        where.append("updated_at < ?")
        params.append(updated_before)
    return THREADS.select(conn, " AND ".join(where), params, order="updated_at DESC, id DESC", limit=limit)


def update_thread(conn: sqlite3.Connection, thread_id: str, **changes: Any) -> Thread:
    """Change thread fields (write); ``updated_at`` is refreshed. Raises NotFound, UsageError."""
    if "kind" in changes and changes["kind"] not in THREAD_KINDS:
        raise UsageError(f"thread kind must be one of {THREAD_KINDS}")
    return THREADS.update(conn, thread_id, changes)


def delete_thread(conn: sqlite3.Connection, thread_id: str) -> None:
    """Delete a thread and (cascade) its turns, items, held input, workers, context (write).

    Raises NotFound.
    """
    THREADS.delete(conn, thread_id)


def create_turn(
    conn: sqlite3.Connection,
    thread_id: str,
    *,
    id: str | None = None,
    status: str = "running",
    run_id: str | None = None,
) -> Turn:
    """Insert a turn of a thread (write); ``started_at`` is now. Raises Conflict (no such thread)."""
    turn = Turn(id=id or new_id("turn"), thread_id=thread_id, status=status, run_id=run_id, started_at=utc_now())
    return TURNS.insert(conn, turn)


def get_turn(conn: sqlite3.Connection, turn_id: str) -> Turn:
    """Return one turn (read-only). Raises NotFound."""
    return TURNS.get(conn, turn_id)


def list_turns(conn: sqlite3.Connection, thread_id: str, *, status: str | None = None) -> list[Turn]:
    """Return a thread's turns, oldest first (read-only)."""
    if status is None:
        return TURNS.select(conn, "thread_id = ?", (thread_id,), order="started_at, rowid")
    return TURNS.select(conn, "thread_id = ? AND status = ?", (thread_id, status), order="started_at, rowid")


def update_turn(conn: sqlite3.Connection, turn_id: str, **changes: Any) -> Turn:
    """Change turn fields (write). A terminal ``status`` without ``completed_at`` stamps it now.

    Raises NotFound, UsageError.
    """
    if changes.get("status") in ("completed", "interrupted", "failed"):
        changes.setdefault("completed_at", utc_now())
    return TURNS.update(conn, turn_id, changes)


def create_run(
    conn: sqlite3.Connection,
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
    return RUNS.insert(conn, run)


def get_run(conn: sqlite3.Connection, run_id: str) -> Run:
    """Return one run (read-only). Raises NotFound."""
    return RUNS.get(conn, run_id)


def list_runs(conn: sqlite3.Connection, *, thread_id: str | None = None, status: str | None = None) -> list[Run]:
    """Return runs, oldest first, optionally of one thread and/or status (read-only)."""
    where: list[str] = ["1"]
    params: list[Any] = []
    if thread_id is not None:
        where.append("thread_id = ?")
        params.append(thread_id)
    if status is not None:
        where.append("status = ?")
        params.append(status)
    return RUNS.select(conn, " AND ".join(where), params, order="started_at, rowid")


def update_run(conn: sqlite3.Connection, run_id: str, **changes: Any) -> Run:
    """Change run fields (write). A terminal ``status`` without ``completed_at`` stamps it now."""
    if changes.get("status") in ("completed", "interrupted", "failed"):
        changes.setdefault("completed_at", utc_now())
    return RUNS.update(conn, run_id, changes)
