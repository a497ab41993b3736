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
        The counts of released leases and interrupted turns, workers and runs.
    """
    with conn.transaction():
        params = {"owner": owner, "now": db_now(conn) if now is None else now, "stamp": utc_now()}
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
            f"SELECT id, error FROM turns WHERE status = 'running' AND NOT {_LIVE.format(col='turns.thread_id')}"
            " FOR UPDATE",
            params,
        ).fetchall()
        for turn_id, error in turns:
            conn.execute(
                "UPDATE turns SET status = 'interrupted', completed_at = %s, error = %s WHERE id = %s",
                (params["stamp"], _abandoned_error(error), turn_id),
            )
        conn.execute(
            """UPDATE items SET status = 'interrupted' WHERE status = 'in_progress'
                  AND turn_id IN (SELECT id FROM turns WHERE status = 'interrupted')"""
        )
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
        killed = reap_tool_processes(conn, owner)
    return ReconcileReport(leases, len(turns), workers, runs, killed)
