"""Start-up reconciliation on PostgreSQL: :func:`roost.storage.reconcile`'s rules, cluster-wide.

The same rules as on SQLite (see :func:`roost.storage.reconcile`), with two differences:

* expiry is judged on the database's clock (``now()``), so a node with a wrong clock neither
  steals live executions nor keeps dead ones;
* tool process groups: :func:`roost.storage.reap_tool_processes` (the same function) kills the
  leftovers of this host's dead processes; a row of another host is left to that host (its own
  next start reaps it): a process table is only judged locally, another host's owner by its lease.

A thread executing on another node is protected by that node's live lease, whatever host it is on.
"""

from __future__ import annotations

from typing import Any

import psycopg

from roost._json import dumps, loads

from ._pg_leases import db_now
from ._processes import reap_tool_processes
from ._reconcile import ReconcileReport
from ._rows import utc_now
from .leases import owner_is_dead

__all__ = ["reconcile_pg"]

_LIVE = """EXISTS (SELECT 1 FROM leases WHERE leases.key = 'thread:' || {col}
                   AND leases.owner IS NOT NULL AND leases.expires_at > %(now)s)"""
_ABANDONED = "interrupted: the process running it ended without settling it"
_NOT_STARTED = "interrupted: the process admitting the run ended before its first turn started"


def _abandoned_error(raw: Any) -> str:
    try:
        error = loads(raw) if raw else {}
    except ValueError:
        error = {}
    if not isinstance(error, dict):
        error = {}
    error.update(category="cancelled", reason="abandoned", message=_ABANDONED)
    return dumps(error).decode()


def reconcile_pg(conn: psycopg.Connection, owner: str, *, now: float | None = None) -> ReconcileReport:
    """Close the executions a previous process left open, in one transaction (blocking).

    Args:
        conn: a connection (autocommit, or in a transaction: then a savepoint).
        owner: this process's lease owner identity.
        now: unix seconds to judge expiry by (default: the database's clock).

    Returns:
        The counts of released leases, interrupted turns, workers, runs and items, and lost
        background processes.
    """
    with conn.transaction():
        stamp = utc_now()
        params = {"owner": owner, "now": db_now(conn) if now is None else now, "stamp": stamp}
        held = conn.execute(
            "SELECT key, owner FROM leases WHERE owner IS NOT NULL AND owner <> %(owner)s AND expires_at > %(now)s"
            " FOR UPDATE",
            params,
        ).fetchall()
        for key, holder in held:
            if owner_is_dead(holder):  # a dead process of this host: as good as expired
                conn.execute("UPDATE leases SET expires_at = 0 WHERE key = %s AND owner = %s", (key, holder))
        leases = conn.execute(
            """UPDATE leases SET owner = NULL, successor = NULL, expires_at = 0
               WHERE (owner IS NOT NULL OR successor IS NOT NULL) AND (owner = %(owner)s OR expires_at <= %(now)s)""",
            params,
        ).rowcount
        turns = conn.execute(
            "SELECT id, error FROM turns WHERE status IN ('queued', 'running')"
            f" AND NOT {_LIVE.format(col='turns.thread_id')}"
            " FOR UPDATE",
            params,
        ).fetchall()
        for turn_id, error in turns:
            conn.execute(
                "UPDATE turns SET status = 'interrupted', completed_at = %s, error = %s WHERE id = %s",
                (params["stamp"], _abandoned_error(error), turn_id),
            )
        items = conn.execute(
            f"""UPDATE items SET status = 'interrupted'
                WHERE status = 'in_progress' AND NOT {_LIVE.format(col="items.thread_id")}
                  AND NOT EXISTS (SELECT 1 FROM turns WHERE turns.id = items.turn_id
                                  AND turns.status IN ('queued', 'running'))""",
            params,
        ).rowcount
        workers = conn.execute(
            f"""UPDATE workers SET status = 'interrupted', updated_at = %(stamp)s
                WHERE status IN ('pending', 'running', 'waiting_children')
                  AND NOT {_LIVE.format(col="workers.thread_id")}
                  AND NOT {_LIVE.format(col="workers.root_thread_id")}""",
            params,
        ).rowcount
        runs = conn.execute(
            f"""UPDATE runs SET status = 'interrupted', completed_at = %(stamp)s
                WHERE status = 'running'
                  AND CASE WHEN runs.thread_id IS NULL
                           THEN runs.owner IS NULL OR runs.owner = %(owner)s
                           ELSE NOT {_LIVE.format(col="runs.thread_id")} END""",
            params,
        ).rowcount
        runs += _settle_accepted_runs(conn, owner, stamp)
        lost = _settle_background_processes(conn, owner, stamp)
        killed = reap_tool_processes(conn, owner)
    return ReconcileReport(leases, len(turns), workers, runs, killed, items, lost)


def _settle_accepted_runs(conn: psycopg.Connection, owner: str, stamp: str) -> int:
    """Runs left ``accepted`` by ``owner``, a dead starter of this host or an unknown one become
    ``interrupted`` (the SQLite rule, :func:`roost.storage._reconcile._settle_accepted_runs`)."""
    settled = 0
    for run_id, metadata in conn.execute("SELECT id, metadata FROM runs WHERE status = 'accepted' FOR UPDATE"):
        try:
            starter = ((loads(metadata) if metadata else {}).get("runtime") or {}).get("owner")
        except (ValueError, AttributeError):
            starter = None
        if starter and starter != owner and not owner_is_dead(starter):
            continue
        error = dumps({"code": "interrupted", "message": _NOT_STARTED}).decode()
        settled += conn.execute(
            "UPDATE runs SET status = 'interrupted', completed_at = %s, error = %s"
            " WHERE id = %s AND status = 'accepted'",
            (stamp, error, run_id),
        ).rowcount
    return settled


def _settle_background_processes(conn: psycopg.Connection, owner: str, stamp: str) -> int:
    """``running`` background processes of ``owner`` or of a dead process of this host become ``lost``."""
    settled = 0
    owners = conn.execute("SELECT DISTINCT owner FROM background_processes WHERE status = 'running'").fetchall()
    for (holder,) in owners:
        if holder != owner and not owner_is_dead(holder):
            continue
        settled += conn.execute(
            """UPDATE background_processes SET status = 'lost', ended_at = %s,
                      reason = 'Roost ended while the process ran',
                      trigger_status = CASE trigger_status WHEN 'waiting' THEN 'stopped' ELSE trigger_status END
               WHERE owner = %s AND status = 'running'""",
            (stamp, holder),
        ).rowcount
    return settled
