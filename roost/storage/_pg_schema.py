"""The PostgreSQL schema: the SQLite migration list (``_schema.MIGRATIONS``), translated.

There is one list of versioned migrations. Each SQLite migration is a function that only calls
``db.execute(sql)``; here it is run against a recorder that collects its statements, and each
statement is translated to PostgreSQL:

* ``REAL`` columns become ``DOUBLE PRECISION`` (lease expiry, unix seconds);
* ``BLOB`` columns become ``BYTEA`` (attachment blobs);
* ``INTEGER`` columns become ``BIGINT`` (SQLite integers are 64-bit; tool process start ticks
  outgrow 32 bits);
* ``TEXT`` columns get ``COLLATE "C"``: bytewise comparison and order, as SQLite's ``BINARY``
  (ids, ISO timestamps, keys sort the same on both, whatever the server's locale);
* the FTS5 table ``items_fts`` becomes a generated ``tsvector`` column ``items.text_search`` with
  a GIN index (https://www.postgresql.org/docs/15/textsearch-tables.html), and the triggers that
  keep FTS5 in step are not needed;
* every other statement (``CREATE TABLE``, ``CREATE INDEX``, ``ALTER TABLE ADD COLUMN``,
  ``INSERT``) is the same SQL in both.

A statement with no translation stops the migration with :class:`MigrationError`, so a new
SQLite-only construct is caught by the PostgreSQL tests rather than at a user's site.

Applied migrations are recorded in ``roost_migrations``. :func:`migrate_pg` applies the pending
ones in one transaction under an advisory lock, so concurrent daemons serialise and the second
finds nothing to do; a database that holds a migration this code does not know is refused
(:class:`SchemaTooNew`).
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import sqlite_utils

from roost.errors import MigrationError, SchemaTooNew, StoreError

from ._pg_connect import SETTING, translate_pg_error
from ._schema import MIGRATIONS

__all__ = ["pg_migrations", "migrate_pg", "pg_schema_version"]

#: Key of the advisory lock migrators take (any constant bigint; "roost" in ASCII).
_LOCK_KEY = 0x726F6F7374
_FTS_STATEMENTS = (
    "ALTER TABLE items ADD COLUMN text_search tsvector"
    " GENERATED ALWAYS AS (to_tsvector('simple', coalesce(text, ''))) STORED",
    "CREATE INDEX items_text_search ON items USING GIN (text_search)",
)


class _Recorder:
    """Stands in for ``sqlite_utils.Database``: records what a migration executes."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def execute(self, sql: str, parameters: Any = None) -> None:
        if parameters:
            raise MigrationError("a migration with parameters has no PostgreSQL translation")
        self.statements.append(sql)

    def __getattr__(self, name: str) -> Any:
        raise MigrationError(f"a migration uses sqlite_utils' {name!r}; write it as plain SQL for PostgreSQL")


def _translate(sql: str) -> list[str]:
    """Return the PostgreSQL statements for one SQLite statement."""
    head = " ".join(sql.split()[:4]).upper()
    if head.startswith("CREATE VIRTUAL TABLE ITEMS_FTS"):
        return list(_FTS_STATEMENTS)
    if head.startswith("CREATE TRIGGER ITEMS_FTS_"):
        return []
    if head.startswith(("CREATE VIRTUAL", "CREATE TRIGGER", "PRAGMA")):
        raise MigrationError(f"no PostgreSQL translation for: {head} ...")
    sql = re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)
    sql = re.sub(r"\bBLOB\b", "BYTEA", sql)
    sql = re.sub(r"\bINTEGER\b", "BIGINT", sql)
    return [re.sub(r"\bTEXT\b", 'TEXT COLLATE "C"', sql)]


def pg_migrations() -> list[tuple[str, list[str]]]:
    """Return every migration of the shared list, oldest first, as ``(name, postgres statements)``.

    Raises:
        MigrationError: a migration has a statement without a PostgreSQL translation.
    """
    # pending() on an empty database lists every registered migration (public sqlite_utils API).
    every = MIGRATIONS.migrations().pending(sqlite_utils.Database(memory=True))
    out = []
    for migration in every:
        recorder = _Recorder()
        migration.fn(recorder)  # type: ignore[arg-type]
        out.append((migration.name, [pg for sql in recorder.statements for pg in _translate(sql)]))
    return out


def pg_schema_version(conn: psycopg.Connection) -> list[str]:
    """Return the names of the applied migrations, oldest first (empty for a fresh database)."""
    exists = conn.execute("SELECT to_regclass('roost_migrations') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return []
    rows = conn.execute("SELECT name FROM roost_migrations ORDER BY applied_order").fetchall()
    return [row[0] for row in rows]


def migrate_pg(conn: psycopg.Connection, url: str | None = None) -> list[str]:
    """Bring the PostgreSQL schema up to date; idempotent; safe against concurrent migrators.

    Args:
        conn: an autocommit connection (:func:`~roost.storage._pg_connect.connect_pg`).
        url: the database URL, for messages only.

    Returns:
        The names of the migrations applied by this call.

    Raises:
        SchemaTooNew: the database has a migration this code does not know.
        DatabasePermissionDenied: the role may not create Roost's tables.
        MigrationError: a migration failed; nothing of this call was applied.
    """
    known = pg_migrations()
    names = [name for name, _ in known]
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            conn.execute(
                """CREATE TABLE IF NOT EXISTS roost_migrations (
                    name TEXT PRIMARY KEY,
                    applied_order INTEGER NOT NULL,
                    applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"""
            )
            applied = pg_schema_version(conn)
            unknown = [name for name in applied if name not in names]
            if unknown:
                raise SchemaTooNew(
                    f"the database of {SETTING} has migrations this Roost does not know ({', '.join(unknown)}):"
                    " it was created by a newer Roost; upgrade Roost or point the setting at another database"
                )
            pending = [(name, stmts) for name, stmts in known if name not in applied]
            for order, (name, statements) in enumerate(pending, start=len(applied) + 1):
                for sql in statements:
                    conn.execute(sql)  # our own literal SQL
                conn.execute("INSERT INTO roost_migrations (name, applied_order) VALUES (%s, %s)", (name, order))
    except StoreError:
        raise
    except psycopg.errors.InsufficientPrivilege as exc:
        raise translate_pg_error(exc, url) from exc
    except psycopg.Error as exc:
        raise MigrationError(f"PostgreSQL migration failed: {exc}") from exc
    return [name for name, _ in pending]
