"""SQL that both backends run: one statement text, the parameter style of the connection.

The small data modules (background processes, blobs, usage records, thread state, tool process
records) write SQL that SQLite and PostgreSQL both accept (``ON CONFLICT``, ``RETURNING``,
``substr`` on a BLOB/BYTEA, ``COALESCE``); :func:`execute` runs it on either connection, turning
SQLite's ``?`` placeholders into psycopg's ``%s``. A statement must not contain a literal ``?`` or
``%``. What differs (row order tie-breakers) is chosen with :func:`is_sqlite`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

__all__ = ["execute", "is_sqlite"]


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
