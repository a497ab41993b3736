"""The Store: one database file, its migrations, its writer and a small pool of read connections."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from roost._paths import database_path
from roost.errors import (
    MigrationError,
    SchemaTooNew,
    StoreBusy,
    StoreClosed,
    StoreCorrupt,
    StoreDiskFull,
    StoreError,
    StoreReadOnly,
)

from ._connect import DEFAULT_BUSY_TIMEOUT, connect, connect_read_only, immediate, translate_error
from ._schema import migrate
from ._sqlite_ops import SQLiteOperations

if TYPE_CHECKING:
    from ._writer import StoreWriter

__all__ = ["Store", "open_store"]

#: Idle read connections kept for reuse.
_POOL_MAX = 8


class Store(SQLiteOperations):
    """An open Roost database. Create it with :func:`open_store`.

    It implements the store interface (:class:`roost.storage.StoreBackend`) for SQLite: every
    operation is also a method taking the connection first (``store.get_thread(conn, id)``).

    Attributes:
        path: the database file.
        writer: the process's :class:`StoreWriter` (start it with ``nursery.start(store.writer.run)``).
        read_only: opened by ``open_store(read_only_ok=True)`` on an unwritable home: reads work,
            :meth:`transaction` and :attr:`writer` raise :class:`StoreReadOnly`.
    """

    def __init__(
        self,
        path: Path,
        *,
        busy_timeout: float,
        batch_max: int,
        queue_size: int,
        _tempdir: str | None = None,
        read_only: StoreReadOnly | None = None,
    ) -> None:
        self.path = path
        self.read_only = read_only is not None
        self._why_read_only = read_only
        self.busy_timeout = busy_timeout
        self._writer_sizes = (batch_max, queue_size)
        self._writer: StoreWriter | None = None
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._tempdir = _tempdir

    @property
    def writer(self) -> StoreWriter:
        """The process's :class:`StoreWriter`, created on first use (it imports trio: a blocking
        CLI command that only reads never pays for that)."""
        if self._why_read_only is not None:
            raise StoreReadOnly(str(self._why_read_only))
        if self._writer is None:
            from ._writer import StoreWriter

            batch_max, queue_size = self._writer_sizes
            self._writer = StoreWriter(
                self.path, batch_max=batch_max, queue_size=queue_size, busy_timeout=self.busy_timeout
            )
        return self._writer

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """Lend a read-only connection (``PRAGMA query_only``) for the block; thread-safe.

        The connection is in autocommit mode: each statement sees the latest committed state.
        Wrap several statements in ``BEGIN``/``COMMIT`` for one consistent snapshot. Reads are
        blocking; offload big ones with ``trio.to_thread.run_sync``.

        Raises:
            StoreClosed: the store is closed.
        """
        with self._lock:
            if self._closed:
                raise StoreClosed("the store is closed")
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            if self.read_only:
                conn = connect_read_only(self.path, busy_timeout=self.busy_timeout)
            else:
                conn = connect(self.path, query_only=True, busy_timeout=self.busy_timeout)
        try:
            yield conn
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            with self._lock:
                if self._closed or len(self._idle) >= _POOL_MAX:
                    conn.close()
                else:
                    self._idle.append(conn)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Run the block in a ``BEGIN IMMEDIATE`` transaction on a fresh connection (blocking).

        For synchronous callers (CLI commands, start-up reconciliation, tests) that are not served
        by the writer. It competes for the write lock like another process would.

        Raises:
            StoreClosed: the store is closed.
            StoreBusy: the write lock stayed held past every retry.
            StoreReadOnly: the database cannot be written (a read-only home: the block's first
                write failed, SQLITE_READONLY); nothing was committed.
        """
        if self._closed:
            raise StoreClosed("the store is closed")
        if self._why_read_only is not None:
            raise StoreReadOnly(str(self._why_read_only))
        conn = connect(self.path, busy_timeout=self.busy_timeout)
        try:
            with immediate(conn):
                yield conn
        except sqlite3.OperationalError as exc:
            failure = translate_error(exc)
            if isinstance(failure, StoreReadOnly):
                raise failure from exc
            raise
        finally:
            conn.close()

    def write_refusal(self) -> str | None:
        """Why this database refuses writes (its :class:`StoreReadOnly` message: a read-only file,
        directory or mount), or None when a write would be taken.

        A file and directory this process may write (``os.access``, which also refuses on a
        read-only mount) count as writable at once (the usual case: no cost at start-up). Else
        the probe is a write statement that changes nothing, on a connection of its own that
        does not wait for a lock: a database another process is writing counts as writable.
        """
        if self._why_read_only is not None:
            return str(self._why_read_only)
        if os.access(self.path, os.W_OK) and os.access(self.path.parent, os.W_OK):
            return None  # (access() also says no for a read-only mount, EROFS): no probe needed
        try:
            conn = connect(self.path, busy_timeout=0)
        except StoreError as exc:
            return str(exc) if isinstance(exc, StoreReadOnly) else None
        try:
            conn.execute("BEGIN")
            conn.execute("UPDATE _sqlite_migrations SET name = name WHERE 0")
        except sqlite3.Error as exc:
            error = translate_error(exc)
            return str(error) if isinstance(error, StoreReadOnly) else None
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            conn.close()
        return None

    def close(self) -> None:
        """Close the idle read connections (idempotent). The writer closes its own on stop.

        An ephemeral store (``open_store(":memory:")``) also deletes its files.
        """
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        if self._tempdir is not None:
            import shutil

            shutil.rmtree(self._tempdir, ignore_errors=True)
            self._tempdir = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(
    path: str | Path | None = None,
    *,
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    batch_max: int = 512,
    queue_size: int = 4096,
    read_only_ok: bool = False,
) -> Store:
    """Open (creating and migrating as needed) the database and return a :class:`Store`.

    Blocking (migrations run here). Safe to call from several processes at once.

    Args:
        path: the database file; ``None`` means ``$ROOST_HOME/roost.db``; ``":memory:"`` makes an
            ephemeral store in a private temporary directory, deleted by :meth:`Store.close`
            (a real file, because the writer and the readers need separate connections).
        busy_timeout: seconds a connection waits for another's lock.
        batch_max: most writes per group commit.
        queue_size: bound of the writer's queue.
        read_only_ok: a command that mostly reads: when the database (or its directory) cannot
            be written but its schema is current, return a read-only store (:attr:`Store.read_only`)
            instead of raising, so reads keep working on a read-only home (issue 18, finding 6); a
            read-only home with no database yet gives an empty read-only store (nothing to read;
            a write raises the :class:`StoreReadOnly` that says which directory to make writable).

    Raises:
        MigrationError: the schema could not be brought up to date.
        StoreBusy: the database stayed locked.
        StoreError: the file cannot be opened.
    """
    tempdir = None
    if path is None:
        db_path = database_path()
    elif str(path) == ":memory:":
        import tempfile  # only an ephemeral store needs it (issue 19: start-up)

        tempdir = tempfile.mkdtemp(prefix="roost-store-")
        db_path = Path(tempdir) / "roost.db"
    else:
        db_path = Path(path)
    try:
        db_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create {db_path.parent}: {exc.strerror or exc}") from exc
    try:
        conn = connect(db_path, busy_timeout=busy_timeout)
        try:
            _migrate_patiently(conn, busy_timeout)
        finally:
            conn.close()
    except (sqlite3.DatabaseError, StoreError) as exc:  # "file is not a database", unwritable...
        failure = _open_failure(db_path, exc if isinstance(exc, StoreError) else translate_error(exc))
        if read_only_ok and isinstance(failure, StoreReadOnly):
            if _schema_current(db_path, busy_timeout):
                return Store(
                    db_path, busy_timeout=busy_timeout, batch_max=batch_max, queue_size=queue_size, read_only=failure
                )
            if not db_path.exists():  # a read-only home with no database yet: nothing to read
                return _empty_read_only(failure, busy_timeout=busy_timeout, batch_max=batch_max, queue_size=queue_size)
        raise failure from exc
    return Store(db_path, busy_timeout=busy_timeout, batch_max=batch_max, queue_size=queue_size, _tempdir=tempdir)


def _empty_read_only(failure: StoreReadOnly, *, busy_timeout: float, batch_max: int, queue_size: int) -> Store:
    """An empty, current database in a private temporary directory (deleted by :meth:`Store.close`),
    opened read-only: every read finds nothing, every write raises ``failure`` (which says what to
    make writable). For ``open_store(read_only_ok=True)`` on a read-only home without a database."""
    import tempfile

    tempdir = tempfile.mkdtemp(prefix="roost-store-")
    path = Path(tempdir) / "roost.db"
    conn = connect(path, busy_timeout=busy_timeout)
    try:
        _migrate_patiently(conn, busy_timeout)
    finally:
        conn.close()
    return Store(
        path, busy_timeout=busy_timeout, batch_max=batch_max, queue_size=queue_size, _tempdir=tempdir, read_only=failure
    )


def _open_failure(db_path: Path, exc: StoreError) -> StoreError:
    """The start-up error for ``db_path``, telling corrupt, unwritable and full apart (issue 18, finding 6).

    Moving the file aside is suggested only when SQLite says it is not a database or its
    integrity check fails; a healthy database on a full or read-only disk is never called corrupt.
    """
    if isinstance(exc, SchemaTooNew):
        return exc  # its message names the file and what to do
    if isinstance(exc, (StoreDiskFull, StoreReadOnly, StoreBusy, MigrationError)):
        return type(exc)(f"{db_path}: {exc}")
    if isinstance(exc, StoreCorrupt) or not _passes_integrity_check(db_path):
        return StoreCorrupt(
            f"{db_path} is not a usable Roost database ({exc}); it fails SQLite's integrity "
            "check, so move it aside (keep the copy) to start afresh"
        )
    if not db_path.exists() and db_path.parent.is_dir() and not os.access(db_path.parent, os.W_OK):
        return StoreReadOnly(
            f"{db_path} does not exist and cannot be created ({exc}): make {db_path.parent} writable "
            "(a fresh home creates its database on first use)"
        )
    if not os.access(db_path if db_path.exists() else db_path.parent, os.W_OK):
        return StoreReadOnly(
            f"{db_path} cannot be written ({exc}): make it and its directory writable; its contents are fine"
        )
    return StoreError(
        f"{db_path} could not be opened ({exc}); it passes SQLite's integrity check, "
        "so do not move it: fix the cause above and retry"
    )


def _passes_integrity_check(db_path: Path) -> bool:
    """Whether ``db_path`` opens read-only and passes ``PRAGMA quick_check`` (True when absent)."""
    if not db_path.exists():
        return True
    try:
        conn = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            return conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        code = getattr(exc, "sqlite_errorcode", 0) or 0
        return (code & 0xFF) not in (11, 26)  # corrupt / not a database; other errors say nothing


def _schema_current(db_path: Path, busy_timeout: float) -> bool:
    """Whether ``db_path`` opens read-only and holds every migration this code knows."""
    from ._schema import MIGRATIONS, schema_version

    try:
        conn = connect_read_only(db_path, busy_timeout=busy_timeout)
    except StoreError:
        return False
    try:
        return set(MIGRATIONS.names()) <= set(schema_version(conn))
    except StoreError:
        return False
    finally:
        conn.close()


def _migrate_patiently(conn: sqlite3.Connection, busy_timeout: float) -> None:
    """:func:`migrate`, tried again while another process holds the lock, up to ``busy_timeout``
    seconds in all: switching a new file to WAL needs the database to itself, and SQLite answers
    that with an immediate "database is locked" (no busy handler) while a second process that
    started at the same moment migrates. Raises what :func:`migrate` raises (``StoreBusy`` once
    the time is up)."""
    deadline = time.monotonic() + busy_timeout
    delay = 0.01
    while True:
        try:
            migrate(conn)
            return
        except StoreBusy:
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
