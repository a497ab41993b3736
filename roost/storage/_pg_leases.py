"""Execution leases on PostgreSQL: the contract of :mod:`roost.storage.leases`, cluster-wide.

Same rows (``leases``: key, owner, token, expires_at unix seconds, successor), same rules: the
fencing token increments on every acquisition; renew, release and hand-over are conditional on the
token; a write of an execution is guarded by :func:`check_fence` in its own transaction.

Differences forced by N nodes on one server:

* **Clock.** Expiry is judged on the database's clock, ``extract(epoch FROM now())`` (the start
  of the current transaction, https://www.postgresql.org/docs/15/functions-datetime.html), never a
  node's. An explicit ``now`` (tests of simulated time) overrides it, as on SQLite.
* **Locking.** SQLite serialises writers on one file lock; here :func:`acquire` locks the lease row
  (``SELECT ... FOR UPDATE``, after creating it with ``ON CONFLICT DO NOTHING`` so two first
  acquirers serialise too), and :func:`check_fence` takes ``FOR SHARE`` on it: a takeover's
  ``UPDATE`` waits for the guarded write's transaction to end, or the guard waits for the takeover
  to commit and then sees the new token. Either way no write of a stale token commits.
* **Liveness.** A holder on another host is alive until its lease expires
  (:func:`roost.storage.leases.owner_is_dead` only judges this host's processes).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import psycopg

from roost.errors import StaleLease

from .leases import Lease, refuse_if_held

__all__ = [
    "acquire",
    "acquire_then",
    "renew",
    "release",
    "hand_over",
    "check_fence",
    "fenced",
    "get_lease",
    "get_leases",
    "db_now",
    "live_lease_owners",
]

R = TypeVar("R")
_COLUMNS = ("key", "owner", "token", "expires_at", "successor")


def db_now(conn: psycopg.Connection) -> float:
    """Return the database's clock, unix seconds (``now()``: the current transaction's start)."""
    row = conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()
    assert row is not None
    return float(row[0])


def get_lease(conn: psycopg.Connection, key: str) -> dict[str, Any] | None:
    """Return the lease row as a dict (``key, owner, token, expires_at, successor``) or ``None``."""
    row = conn.execute("SELECT key, owner, token, expires_at, successor FROM leases WHERE key = %s", (key,)).fetchone()
    return None if row is None else dict(zip(_COLUMNS, row, strict=True))


def get_leases(conn: psycopg.Connection, keys: list[str]) -> list[tuple[Any, ...]]:
    """Return the lease rows (``key, owner, token, expires_at, successor`` tuples) of ``keys``
    that have one, in no particular order (``key = ANY(...)``: one round trip)."""
    return conn.execute(
        "SELECT key, owner, token, expires_at, successor FROM leases WHERE key = ANY(%s)", (list(keys),)
    ).fetchall()


def acquire(conn: psycopg.Connection, key: str, owner: str, ttl: float, *, now: float | None = None) -> Lease:
    """Take the lease ``key`` for ``owner`` for ``ttl`` seconds (see :func:`roost.storage.acquire`).

    Args:
        conn: a connection (autocommit or inside a transaction: this runs in a savepoint).
        now: unix seconds to judge expiry by; default the database's clock.

    Returns:
        The new :class:`Lease`, its token one higher than any before for ``key``.

    Raises:
        LeaseHeld: another holder's lease is live, or it is handed over to someone else.
        ValueError: ``ttl`` is not positive.
    """
    if ttl <= 0:
        raise ValueError("ttl must be positive seconds")
    with conn.transaction():
        conn.execute("INSERT INTO leases (key) VALUES (%s) ON CONFLICT (key) DO NOTHING", (key,))
        row = conn.execute(
            "SELECT owner, token, expires_at, successor, extract(epoch FROM now())::float8"
            " FROM leases WHERE key = %s FOR UPDATE",
            (key,),
        ).fetchone()
        assert row is not None
        holder, old_token, expires_at, successor, clock = row
        current = clock if now is None else now
        refuse_if_held(key, owner, holder, expires_at, successor, current)
        token = old_token + 1
        expires = current + ttl
        conn.execute(
            "UPDATE leases SET owner = %s, token = %s, expires_at = %s, successor = NULL WHERE key = %s",
            (owner, token, expires, key),
        )
    return Lease(key=key, owner=owner, token=token, expires_at=expires, ttl=ttl)


def acquire_then(
    conn: psycopg.Connection,
    key: str,
    owner: str,
    ttl: float,
    fn: Callable[..., R],
    *args: Any,
    now: float | None = None,
) -> tuple[Lease, R]:
    """:func:`acquire`, then ``fn(conn, *args)`` in the same transaction (see
    :func:`roost.storage.leases.acquire_then`): the lease row stays locked ``FOR UPDATE`` until it
    commits, so no fence check is needed; either both commit or neither does.

    Raises:
        LeaseHeld: as :func:`acquire` (``fn`` did not run). Exception: whatever ``fn`` raised
            (the acquisition is rolled back with it).
    """
    with conn.transaction():
        lease = acquire(conn, key, owner, ttl, now=now)
        return lease, fn(conn, *args)


_FENCE_SQL = {
    "share": "SELECT owner, token, extract(epoch FROM now())::float8 FROM leases WHERE key = %s FOR SHARE",
    "update": "SELECT owner, token, extract(epoch FROM now())::float8 FROM leases WHERE key = %s FOR UPDATE",
}


def _fence_row(conn: psycopg.Connection, key: str, token: int, lock: str = "share") -> float:
    """Lock the lease row (``FOR SHARE`` to guard a write, ``FOR UPDATE`` to change the lease
    itself, so two changers never deadlock on a lock upgrade), check the token, and return the
    database clock."""
    row = conn.execute(_FENCE_SQL[lock], (key,)).fetchone()
    if row is None or row[0] is None or row[1] != token:
        current = None if row is None else row[1]
        raise StaleLease(f"lease {key!r} token {token} is stale (current token {current})")
    return float(row[2])


def check_fence(conn: psycopg.Connection, key: str, token: int) -> None:
    """Raise :class:`StaleLease` unless ``token`` is the current, held token of ``key``.

    Call it inside the transaction of the write it guards, before the write: it locks the lease row
    ``FOR SHARE`` until that transaction ends, so no takeover can commit in between. Unlike on
    SQLite, that needs a write transaction (``PostgresStore.transaction()``, not ``read()``).

    Raises:
        StaleLease: the lease was re-acquired (higher token), released or handed over.
    """
    _fence_row(conn, key, token)


def fenced(key: str, token: int, fn: Callable[..., R]) -> Callable[..., R]:
    """Return ``fn`` guarded by :func:`check_fence`: ``check_fence(conn, key, token)``, then
    ``fn(conn, *args, **kwargs)`` (run both in one transaction)."""

    @functools.wraps(fn)
    def guarded(conn: psycopg.Connection, *args: Any, **kwargs: Any) -> R:
        check_fence(conn, key, token)
        return fn(conn, *args, **kwargs)

    return guarded


def renew(conn: psycopg.Connection, lease: Lease, ttl: float | None = None, *, now: float | None = None) -> Lease:
    """Extend a held lease to ``now + ttl`` (default: the database's clock, the lease's ttl).

    Raises:
        StaleLease: the token was superseded, released or handed over; nothing changed.
    """
    ttl = lease.ttl if ttl is None else ttl
    with conn.transaction():
        clock = _fence_row(conn, lease.key, lease.token, "update")
        expires = (clock if now is None else now) + ttl
        conn.execute("UPDATE leases SET expires_at = %s WHERE key = %s", (expires, lease.key))
    return attrs.evolve(lease, expires_at=expires, ttl=ttl)


def release(conn: psycopg.Connection, lease: Lease) -> bool:
    """Free the lease if ``lease`` still holds it (idempotent).

    Returns:
        ``True`` if it was released now, ``False`` if the token was already stale.
    """
    with conn.transaction():
        cur = conn.execute(
            "UPDATE leases SET owner = NULL, successor = NULL, expires_at = 0"
            " WHERE key = %s AND token = %s AND owner IS NOT NULL",
            (lease.key, lease.token),
        )
        return cur.rowcount == 1


def hand_over(
    conn: psycopg.Connection, lease: Lease, successor: str, *, ttl: float | None = None, now: float | None = None
) -> None:
    """Release the lease to ``successor``: only it may acquire until ``now + ttl``.

    The old token is stale from this moment.

    Raises:
        StaleLease: ``lease`` no longer holds it; nothing changed.
    """
    ttl = lease.ttl if ttl is None else ttl
    with conn.transaction():
        clock = _fence_row(conn, lease.key, lease.token, "update")
        conn.execute(
            "UPDATE leases SET owner = NULL, successor = %s, expires_at = %s WHERE key = %s",
            (successor, (clock if now is None else now) + ttl, lease.key),
        )


def live_lease_owners(conn: psycopg.Connection) -> list[tuple[str, int, float]]:
    """Return ``(owner, live leases, seconds until the last expires)`` per owner holding an
    unexpired lease, on the database's clock, busiest first (read-only; for a cluster status)."""
    rows = conn.execute(
        """SELECT owner, count(*), max(expires_at) - extract(epoch FROM now())::float8
           FROM leases WHERE owner IS NOT NULL AND expires_at > extract(epoch FROM now())::float8
           GROUP BY owner ORDER BY count(*) DESC, owner"""
    ).fetchall()
    return [(str(r[0]), int(r[1]), float(r[2])) for r in rows]
