"""SQLite's fresh-file migration fast path (issue 19, start-up): a new file is migrated by plain SQL
without importing sqlite-utils, with exactly the schema and bookkeeping rows sqlite-utils' own
``Migrations.apply`` gives; a partly migrated file still goes through sqlite-utils. SQLite-only by
nature (PostgreSQL migrates with its own runner, tests/test_pg_store.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from roost.storage import open_store, schema_version


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "roost.db"


def _schema_of(conn: sqlite3.Connection) -> tuple[list, list]:
    return (conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall(),
            conn.execute("SELECT id, migration_set, name FROM _sqlite_migrations ORDER BY id").fetchall())


def test_a_fresh_store_is_migrated_as_sqlite_utils_would_without_it(tmp_path: Path) -> None:
    """A fresh file is migrated by plain SQL (no sqlite-utils import at a first start, issue 19):
    the same tables, indexes, triggers and ``_sqlite_migrations`` rows, with sqlite-utils'
    ``applied_at`` format, as ``Migrations.apply``; a later migration run by sqlite-utils on it
    finds nothing pending."""
    import datetime

    import sqlite_utils

    from roost.storage._schema import MIGRATIONS, _migrate_fresh

    plain = sqlite3.connect(tmp_path / "plain.db", isolation_level=None)
    assert _migrate_fresh(plain) == MIGRATIONS.names()
    reference = sqlite3.connect(tmp_path / "reference.db", isolation_level=None)
    MIGRATIONS.migrations().apply(sqlite_utils.Database(reference, execute_plugins=False, recursive_triggers=False))
    assert _schema_of(plain) == _schema_of(reference)
    for (applied_at,) in plain.execute("SELECT applied_at FROM _sqlite_migrations"):
        assert datetime.datetime.fromisoformat(applied_at).utcoffset() == datetime.timedelta(0)
    db = sqlite_utils.Database(plain, execute_plugins=False, recursive_triggers=False)
    assert MIGRATIONS.migrations().pending(db) == []
    assert _migrate_fresh(plain) is None  # not fresh any more: left to the sqlite-utils path


def test_a_partly_migrated_store_is_brought_up_to_date(db: Path) -> None:
    """A store with only some migrations applied (an older Roost's) gets the rest, by sqlite-utils."""
    import sqlite_utils

    from roost.storage._schema import MIGRATIONS

    conn = sqlite3.connect(db, isolation_level=None)
    MIGRATIONS.migrations().apply(sqlite_utils.Database(conn, execute_plugins=False, recursive_triggers=False),
                                  stop_before="0005_attachment_blobs")
    conn.close()
    store = open_store(db)
    with store.read() as conn:
        assert schema_version(conn) == MIGRATIONS.names()
    store.close()


