"""Start-up reconciliation: close what a dead process left open."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import attrs

from ._connect import immediate
from ._portable import is_sqlite
from ._processes import reap_tool_processes
from ._rows import utc_now
from .leases import owner_is_dead

__all__ = ["ReconcileReport", "reconcile"]

# A thread is live when another owner holds an unexpired lease on "thread:<id>".
_LIVE = """EXISTS (SELECT 1 FROM leases WHERE leases.key = 'thread:' || {col}
                   AND leases.owner IS NOT NULL AND leases.expires_at > :now)"""


@attrs.frozen
class ReconcileReport:
    """Rows changed by :func:`reconcile` (counts), and leftover tool process groups killed."""

    leases_released: int
    turns_interrupted: int
    workers_interrupted: int
    runs_interrupted: int
    tool_processes_killed: int = 0
    items_interrupted: int = 0
    background_processes_lost: int = 0


def reconcile(conn: Any, owner: str, *, now: float | None = None) -> ReconcileReport:
    """Close the executions a previous process left open (one ``BEGIN IMMEDIATE``; blocking).

    * leases held by ``owner`` (this process's identity, e.g. a fixed owner of a restarted
      daemon), expired, or held by a dead process of this host (:func:`owner_is_dead`) are
      released (tokens kept, so they keep growing);
    * turns still ``queued`` or ``running`` and runs still ``running`` become ``interrupted``
      (``completed_at`` now; a turn's ``error`` gets ``category: "cancelled", reason:
      "abandoned"``), runs left ``accepted`` by a dead starter likewise
      (:func:`_settle_accepted_runs`), items still ``in_progress`` outside an executing turn
      become ``interrupted``, and workers
      ``pending``, ``running`` or ``waiting_children`` become ``interrupted``, unless their thread
      is under a live lease of another process (which is still executing it). ``queued`` workers
      are kept: a queued spawn survives a restart and is claimed exactly once later
      (:func:`claim_queued_worker`).
    * Not here, by design: daemon tasks ``queued``/``running`` are resumed by the next daemon
      (``TaskQueue.restore``), schedule runs ``claimed``/``running`` are adopted or settled by the
      next scheduler, an objective task ``running`` settles with its daemon task, and held or
      pending input waits for the thread's next turn: each is work accepted and owed, and the
      component that owes it finishes it at start-up.
    * background processes (``process/*``) still ``running`` for ``owner`` or a dead process of
      this host become ``lost`` (:func:`_settle_background_processes`);
    * tool process groups (shell commands) recorded by ``owner`` or by a dead process of this
      host are sent SIGKILL when they still run and are the recorded ones (leader start time),
      and their rows deleted (:func:`~roost.storage.reap_tool_processes`).

    Args:
        conn: a write-capable connection not in a transaction (or in one: then a savepoint); a
            PostgreSQL connection runs :func:`~roost.storage._pg_reconcile.reconcile_pg`.
        owner: this process's lease owner identity.
        now: wall-clock unix seconds (default ``time.time()``).

    Raises:
        StoreBusy: the write lock could not be taken.
    """
    if not is_sqlite(conn):
        from ._pg_reconcile import reconcile_pg

        return reconcile_pg(conn, owner, now=now)
    now = time.time() if now is None else now
    stamp = utc_now()
    params = {
        "owner": owner,
        "now": now,
        "stamp": stamp,
        "abandoned": "interrupted: the process running it ended without settling it",
    }
    with immediate(conn):
        leases = _release_leases(conn, params)
        turns = conn.execute(
            f"""UPDATE turns SET status = 'interrupted', completed_at = :stamp,
                       error = json_set(CASE WHEN json_valid(error) THEN error ELSE '{{}}' END,
                                        '$.category', 'cancelled', '$.reason', 'abandoned',
                                        '$.message', :abandoned)
                WHERE status IN ('queued', 'running') AND NOT {_LIVE.format(col="turns.thread_id")}""",
            params,
        ).rowcount
        # Items checkpointed while running (a started tool call) end with their turn: any item
        # still in progress whose turn is not executing (settled, gone, or never recorded).
        items = conn.execute(
            f"""UPDATE items SET status = 'interrupted'
                WHERE status = 'in_progress' AND NOT {_LIVE.format(col="items.thread_id")}
                  AND NOT EXISTS (SELECT 1 FROM turns WHERE turns.id = items.turn_id
                                  AND turns.status IN ('queued', 'running'))""",
            params,
        ).rowcount
        workers, runs = _settle_workers_and_runs(conn, params)
        runs += _settle_accepted_runs(conn, owner, stamp)
        lost = _settle_background_processes(conn, owner, stamp)
        killed = reap_tool_processes(conn, owner)
    return ReconcileReport(leases, turns, workers, runs, killed, items, lost)


def _settle_workers_and_runs(conn: sqlite3.Connection, params: dict) -> tuple[int, int]:
    """Workers and ``running`` runs whose thread is not executing become ``interrupted``; returns
    their counts (inside :func:`reconcile`'s transaction)."""
    workers = conn.execute(
        f"""UPDATE workers SET status = 'interrupted', updated_at = :stamp
            WHERE status IN ('pending', 'running', 'waiting_children')
              AND NOT {_LIVE.format(col="workers.thread_id")}
              AND NOT {_LIVE.format(col="workers.root_thread_id")}""",
        params,
    ).rowcount
    runs = conn.execute(
        f"""UPDATE runs SET status = 'interrupted', completed_at = :stamp
            WHERE status = 'running'
              AND CASE WHEN runs.thread_id IS NULL
                       THEN runs.owner IS NULL OR runs.owner = :owner
                       ELSE NOT {_LIVE.format(col="runs.thread_id")} END""",
        params,
    ).rowcount
    return workers, runs


def _release_leases(conn: sqlite3.Connection, params: dict) -> int:
    """Release leases held by ``params["owner"]``, expired, or held by a dead process of this host
    (as good as expired: it was killed); tokens are kept. Returns how many were released."""
    held = conn.execute(
        "SELECT key, owner FROM leases WHERE owner IS NOT NULL AND owner != :owner AND expires_at > :now",
        params,
    ).fetchall()
    for key, holder in held:
        if owner_is_dead(holder):
            conn.execute("UPDATE leases SET expires_at = 0 WHERE key = ? AND owner = ?", (key, holder))
    return conn.execute(
        """UPDATE leases SET owner = NULL, successor = NULL, expires_at = 0
           WHERE (owner IS NOT NULL OR successor IS NOT NULL)
             AND (owner = :owner OR expires_at <= :now)""",
        params,
    ).rowcount


def _settle_background_processes(conn: sqlite3.Connection, owner: str, stamp: str) -> int:
    """``running`` background processes of ``owner`` or of a dead process of this host become ``lost``.

    Their process group is a recorded tool process, so :func:`reap_tool_processes` kills it; the
    row says why it ended (``reason``) and a waiting exit trigger is ``stopped`` (it never fires).
    Returns the number of rows settled.
    """
    settled = 0
    owners = conn.execute("SELECT DISTINCT owner FROM background_processes WHERE status = 'running'").fetchall()
    for (holder,) in owners:
        if holder != owner and not owner_is_dead(holder):
            continue  # a live process of this or another host still runs it
        settled += conn.execute(
            """UPDATE background_processes SET status = 'lost', ended_at = ?,
                      reason = 'Roost ended while the process ran',
                      trigger_status = CASE trigger_status WHEN 'waiting' THEN 'stopped' ELSE trigger_status END
               WHERE owner = ? AND status = 'running'""",
            (stamp, holder),
        ).rowcount
    return settled


def _settle_accepted_runs(conn: sqlite3.Connection, owner: str, stamp: str) -> int:
    """Runs left ``accepted`` (killed during ``run/start`` admission) become ``interrupted``.

    A run is ``accepted`` only while its starter admits the first turn, before any lease is taken,
    so liveness is told by the starter's identity (``metadata.runtime.owner``): the run is settled
    when that is ``owner`` itself, a dead process of this host, or unknown (issue 18, finding 3).
    Returns the number of runs settled.
    """
    rows = conn.execute(
        "SELECT id, json_extract(metadata, '$.runtime.owner') FROM runs WHERE status = 'accepted'"
    ).fetchall()
    settled = 0
    for run_id, starter in rows:
        if starter and starter != owner and not owner_is_dead(starter):
            continue
        settled += conn.execute(
            """UPDATE runs SET status = 'interrupted', completed_at = :stamp,
                      error = json_object('code', 'interrupted', 'message', :message)
               WHERE id = :id AND status = 'accepted'""",
            {
                "id": run_id,
                "stamp": stamp,
                "message": "interrupted: the process admitting the run ended before its first turn started",
            },
        ).rowcount
    return settled
