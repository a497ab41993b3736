"""SQLite connections, transactions and the translation of sqlite3 errors into Roost errors.

Every connection is opened in driver autocommit mode (``isolation_level=None``) so that Roost, not
the sqlite3 module, decides where transactions begin: write transactions always start with
``BEGIN IMMEDIATE`` (take the write lock first, so a read-then-write never deadlocks on a lock
upgrade), nested ones use savepoints (the ``sqlite_utils.Database.atomic`` pattern).
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from roost.errors import Conflict, StoreBusy, StoreCorrupt, StoreDiskFull, StoreError, StoreReadOnly

__all__ = [
    "DEFAULT_BUSY_TIMEOUT",
    "connect",
    "connect_read_only",
    "immediate",
    "is_locked",
    "translate_error",
]

#: Seconds a statement waits for another connection's lock before SQLite reports it busy.
DEFAULT_BUSY_TIMEOUT = 5.0
# SQLite result codes (https://www.sqlite.org/rescode.html).
_SQLITE_READONLY, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_NOTADB = 8, 11, 13, 26
#: SQLITE_IOERR_WRITE, _FSYNC, _TRUNCATE: a write the file system refused (ENOSPC, EFBIG, EDQUOT).
_WRITE_IOERRS = frozenset({778, 1034, 1546})

#: How many times ``COMMIT`` is retried after a full busy_timeout; ``BEGIN IMMEDIATE`` waits as
#: long in all, polling (:func:`_begin_immediate`).
_BUSY_RETRIES = 3
#: First and longest sleep, seconds, between two tries of ``BEGIN IMMEDIATE`` on a held lock.
_POLL_FIRST_S = 0.0001
_POLL_MAX_S = 0.001

#: The one savepoint name: SQLite's ``RELEASE``/``ROLLBACK TO`` act on the newest savepoint of a
#: name, so nested blocks of one name unwind as a stack; one SQL text per statement also keeps
#: them prepared in the connection's statement cache (a name per savepoint prepared two fresh
#: statements for every write of a group, and pushed the group's other statements out).
_SAVEPOINT = "roost_sp"
_BEGIN_SAVEPOINT = f"SAVEPOINT {_SAVEPOINT}"
_ROLLBACK_SAVEPOINT = f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}"
_RELEASE_SAVEPOINT = f"RELEASE SAVEPOINT {_SAVEPOINT}"


def connect(
    path: str | Path, *, query_only: bool = False, busy_timeout: float = DEFAULT_BUSY_TIMEOUT
) -> sqlite3.Connection:
    """Open a connection with Roost's settings.

    Settings: autocommit driver mode, ``synchronous=NORMAL`` (durable at each WAL checkpoint, never
    corrupt), ``busy_timeout``, ``foreign_keys=ON``, rows as :class:`sqlite3.Row`, usable from any
    thread (the caller guarantees one thread at a time). WAL mode is set once by the migration step
    and is persistent in the file.

    A database that exists in a directory this process cannot write (a read-only
    ``$ROOST_HOME``) is opened read-only, as SQLite itself opens an unwritable file: reads work and
    every write raises :class:`StoreReadOnly` (a WAL database there has no ``-shm`` file to open
    read-write; :func:`connect_read_only`).

    Args:
        path: the database file.
        query_only: refuse writes on this connection (``PRAGMA query_only``).
        busy_timeout: seconds to wait for a lock before an operation reports busy.

    Raises:
        StoreError: the file cannot be opened.
    """
    try:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=busy_timeout)
    except sqlite3.Error as exc:
        raise translate_error(exc) from exc
    if _unwritable_home(path):
        try:
            conn.execute("PRAGMA schema_version")  # opens the WAL's -shm now, not at the first query
        except sqlite3.OperationalError:
            conn.close()
            conn = _open_read_only(Path(path), busy_timeout, query_only=False)  # (set below when asked)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = ON")
    if query_only:
        conn.execute("PRAGMA query_only = 1")
    return conn


def connect_read_only(path: str | Path, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> sqlite3.Connection:
    """Open ``path`` read-only (``mode=ro``), for a database whose file or directory is unwritable.

    A WAL database needs its ``-shm`` file; when there is no ``-wal`` file (nothing waits to be
    checkpointed) and the directory is not writable (so no writer can start one), the file is
    opened ``immutable=1``, which SQLite reads without ``-shm`` (https://www.sqlite.org/wal.html,
    "Read-Only Databases"; https://www.sqlite.org/uri.html). Rows as :class:`sqlite3.Row`.

    Raises:
        StoreError: the file cannot be opened.
    """
    conn = _open_read_only(Path(path), busy_timeout, query_only=True)
    conn.row_factory = sqlite3.Row
    return conn


def _unwritable_home(path: str | Path) -> bool:
    """Whether ``path`` is an existing file in a directory this process cannot write."""
    path = Path(path)
    return path.is_file() and not os.access(path.parent, os.W_OK)


def _open_read_only(path: Path, busy_timeout: float, *, query_only: bool) -> sqlite3.Connection:
    """``path`` opened ``mode=ro`` (``immutable=1`` when no ``-wal`` file waits and the directory
    is unwritable, see :func:`connect_read_only`); a write on it raises SQLITE_READONLY, which
    :func:`translate_error` makes :class:`StoreReadOnly`.

    Raises:
        StoreError: the file cannot be opened.
    """
    immutable = not Path(f"{path}-wal").exists() and not os.access(path.parent, os.W_OK)
    uri = f"{path.resolve().as_uri()}?mode=ro" + ("&immutable=1" if immutable else "")
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False, timeout=busy_timeout)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        if query_only:
            conn.execute("PRAGMA query_only = 1")
    except sqlite3.Error as exc:
        raise translate_error(exc) from exc
    return conn


def is_locked(exc: BaseException) -> bool:
    """Return whether ``exc`` is SQLite's "database is locked"/"busy" (SQLITE_BUSY/SQLITE_LOCKED)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (5, 6)
    text = str(exc)
    return "locked" in text or "busy" in text


def translate_error(exc: sqlite3.Error) -> StoreError:
    """Map a sqlite3 error to the most specific :class:`~roost.errors.StoreError` (not raised).

    ``database is locked``/busy -> :class:`StoreBusy`; constraint violations (``IntegrityError``)
    -> :class:`Conflict`; SQLITE_FULL and failed writes (SQLITE_IOERR_WRITE/FSYNC/TRUNCATE) ->
    :class:`StoreDiskFull`; SQLITE_READONLY -> :class:`StoreReadOnly`; SQLITE_CORRUPT/NOTADB ->
    :class:`StoreCorrupt` (result codes: https://www.sqlite.org/rescode.html); anything else ->
    :class:`StoreError`. The caller raises it ``from exc``.
    """
    if is_locked(exc):
        return StoreBusy(f"database stayed locked: {exc}")
    if isinstance(exc, sqlite3.IntegrityError):
        return Conflict(str(exc))
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary == _SQLITE_FULL or code in _WRITE_IOERRS:
        return StoreDiskFull(
            f"the database could not be written: no space left (disk full or a file-size "
            f"limit; {exc}). Nothing committed is lost: free space and retry"
        )
    if primary == _SQLITE_READONLY:
        return StoreReadOnly(
            f"the database is read-only ({exc}): make the file, its directory and its "
            "mount writable; its contents are fine"
        )
    if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return StoreCorrupt(f"the database is damaged or not a SQLite database ({exc})")
    return StoreError(f"{type(exc).__name__}: {exc}")


def _execute_retrying(conn: sqlite3.Connection, sql: str) -> None:
    """Run ``sql`` (COMMIT), retrying a few times past busy_timeout."""
    for attempt in range(_BUSY_RETRIES + 1):
        try:
            conn.execute(sql)
            return
        except sqlite3.OperationalError as exc:
            if not is_locked(exc) or attempt == _BUSY_RETRIES:
                raise translate_error(exc) from exc
            time.sleep(0.01 * (attempt + 1))


def _begin_immediate(conn: sqlite3.Connection) -> None:
    """``BEGIN IMMEDIATE``, polling for the write lock with short jittered sleeps of our own.

    SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25 ... ms between tries: between two
    processes on one file (``roost serve --workers``) a writer waited 7-8 ms at p90 for a lock the
    other had released long before (issue 19). So the connection's busy timeout is set to 0 for
    the BEGIN alone and each try that finds the lock held sleeps :data:`_POLL_FIRST_S` doubling
    up to :data:`_POLL_MAX_S` (times 0.5-1.5 at random, so two waiters do not poll in step),
    for at most ``(1 + _BUSY_RETRIES)`` times the connection's busy timeout in all (the bound of
    the retries before); then :class:`StoreBusy`, naming the wait. The busy timeout is restored
    for the statements of the transaction (and the COMMIT), also when the BEGIN fails. Nothing is
    written before the lock is held, so a retried BEGIN loses nothing.
    """
    timeout_ms = int(conn.execute("PRAGMA busy_timeout").fetchone()[0])
    deadline = time.monotonic() + timeout_ms * (1 + _BUSY_RETRIES) / 1000
    delay = _POLL_FIRST_S
    conn.execute("PRAGMA busy_timeout = 0")
    try:
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not is_locked(exc):
                    raise translate_error(exc) from exc
                left = deadline - time.monotonic()
                if left <= 0:
                    waited = timeout_ms * (1 + _BUSY_RETRIES) / 1000
                    raise StoreBusy(
                        f"database stayed locked by another connection for {waited:g} s "
                        f"(waiting to write: {exc}); another process holds a write transaction open"
                    ) from exc
                time.sleep(min(left, delay * random.uniform(0.5, 1.5)))
                delay = min(delay * 2, _POLL_MAX_S)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {timeout_ms}")


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection, *, begun: bool = False) -> Iterator[sqlite3.Connection]:
    """Run the block in a write transaction: ``BEGIN IMMEDIATE`` or, nested, a savepoint.

    Outermost: takes the write lock up front (polling for it up to four times the connection's
    busy_timeout, :func:`_begin_immediate`),
    commits on success, rolls back on any ``BaseException`` without masking it. Nested (the
    connection is already in a transaction, e.g. inside a StoreWriter group): a savepoint that
    rolls back alone (one name for all: nested ones unwind as a stack). ``begun``: the caller
    already ran ``BEGIN IMMEDIATE`` on ``conn``; the block is that transaction (committed or rolled
    back here, like an outermost one).

    This is a blocking call (run it in a worker thread from trio).

    Raises:
        StoreBusy: the write lock stayed held by another connection past every retry.
        StoreError: COMMIT failed (the transaction was rolled back).
    """
    if conn.in_transaction and not begun:
        conn.execute(_BEGIN_SAVEPOINT)
        try:
            yield conn
        except BaseException:
            # A failure may have destroyed the whole transaction (and the savepoint with it).
            if conn.in_transaction:
                conn.execute(_ROLLBACK_SAVEPOINT)
                conn.execute(_RELEASE_SAVEPOINT)
            raise
        conn.execute(_RELEASE_SAVEPOINT)
        return
    if not begun:
        _begin_immediate(conn)
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    try:
        _execute_retrying(conn, "COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
