"""Scheduled jobs and their run records on PostgreSQL: the functions of
:mod:`roost.storage._schedules2` (and the schedule-run queries of :mod:`roost.storage._queries`),
with the same arguments, results and errors, on a ``psycopg.Connection``.

At most one run record per (schedule, slot), cluster-wide: :func:`claim_slot` is one
``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` statement, so of two nodes claiming a slot the
second waits for the first's row and then gets nothing (``None``). See the SQLite module for the
statuses.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from roost.errors import Conflict, NotFound

from ._rows import new_id, utc_now
from ._schedules2 import _JOB_SELECT, _RUN_COLS, CATCH_UP, OVERLAP, JobRun, ScheduledJob

__all__ = [
    "add_job",
    "get_job",
    "list_jobs",
    "remove_job",
    "set_job_enabled",
    "bump_schedule_changes",
    "schedule_changes",
    "advance_next_run",
    "request_run",
    "list_requested_runs",
    "claim_requested_run",
    "claim_slot",
    "record_skipped",
    "mark_run_started",
    "mark_run_finished",
    "has_running_run",
    "list_open_runs",
    "list_job_runs",
    "adopt_job",
    "adopt_schedule_run",
    "schedule_run_status",
]

_RUNS_SELECT = f"SELECT {', '.join(_RUN_COLS)} FROM schedule_runs"


def _dicts(conn: psycopg.Connection, sql: str, params: Any = ()) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(sql, params)  # our own SQL
        return cur.fetchall()


def _job(row: dict[str, Any]) -> ScheduledJob:
    return ScheduledJob(**{**row, "enabled": bool(row["enabled"])})


def _runs(conn: psycopg.Connection, sql: str, params: Any = ()) -> list[JobRun]:
    return [JobRun(**row) for row in _dicts(conn, sql, params)]


def bump_schedule_changes(conn: psycopg.Connection) -> None:
    """Bump the change counter (write; call in the same transaction as the change)."""
    conn.execute("UPDATE schedule_changes SET counter = counter + 1 WHERE id = 1")


def schedule_changes(conn: psycopg.Connection) -> int:
    """Return the change counter."""
    row = conn.execute("SELECT counter FROM schedule_changes WHERE id = 1").fetchone()
    return 0 if row is None else int(row[0])


def add_job(
    conn: psycopg.Connection,
    *,
    name: str,
    cron: str,
    task: str,
    next_run: str | None,
    description: str | None = None,
    config: str | None = None,
    work_dir: str | None = None,
    catch_up: str = "once",
    overlap: str = "skip",
    enabled: bool = True,
    provider: str | None = None,
    model: str | None = None,
) -> ScheduledJob:
    """Insert a job (write). Raises Conflict (the name exists), ValueError (unknown policy)."""
    if catch_up not in CATCH_UP or overlap not in OVERLAP:
        raise ValueError(f"catch_up must be one of {CATCH_UP} and overlap one of {OVERLAP}")
    now = utc_now()
    try:
        with conn.transaction():
            conn.execute(
                """INSERT INTO schedules (id, name, cron, timezone, enabled, payload, created_at, updated_at,
                       description, task, config, work_dir, catch_up, overlap, next_run, provider, model)
                   VALUES (%s, %s, %s, 'UTC', %s, NULL, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)""",
                (
                    new_id("sched"),
                    name,
                    cron,
                    int(enabled),
                    now,
                    now,
                    description,
                    task,
                    config,
                    work_dir,
                    catch_up,
                    overlap,
                    next_run,
                    provider,
                    model,
                ),
            )
    except psycopg.IntegrityError as exc:
        raise Conflict(f"a schedule named {name!r} exists") from exc
    bump_schedule_changes(conn)
    return get_job(conn, name)


def get_job(conn: psycopg.Connection, name: str) -> ScheduledJob:
    """Return the job called ``name``. Raises NotFound."""
    rows = _dicts(conn, _JOB_SELECT + " WHERE s.name = %s", (name,))
    if not rows:
        raise NotFound(f"no schedule named {name!r}")
    return _job(rows[0])


def list_jobs(
    conn: psycopg.Connection, *, enabled_only: bool = False, project: str | None = None
) -> list[ScheduledJob]:
    """Return jobs ordered by next run (never-firing ones last), then name; ``project``: only its
    jobs and the unadopted ones."""
    clauses, args = [], []
    if enabled_only:
        clauses.append("s.enabled = 1")
    if project is not None:
        clauses.append("(s.work_dir = %s OR s.work_dir IS NULL)")
        args.append(project)
    where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
    return [
        _job(r) for r in _dicts(conn, _JOB_SELECT + where + " ORDER BY s.next_run IS NULL, s.next_run, s.name", args)
    ]


def adopt_job(conn: psycopg.Connection, schedule_id: str, work_dir: str) -> bool:
    """Give an unadopted job (``work_dir`` NULL) the work directory ``work_dir`` (write; at most
    one node wins). Returns whether this call adopted it."""
    cur = conn.execute(
        "UPDATE schedules SET work_dir = %s, updated_at = %s WHERE id = %s AND work_dir IS NULL",
        (work_dir, utc_now(), schedule_id),
    )
    if cur.rowcount:
        bump_schedule_changes(conn)
    return cur.rowcount == 1


def remove_job(conn: psycopg.Connection, name: str) -> None:
    """Delete a job and its run records (write). Raises NotFound."""
    if conn.execute("DELETE FROM schedules WHERE name = %s", (name,)).rowcount == 0:
        raise NotFound(f"no schedule named {name!r}")
    bump_schedule_changes(conn)


def set_job_enabled(conn: psycopg.Connection, name: str, enabled: bool, *, next_run: str | None) -> ScheduledJob:
    """Enable (setting ``next_run``) or disable a job (write). Raises NotFound."""
    if enabled:
        cur = conn.execute(
            "UPDATE schedules SET enabled = 1, next_run = %s, updated_at = %s WHERE name = %s AND enabled = 0",
            (next_run, utc_now(), name),
        )
    else:
        cur = conn.execute("UPDATE schedules SET enabled = 0, updated_at = %s WHERE name = %s", (utc_now(), name))
    job = get_job(conn, name)
    if cur.rowcount:
        bump_schedule_changes(conn)
    return job


def advance_next_run(conn: psycopg.Connection, schedule_id: str, next_run: str | None) -> None:
    """Move ``next_run`` forward (write; never backwards). ``None`` marks a job that never fires."""
    if next_run is None:
        conn.execute("UPDATE schedules SET next_run = NULL WHERE id = %s", (schedule_id,))
        return
    conn.execute(
        "UPDATE schedules SET next_run = %s WHERE id = %s AND (next_run IS NULL OR next_run < %s)",
        (next_run, schedule_id, next_run),
    )


def request_run(conn: psycopg.Connection, name: str) -> JobRun:
    """Record a manual "run now" request (write). Raises NotFound."""
    job = get_job(conn, name)
    now = utc_now()
    run = JobRun(
        id=new_id("srun"), schedule_id=job.id, slot=f"manual:{now}", status="requested", source="manual", created_at=now
    )
    conn.execute(
        "INSERT INTO schedule_runs (id, schedule_id, slot, status, source, created_at) VALUES (%s, %s, %s, %s, %s, %s)",
        (run.id, run.schedule_id, run.slot, run.status, run.source, run.created_at),
    )
    bump_schedule_changes(conn)
    return run


def list_requested_runs(conn: psycopg.Connection) -> list[JobRun]:
    """Return the manual run requests not yet claimed, oldest first."""
    return _runs(conn, _RUNS_SELECT + " WHERE status = 'requested' ORDER BY created_at, id")


def claim_requested_run(conn: psycopg.Connection, run_id: str, owner: str) -> bool:
    """Claim a manual request (write). Returns ``False`` when another scheduler took it."""
    cur = conn.execute(
        "UPDATE schedule_runs SET status = 'claimed', owner = %s WHERE id = %s AND status = 'requested'",
        (owner, run_id),
    )
    return cur.rowcount == 1


def claim_slot(conn: psycopg.Connection, schedule_id: str, slot: str, owner: str) -> str | None:
    """Claim one slot of a job, at most once across the cluster (write); a ``skipped``/``missed``
    record is upgraded. Returns the run record id, or ``None`` (already claimed, or no such job)."""
    row = conn.execute(
        """INSERT INTO schedule_runs (id, schedule_id, slot, status, owner, created_at)
           SELECT %s, %s, %s, 'claimed', %s, %s WHERE EXISTS (SELECT 1 FROM schedules WHERE id = %s)
           ON CONFLICT (schedule_id, slot) DO UPDATE SET status = 'claimed', owner = excluded.owner,
               outcome = NULL
           WHERE schedule_runs.status = 'skipped' AND schedule_runs.outcome = 'missed'
           RETURNING id""",
        (new_id("srun"), schedule_id, slot, owner, utc_now(), schedule_id),
    ).fetchone()
    return None if row is None else str(row[0])


def record_skipped(conn: psycopg.Connection, schedule_id: str, slots: list[str], outcome: str) -> int:
    """Record slots as ``skipped`` with ``outcome`` (write); recorded slots are kept. Returns how many."""
    now = utc_now()
    n = 0
    for slot in slots:
        n += conn.execute(
            """INSERT INTO schedule_runs (id, schedule_id, slot, status, outcome, created_at)
               SELECT %s, %s, %s, 'skipped', %s, %s WHERE EXISTS (SELECT 1 FROM schedules WHERE id = %s)
               ON CONFLICT (schedule_id, slot) DO NOTHING""",
            (new_id("srun"), schedule_id, slot, outcome, now, schedule_id),
        ).rowcount
    return n


def mark_run_started(conn: psycopg.Connection, run_id: str, session_id: str, started_at: str) -> None:
    """Record the dispatch of a claimed run (write). Raises NotFound."""
    cur = conn.execute(
        "UPDATE schedule_runs SET status = 'running', session_id = %s, started_at = %s WHERE id = %s",
        (session_id, started_at, run_id),
    )
    if cur.rowcount == 0:
        raise NotFound(f"no schedule run {run_id!r}")


def mark_run_finished(conn: psycopg.Connection, run_id: str, outcome: str, finished_at: str) -> None:
    """Record the end of a run (write): status ``done`` (``skipped`` for ``overlap``/``missed``)."""
    status = "skipped" if outcome in ("overlap", "missed") else "done"
    conn.execute(
        "UPDATE schedule_runs SET status = %s, outcome = %s, finished_at = %s WHERE id = %s",
        (status, outcome, finished_at, run_id),
    )


def has_running_run(conn: psycopg.Connection, schedule_id: str, *, exclude: str | None = None) -> bool:
    """Whether a run of the job is claimed or dispatched and not finished."""
    row = conn.execute(
        """SELECT 1 FROM schedule_runs WHERE schedule_id = %s AND status IN ('claimed', 'running')
           AND id IS DISTINCT FROM %s::text LIMIT 1""",
        (schedule_id, exclude),
    ).fetchone()
    return row is not None


def list_open_runs(conn: psycopg.Connection) -> list[JobRun]:
    """Return run records still ``claimed`` or ``running``, oldest first."""
    return _runs(conn, _RUNS_SELECT + " WHERE status IN ('claimed', 'running') ORDER BY created_at, id")


def list_job_runs(conn: psycopg.Connection, schedule_id: str, *, limit: int = 100) -> list[JobRun]:
    """Return a job's run records, newest slot first."""
    return _runs(
        conn,
        _RUNS_SELECT + " WHERE schedule_id = %s ORDER BY created_at DESC, slot DESC LIMIT %s",
        (schedule_id, limit),
    )


def adopt_schedule_run(conn: psycopg.Connection, run_id: str, owner: str) -> None:
    """Make ``owner`` the owner of a schedule run record (write)."""
    conn.execute("UPDATE schedule_runs SET owner = %s WHERE id = %s", (owner, run_id))


def schedule_run_status(conn: psycopg.Connection, run_id: str) -> str | None:
    """Return a schedule run record's status, or None when there is no such record."""
    row = conn.execute("SELECT status FROM schedule_runs WHERE id = %s", (run_id,)).fetchone()
    return None if row is None else str(row[0])
