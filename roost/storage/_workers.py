"""Worker trees: one row per subagent, with its own thread, its parent and its spawn order.

Writers run inside a write transaction; readers are read-only.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from roost.model import Worker

from ._rows import TableSpec, new_id, utc_now

__all__ = ["create_worker", "get_worker", "list_workers", "update_worker", "claim_queued_worker"]

WORKERS = TableSpec("workers", Worker, json=frozenset({"result"}), touch="updated_at")


def create_worker(
    conn: sqlite3.Connection,
    *,
    thread_id: str,
    root_thread_id: str,
    parent_id: str | None = None,
    name: str | None = None,
    status: str = "queued",
    id: str | None = None,
) -> Worker:
    """Insert a worker (write).

    ``depth`` is the parent's depth + 1 (0 without a parent) and ``spawn_order`` the next number
    in the root thread's tree (1, 2, 3...), both computed in this transaction.

    Raises:
        NotFound: ``parent_id`` names no worker. Conflict: no such thread (via the writer).
    """
    depth = 0
    if parent_id is not None:
        depth = WORKERS.get(conn, parent_id).depth + 1
    order = conn.execute(
        "SELECT COALESCE(MAX(spawn_order), 0) + 1 FROM workers WHERE root_thread_id = ?",
        (root_thread_id,),
    ).fetchone()[0]
    now = utc_now()
    worker = Worker(
        id=id or new_id("wrk"),
        thread_id=thread_id,
        root_thread_id=root_thread_id,
        parent_id=parent_id,
        name=name,
        status=status,
        depth=depth,
        spawn_order=order,
        created_at=now,
        updated_at=now,
    )
    return WORKERS.insert(conn, worker)


def get_worker(conn: sqlite3.Connection, worker_id: str) -> Worker:
    """Return one worker (read-only). Raises NotFound."""
    return WORKERS.get(conn, worker_id)


def list_workers(conn: sqlite3.Connection, root_thread_id: str, *, status: str | None = None) -> list[Worker]:
    """Return the workers of a tree in spawn order (read-only)."""
    if status is None:
        return WORKERS.select(conn, "root_thread_id = ?", (root_thread_id,), order="spawn_order")
    return WORKERS.select(conn, "root_thread_id = ? AND status = ?", (root_thread_id, status), order="spawn_order")


def update_worker(conn: sqlite3.Connection, worker_id: str, **changes: Any) -> Worker:
    """Change worker fields (``status``, ``result``, ``name``) (write). Raises NotFound."""
    return WORKERS.update(conn, worker_id, changes)


def claim_queued_worker(conn: sqlite3.Connection, worker_id: str) -> bool:
    """Move a ``queued`` worker to ``running`` (write); True for exactly one caller.

    The compare-and-set on ``status`` makes the claim exactly-once across processes sharing the
    database: a queued spawn that survived a restart starts once, however many processes look.
    """
    return (
        conn.execute(
            "UPDATE workers SET status = 'running', updated_at = ? WHERE id = ? AND status = 'queued'",
            (utc_now(), worker_id),
        ).rowcount
        == 1
    )
