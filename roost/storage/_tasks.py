"""The ``serve`` daemon's task queue (``daemon_tasks``): dispatched tasks in queue order.

Writers run inside a write transaction; readers are read-only.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from roost.model import DaemonTask

from ._rows import TableSpec, new_id, utc_now

__all__ = ["enqueue_daemon_task", "list_daemon_tasks", "get_daemon_task", "update_daemon_task"]

DAEMON_TASKS = TableSpec("daemon_tasks", DaemonTask, json=frozenset({"payload", "error"}), touch="updated_at")


def enqueue_daemon_task(
    conn: sqlite3.Connection, *, payload: Any, client_id: str | None = None, id: str | None = None
) -> tuple[DaemonTask, bool]:
    """Append a task to the daemon queue (write; idempotent on ``client_id``).

    Returns:
        ``(task, created)``; ``created`` is ``False`` when ``client_id`` matched an existing task.
    """
    if client_id is not None:
        rows = DAEMON_TASKS.select(conn, "client_id = ?", (client_id,), order="position")
        if rows:
            return rows[0], False
    position = conn.execute("SELECT COALESCE(MAX(position), 0) + 1 FROM daemon_tasks").fetchone()[0]
    now = utc_now()
    task = DaemonTask(
        id=id or new_id("task"),
        position=position,
        status="queued",
        payload=payload,
        client_id=client_id,
        created_at=now,
        updated_at=now,
    )
    return DAEMON_TASKS.insert(conn, task), True


def list_daemon_tasks(conn: sqlite3.Connection, *, status: str | None = None) -> list[DaemonTask]:
    """Return daemon tasks in queue order (read-only)."""
    if status is None:
        return DAEMON_TASKS.select(conn, order="position")
    return DAEMON_TASKS.select(conn, "status = ?", (status,), order="position")


def update_daemon_task(conn: sqlite3.Connection, task_id: str, **changes: Any) -> DaemonTask:
    """Change a daemon task's ``status``/``run_id``/``error`` (write). Raises NotFound."""
    return DAEMON_TASKS.update(conn, task_id, changes)


def get_daemon_task(conn: sqlite3.Connection, task_id: str) -> DaemonTask | None:
    """Return the daemon task ``task_id``, or None when there is none (read-only)."""
    rows = DAEMON_TASKS.select(conn, "id = ?", (task_id,), order="position")
    return rows[0] if rows else None
