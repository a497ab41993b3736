"""Schedules, their claimed slots, and the ``serve`` daemon's task queue.

Writers run inside a write transaction; readers are read-only.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from roost.model import DaemonTask, Schedule, ScheduleRun

from ._rows import TableSpec, new_id, utc_now

__all__ = [
    "create_schedule",
    "get_schedule",
    "list_schedules",
    "update_schedule",
    "delete_schedule",
    "claim_schedule_slot",
    "list_schedule_runs",
    "update_schedule_run",
    "enqueue_daemon_task",
    "list_daemon_tasks",
    "update_daemon_task",
]

SCHEDULES = TableSpec("schedules", Schedule, json=frozenset({"payload"}), bools=frozenset({"enabled"}),
                      touch="updated_at")
SCHEDULE_RUNS = TableSpec("schedule_runs", ScheduleRun)
DAEMON_TASKS = TableSpec("daemon_tasks", DaemonTask, json=frozenset({"payload", "error"}), touch="updated_at")


def create_schedule(
    conn: sqlite3.Connection, *, name: str, cron: str, timezone: str = "UTC", enabled: bool = True,
    payload: Any = None, id: str | None = None,
) -> Schedule:
    """Insert a schedule (write). ``cron`` is not validated here (the scheduler uses croniter).

    Raises Conflict: the name exists (via the writer).
    """
    now = utc_now()
    schedule = Schedule(id=id or new_id("sched"), name=name, cron=cron, timezone=timezone,
                        enabled=enabled, payload=payload, created_at=now, updated_at=now)
    return SCHEDULES.insert(conn, schedule)


def get_schedule(conn: sqlite3.Connection, schedule_id: str) -> Schedule:
    """Return one schedule (read-only). Raises NotFound."""
    return SCHEDULES.get(conn, schedule_id)


def list_schedules(conn: sqlite3.Connection, *, enabled: bool | None = None) -> list[Schedule]:
    """Return schedules by name (read-only)."""
    if enabled is None:
        return SCHEDULES.select(conn, order="name")
    return SCHEDULES.select(conn, "enabled = ?", (int(enabled),), order="name")


def update_schedule(conn: sqlite3.Connection, schedule_id: str, **changes: Any) -> Schedule:
    """Change schedule fields (write). Raises NotFound."""
    return SCHEDULES.update(conn, schedule_id, changes)


def delete_schedule(conn: sqlite3.Connection, schedule_id: str) -> None:
    """Delete a schedule and its slot records (write). Raises NotFound."""
    SCHEDULES.delete(conn, schedule_id)


def claim_schedule_slot(
    conn: sqlite3.Connection, schedule_id: str, slot: str, *, run_id: str | None = None
) -> ScheduleRun | None:
    """Claim one due slot of a schedule, at most once across processes (write).

    Args:
        slot: the slot's scheduled time as ISO 8601 UTC text.

    Returns:
        The new claim, or ``None`` when the slot was already claimed (``UNIQUE(schedule_id, slot)``).
    """
    row = ScheduleRun(id=new_id("srun"), schedule_id=schedule_id, slot=slot, status="claimed",
                      run_id=run_id, created_at=utc_now())
    cur = conn.execute(
        """INSERT INTO schedule_runs (id, schedule_id, slot, status, run_id, created_at)
           VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (schedule_id, slot) DO NOTHING""",
        (row.id, row.schedule_id, row.slot, row.status, row.run_id, row.created_at),
    )
    return row if cur.rowcount == 1 else None


def list_schedule_runs(conn: sqlite3.Connection, schedule_id: str, *, limit: int = 100) -> list[ScheduleRun]:
    """Return a schedule's claimed slots, newest first (read-only)."""
    return SCHEDULE_RUNS.select(conn, "schedule_id = ?", (schedule_id,), order="slot DESC", limit=limit)


def update_schedule_run(conn: sqlite3.Connection, schedule_run_id: str, **changes: Any) -> ScheduleRun:
    """Change ``status``/``run_id`` of a claimed slot (write). Raises NotFound."""
    return SCHEDULE_RUNS.update(conn, schedule_run_id, changes)


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
    task = DaemonTask(id=id or new_id("task"), position=position, status="queued", payload=payload,
                      client_id=client_id, created_at=now, updated_at=now)
    return DAEMON_TASKS.insert(conn, task), True


def list_daemon_tasks(conn: sqlite3.Connection, *, status: str | None = None) -> list[DaemonTask]:
    """Return daemon tasks in queue order (read-only)."""
    if status is None:
        return DAEMON_TASKS.select(conn, order="position")
    return DAEMON_TASKS.select(conn, "status = ?", (status,), order="position")


def update_daemon_task(conn: sqlite3.Connection, task_id: str, **changes: Any) -> DaemonTask:
    """Change a daemon task's ``status``/``run_id``/``error`` (write). Raises NotFound."""
    return DAEMON_TASKS.update(conn, task_id, changes)
