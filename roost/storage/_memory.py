"""Memory (values under a scope and key) and context files attached to threads.

Writers run inside a write transaction; readers are read-only.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from roost.errors import NotFound
from roost.model import ContextFile, MemoryEntry

from ._rows import TableSpec, new_id, utc_now

__all__ = [
    "put_memory",
    "get_memory",
    "list_memory",
    "delete_memory",
    "put_context_file",
    "list_context_files",
    "delete_context_file",
]

MEMORY = TableSpec("memory", MemoryEntry, json=frozenset({"value"}), touch="updated_at")
CONTEXT = TableSpec("context_files", ContextFile)


def put_memory(conn: sqlite3.Connection, scope: str, key: str, value: Any) -> MemoryEntry:
    """Insert or replace the value under (scope, key) (write)."""
    now = utc_now()
    conn.execute(
        """INSERT INTO memory (id, scope, key, value, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)
           ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at""",
        (new_id("mem"), scope, key, MEMORY.encode({"value": value})["value"], now, now),
    )
    return get_memory(conn, scope, key)


def get_memory(conn: sqlite3.Connection, scope: str, key: str) -> MemoryEntry:
    """Return the entry under (scope, key) (read-only). Raises NotFound."""
    rows = MEMORY.select(conn, "scope = ? AND key = ?", (scope, key), order="key")
    if not rows:
        raise NotFound(f"no memory {key!r} in scope {scope!r}")
    return rows[0]


def list_memory(conn: sqlite3.Connection, scope: str) -> list[MemoryEntry]:
    """Return a scope's entries by key (read-only)."""
    return MEMORY.select(conn, "scope = ?", (scope,), order="key")


def delete_memory(conn: sqlite3.Connection, scope: str, key: str) -> bool:
    """Delete the entry under (scope, key) (write). Returns whether there was one."""
    return conn.execute("DELETE FROM memory WHERE scope = ? AND key = ?", (scope, key)).rowcount == 1


def put_context_file(conn: sqlite3.Connection, thread_id: str, path: str, content: str) -> ContextFile:
    """Attach (or refresh) a file in a thread's context (write)."""
    conn.execute(
        """INSERT INTO context_files (id, thread_id, path, content, created_at) VALUES (?, ?, ?, ?, ?)
           ON CONFLICT (thread_id, path) DO UPDATE SET content = excluded.content""",
        (new_id("ctx"), thread_id, path, content, utc_now()),
    )
    return CONTEXT.select(conn, "thread_id = ? AND path = ?", (thread_id, path), order="path")[0]


def list_context_files(conn: sqlite3.Connection, thread_id: str) -> list[ContextFile]:
    """Return a thread's context files by path (read-only)."""
    return CONTEXT.select(conn, "thread_id = ?", (thread_id,), order="path")


def delete_context_file(conn: sqlite3.Connection, thread_id: str, path: str) -> bool:
    """Detach a file from a thread's context (write). Returns whether it was attached."""
    cur = conn.execute("DELETE FROM context_files WHERE thread_id = ? AND path = ?", (thread_id, path))
    return cur.rowcount == 1
