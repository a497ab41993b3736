"""The cluster: the shared daemon task queue's claims and the nodes' heartbeats (issue 13).

N daemons on one database (PostgreSQL; several daemons on one SQLite file work the same way)
share ``daemon_tasks``. A node runs a task only after :func:`claim_daemon_task` gave it the
task's lease ``task:<id>`` (a fencing token, :mod:`roost.storage.leases`): exactly one claim
wins, in one transaction. The same SQL runs on both backends (:mod:`roost.storage._portable`);
PostgreSQL locks the candidate rows ``FOR UPDATE SKIP LOCKED`` so concurrent claimers of other
nodes skip each other's rows instead of waiting, SQLite's write lock serialises claimers.

Lease times are unix seconds on the database's clock (PostgreSQL ``now()``; SQLite: this host's clock,
the only one that opens the file). Node heartbeats are written and judged in SQL on the database's
clock (:func:`roost.storage._portable.now_sql`: PostgreSQL ``clock_timestamp()``, SQLite
``julianday('now')``), so a node's own clock never decides whether a node is gone.

Wake-up: on PostgreSQL :func:`wake_task_claimers` sends ``NOTIFY roost_tasks`` (ids only) in the
transaction that made a task claimable, and each claiming node listens
(:func:`task_wake_listener`, :mod:`roost.storage._pg_task_wake`); on SQLite both are no-ops and the
claimers poll.
"""

from __future__ import annotations

import os
import time
from typing import Any

from roost.errors import LeaseHeld
from roost.model import DaemonTask

from . import leases
from ._dispatch import by_connection
from ._portable import execute, is_sqlite, now_sql
from ._rows import iso_from_unix, utc_now
from ._tasks import get_daemon_task, update_daemon_task
from .leases import hostname as _hostname

_get_daemon_task = by_connection(get_daemon_task)
_update_daemon_task = by_connection(update_daemon_task)

__all__ = [
    "task_lease_key",
    "claim_daemon_task",
    "withdraw_daemon_task",
    "previous_claim",
    "beat_node",
    "forget_node",
    "list_nodes",
    "queue_depth",
    "db_clock",
    "owner_gone",
    "wake_task_claimers",
    "task_wake_listener",
]

#: A node row is deleted (and no longer listed) once its heartbeat is this many of its ttls old.
RETENTION_TTLS = 10
#: Candidates examined per claim, of each kind (resumable running tasks, queued tasks).
_CLAIM_SCAN = 64


def task_lease_key(task_id: str) -> str:
    """Return the lease key of a daemon task's execution: ``"task:<task_id>"``."""
    return f"task:{task_id}"


def db_clock(conn: Any) -> float:
    """The leases' clock, unix seconds: the database's (PostgreSQL ``now()``); on SQLite
    ``time.time()``, which the SQLite lease functions write (:mod:`roost.storage.leases`)."""
    if is_sqlite(conn):
        return time.time()
    row = execute(conn, "SELECT extract(epoch FROM now())::float8").fetchone()
    return float(row[0])


def claim_daemon_task(
    conn: Any, owner: str, ttl: float, *, node: str | None = None
) -> tuple[DaemonTask, leases.Lease, bool] | None:
    """Claim the next task of the shared queue for ``owner`` (write, one transaction).

    The next task is the first, in queue order, of: the ``running`` tasks whose executor is gone
    (their ``task:<id>`` lease and their thread's lease both expired, released, or held by a
    dead process of this host) -- they are *resumed* -- then the ``queued`` tasks. The claim takes
    the task's lease (its token one higher than any before) and sets the row ``running``.

    The claim is recorded in the task's payload: ``claimedBy`` (``owner``) and ``claimedNode``
    (``node``), and for a resumed task ``resumedFrom`` (:func:`previous_claim`: who ran it before
    and why it stopped), so a resumed task can say what happened.

    Args:
        conn: a write connection (in the store writer's transaction, or its own).
        owner: the claiming node's lease owner identity.
        ttl: the lease duration, seconds.
        node: the claiming node's name (:func:`roost._paths.node_name`), recorded with the claim.

    Returns:
        ``(task, lease, resumed)``, or None when nothing is claimable.
    """
    now = db_clock(conn)
    # running tasks whose lease is not live by the clock, or held on this host (its pid may be
    # dead: judged below), with both their leases (task and thread) in the same query; then the
    # queued ones. Each list is bounded, so neither hides the other.
    rows = execute(
        conn,
        "SELECT t.id, t.status, l.owner, l.expires_at, h.owner, h.expires_at FROM daemon_tasks t"
        " LEFT JOIN leases l ON l.key = 'task:' || t.id LEFT JOIN leases h ON h.key = 'thread:' || t.id"
        " WHERE t.status = 'running' AND (l.owner IS NULL OR l.expires_at <= ? OR l.owner LIKE ?)"
        " ORDER BY t.position LIMIT ?",
        (now, _hostname() + ":%", _CLAIM_SCAN),
    ).fetchall()
    rows += execute(
        conn,
        "SELECT id, status, NULL, NULL, NULL, NULL FROM daemon_tasks WHERE status = 'queued' ORDER BY position LIMIT ?",
        (_CLAIM_SCAN,),
    ).fetchall()
    # Under ``roost serve --workers`` every running task's lease is of this host: judged once per
    # owner, not per task (one kill(2) and /proc read each), inside the write transaction.
    dead: dict[str, bool] = {}

    def live(holder: str | None, expires_at: Any) -> bool:
        if holder is None or holder == owner or not expires_at > now:
            return False
        if holder not in dead:
            dead[holder] = leases.owner_is_dead(holder)
        return not dead[holder]

    for task_id, status, task_owner, task_expiry, thread_owner, thread_expiry in rows:
        resumed = status == "running"
        if resumed and (live(task_owner, task_expiry) or live(thread_owner, thread_expiry)):
            continue  # a live node runs it
        if not is_sqlite(conn):
            # lock this row only: another node's claim in flight holds it (skip it, not wait), and
            # the row's committed status is re-read under the lock
            locked = execute(
                conn, "SELECT 1 FROM daemon_tasks WHERE id = ? AND status = ? FOR UPDATE SKIP LOCKED", (task_id, status)
            ).fetchone()
            if locked is None:
                continue
        before = leases.get_lease(conn, task_lease_key(task_id))
        try:
            lease = leases.acquire(conn, task_lease_key(task_id), owner, ttl)
        except LeaseHeld:
            continue  # taken meanwhile
        task = _get_daemon_task(conn, task_id)
        assert task is not None
        payload = dict(task.payload) if isinstance(task.payload, dict) else {}
        previous = previous_claim(payload, before, now, beat=_beat(conn, before, payload)) if resumed else None
        payload.update(claimedBy=owner, claimedNode=node, resumedFrom=previous)
        task = _update_daemon_task(conn, task_id, status="running", payload=payload)
        return task, lease, resumed
    return None


def withdraw_daemon_task(conn: Any, task_id: str, payload: Any) -> bool:
    """Finish a task that is still queued, before any node claims it (write, one transaction).

    Exactly one of a claim (:func:`claim_daemon_task`) and a withdrawal wins: the row becomes
    ``finished`` with ``payload`` only while its status is ``queued`` (on PostgreSQL the
    conditional update waits for a claim in flight that holds the row, then finds it
    ``running``).

    Returns:
        True when the task was withdrawn; False when it is not queued any more (claimed,
        finished) or does not exist.
    """
    changed = execute(
        conn,
        "UPDATE daemon_tasks SET status = 'finished', updated_at = ? WHERE id = ? AND status = 'queued'",
        (utc_now(), task_id),
    ).rowcount
    if changed != 1:
        return False
    _update_daemon_task(conn, task_id, payload=payload)
    return True


def _beat(conn: Any, lease: dict[str, Any] | None, payload: dict) -> tuple[float, float] | None:
    """``(last_seen, ttl)`` of the heartbeat row of a released task's previous claimer, or None."""
    claimed_by = payload.get("claimedBy")
    if (lease or {}).get("owner") is not None or not claimed_by or is_sqlite(conn):
        return None  # (SQLite daemons keep no heartbeat rows)
    row = execute(conn, "SELECT last_seen, ttl FROM nodes WHERE owner = ?", (claimed_by,)).fetchone()
    return None if row is None else (float(row[0]), float(row[1]))


def previous_claim(
    payload: Any, lease: dict[str, Any] | None, now: float, *, beat: tuple[float, float] | None = None
) -> dict[str, Any]:
    """Who ran a task before it was claimed again, and why it stopped (pure but for
    :func:`leases.owner_is_dead`).

    Args:
        payload: the task's payload as the previous claim left it (``claimedBy``, ``claimedNode``).
        lease: the task's ``task:<id>`` lease row before the new claim (:func:`leases.get_lease`).
        now: the database clock, unix seconds.
        beat: ``(last_seen, ttl)`` of the previous claimer's ``nodes`` row when the lease was
            released (PostgreSQL; a clean stop deletes the row), else None.

    Returns:
        ``{owner, node, reason}``: ``owner`` the previous claimer's lease owner id and ``node`` its
        node name (None when not recorded: a task claimed before they were); ``reason`` one of
        ``died`` (a process of this host that is gone: killed, or crashed), ``lease_lost`` (its
        lease expired unrenewed, or was released for it after its heartbeat stopped: dead, paused
        or cut off from the database), ``stopped`` (it released the lease itself: a clean stop,
        or its task queue restarted).
    """
    payload = payload if isinstance(payload, dict) else {}
    holder = (lease or {}).get("owner")
    claimed_by = payload.get("claimedBy")
    before = holder if holder is not None else claimed_by
    node = payload.get("claimedNode") if before == claimed_by else None
    expired = holder is not None and float((lease or {}).get("expires_at") or 0) <= now
    unbeaten = holder is None and beat is not None and now - beat[0] >= beat[1]
    if leases.owner_is_dead(before):
        reason = "died"  # (a restarted daemon may have released its lease already: reconcile)
    elif expired or unbeaten:
        reason = "lease_lost"
    else:
        reason = "stopped"
    return {"owner": before, "node": node, "reason": reason}


def beat_node(conn: Any, owner: str, ttl: float, *, started_at: float | None = None) -> float:
    """Insert or refresh this node's heartbeat row, and delete the rows of long-gone nodes (write);
    return the heartbeat's time.

    The heartbeat is the database's clock, written in SQL (:func:`._portable.now_sql`), never this
    host's. A row whose heartbeat is older than :data:`RETENTION_TTLS` of its own ttl is deleted:
    that node is gone (as it was before), its leases expired long ago and the expiry logic
    already resumed its tasks (:func:`claim_daemon_task` reads leases, not these rows), and
    :func:`owner_gone` counts a missing row as gone.

    Args:
        owner: the node's lease owner identity (``"<host>:<pid>:<nonce>"``).
        ttl: seconds after ``last_seen`` at which the node counts as gone.
        started_at: when the node started (first beat; default now).
    """
    now = now_sql(conn)
    row = execute(
        conn,
        f"""INSERT INTO nodes (owner, host, pid, started_at, last_seen, ttl)
            VALUES (?, ?, ?, COALESCE(CAST(? AS DOUBLE PRECISION), {now}), {now}, ?)
            ON CONFLICT (owner) DO UPDATE SET last_seen = excluded.last_seen, ttl = excluded.ttl
            RETURNING last_seen""",
        (owner, _hostname(), os.getpid(), started_at, ttl),
    ).fetchone()
    execute(conn, f"DELETE FROM nodes WHERE last_seen < {now} - ttl * ?", (RETENTION_TTLS,))
    return float(row[0])


def forget_node(conn: Any, owner: str) -> bool:
    """Delete a node's heartbeat row (write; a clean stop); True when there was one."""
    return bool(execute(conn, "DELETE FROM nodes WHERE owner = ?", (owner,)).rowcount == 1)


def list_nodes(conn: Any) -> list[dict[str, Any]]:
    """The cluster's nodes, most recently seen first (read-only).

    A node is ``gone`` once its last heartbeat is ``ttl`` seconds old on the database clock, or at
    once when it is a process of this host that no longer runs (:func:`leases.owner_is_dead`: a
    ``kill -9``, as the leases judge it); one gone for :data:`RETENTION_TTLS` of its ttl is not
    listed (its row is deleted at the next heartbeat of any node, :func:`beat_node`).

    Returns:
        ``[{owner, host, pid, startedAt, lastSeen, ageSeconds, uptimeSeconds, alive, state,
        leases, runningTasks}]``: ``startedAt`` and ``lastSeen`` are ISO 8601 UTC text on the
        database clock; ``ageSeconds`` is the seconds since the last heartbeat and
        ``uptimeSeconds`` since the start (on that clock); ``alive`` while the age is under the
        node's ttl and its process is not seen dead, ``state`` ``"alive"`` or ``"gone"``;
        ``leases`` the keys of its live leases (sorted), ``runningTasks`` the ids of the daemon
        tasks it runs (its ``task:<id>`` leases).
    """
    now = db_clock(conn)
    rows = execute(
        conn,
        f"SELECT owner, host, pid, started_at, last_seen, ttl, {now_sql(conn)} - last_seen AS age FROM nodes"
        f" WHERE last_seen >= {now_sql(conn)} - ttl * ? ORDER BY last_seen DESC",
        (RETENTION_TTLS,),
    )
    held: dict[str, list[str]] = {}
    for key, holder in execute(
        conn, "SELECT key, owner FROM leases WHERE owner IS NOT NULL AND expires_at > ? ORDER BY key", (now,)
    ).fetchall():
        held.setdefault(holder, []).append(key)
    nodes = []
    for owner, host, pid, started, seen, ttl, age in rows.fetchall():
        alive = float(age) < float(ttl) and not leases.owner_is_dead(owner)
        keys = held.get(owner, [])
        nodes.append(
            {
                "owner": owner,
                "host": host,
                "pid": int(pid),
                "startedAt": iso_from_unix(float(started)),
                "lastSeen": iso_from_unix(float(seen)),
                "ageSeconds": round(float(age), 3),
                "uptimeSeconds": round(float(seen) + float(age) - float(started), 3),
                "alive": alive,
                "state": "alive" if alive else "gone",
                "leases": keys,
                "runningTasks": [k.removeprefix("task:") for k in keys if k.startswith("task:")],
            }
        )
    return nodes


def owner_gone(conn: Any, owner: str) -> bool:
    """Whether the process ``owner`` (a lease owner identity) no longer runs (read-only).

    A dead process of this host (:func:`roost.storage.leases.owner_is_dead`) is gone. On
    PostgreSQL an owner of any host is gone when its node's heartbeat row is missing (it stopped,
    or was pruned long after it died) or is ttl seconds old on the database clock (it died, or
    is cut off), compared in SQL; on SQLite only this host's process table can tell, so another
    owner counts as alive.
    """
    if leases.owner_is_dead(owner):
        return True
    if is_sqlite(conn):
        return False
    row = execute(conn, f"SELECT {now_sql(conn)} - last_seen >= ttl FROM nodes WHERE owner = ?", (owner,)).fetchone()
    return row is None or bool(row[0])


def queue_depth(conn: Any) -> dict[str, int]:
    """``{queued, running}``: the shared task queue's tasks by status (read-only)."""
    counts = dict(
        execute(
            conn,
            "SELECT status, COUNT(*) FROM daemon_tasks WHERE status IN ('queued', 'running') GROUP BY status",
        ).fetchall()
    )
    return {"queued": int(counts.get("queued", 0)), "running": int(counts.get("running", 0))}


def wake_task_claimers(conn: Any, task_id: str, sender: str) -> None:
    """Tell the cluster's idle claimers that ``task_id`` may be claimed (write; part of the
    caller's transaction, delivered when it commits).

    PostgreSQL: ``NOTIFY roost_tasks, '<task_id> <sender>'`` (:mod:`roost.storage._pg_task_wake`);
    ``sender`` (the lease owner id of the sending process) lets it skip its own notifications.
    SQLite: nothing (its claimers poll).
    """
    if is_sqlite(conn):
        return
    from ._pg_task_wake import notify_task

    notify_task(conn, task_id, sender)


def task_wake_listener(store: Any, owner: str) -> Any:
    """A listener of the task queue's wake-ups for the process ``owner``, or None (SQLite).

    Returns:
        A :class:`roost.storage._pg_task_wake.PgTaskWakeListener` (``wait(timeout) -> bool`` in a
        worker thread, ``close()``) on a PostgreSQL store; None on any other store.

    Raises:
        DatabaseUnreachable: (and the other connection errors of :func:`roost.storage.open_backend`)
            the listening connection could not be opened.
    """
    url = getattr(store, "url", None)
    if not isinstance(url, str) or not url.startswith(("postgresql:", "postgres:")):
        return None
    from ._pg_task_wake import PgTaskWakeListener

    return PgTaskWakeListener(url, owner)
