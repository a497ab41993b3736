"""Worker trees on PostgreSQL: the functions of :mod:`roost.storage._workers` and the worker
queries of :mod:`roost.storage._queries`, with the same arguments, results and errors, on a
``psycopg.Connection`` (tool process records are portable SQL: :mod:`roost.storage._processes`).

``spawn_order`` is computed under a transaction-scoped advisory lock on the root thread, so
spawns of one tree on any node get unique, ordered numbers. :func:`claim_queued_worker` is a
compare-and-set on ``status``: exactly one node's claim succeeds.
"""

from __future__ import annotations

from typing import Any

import psycopg

from roost._json import dumps, loads
from roost.model import Worker

from ._pg_rows import PgTableSpec
from ._rows import new_id, utc_now
from ._workers import WORKERS

__all__ = [
    "create_worker",
    "get_worker",
    "list_workers",
    "update_worker",
    "claim_queued_worker",
    "queued_worker_roots",
    "mark_worker_delivered",
]

_WORKERS = PgTableSpec(WORKERS.table, Worker, json=WORKERS.json, touch=WORKERS.touch)


def create_worker(
    conn: psycopg.Connection,
    *,
    thread_id: str,
    root_thread_id: str,
    parent_id: str | None = None,
    name: str | None = None,
    status: str = "queued",
    id: str | None = None,
) -> Worker:
    """Insert a worker (write); see :func:`roost.storage.create_worker`.

    Raises:
        NotFound: ``parent_id`` names no worker. Conflict: no such thread.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"roost.workers:{root_thread_id}",))
        depth = 0 if parent_id is None else _WORKERS.get(conn, parent_id).depth + 1
        row = conn.execute(
            "SELECT COALESCE(MAX(spawn_order), 0) + 1 FROM workers WHERE root_thread_id = %s", (root_thread_id,)
        ).fetchone()
        assert row is not None
        now = utc_now()
        worker = Worker(
            id=id or new_id("wrk"),
            thread_id=thread_id,
            root_thread_id=root_thread_id,
            parent_id=parent_id,
            name=name,
            status=status,
            depth=depth,
            spawn_order=row[0],
            created_at=now,
            updated_at=now,
        )
        return _WORKERS.insert(conn, worker)


def get_worker(conn: psycopg.Connection, worker_id: str) -> Worker:
    """Return one worker. Raises NotFound."""
    return _WORKERS.get(conn, worker_id)


def list_workers(conn: psycopg.Connection, root_thread_id: str, *, status: str | None = None) -> list[Worker]:
    """Return the workers of a tree in spawn order."""
    if status is None:
        return _WORKERS.select(conn, "root_thread_id = %s", (root_thread_id,), order="spawn_order")
    return _WORKERS.select(conn, "root_thread_id = %s AND status = %s", (root_thread_id, status), order="spawn_order")


def update_worker(conn: psycopg.Connection, worker_id: str, **changes: Any) -> Worker:
    """Change worker fields (``status``, ``result``, ``name``) (write). Raises NotFound."""
    return _WORKERS.update(conn, worker_id, changes)


def claim_queued_worker(conn: psycopg.Connection, worker_id: str) -> bool:
    """Move a ``queued`` worker to ``running`` (write); True for exactly one caller cluster-wide."""
    cur = conn.execute(
        "UPDATE workers SET status = 'running', updated_at = %s WHERE id = %s AND status = 'queued'",
        (utc_now(), worker_id),
    )
    return cur.rowcount == 1


def queued_worker_roots(conn: psycopg.Connection) -> list[str]:
    """Return the root thread ids that have queued worker spawns, each once."""
    rows = conn.execute("SELECT DISTINCT root_thread_id FROM workers WHERE status = 'queued'").fetchall()
    return [str(r[0]) for r in rows]


def mark_worker_delivered(conn: psycopg.Connection, worker_id: str) -> bool:
    """Set ``delivered`` in a worker's ``result`` JSON once (write); True when this call marked it.

    The row is locked (``FOR UPDATE``) so two nodes cannot both mark it.
    """
    with conn.transaction():
        row = conn.execute("SELECT result FROM workers WHERE id = %s FOR UPDATE", (worker_id,)).fetchone()
        data = loads(row[0]) if row and row[0] else {}
        if data.get("delivered"):
            return False
        data["delivered"] = True
        conn.execute(
            "UPDATE workers SET result = %s, updated_at = %s WHERE id = %s",
            (dumps(data).decode(), utc_now(), worker_id),
        )
        return True
