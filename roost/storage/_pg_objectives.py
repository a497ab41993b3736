"""Objectives on PostgreSQL: the functions of :mod:`roost.storage._objectives` with the same
arguments, results and errors, on a ``psycopg.Connection``.

Objective ids (``OBJ-NNNN``) are allocated under a transaction-scoped advisory lock, so creators
on every node serialise and ids stay unique and ordered cluster-wide.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from roost.errors import NotFound, UsageError

from ._objectives import OBJECTIVE_STATUSES, Objective, ObjectiveTask, attempt_outcome, check_new_objective
from ._rows import utc_now

__all__ = [
    "create_objective",
    "get_objective",
    "list_objectives",
    "set_objective_status",
    "add_objective_task",
    "start_objective_task",
    "finish_objective_task",
]

#: pg_advisory_xact_lock key of objective id allocation (any constant unique within Roost).
_ID_LOCK = 0x524F4F5354_0B


def _rows(conn: psycopg.Connection, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql, args)
        return cur.fetchall()


def _task(row: dict[str, Any]) -> ObjectiveTask:
    return ObjectiveTask(
        objective_id=row["objective_id"],
        index=row["idx"],
        task=row["task"],
        outcome=row["outcome"],
        failures=row["failures"],
        session_id=row["session_id"],
        updated_at=row["updated_at"],
    )


def _objective(conn: psycopg.Connection, row: dict[str, Any]) -> Objective:
    tasks = [
        _task(r)
        for r in _rows(conn, "SELECT * FROM objective_tasks WHERE objective_id = %s ORDER BY idx", (row["id"],))
    ]
    return Objective(
        id=row["id"],
        title=row["title"],
        description=row["description"],
        status=row["status"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        tasks=tasks,
    )


def create_objective(
    conn: psycopg.Connection, *, title: str, tasks: list[str], description: str | None = None, status: str = "active"
) -> Objective:
    """Create an objective with the next id ``OBJ-NNNN`` (write). Raises UsageError."""
    check_new_objective(title, tasks, status)
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ID_LOCK,))
    row = conn.execute("SELECT COALESCE(MAX(CAST(substr(id, 5) AS BIGINT)), 0) + 1 FROM objectives").fetchone()
    objective_id = f"OBJ-{int(row[0] if row else 1):04d}"
    now = utc_now()
    if not tasks and status == "active":
        status = "completed"
    conn.execute(
        "INSERT INTO objectives (id, title, description, status, created_at, updated_at) "
        "VALUES (%s, %s, %s, %s, %s, %s)",
        (objective_id, title, description, status, now, now),
    )
    for index, text in enumerate(tasks):
        conn.execute(
            "INSERT INTO objective_tasks (objective_id, idx, task, outcome, failures, updated_at) "
            "VALUES (%s, %s, %s, 'pending', 0, %s)",
            (objective_id, index, text, now),
        )
    return get_objective(conn, objective_id)


def get_objective(conn: psycopg.Connection, objective_id: str) -> Objective:
    """The objective with its tasks (read-only). Raises NotFound."""
    rows = _rows(conn, "SELECT * FROM objectives WHERE id = %s", (objective_id,))
    if not rows:
        raise NotFound(f"no objective {objective_id!r}")
    return _objective(conn, rows[0])


def list_objectives(conn: psycopg.Connection, *, status: str | None = None) -> list[Objective]:
    """Objectives in id order, optionally only those with ``status`` (read-only)."""
    if status is None:
        rows = _rows(conn, "SELECT * FROM objectives ORDER BY id")
    else:
        rows = _rows(conn, "SELECT * FROM objectives WHERE status = %s ORDER BY id", (status,))
    return [_objective(conn, row) for row in rows]


def set_objective_status(conn: psycopg.Connection, objective_id: str, status: str) -> Objective:
    """Change an objective's status (write). Raises NotFound, UsageError (unknown status)."""
    if status not in OBJECTIVE_STATUSES:
        raise UsageError(f"unknown objective status {status!r}")
    cur = conn.execute(
        "UPDATE objectives SET status = %s, updated_at = %s WHERE id = %s", (status, utc_now(), objective_id)
    )
    if cur.rowcount == 0:
        raise NotFound(f"no objective {objective_id!r}")
    return get_objective(conn, objective_id)


def add_objective_task(conn: psycopg.Connection, objective_id: str, task: str) -> ObjectiveTask:
    """Append a task to an objective (write; a completed objective becomes active again).

    Raises:
        NotFound: no such objective. UsageError: an empty task.
    """
    if not task.strip():
        raise UsageError("an objective task must not be empty")
    conn.execute("SELECT id FROM objectives WHERE id = %s FOR UPDATE", (objective_id,))  # appenders serialise
    objective = get_objective(conn, objective_id)
    now = utc_now()
    index = len(objective.tasks)
    conn.execute(
        "INSERT INTO objective_tasks (objective_id, idx, task, outcome, failures, updated_at) "
        "VALUES (%s, %s, %s, 'pending', 0, %s)",
        (objective_id, index, task, now),
    )
    if objective.status == "completed":
        conn.execute("UPDATE objectives SET status = 'active', updated_at = %s WHERE id = %s", (now, objective_id))
    return get_objective(conn, objective_id).tasks[index]


def start_objective_task(conn: psycopg.Connection, objective_id: str, index: int, session_id: str) -> ObjectiveTask:
    """Record that task ``index`` was dispatched as daemon task ``session_id`` (write). Raises NotFound."""
    cur = conn.execute(
        "UPDATE objective_tasks SET outcome = 'running', session_id = %s, updated_at = %s "
        "WHERE objective_id = %s AND idx = %s",
        (session_id, utc_now(), objective_id, index),
    )
    if cur.rowcount == 0:
        raise NotFound(f"no task {index} in objective {objective_id!r}")
    return get_objective(conn, objective_id).tasks[index]


def finish_objective_task(conn: psycopg.Connection, objective_id: str, index: int, succeeded: bool) -> ObjectiveTask:
    """Record the end of task ``index``'s attempt (write, one transaction); see
    :func:`roost.storage._objectives.finish_objective_task`. Raises NotFound."""
    rows = _rows(
        conn,
        "SELECT failures FROM objective_tasks WHERE objective_id = %s AND idx = %s FOR UPDATE",
        (objective_id, index),
    )
    if not rows:
        raise NotFound(f"no task {index} in objective {objective_id!r}")
    now = utc_now()
    outcome, failures = attempt_outcome(int(rows[0]["failures"]), succeeded)
    conn.execute(
        "UPDATE objective_tasks SET outcome = %s, failures = %s, updated_at = %s WHERE objective_id = %s AND idx = %s",
        (outcome, failures, now, objective_id, index),
    )
    objective = get_objective(conn, objective_id)
    if objective.next_task() is None and objective.status == "active":
        conn.execute("UPDATE objectives SET status = 'completed', updated_at = %s WHERE id = %s", (now, objective_id))
    return get_objective(conn, objective_id).tasks[index]
