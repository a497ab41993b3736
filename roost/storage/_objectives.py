"""Objectives: long-horizon goals with an ordered task list and each task's outcome (migration 0004).

wire-protocol.md, appendix "Objectives": ids such as ``OBJ-0001``; ``serve --auto-objective`` runs
the first remaining task of an active objective; a task is skipped after 3 consecutive failures,
and that counter is durable here (``objective_tasks.failures``) so a restarted daemon neither
retries a task forever nor reruns a task that already succeeded.

Objective ``status``: ``active`` (its remaining tasks may be auto-dispatched), ``paused``,
``completed`` (no task remains). Task ``outcome``:

========= =========================================================================
outcome   meaning
========= =========================================================================
pending   not run yet, or failed fewer than :data:`MAX_FAILURES` times in a row
running   dispatched; ``session_id`` is the daemon task's id (its ``sessionId``)
succeeded its latest attempt succeeded
skipped   it failed :data:`MAX_FAILURES` times in a row
========= =========================================================================

Plain functions of a connection: writers run in a write transaction, readers are read-only.
"""

from __future__ import annotations

import sqlite3

import attrs

from roost.errors import NotFound, UsageError

from ._rows import utc_now

__all__ = [
    "Objective",
    "ObjectiveTask",
    "MAX_FAILURES",
    "OBJECTIVE_STATUSES",
    "create_objective",
    "get_objective",
    "list_objectives",
    "set_objective_status",
    "add_objective_task",
    "start_objective_task",
    "finish_objective_task",
]

#: Consecutive failures after which a task is skipped (wire-protocol.md appendix).
MAX_FAILURES = 3
OBJECTIVE_STATUSES = ("active", "paused", "completed")


@attrs.define(kw_only=True)
class ObjectiveTask:
    """One task of an objective (``index`` is its 0-based place in the list)."""

    objective_id: str
    index: int
    task: str
    outcome: str = "pending"
    failures: int = 0
    session_id: str | None = None
    updated_at: str = ""


@attrs.define(kw_only=True)
class Objective:
    """One objective with its tasks in order."""

    id: str
    title: str
    description: str | None = None
    status: str = "active"
    created_at: str = ""
    updated_at: str = ""
    tasks: list[ObjectiveTask] = attrs.field(factory=list)

    def next_task(self) -> ObjectiveTask | None:
        """The first task neither succeeded nor skipped (running counts: it is in progress)."""
        for task in self.tasks:
            if task.outcome in ("pending", "running"):
                return task
        return None


def check_new_objective(title: str, tasks: list[str], status: str) -> None:
    """Validate a new objective (shared by both backends). Raises UsageError: an empty title, an
    empty task, or an unknown status."""
    if not title.strip():
        raise UsageError("an objective needs a non-empty title")
    if any(not t.strip() for t in tasks):
        raise UsageError("an objective task must not be empty")
    if status not in OBJECTIVE_STATUSES:
        raise UsageError(f"unknown objective status {status!r} (one of {', '.join(OBJECTIVE_STATUSES)})")


def attempt_outcome(failures: int, succeeded: bool) -> tuple[str, int]:
    """A task's ``(outcome, consecutive failures)`` after an attempt with ``failures`` failures
    before it: success resets the counter; :data:`MAX_FAILURES` in a row skips the task."""
    if succeeded:
        return "succeeded", 0
    failures += 1
    return ("skipped" if failures >= MAX_FAILURES else "pending"), failures


def _task(row: sqlite3.Row) -> ObjectiveTask:
    return ObjectiveTask(
        objective_id=row["objective_id"],
        index=row["idx"],
        task=row["task"],
        outcome=row["outcome"],
        failures=row["failures"],
        session_id=row["session_id"],
        updated_at=row["updated_at"],
    )


def _objective(conn: sqlite3.Connection, row: sqlite3.Row) -> Objective:
    tasks = [
        _task(r)
        for r in conn.execute("SELECT * FROM objective_tasks WHERE objective_id = ? ORDER BY idx", (row["id"],))
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
    conn: sqlite3.Connection, *, title: str, tasks: list[str], description: str | None = None, status: str = "active"
) -> Objective:
    """Create an objective with the next id ``OBJ-NNNN`` (write).

    Raises:
        UsageError: an empty title, an empty task, or an unknown status.
    """
    check_new_objective(title, tasks, status)
    number = conn.execute("SELECT COALESCE(MAX(CAST(substr(id, 5) AS INTEGER)), 0) + 1 FROM objectives").fetchone()[0]
    objective_id = f"OBJ-{number:04d}"
    now = utc_now()
    if not tasks and status == "active":
        status = "completed"
    conn.execute(
        "INSERT INTO objectives (id, title, description, status, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
        (objective_id, title, description, status, now, now),
    )
    for index, text in enumerate(tasks):
        conn.execute(
            "INSERT INTO objective_tasks (objective_id, idx, task, outcome, failures, updated_at) "
            "VALUES (?, ?, ?, 'pending', 0, ?)",
            (objective_id, index, text, now),
        )
    return get_objective(conn, objective_id)


def get_objective(conn: sqlite3.Connection, objective_id: str) -> Objective:
    """The objective with its tasks (read-only). Raises NotFound."""
    row = conn.execute("SELECT * FROM objectives WHERE id = ?", (objective_id,)).fetchone()
    if row is None:
        raise NotFound(f"no objective {objective_id!r}")
    return _objective(conn, row)


def list_objectives(conn: sqlite3.Connection, *, status: str | None = None) -> list[Objective]:
    """Objectives in id order, optionally only those with ``status`` (read-only)."""
    if status is None:
        rows = conn.execute("SELECT * FROM objectives ORDER BY id").fetchall()
    else:
        rows = conn.execute("SELECT * FROM objectives WHERE status = ? ORDER BY id", (status,)).fetchall()
    return [_objective(conn, row) for row in rows]


def set_objective_status(conn: sqlite3.Connection, objective_id: str, status: str) -> Objective:
    """Change an objective's status (write). Raises NotFound, UsageError (unknown status)."""
    if status not in OBJECTIVE_STATUSES:
        raise UsageError(f"unknown objective status {status!r}")
    cur = conn.execute(
        "UPDATE objectives SET status = ?, updated_at = ? WHERE id = ?", (status, utc_now(), objective_id)
    )
    if cur.rowcount == 0:
        raise NotFound(f"no objective {objective_id!r}")
    return get_objective(conn, objective_id)


def add_objective_task(conn: sqlite3.Connection, objective_id: str, task: str) -> ObjectiveTask:
    """Append a task to an objective (write; a completed objective becomes active again).

    Raises:
        NotFound: no such objective. UsageError: an empty task.
    """
    if not task.strip():
        raise UsageError("an objective task must not be empty")
    objective = get_objective(conn, objective_id)
    now = utc_now()
    index = len(objective.tasks)
    conn.execute(
        "INSERT INTO objective_tasks (objective_id, idx, task, outcome, failures, updated_at) "
        "VALUES (?, ?, ?, 'pending', 0, ?)",
        (objective_id, index, task, now),
    )
    if objective.status == "completed":
        conn.execute("UPDATE objectives SET status = 'active', updated_at = ? WHERE id = ?", (now, objective_id))
    return get_objective(conn, objective_id).tasks[index]


def start_objective_task(conn: sqlite3.Connection, objective_id: str, index: int, session_id: str) -> ObjectiveTask:
    """Record that task ``index`` was dispatched as daemon task ``session_id`` (write). Raises NotFound."""
    cur = conn.execute(
        "UPDATE objective_tasks SET outcome = 'running', session_id = ?, updated_at = ? "
        "WHERE objective_id = ? AND idx = ?",
        (session_id, utc_now(), objective_id, index),
    )
    if cur.rowcount == 0:
        raise NotFound(f"no task {index} in objective {objective_id!r}")
    return get_objective(conn, objective_id).tasks[index]


def finish_objective_task(conn: sqlite3.Connection, objective_id: str, index: int, succeeded: bool) -> ObjectiveTask:
    """Record the end of task ``index``'s attempt (write, one transaction).

    Success marks it ``succeeded`` and resets its failure counter; a failure counts one more
    consecutive failure and marks it ``skipped`` at :data:`MAX_FAILURES`, else ``pending`` again.
    When no task remains, the objective becomes ``completed``.

    Raises:
        NotFound: no such task.
    """
    row = conn.execute(
        "SELECT failures FROM objective_tasks WHERE objective_id = ? AND idx = ?", (objective_id, index)
    ).fetchone()
    if row is None:
        raise NotFound(f"no task {index} in objective {objective_id!r}")
    now = utc_now()
    outcome, failures = attempt_outcome(int(row["failures"]), succeeded)
    conn.execute(
        "UPDATE objective_tasks SET outcome = ?, failures = ?, updated_at = ? WHERE objective_id = ? AND idx = ?",
        (outcome, failures, now, objective_id, index),
    )
    objective = get_objective(conn, objective_id)
    if objective.next_task() is None and objective.status == "active":
        conn.execute("UPDATE objectives SET status = 'completed', updated_at = ? WHERE id = ?", (now, objective_id))
    return get_objective(conn, objective_id).tasks[index]
