"""Memory, context files and the daemon task queue on PostgreSQL: the functions of
:mod:`roost.storage._memory`, the memory queries of :mod:`roost.storage._queries` and
:mod:`roost.storage._tasks`, with the same arguments, results and errors, on a
``psycopg.Connection``.

The task queue is cluster-wide: :func:`enqueue_daemon_task` takes a transaction-scoped advisory
lock before it computes the next ``position``, so enqueuers on every node serialise and positions
stay unique and ordered.
"""

from __future__ import annotations

from typing import Any

import psycopg

from roost._json import loads
from roost.errors import Conflict, NotFound
from roost.model import ContextFile, DaemonTask, MemoryEntry

from ._memory import CONTEXT, MEMORY
from ._pg_rows import PgTableSpec
from ._rows import new_id, utc_now
from ._tasks import DAEMON_TASKS

__all__ = [
    "put_memory",
    "get_memory",
    "list_memory",
    "delete_memory",
    "put_context_file",
    "list_context_files",
    "delete_context_file",
    "memory_value",
    "memory_scope_counts",
    "delete_memory_prefix",
    "scope_has_memory",
    "enqueue_daemon_task",
    "get_daemon_task",
    "list_daemon_tasks",
    "update_daemon_task",
]

_MEMORY = PgTableSpec(MEMORY.table, MemoryEntry, json=MEMORY.json, touch=MEMORY.touch)
_CONTEXT = PgTableSpec(CONTEXT.table, ContextFile)
_TASKS = PgTableSpec(DAEMON_TASKS.table, DaemonTask, json=DAEMON_TASKS.json, touch=DAEMON_TASKS.touch)


def put_memory(conn: psycopg.Connection, scope: str, key: str, value: Any) -> MemoryEntry:
    """Insert or replace the value under (scope, key) (write)."""
    now = utc_now()
    conn.execute(
        """INSERT INTO memory (id, scope, key, value, created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s)
           ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at""",
        (new_id("mem"), scope, key, MEMORY.encode({"value": value})["value"], now, now),
    )
    return get_memory(conn, scope, key)


def get_memory(conn: psycopg.Connection, scope: str, key: str) -> MemoryEntry:
    """Return the entry under (scope, key). Raises NotFound."""
    rows = _MEMORY.select(conn, "scope = %s AND key = %s", (scope, key), order="key")
    if not rows:
        raise NotFound(f"no memory {key!r} in scope {scope!r}")
    return rows[0]


def list_memory(conn: psycopg.Connection, scope: str) -> list[MemoryEntry]:
    """Return a scope's entries by key."""
    return _MEMORY.select(conn, "scope = %s", (scope,), order="key")


def delete_memory(conn: psycopg.Connection, scope: str, key: str) -> bool:
    """Delete the entry under (scope, key) (write). Returns whether there was one."""
    return conn.execute("DELETE FROM memory WHERE scope = %s AND key = %s", (scope, key)).rowcount == 1


def put_context_file(conn: psycopg.Connection, thread_id: str, path: str, content: str) -> ContextFile:
    """Attach (or refresh) a file in a thread's context (write). Raises Conflict (no such thread)."""
    try:
        with conn.transaction():
            conn.execute(
                """INSERT INTO context_files (id, thread_id, path, content, created_at) VALUES (%s, %s, %s, %s, %s)
                   ON CONFLICT (thread_id, path) DO UPDATE SET content = excluded.content""",
                (new_id("ctx"), thread_id, path, content, utc_now()),
            )
    except psycopg.IntegrityError as exc:
        raise Conflict(str(exc).strip().splitlines()[0]) from exc
    return _CONTEXT.select(conn, "thread_id = %s AND path = %s", (thread_id, path), order="path")[0]


def list_context_files(conn: psycopg.Connection, thread_id: str) -> list[ContextFile]:
    """Return a thread's context files by path."""
    return _CONTEXT.select(conn, "thread_id = %s", (thread_id,), order="path")


def delete_context_file(conn: psycopg.Connection, thread_id: str, path: str) -> bool:
    """Detach a file from a thread's context (write). Returns whether it was attached."""
    cur = conn.execute("DELETE FROM context_files WHERE thread_id = %s AND path = %s", (thread_id, path))
    return cur.rowcount == 1


def memory_value(conn: psycopg.Connection, scope: str, key: str) -> tuple[bool, Any]:
    """Return ``(exists, value)`` of the entry under (scope, key); value None when absent or null."""
    row = conn.execute("SELECT value FROM memory WHERE scope = %s AND key = %s", (scope, key)).fetchone()
    if row is None:
        return False, None
    return True, (loads(row[0]) if row[0] else None)


def memory_scope_counts(conn: psycopg.Connection, prefix: str) -> list[tuple[str, int]]:
    """Return ``(rest of the scope after prefix, entry count)`` per scope starting with ``prefix``."""
    rows = conn.execute(
        "SELECT substr(scope, %s), COUNT(*) FROM memory WHERE substr(scope, 1, %s) = %s GROUP BY scope ORDER BY scope",
        (len(prefix) + 1, len(prefix), prefix),
    ).fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


def delete_memory_prefix(conn: psycopg.Connection, scope: str, key_prefix: str) -> int:
    """Delete a scope's entries whose key starts with ``key_prefix`` (write); returns how many."""
    cur = conn.execute(
        "DELETE FROM memory WHERE scope = %s AND substr(key, 1, %s) = %s", (scope, len(key_prefix), key_prefix)
    )
    return int(cur.rowcount)


def scope_has_memory(conn: psycopg.Connection, scope: str) -> bool:
    """Return whether a scope has at least one entry."""
    return conn.execute("SELECT 1 FROM memory WHERE scope = %s LIMIT 1", (scope,)).fetchone() is not None


def enqueue_daemon_task(
    conn: psycopg.Connection, *, payload: Any, client_id: str | None = None, id: str | None = None
) -> tuple[DaemonTask, bool]:
    """Append a task to the cluster's daemon queue (write; idempotent on ``client_id``).

    Returns:
        ``(task, created)``; ``created`` is ``False`` when ``client_id`` matched an existing task.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('roost.daemon_tasks', 0))")
        if client_id is not None:
            rows = _TASKS.select(conn, "client_id = %s", (client_id,), order="position")
            if rows:
                return rows[0], False
        row = conn.execute("SELECT COALESCE(MAX(position), 0) + 1 FROM daemon_tasks").fetchone()
        assert row is not None
        now = utc_now()
        task = DaemonTask(
            id=id or new_id("task"),
            position=row[0],
            status="queued",
            payload=payload,
            client_id=client_id,
            created_at=now,
            updated_at=now,
        )
        return _TASKS.insert(conn, task), True


def list_daemon_tasks(conn: psycopg.Connection, *, status: str | None = None) -> list[DaemonTask]:
    """Return daemon tasks in queue order."""
    if status is None:
        return _TASKS.select(conn, order="position")
    return _TASKS.select(conn, "status = %s", (status,), order="position")


def update_daemon_task(conn: psycopg.Connection, task_id: str, **changes: Any) -> DaemonTask:
    """Change a daemon task's ``status``/``run_id``/``error`` (write). Raises NotFound."""
    return _TASKS.update(conn, task_id, changes)


def get_daemon_task(conn: psycopg.Connection, task_id: str) -> DaemonTask | None:
    """Return the daemon task ``task_id``, or None when there is none."""
    rows = _TASKS.select(conn, "id = %s", (task_id,), order="position")
    return rows[0] if rows else None
