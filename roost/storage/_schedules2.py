"""Scheduled jobs (wire-protocol.md ``ScheduledJob``) and their run records (migration 0002).

Plain functions of a connection, like the other data modules: writers run inside a write
transaction (:meth:`StoreWriter.submit` or :meth:`Store.transaction`), readers are read-only.

Run records (``schedule_runs``), one per (schedule, slot), ``UNIQUE(schedule_id, slot)``:

========== ===========================================================================
status     meaning
========== ===========================================================================
requested  ``roost schedule run NAME`` asked for a run now (slot ``manual:<time>``)
claimed    a scheduler claimed the slot and is about to dispatch it (or, overlap
           ``queue``, waits for the previous run)
running    dispatched; ``session_id`` is the task's id
done       finished; ``outcome`` is ``succeeded``, ``failed`` or ``interrupted``
skipped    never run; ``outcome`` is ``missed`` (catch-up) or ``overlap``
========== ===========================================================================

A ``skipped``/``missed`` row never blocks a claim of the same slot (:func:`claim_slot` upgrades
it: a scheduler that started later must not veto a slot that another one sees as due now); any
other row does, so a slot is dispatched at most once across processes.

Times are ISO 8601 UTC text (``2026-01-31T12:00:00.000000Z``), so text order is time order.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import attrs

from roost.errors import Conflict, NotFound

from ._portable import is_sqlite
from ._rows import new_id, utc_now

__all__ = [
    "ScheduledJob",
    "JobRun",
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
]

CATCH_UP = ("once", "none")
OVERLAP = ("skip", "queue")


@attrs.define(kw_only=True)
class ScheduledJob:
    """One schedule row with the ScheduledJob fields (snake_case; the CLI renders camelCase).

    Attributes:
        id, name, cron, task, description, config, work_dir, enabled, created_at: as stored.
        catch_up: ``once`` or ``none`` (missed slots while no daemon ran).
        overlap: ``skip`` or ``queue`` (a slot due while the previous run still runs).
        next_run: the next slot (ISO UTC) or ``None`` (never fires / not yet computed).
        last_run: start time of the latest dispatched run, or ``None``.
        last_result: how the latest finished (or skipped) run ended: its ``outcome``
            (``succeeded``, ``failed``, ``interrupted``, ``missed``, ``overlap``), or ``running``
            while the latest dispatched run still runs; ``None`` before any run.
        provider, model: the model settings its runs use (``schedule add --provider/--model``;
            ``None``: the daemon's).

    ``work_dir`` is also the job's *project*: a ``roost serve`` fires only the jobs whose
    ``work_dir`` is its own work directory (issue 17). ``None`` marks a row written before that
    rule; the first daemon that loads it adopts it (:func:`adopt_job`).
    """

    id: str
    name: str
    cron: str
    task: str
    description: str | None = None
    config: str | None = None
    work_dir: str | None = None
    enabled: bool = True
    catch_up: str = "once"
    overlap: str = "skip"
    created_at: str = ""
    next_run: str | None = None
    last_run: str | None = None
    last_result: str | None = None
    provider: str | None = None
    model: str | None = None


@attrs.define(kw_only=True)
class JobRun:
    """One ``schedule_runs`` row (see the module docstring for ``status``)."""

    id: str
    schedule_id: str
    slot: str
    status: str
    source: str = "cron"
    owner: str | None = None
    session_id: str | None = None
    outcome: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    created_at: str = ""


_JOB_SELECT = """SELECT s.id, s.name, s.cron, s.task, s.description, s.config, s.work_dir, s.enabled,
       s.catch_up, s.overlap, s.created_at, s.next_run, s.provider, s.model,
       (SELECT MAX(r.started_at) FROM schedule_runs r WHERE r.schedule_id = s.id) AS last_run,
       (SELECT CASE WHEN r.status = 'running' THEN 'running' ELSE r.outcome END FROM schedule_runs r
         WHERE r.schedule_id = s.id AND r.status IN ('running', 'done', 'skipped')
         ORDER BY COALESCE(r.finished_at, r.started_at, r.created_at) DESC LIMIT 1) AS last_result
  FROM schedules s"""

_RUN_COLS = (
    "id",
    "schedule_id",
    "slot",
    "status",
    "source",
    "owner",
    "session_id",
    "outcome",
    "started_at",
    "finished_at",
    "created_at",
)


def _job(row: sqlite3.Row) -> ScheduledJob:
    values = dict(zip(row.keys(), tuple(row), strict=True))
    values["enabled"] = bool(values["enabled"])
    return ScheduledJob(**values)


def _run_row(row: sqlite3.Row) -> JobRun:
    return JobRun(**{k: row[k] for k in _RUN_COLS})


def bump_schedule_changes(conn: sqlite3.Connection) -> None:
    """Bump the change counter (write; call in the same transaction as the change)."""
    conn.execute("UPDATE schedule_changes SET counter = counter + 1 WHERE id = 1")


def schedule_changes(conn: sqlite3.Connection) -> int:
    """Return the change counter (read-only; one indexed row)."""
    row = conn.execute("SELECT counter FROM schedule_changes WHERE id = 1").fetchone()
    return 0 if row is None else int(row[0])


def add_job(
    conn: sqlite3.Connection,
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
    """Insert a job (write). ``cron`` must already be validated (:func:`roost.scheduling.parse_cron`).

    Raises:
        Conflict: a job with this name exists.
        ValueError: ``catch_up`` or ``overlap`` is not a known policy.
    """
    if catch_up not in CATCH_UP or overlap not in OVERLAP:
        raise ValueError(f"catch_up must be one of {CATCH_UP} and overlap one of {OVERLAP}")
    now = utc_now()
    job_id = new_id("sched")
    try:
        conn.execute(
            """INSERT INTO schedules (id, name, cron, timezone, enabled, payload, created_at, updated_at,
                   description, task, config, work_dir, catch_up, overlap, next_run, provider, model)
               VALUES (?, ?, ?, 'UTC', ?, NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            (
                job_id,
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
    except sqlite3.IntegrityError as exc:
        raise Conflict(f"a schedule named {name!r} exists") from exc
    bump_schedule_changes(conn)
    return get_job(conn, name)


def get_job(conn: sqlite3.Connection, name: str) -> ScheduledJob:
    """Return the job called ``name`` (read-only). Raises NotFound."""
    row = conn.execute(_JOB_SELECT + " WHERE s.name = ?", (name,)).fetchone()
    if row is None:
        raise NotFound(f"no schedule named {name!r}")
    return _job(row)


def list_jobs(
    conn: sqlite3.Connection, *, enabled_only: bool = False, project: str | None = None
) -> list[ScheduledJob]:
    """Return jobs ordered by next run (never-firing ones last), then name (read-only).

    Args:
        project: only the jobs of this work directory (absolute, resolved) and the unadopted
            ones (``work_dir`` NULL, see :func:`adopt_job`); ``None``: every job.
    """
    clauses, args = [], []
    if enabled_only:
        clauses.append("s.enabled = 1")
    if project is not None:
        clauses.append("(s.work_dir = ? OR s.work_dir IS NULL)")
        args.append(project)
    where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
    sql = _JOB_SELECT + where + " ORDER BY s.next_run IS NULL, s.next_run, s.name"
    return [_job(r) for r in conn.execute(sql, args)]


def schedule_snapshot(conn: sqlite3.Connection, *, project: str | None = None) -> tuple[int, list[ScheduledJob]]:
    """Return ``(change counter, jobs)`` read in one snapshot (read-only; see :func:`list_jobs`).

    On SQLite in one ``BEGIN``; on PostgreSQL in the read transaction the connection is in.
    """
    if not is_sqlite(conn):
        from . import _pg_schedules

        pg: Any = conn
        return _pg_schedules.schedule_changes(pg), _pg_schedules.list_jobs(pg, project=project)
    conn.execute("BEGIN")
    try:
        return schedule_changes(conn), list_jobs(conn, project=project)
    finally:
        conn.execute("COMMIT")


def adopt_job(conn: sqlite3.Connection, schedule_id: str, work_dir: str) -> bool:
    """Give a job written before schedules belonged to a project (``work_dir`` NULL) the work
    directory ``work_dir`` (write; at most one daemon wins).

    Returns:
        ``True`` when this call adopted it, ``False`` when it already had a work directory.
    """
    cur = conn.execute(
        "UPDATE schedules SET work_dir = ?, updated_at = ? WHERE id = ? AND work_dir IS NULL",
        (work_dir, utc_now(), schedule_id),
    )
    if cur.rowcount:
        bump_schedule_changes(conn)
    return cur.rowcount == 1


def remove_job(conn: sqlite3.Connection, name: str) -> None:
    """Delete a job and its run records (write). Raises NotFound."""
    if conn.execute("DELETE FROM schedules WHERE name = ?", (name,)).rowcount == 0:
        raise NotFound(f"no schedule named {name!r}")
    bump_schedule_changes(conn)


def set_job_enabled(conn: sqlite3.Connection, name: str, enabled: bool, *, next_run: str | None) -> ScheduledJob:
    """Enable or disable a job (write). Enabling sets ``next_run`` (the first slot from now, so
    slots passed while disabled are not caught up). Raises NotFound."""
    if enabled:
        cur = conn.execute(
            """UPDATE schedules SET enabled = 1, next_run = ?, updated_at = ?
               WHERE name = ? AND enabled = 0""",
            (next_run, utc_now(), name),
        )
    else:
        cur = conn.execute("UPDATE schedules SET enabled = 0, updated_at = ? WHERE name = ?", (utc_now(), name))
    job = get_job(conn, name)
    if cur.rowcount:
        bump_schedule_changes(conn)
    return job


def advance_next_run(conn: sqlite3.Connection, schedule_id: str, next_run: str | None) -> None:
    """Move ``next_run`` forward to ``next_run`` (write; never backwards, so racing schedulers
    agree). ``None`` marks a job that never fires."""
    if next_run is None:
        conn.execute("UPDATE schedules SET next_run = NULL WHERE id = ?", (schedule_id,))
        return
    conn.execute(
        "UPDATE schedules SET next_run = ? WHERE id = ? AND (next_run IS NULL OR next_run < ?)",
        (next_run, schedule_id, next_run),
    )


def request_run(conn: sqlite3.Connection, name: str) -> JobRun:
    """Record a manual "run now" request for a daemon to pick up (write). Raises NotFound."""
    job = get_job(conn, name)
    now = utc_now()
    run = JobRun(
        id=new_id("srun"), schedule_id=job.id, slot=f"manual:{now}", status="requested", source="manual", created_at=now
    )
    conn.execute(
        """INSERT INTO schedule_runs (id, schedule_id, slot, status, source, created_at)
           VALUES (?, ?, ?, ?, ?, ?)""",
        (run.id, run.schedule_id, run.slot, run.status, run.source, run.created_at),
    )
    bump_schedule_changes(conn)
    return run


def list_requested_runs(conn: sqlite3.Connection) -> list[JobRun]:
    """Return the manual run requests not yet claimed, oldest first (read-only)."""
    rows = conn.execute(
        f"SELECT {', '.join(_RUN_COLS)} FROM schedule_runs WHERE status = 'requested' ORDER BY created_at"
    )
    return [_run_row(r) for r in rows]


def claim_requested_run(conn: sqlite3.Connection, run_id: str, owner: str) -> bool:
    """Claim a manual request (write). Returns ``False`` when another scheduler took it."""
    cur = conn.execute(
        "UPDATE schedule_runs SET status = 'claimed', owner = ? WHERE id = ? AND status = 'requested'", (owner, run_id)
    )
    return cur.rowcount == 1


def claim_slot(conn: sqlite3.Connection, schedule_id: str, slot: str, owner: str) -> str | None:
    """Claim one slot of a job, at most once across processes (write).

    A ``skipped``/``missed`` record of the slot (a catch-up by a scheduler that started later) is
    upgraded to the claim; any other record (including an ``overlap`` skip) refuses it.

    Returns:
        The run record id, or ``None`` when the slot was already claimed (or the job is gone).
    """
    row = conn.execute(
        """INSERT INTO schedule_runs (id, schedule_id, slot, status, owner, created_at)
           SELECT ?, ?, ?, 'claimed', ?, ? WHERE EXISTS (SELECT 1 FROM schedules WHERE id = ?)
           ON CONFLICT (schedule_id, slot) DO UPDATE SET status = 'claimed', owner = excluded.owner,
               outcome = NULL
           WHERE schedule_runs.status = 'skipped' AND schedule_runs.outcome = 'missed'
           RETURNING id""",
        (new_id("srun"), schedule_id, slot, owner, utc_now(), schedule_id),
    ).fetchone()
    return None if row is None else str(row[0])


def record_skipped(conn: sqlite3.Connection, schedule_id: str, slots: list[str], outcome: str) -> int:
    """Record slots as ``skipped`` with ``outcome`` (write); slots already recorded are kept.

    Returns:
        How many were recorded.
    """
    now = utc_now()
    n = 0
    for slot in slots:
        n += conn.execute(
            """INSERT INTO schedule_runs (id, schedule_id, slot, status, outcome, created_at)
               SELECT ?, ?, ?, 'skipped', ?, ? WHERE EXISTS (SELECT 1 FROM schedules WHERE id = ?)
               ON CONFLICT (schedule_id, slot) DO NOTHING""",
            (new_id("srun"), schedule_id, slot, outcome, now, schedule_id),
        ).rowcount
    return n


def mark_run_started(conn: sqlite3.Connection, run_id: str, session_id: str, started_at: str) -> None:
    """Record the dispatch of a claimed run (write). Raises NotFound."""
    cur = conn.execute(
        "UPDATE schedule_runs SET status = 'running', session_id = ?, started_at = ? WHERE id = ?",
        (session_id, started_at, run_id),
    )
    if cur.rowcount == 0:
        raise NotFound(f"no schedule run {run_id!r}")


def mark_run_finished(conn: sqlite3.Connection, run_id: str, outcome: str, finished_at: str) -> None:
    """Record the end of a run (write): status ``done`` (or ``skipped`` for ``overlap``/``missed``)."""
    status = "skipped" if outcome in ("overlap", "missed") else "done"
    conn.execute(
        "UPDATE schedule_runs SET status = ?, outcome = ?, finished_at = ? WHERE id = ?",
        (status, outcome, finished_at, run_id),
    )


def has_running_run(conn: sqlite3.Connection, schedule_id: str, *, exclude: str | None = None) -> bool:
    """Whether a run of the job is claimed or dispatched and not finished (read-only)."""
    row = conn.execute(
        """SELECT 1 FROM schedule_runs WHERE schedule_id = ? AND status IN ('claimed', 'running')
           AND id IS NOT ? LIMIT 1""",
        (schedule_id, exclude),
    ).fetchone()
    return row is not None


def list_open_runs(conn: sqlite3.Connection) -> list[JobRun]:
    """Return run records still ``claimed`` or ``running`` (read-only), oldest first."""
    rows = conn.execute(
        f"""SELECT {", ".join(_RUN_COLS)} FROM schedule_runs WHERE status IN ('claimed', 'running')
            ORDER BY created_at"""
    )
    return [_run_row(r) for r in rows]


def list_job_runs(conn: sqlite3.Connection, schedule_id: str, *, limit: int = 100) -> list[JobRun]:
    """Return a job's run records, newest slot first (read-only)."""
    rows = conn.execute(
        f"SELECT {', '.join(_RUN_COLS)} FROM schedule_runs WHERE schedule_id = ?"
        " ORDER BY created_at DESC, slot DESC LIMIT ?",
        (schedule_id, limit),
    )
    return [_run_row(r) for r in rows]
