"""SQL that both backends run: one statement text, the parameter style of the connection.

The small data modules (background processes, blobs, usage records, thread state, tool process
records) write SQL that SQLite and PostgreSQL both accept (``ON CONFLICT``, ``RETURNING``,
``substr`` on a BLOB/BYTEA, ``COALESCE``); :func:`execute` runs it on either connection, turning
SQLite's ``?`` placeholders into psycopg's ``%s``. A statement must not contain a literal ``?`` or
``%``. What differs (row order tie-breakers, the clock) is chosen with :func:`is_sqlite`.

The database's clock (:func:`now_sql`, :func:`at_sql`) is what cluster liveness is judged on:
heartbeats are written with it and compared with it in SQL, so a node's own clock never counts.
On PostgreSQL it is the server's ``clock_timestamp()`` (the current time, microseconds, advancing
within a transaction, so rows written in one group commit keep their order,
https://www.postgresql.org/docs/15/functions-datetime.html#FUNCTIONS-DATETIME-CURRENT); on SQLite
it is SQLite's own ``julianday('now')`` (the clock of the host that opens the file, read by SQLite,
millisecond resolution, https://www.sqlite.org/lang_datefunc.html).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

__all__ = ["execute", "is_sqlite", "now_sql", "at_sql"]

#: The database's clock as a SQL expression, unix seconds (float), per backend.
SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"
PG_NOW = "extract(epoch FROM clock_timestamp())::float8"


def is_sqlite(conn: Any) -> bool:
    """Whether ``conn`` is a SQLite connection (else it is a psycopg one)."""
    return isinstance(conn, sqlite3.Connection)


def execute(conn: Any, sql: str, params: Sequence[Any] = ()) -> Any:
    """Run ``sql`` (``?`` placeholders) on a SQLite or psycopg connection; return its cursor.

    Both cursors offer ``fetchone()``, ``fetchall()``, ``rowcount`` and iteration.
    """
    if isinstance(conn, sqlite3.Connection):
        return conn.execute(sql, params)
    return conn.execute(sql.replace("?", "%s"), params)


def now_sql(conn: Any) -> str:
    """The SQL expression of the database's clock (unix seconds) for ``conn``'s backend."""
    return SQLITE_NOW if isinstance(conn, sqlite3.Connection) else PG_NOW


def at_sql(conn: Any, now: float | None) -> tuple[str, tuple[Any, ...]]:
    """SQL for "now" and its parameters: the database's clock, or an explicit ``now`` (unix
    seconds; tests that set the time) as a bound parameter."""
    return (now_sql(conn), ()) if now is None else ("CAST(? AS DOUBLE PRECISION)", (now,))
