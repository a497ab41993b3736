"""Execution leases with fencing tokens, shared by every process that opens the database.

A lease is a row ``leases(key, owner, token, expires_at, successor)``. Time is the wall clock
(``time.time()``, unix seconds) because several OS processes compare it. Rules:

* :func:`acquire` wins when there is no row, the lease expired, it was released, it was handed
  over to this very owner, or its owner is a dead process of this host (:func:`owner_is_dead`);
  every win increments ``token`` (the fencing token), also for the same owner. The row is never
  deleted, so tokens only grow.
* :func:`renew` extends the lease if its token is still current (even past expiry, when nobody
  else took it: fencing, not the clock, decides who may write).
* :func:`acquire_then` acquires and runs a first write in the same transaction (a turn's
  admission: one commit, not two); either both commit or neither does.
* :func:`release` frees it; :func:`hand_over` frees it for one named successor until a deadline.
* :func:`check_fence` guards a write: call it first inside the write's transaction; a superseded,
  released or handed-over token raises :class:`StaleLease` and the whole transaction (or the
  writer's savepoint) rolls back, so the write changes nothing. :func:`fenced` wraps a write
  function with that check.

All functions take a connection and are blocking. Outside a transaction each runs in its own
``BEGIN IMMEDIATE``; inside one (e.g. submitted to the :class:`StoreWriter`) in a savepoint.
The keeper that renews leases for running executions is :class:`~roost.storage.LeaseKeeper`.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from roost.errors import LeaseHeld, StaleLease

from ._connect import immediate
from ._portable import is_sqlite

__all__ = [
    "Lease",
    "acquire",
    "acquire_then",
    "refuse_if_held",
    "renew",
    "release",
    "hand_over",
    "check_fence",
    "fenced",
    "get_lease",
    "held_elsewhere",
    "held_elsewhere_many",
    "live_elsewhere",
    "owner_is_dead",
    "thread_lease_key",
]

R = TypeVar("R")
#: The columns of a lease row, in the order every query here selects them.
_COLUMNS = ("key", "owner", "token", "expires_at", "successor")


def _pg() -> Any:
    """The PostgreSQL lease functions (:mod:`roost.storage._pg_leases`): each function here runs
    them when given a psycopg connection, so callers need not know the backend."""
    from . import _pg_leases

    return _pg_leases


@attrs.frozen(kw_only=True)
class Lease:
    """A held lease as its holder knows it.

    Attributes:
        key: what is leased (``thread_lease_key(thread_id)`` for a thread's execution).
        owner: the holder's identity (one per process, e.g. ``host:pid:nonce``).
        token: the fencing token of this acquisition (1, 2, 3... per key).
        expires_at: unix seconds (wall clock) after which others may take it.
        ttl: the duration, in seconds, each renewal extends it by.
    """

    key: str
    owner: str
    token: int
    expires_at: float
    ttl: float


def thread_lease_key(thread_id: str) -> str:
    """Return the lease key of a thread's execution: ``"thread:<thread_id>"``."""
    return f"thread:{thread_id}"


def hostname() -> str:
    """This machine's name, as lease owners and tool process rows carry it: the kernel's node name,
    which is what ``socket.gethostname()`` returns (glibc reads it from ``uname``), without
    importing socket (some 3 ms before ``roost app-server`` answers ``initialize``; issue 19)."""
    return os.uname().nodename


def owner_is_dead(owner: str | None) -> bool:
    """Whether ``owner`` names a process of this host that no longer runs.

    Owners made by :func:`roost.storage.default_owner` read ``"<host>:<pid>:<nonce>"``. A lease
    whose owner is such a process of this host, and that process is gone (or a zombie), is as good
    as expired: it was killed (``kill -9``) before it could release. Any other owner string, another
    host's, or a running pid is treated as alive (the clock then decides). A recycled pid only
    makes a dead owner look alive until its lease expires; never the reverse.

    Blocking but cheap (``kill(pid, 0)`` and one ``/proc`` read).
    """
    if not owner:
        return False
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit() or parts[0] != hostname():
        return False
    pid = int(parts[1])
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # EPERM: it exists, under another user
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    state = stat[stat.rfind(b")") + 2 :][:1]
    return state in (b"Z", b"X")


def get_lease(conn: sqlite3.Connection, key: str) -> dict[str, Any] | None:
    """Return the lease row as a dict (``key, owner, token, expires_at, successor``) or ``None``.

    Read-only.
    """
    if not is_sqlite(conn):
        return _pg().get_lease(conn, key)
    row = conn.execute("SELECT key, owner, token, expires_at, successor FROM leases WHERE key = ?", (key,)).fetchone()
    return None if row is None else dict(zip(_COLUMNS, row, strict=True))


def live_elsewhere(lease: dict[str, Any] | None, owner: str, *, now: float | None = None) -> bool:
    """Whether the lease row ``lease`` (:func:`get_lease`) is held by a live execution of an owner
    other than ``owner``.

    Live: not released, not expired at ``now`` (unix wall-clock seconds, default the current time),
    and its owner not a dead process of this host (:func:`owner_is_dead`).
    """
    if not lease or lease.get("owner") is None or lease["owner"] == owner:
        return False
    current = time.time() if now is None else now
    return bool(lease["expires_at"] > current) and not owner_is_dead(lease["owner"])


def held_elsewhere(conn: sqlite3.Connection, key: str, owner: str) -> dict[str, Any] | None:
    """Return the lease row of ``key`` when a live execution of another owner holds it, else None
    (read-only; see :func:`live_elsewhere`)."""
    lease = get_lease(conn, key)
    now = None if is_sqlite(conn) else _pg().db_now(conn)  # PostgreSQL: the database's clock
    return lease if live_elsewhere(lease, owner, now=now) else None


#: Keys per ``IN (...)`` query of :func:`held_elsewhere_many` (below SQLite's 999 host parameters).
_KEYS_PER_QUERY = 500


def held_elsewhere_many(conn: sqlite3.Connection, keys: list[str], owner: str) -> dict[str, dict[str, Any]]:
    """:func:`held_elsewhere` for many keys at once: ``{key: lease row}`` of those ``keys`` a live
    execution of another owner holds (keys not held elsewhere are absent).

    One query per 500 keys (and, on PostgreSQL, one read of the database's clock) instead of one
    or two per key, so listing a page of threads costs a few round trips, not a page's worth.
    Read-only.
    """
    if not keys:
        return {}
    pg = not is_sqlite(conn)
    now = _pg().db_now(conn) if pg else None
    held: dict[str, dict[str, Any]] = {}
    for start in range(0, len(keys), _KEYS_PER_QUERY):
        chunk = keys[start : start + _KEYS_PER_QUERY]
        if pg:
            rows = _pg().get_leases(conn, chunk)
        else:
            marks = ",".join("?" * len(chunk))
            rows = conn.execute(
                f"SELECT key, owner, token, expires_at, successor FROM leases WHERE key IN ({marks})", chunk
            ).fetchall()
        for row in rows:
            lease = dict(zip(_COLUMNS, row, strict=True))
            if live_elsewhere(lease, owner, now=now):
                held[lease["key"]] = lease
    return held


def acquire(conn: sqlite3.Connection, key: str, owner: str, ttl: float, *, now: float | None = None) -> Lease:
    """Take the lease ``key`` for ``owner`` for ``ttl`` seconds.

    Args:
        conn: a write-capable connection.
        key: the lease key.
        owner: the acquiring owner's identity.
        ttl: seconds until expiry (must be > 0).
        now: the wall-clock time to use (unix seconds; default ``time.time()``).

    Returns:
        The new :class:`Lease`, with a token one higher than any before for ``key``.

    Raises:
        LeaseHeld: another holder's lease is live (or it is handed over to someone else); the
            error carries that ``owner`` (or the successor) and ``expires_at``.
        StoreBusy: the write lock could not be taken.
    """
    if not is_sqlite(conn):
        return _pg().acquire(conn, key, owner, ttl, now=now)
    if ttl <= 0:
        raise ValueError("ttl must be positive seconds")
    with immediate(conn):
        return _take(conn, key, owner, ttl, now)


def acquire_then(
    conn: sqlite3.Connection,
    key: str,
    owner: str,
    ttl: float,
    fn: Callable[..., R],
    *args: Any,
    now: float | None = None,
) -> tuple[Lease, R]:
    """:func:`acquire` the lease ``key``, then run ``fn(conn, *args)`` in the same transaction (or
    savepoint): the first write of the new execution, with no fence to check (the lease was
    taken by this very transaction), and one commit for both (a turn's admission, issue 12).

    Returns:
        ``(lease, what fn returned)``.

    Raises:
        LeaseHeld: as :func:`acquire`; ``fn`` did not run, nothing changed.
        ValueError: ``ttl`` is not positive.
        Exception: whatever ``fn`` raised; the acquisition is rolled back with ``fn``'s changes
            (the lease is not taken, its token does not move).
    """
    if not is_sqlite(conn):
        return _pg().acquire_then(conn, key, owner, ttl, fn, *args, now=now)
    if ttl <= 0:
        raise ValueError("ttl must be positive seconds")
    with immediate(conn):
        lease = _take(conn, key, owner, ttl, now)
        return lease, fn(conn, *args)


def refuse_if_held(
    key: str, owner: str, holder: str | None, expires_at: float, successor: str | None, now: float
) -> None:
    """Raise :class:`LeaseHeld` unless ``owner`` may take the lease ``key`` now: it is free (no
    holder, no successor), expired by ``now`` (unix seconds), handed over to ``owner``, or held by
    a dead process of this host (:func:`owner_is_dead`). The rule of :func:`acquire` on both
    backends (``_pg_leases.acquire`` judges by the database's clock)."""
    free = holder is None and successor is None
    if not (free or expires_at <= now or successor == owner or owner_is_dead(holder)):
        who = holder if holder is not None else f"successor {successor}"
        raise LeaseHeld(
            f"lease {key!r} is held by {who} until {expires_at:.3f}",
            owner=holder if holder is not None else successor,
            expires_at=expires_at,
        )


def _take(conn: sqlite3.Connection, key: str, owner: str, ttl: float, now: float | None) -> Lease:
    """The body of :func:`acquire`, inside the caller's transaction."""
    now = time.time() if now is None else now
    row = conn.execute("SELECT owner, token, expires_at, successor FROM leases WHERE key = ?", (key,)).fetchone()
    token = 1
    if row is not None:
        holder, old_token, expires_at, successor = row
        refuse_if_held(key, owner, holder, expires_at, successor, now)
        token = old_token + 1
    expires = now + ttl
    conn.execute(
        """INSERT INTO leases (key, owner, token, expires_at, successor) VALUES (?, ?, ?, ?, NULL)
           ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, token = excluded.token,
               expires_at = excluded.expires_at, successor = NULL""",
        (key, owner, token, expires),
    )
    return Lease(key=key, owner=owner, token=token, expires_at=expires, ttl=ttl)


def check_fence(conn: sqlite3.Connection, key: str, token: int) -> None:
    """Raise :class:`StaleLease` unless ``token`` is the current, held token of ``key``.

    Call it inside the transaction of the write it guards, before the write: the exception rolls
    the write back (its savepoint in the :class:`StoreWriter`), so it changes nothing.

    Raises:
        StaleLease: the lease was re-acquired (higher token), released or handed over.
    """
    if not is_sqlite(conn):
        return _pg().check_fence(conn, key, token)
    row = conn.execute("SELECT owner, token FROM leases WHERE key = ?", (key,)).fetchone()
    if row is None or row[0] is None or row[1] != token:
        current = None if row is None else row[1]
        raise StaleLease(f"lease {key!r} token {token} is stale (current token {current})")


def fenced(key: str, token: int, fn: Callable[..., R]) -> Callable[..., R]:
    """Return ``fn`` guarded by :func:`check_fence` (for ``writer.submit(fenced(...), *args)``).

    The returned function calls ``check_fence(conn, key, token)`` and then ``fn(conn, *args)``.
    """

    @functools.wraps(fn)
    def guarded(conn: sqlite3.Connection, *args: Any, **kwargs: Any) -> R:
        check_fence(conn, key, token)
        return fn(conn, *args, **kwargs)

    return guarded


def renew(conn: sqlite3.Connection, lease: Lease, ttl: float | None = None, *, now: float | None = None) -> Lease:
    """Extend a held lease to ``now + ttl`` (default: the lease's own ttl).

    Returns:
        The lease with its new ``expires_at`` (same token).

    Raises:
        StaleLease: the token was superseded, released or handed over; nothing changed.
        StoreBusy: the write lock could not be taken.
    """
    if not is_sqlite(conn):
        return _pg().renew(conn, lease, ttl, now=now)
    ttl = lease.ttl if ttl is None else ttl
    with immediate(conn):
        check_fence(conn, lease.key, lease.token)
        now = time.time() if now is None else now
        conn.execute("UPDATE leases SET expires_at = ? WHERE key = ?", (now + ttl, lease.key))
    return attrs.evolve(lease, expires_at=now + ttl, ttl=ttl)


def release(conn: sqlite3.Connection, lease: Lease) -> bool:
    """Free the lease if ``lease`` still holds it (idempotent; for clean-up paths).

    Returns:
        ``True`` if it was released now, ``False`` if the token was already stale.

    Raises:
        StoreBusy: the write lock could not be taken.
    """
    if not is_sqlite(conn):
        return _pg().release(conn, lease)
    with immediate(conn):
        cur = conn.execute(
            """UPDATE leases SET owner = NULL, successor = NULL, expires_at = 0
               WHERE key = ? AND token = ? AND owner IS NOT NULL""",
            (lease.key, lease.token),
        )
        return cur.rowcount == 1


def hand_over(
    conn: sqlite3.Connection,
    lease: Lease,
    successor: str,
    *,
    ttl: float | None = None,
    now: float | None = None,
) -> None:
    """Release the lease to the named ``successor``: only it may acquire until the deadline.

    After ``now + ttl`` (default: the lease's ttl) without the successor taking it, anyone may.
    The old token is stale from this moment (the holder's writes fail).

    Raises:
        StaleLease: ``lease`` no longer holds it; nothing changed.
        StoreBusy: the write lock could not be taken.
    """
    if not is_sqlite(conn):
        return _pg().hand_over(conn, lease, successor, ttl=ttl, now=now)
    ttl = lease.ttl if ttl is None else ttl
    with immediate(conn):
        check_fence(conn, lease.key, lease.token)
        now = time.time() if now is None else now
        conn.execute(
            "UPDATE leases SET owner = NULL, successor = ?, expires_at = ? WHERE key = ?",
            (successor, now + ttl, lease.key),
        )
