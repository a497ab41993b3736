"""The schema, as versioned migrations (``sqlite_utils.migrations.Migrations``, set ``"roost"``).

Add a migration by appending a new decorated function; never edit one that has shipped. Each run
of :func:`migrate` applies the pending ones, in order, inside a single ``BEGIN IMMEDIATE``
transaction together with their records in ``_sqlite_migrations``: two processes that open the
same file at once serialise on the write lock, and the second finds nothing pending.

Timestamps are ISO 8601 UTC text (``...Z``); lease expiry is unix seconds (REAL). JSON columns hold
compact JSON text.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from roost.errors import MigrationError, SchemaTooNew, StoreError, StoreReadOnly

from ._connect import immediate, translate_error

if TYPE_CHECKING:
    import sqlite_utils
    from sqlite_utils.migrations import Migrations

__all__ = ["MIGRATIONS", "migrate", "schema_version"]

#: ``sqlite_utils.migrations.Migrations``' bookkeeping table (one row per applied migration).
_MIGRATIONS_TABLE = "_sqlite_migrations"


class _MigrationSet:
    """The ordered migration functions of one set, registered with the decorator of
    ``sqlite_utils.migrations.Migrations`` (``@MIGRATIONS(name=...)``) and handed to a real
    ``Migrations`` only when one must run: importing sqlite-utils costs tens of milliseconds,
    and a current store (every start but the first) needs none of it.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._steps: list[tuple[str, Callable[..., None], bool]] = []
        self._built: Migrations | None = None

    def __call__(
        self, *, name: str | None = None, transactional: bool = True
    ) -> Callable[[Callable[..., None]], Callable[..., None]]:
        def register(fn: Callable[..., None]) -> Callable[..., None]:
            step = name or fn.__name__
            if step in self.names():
                raise ValueError(f"migration {step!r} is already registered in set {self.name!r}")
            self._steps.append((step, fn, transactional))
            self._built = None
            return fn

        return register

    def names(self) -> list[str]:
        """The registered migration names, in order."""
        return [step for step, _, _ in self._steps]

    def migrations(self) -> Migrations:
        """The equivalent ``sqlite_utils.migrations.Migrations`` (built on first use)."""
        if self._built is None:
            from sqlite_utils.migrations import Migrations

            built = Migrations(self.name)
            for step, fn, transactional in self._steps:
                built(name=step, transactional=transactional)(fn)
            self._built = built
        return self._built


def _applied(conn: sqlite3.Connection, migration_set: str) -> list[str]:
    """The applied migration names of ``migration_set``, oldest first, as sqlite-utils records them."""
    if (
        conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (_MIGRATIONS_TABLE,)).fetchone()
        is None
    ):
        return []
    rows = conn.execute(
        f"SELECT name FROM {_MIGRATIONS_TABLE} WHERE migration_set = ? ORDER BY rowid", (migration_set,)
    ).fetchall()
    return [row[0] for row in rows]


MIGRATIONS = _MigrationSet("roost")


class _NeedsSqliteUtils(Exception):
    """A migration asked :class:`_PlainSql` for more than ``execute``."""


class _PlainSql:
    """Stands in for ``sqlite_utils.Database`` in a migration that only executes SQL (every one
    today: the PostgreSQL backend runs them through the same ``execute``-only shape)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, parameters: Any = None) -> sqlite3.Cursor:
        # sqlite_utils.Database.execute: conn.execute(sql[, parameters])
        return self.conn.execute(sql) if parameters is None else self.conn.execute(sql, parameters)

    def __getattr__(self, name: str) -> Any:
        raise _NeedsSqliteUtils(name)


#: ``sqlite_utils.migrations.Migrations.ensure_migrations_table``'s table and index, as it writes them.
_MIGRATIONS_DDL = (
    f'CREATE TABLE "{_MIGRATIONS_TABLE}" (\n   "id" INTEGER PRIMARY KEY,\n   "migration_set" TEXT,\n'
    '   "name" TEXT,\n   "applied_at" TEXT\n)',
    f'CREATE UNIQUE INDEX "idx_{_MIGRATIONS_TABLE}_migration_set_name"\n'
    f'    ON "{_MIGRATIONS_TABLE}" ("migration_set", "name")',
)


def _migrate_fresh(conn: sqlite3.Connection) -> list[str] | None:
    """Migrate a database that has no migration table yet without importing sqlite-utils (its
    import is most of a first start's cost): the same statements, bookkeeping table and rows as
    ``Migrations.apply`` (``applied_at`` is ``str(datetime.now(UTC))``), in one ``BEGIN IMMEDIATE``.

    Returns:
        The applied names; None when another migrator got there first, or a migration needs more
        of sqlite-utils than ``execute`` (nothing was written: the caller runs sqlite-utils).
    """
    import datetime

    steps = MIGRATIONS._steps
    if not all(transactional for _, _, transactional in steps):
        return None
    try:
        with immediate(conn):
            if conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (_MIGRATIONS_TABLE,)).fetchone():
                return None  # a concurrent migrator was first: the sqlite-utils path does the rest
            plain = _PlainSql(conn)
            for sql in _MIGRATIONS_DDL:
                conn.execute(sql)
            for step, fn, _ in steps:
                fn(plain)
                conn.execute(
                    f'INSERT INTO "{_MIGRATIONS_TABLE}" ("migration_set", "name", "applied_at") VALUES (?, ?, ?)',
                    (MIGRATIONS.name, step, str(datetime.datetime.now(datetime.UTC))),
                )
    except _NeedsSqliteUtils:
        return None
    except StoreError:
        raise
    except Exception as exc:
        raise MigrationError(f"migration failed: {exc}") from exc
    return [step for step, _, _ in steps]


def _run(db: sqlite_utils.Database, *statements: str) -> None:
    for sql in statements:
        db.execute(sql)


@MIGRATIONS(name="0001_core")
def _m0001_core(db: sqlite_utils.Database) -> None:
    _run(
        db,
        """CREATE TABLE threads (
            id TEXT PRIMARY KEY,
            kind TEXT NOT NULL DEFAULT 'chat' CHECK (kind IN ('chat', 'orchestration', 'worker')),
            parent_thread_id TEXT REFERENCES threads(id) ON DELETE SET NULL,
            title TEXT, cwd TEXT, provider TEXT, model TEXT, effort TEXT, permission_mode TEXT,
            pinned INTEGER NOT NULL DEFAULT 0,
            archived INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            metadata TEXT NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX threads_updated ON threads(archived, updated_at)",
        "CREATE INDEX threads_parent ON threads(parent_thread_id)",
        """CREATE TABLE runs (
            id TEXT PRIMARY KEY,
            thread_id TEXT REFERENCES threads(id) ON DELETE CASCADE,
            kind TEXT NOT NULL DEFAULT 'turn',
            status TEXT NOT NULL,
            owner TEXT,
            started_at TEXT NOT NULL,
            completed_at TEXT,
            error TEXT,
            metadata TEXT NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX runs_thread ON runs(thread_id, started_at)",
        """CREATE TABLE turns (
            id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
            status TEXT NOT NULL,
            run_id TEXT REFERENCES runs(id) ON DELETE SET NULL,
            started_at TEXT NOT NULL,
            completed_at TEXT,
            error TEXT,
            usage TEXT
        )""",
        "CREATE INDEX turns_thread ON turns(thread_id, started_at)",
        "CREATE INDEX turns_status ON turns(status)",
        """CREATE TABLE items (
            id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
            turn_id TEXT REFERENCES turns(id) ON DELETE SET NULL,
            seq INTEGER NOT NULL,
            type TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'completed',
            payload TEXT,
            text TEXT,
            created_at TEXT NOT NULL
        )""",
        "CREATE UNIQUE INDEX items_thread_seq ON items(thread_id, seq)",
        "CREATE INDEX items_turn ON items(turn_id)",
        # Full-text search over item text (external content: the text lives once, in items).
        "CREATE VIRTUAL TABLE items_fts USING fts5(text, content='items', content_rowid='rowid')",
        """CREATE TRIGGER items_fts_insert AFTER INSERT ON items WHEN new.text IS NOT NULL BEGIN
            INSERT INTO items_fts(rowid, text) VALUES (new.rowid, new.text);
        END""",
        """CREATE TRIGGER items_fts_delete AFTER DELETE ON items WHEN old.text IS NOT NULL BEGIN
            INSERT INTO items_fts(items_fts, rowid, text) VALUES ('delete', old.rowid, old.text);
        END""",
        """CREATE TRIGGER items_fts_update AFTER UPDATE OF text ON items BEGIN
            INSERT INTO items_fts(items_fts, rowid, text)
                SELECT 'delete', old.rowid, old.text WHERE old.text IS NOT NULL;
            INSERT INTO items_fts(rowid, text) SELECT new.rowid, new.text WHERE new.text IS NOT NULL;
        END""",
        """CREATE TABLE held_input (
            id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('steer', 'queue')),
            payload TEXT,
            held INTEGER NOT NULL DEFAULT 0,
            client_id TEXT,
            created_at TEXT NOT NULL
        )""",
        "CREATE UNIQUE INDEX held_input_position ON held_input(thread_id, position)",
        "CREATE UNIQUE INDEX held_input_client ON held_input(thread_id, client_id)",
        """CREATE TABLE workers (
            id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
            root_thread_id TEXT NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
            parent_id TEXT REFERENCES workers(id) ON DELETE CASCADE,
            name TEXT,
            status TEXT NOT NULL,
            depth INTEGER NOT NULL DEFAULT 0,
            spawn_order INTEGER NOT NULL DEFAULT 0,
            result TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        "CREATE INDEX workers_root ON workers(root_thread_id, spawn_order)",
        """CREATE TABLE schedules (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            cron TEXT NOT NULL,
            timezone TEXT NOT NULL DEFAULT 'UTC',
            enabled INTEGER NOT NULL DEFAULT 1,
            payload TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        """CREATE TABLE schedule_runs (
            id TEXT PRIMARY KEY,
            schedule_id TEXT NOT NULL REFERENCES schedules(id) ON DELETE CASCADE,
            slot TEXT NOT NULL,
            status TEXT NOT NULL,
            run_id TEXT,
            created_at TEXT NOT NULL,
            UNIQUE (schedule_id, slot)
        )""",
        """CREATE TABLE daemon_tasks (
            id TEXT PRIMARY KEY,
            position INTEGER NOT NULL UNIQUE,
            status TEXT NOT NULL,
            payload TEXT,
            run_id TEXT,
            client_id TEXT UNIQUE,
            error TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        """CREATE TABLE leases (
            key TEXT PRIMARY KEY,
            owner TEXT,
            token INTEGER NOT NULL DEFAULT 0,
            expires_at REAL NOT NULL DEFAULT 0,
            successor TEXT
        )""",
        """CREATE TABLE memory (
            id TEXT PRIMARY KEY,
            scope TEXT NOT NULL,
            key TEXT NOT NULL,
            value TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            UNIQUE (scope, key)
        )""",
        """CREATE TABLE context_files (
            id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
            path TEXT NOT NULL,
            content TEXT NOT NULL,
            created_at TEXT NOT NULL,
            UNIQUE (thread_id, path)
        )""",
    )


def schema_version(conn: sqlite3.Connection) -> list[str]:
    """Return the names of the applied migrations, oldest first (read-only).

    Args:
        conn: any connection to the database.
    """
    try:
        return _applied(conn, MIGRATIONS.name)
    except sqlite3.Error as exc:
        raise translate_error(exc) from exc


def _too_new(conn: sqlite3.Connection, unknown: list[str]) -> str:
    """The message of :class:`SchemaTooNew` for this file (the same words as PostgreSQL's)."""
    row = conn.execute("PRAGMA database_list").fetchone()
    where = row[2] if row and row[2] else "the SQLite database"
    return (
        f"the database {where} has migrations this Roost does not know ({', '.join(unknown)}): it was"
        " created by a newer Roost; upgrade Roost, or set ROOST_HOME to another directory"
    )


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Bring the schema up to date; idempotent; safe against a concurrent migrator.

    Also switches the file to WAL journal mode (persistent). Blocking.

    Args:
        conn: an autocommit-mode connection (from :func:`~roost.storage._connect.connect`) that is
            not in a transaction.

    Returns:
        The names of the migrations applied by this call (empty when already current).

    Raises:
        SchemaTooNew: the file holds a migration this code does not know (a newer Roost wrote it;
            running older code on it could lose what the newer schema keeps).
        MigrationError: a migration failed; the schema is left at the previous version.
        StoreBusy: the write lock could not be taken.
    """
    try:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    except sqlite3.Error as exc:
        raise translate_error(exc) from exc
    if str(mode).lower() != "wal" and not _refuses_writes(conn):
        # (a read-only home's file, opened read-only, reports "delete": a current schema is read
        # as it is, and a pending migration fails below as StoreReadOnly)
        raise MigrationError(f"could not switch the database to WAL (journal_mode={mode})")
    applied = schema_version(conn)
    unknown = [name for name in applied if name not in set(MIGRATIONS.names())]
    if unknown:
        raise SchemaTooNew(_too_new(conn, unknown), setting="ROOST_HOME")
    if set(MIGRATIONS.names()) <= set(applied):
        return []  # current (migrations are never removed): no lock, no sqlite-utils
    if not applied:
        fresh = _migrate_fresh(conn)
        if fresh is not None:
            return fresh
    import sqlite_utils

    db = sqlite_utils.Database(conn, execute_plugins=False, recursive_triggers=False)
    migrations = MIGRATIONS.migrations()
    try:
        with immediate(conn):
            pending = [m.name for m in migrations.pending(db)]
            if pending:
                migrations.apply(db)
    except StoreError:
        raise
    except Exception as exc:
        failure = translate_error(exc) if isinstance(exc, sqlite3.Error) else None
        if isinstance(failure, StoreReadOnly):  # a read-only home whose schema is behind
            raise StoreReadOnly(f"the schema needs a migration, but {failure}") from exc
        raise MigrationError(f"migration failed: {exc}") from exc
    return pending


def _refuses_writes(conn: sqlite3.Connection) -> bool:
    """Whether ``conn`` is read-only (:func:`~roost.storage._connect.connect` on a read-only home):
    rewriting ``user_version`` with its own value fails with SQLITE_READONLY. Blocking."""
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        conn.execute(f"PRAGMA user_version = {version}")
    except sqlite3.OperationalError as exc:
        return isinstance(translate_error(exc), StoreReadOnly)
    return False


@MIGRATIONS(name="0002_schedule_jobs")
def _m0002_schedule_jobs(db: sqlite_utils.Database) -> None:
    """ScheduledJob fields (wire-protocol.md) and per-run records for schedules."""
    _run(
        db,
        "ALTER TABLE schedules ADD COLUMN description TEXT",
        "ALTER TABLE schedules ADD COLUMN task TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE schedules ADD COLUMN config TEXT",
        "ALTER TABLE schedules ADD COLUMN work_dir TEXT",
        "ALTER TABLE schedules ADD COLUMN catch_up TEXT NOT NULL DEFAULT 'once'",
        "ALTER TABLE schedules ADD COLUMN overlap TEXT NOT NULL DEFAULT 'skip'",
        "ALTER TABLE schedules ADD COLUMN next_run TEXT",
        "CREATE INDEX schedules_next_run ON schedules(enabled, next_run)",
        "ALTER TABLE schedule_runs ADD COLUMN started_at TEXT",
        "ALTER TABLE schedule_runs ADD COLUMN finished_at TEXT",
        "ALTER TABLE schedule_runs ADD COLUMN session_id TEXT",
        "ALTER TABLE schedule_runs ADD COLUMN outcome TEXT",
        "ALTER TABLE schedule_runs ADD COLUMN owner TEXT",
        "ALTER TABLE schedule_runs ADD COLUMN source TEXT NOT NULL DEFAULT 'cron'",
        "CREATE INDEX schedule_runs_status ON schedule_runs(status)",
        # One row, bumped in the same transaction as every schedule change, so a daemon can tell
        # "something changed" with one cheap read.
        "CREATE TABLE schedule_changes (id INTEGER PRIMARY KEY CHECK (id = 1), counter INTEGER NOT NULL)",
        "INSERT INTO schedule_changes (id, counter) VALUES (1, 0)",
    )


@MIGRATIONS(name="0003_tool_processes")
def _m0003_tool_processes(db: sqlite_utils.Database) -> None:
    """Running tool process groups, so start-up reconciliation can kill a dead process's leftovers."""
    _run(
        db,
        """CREATE TABLE tool_processes (
            pgid INTEGER NOT NULL,
            owner TEXT NOT NULL,
            start_ticks INTEGER NOT NULL,
            boot_id TEXT,
            thread_id TEXT,
            started_at TEXT NOT NULL,
            PRIMARY KEY (owner, pgid)
        )""",
    )


@MIGRATIONS(name="0004_schedule_settings")
def _m0004_schedule_settings(db: sqlite_utils.Database) -> None:
    """Model settings stored with a schedule (issue 17): the provider and model its runs use
    (NULL: the daemon's). Existing rows keep NULL, i.e. the daemon's settings, as before."""
    _run(
        db,
        "ALTER TABLE schedules ADD COLUMN provider TEXT",
        "ALTER TABLE schedules ADD COLUMN model TEXT",
    )


@MIGRATIONS(name="0005_attachment_blobs")
def _m0005_attachment_blobs(db: sqlite_utils.Database) -> None:
    """Attachment bytes stored once, addressed by the sha256 of their decoded bytes (items keep
    ``{media_type, sha256, size}`` references; see ``roost/storage/_blobs.py``)."""
    _run(
        db,
        """CREATE TABLE blobs (
            sha256 TEXT PRIMARY KEY,
            content_type TEXT NOT NULL,
            size INTEGER NOT NULL,
            data BLOB NOT NULL,
            created_at TEXT NOT NULL
        )""",
    )


@MIGRATIONS(name="0006_background_processes")
def _m0006_background_processes(db: sqlite_utils.Database) -> None:
    """Background shell processes of a thread and their exit triggers (``process/*`` methods)."""
    _run(
        db,
        """CREATE TABLE background_processes (
            id TEXT PRIMARY KEY,
            thread_id TEXT NOT NULL REFERENCES threads(id) ON DELETE CASCADE,
            owner TEXT NOT NULL,
            pid INTEGER,
            command TEXT NOT NULL,
            cwd TEXT,
            status TEXT NOT NULL,
            exit_code INTEGER,
            trigger_status TEXT NOT NULL DEFAULT 'waiting',
            on_exit TEXT NOT NULL DEFAULT 'continue',
            output_tail TEXT NOT NULL DEFAULT '',
            reason TEXT,
            started_at TEXT NOT NULL,
            ended_at TEXT
        )""",
        "CREATE INDEX background_processes_thread ON background_processes(thread_id, started_at)",
    )


@MIGRATIONS(name="0007_objectives")
def _m0007_objectives(db: sqlite_utils.Database) -> None:
    """Objectives and their ordered tasks with each task's outcome and failure counter (storage._objectives)."""
    _run(
        db,
        """CREATE TABLE objectives (
            id TEXT PRIMARY KEY,
            title TEXT NOT NULL,
            description TEXT,
            status TEXT NOT NULL DEFAULT 'active',
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        """CREATE TABLE objective_tasks (
            objective_id TEXT NOT NULL REFERENCES objectives(id) ON DELETE CASCADE,
            idx INTEGER NOT NULL,
            task TEXT NOT NULL,
            outcome TEXT NOT NULL DEFAULT 'pending',
            failures INTEGER NOT NULL DEFAULT 0,
            session_id TEXT,
            updated_at TEXT NOT NULL,
            PRIMARY KEY (objective_id, idx)
        )""",
    )


@MIGRATIONS(name="0008_cluster_nodes")
def _m0008_cluster_nodes(db: sqlite_utils.Database) -> None:
    """The nodes of a cluster (issue 13): one heartbeat row per running daemon or runtime,
    keyed by its lease owner identity; ``last_seen`` and ``ttl`` are unix seconds on the
    database's clock (roost/storage/_cluster.py)."""
    _run(
        db,
        """CREATE TABLE nodes (
            owner TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            started_at REAL NOT NULL,
            last_seen REAL NOT NULL,
            ttl REAL NOT NULL
        )""",
    )


@MIGRATIONS(name="0009_node_bus")
def _m0009_node_bus(db: sqlite_utils.Database) -> None:
    """The node bus (storage._bus): the processes on this store and the messages between them."""
    _run(
        db,
        """CREATE TABLE bus_nodes (
            node_id TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            started_at REAL NOT NULL,
            heartbeat_at REAL NOT NULL
        )""",
        """CREATE TABLE bus_messages (
            id TEXT PRIMARY KEY,
            target TEXT NOT NULL,
            sender TEXT NOT NULL,
            kind TEXT NOT NULL,
            body TEXT NOT NULL,
            reply_to TEXT,
            status TEXT NOT NULL DEFAULT 'pending',
            created_at REAL NOT NULL,
            expires_at REAL NOT NULL,
            claimed_at REAL
        )""",
        "CREATE INDEX bus_messages_target ON bus_messages(target, status, created_at)",
    )


@MIGRATIONS(name="0010_daemon_task_status")
def _m0010_daemon_task_status(db: sqlite_utils.Database) -> None:
    """Daemon tasks by status in queue order: a claim (storage._cluster) reads the running and
    the queued ones, which without it meant a scan of every task the daemon ever ran, inside the
    write lock, at each claim of every process (``roost serve --workers``, issue 19)."""
    _run(db, "CREATE INDEX daemon_tasks_status ON daemon_tasks(status, position)")
