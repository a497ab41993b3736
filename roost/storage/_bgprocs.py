"""Background processes of threads and their exit triggers (table ``background_processes``).

Writers run inside a write transaction (:meth:`StoreWriter.submit`); readers are read-only.
Rows: ``{id, thread_id, owner, pid, command, cwd, status, exit_code, trigger_status, on_exit,
output_tail, reason, started_at, ended_at}``; ``status`` is ``running``, ``exited``, ``stopped``
or ``lost`` (its owner ended while it ran); ``trigger_status`` is ``waiting``, ``received``,
``handled``, ``cancelled`` or ``stopped``.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from roost.errors import NotFound, UsageError

from ._rows import utc_now

__all__ = [
    "get_bg_process",
    "insert_bg_process",
    "list_bg_processes",
    "received_bg_processes",
    "mark_lost_bg_processes",
    "running_owners",
    "update_bg_process",
]

_COLUMNS = (
    "id",
    "thread_id",
    "owner",
    "pid",
    "command",
    "cwd",
    "status",
    "exit_code",
    "trigger_status",
    "on_exit",
    "output_tail",
    "reason",
    "started_at",
    "ended_at",
)
_MUTABLE = frozenset({"pid", "status", "exit_code", "trigger_status", "output_tail", "reason", "ended_at"})


def _row(values: tuple) -> dict:
    return dict(zip(_COLUMNS, values, strict=True))


def insert_bg_process(
    conn: sqlite3.Connection, *, id: str, thread_id: str, owner: str, pid: int | None, command: str, cwd: str | None
) -> dict:
    """Record a started background process (write); returns the row."""
    conn.execute(
        "INSERT INTO background_processes (id, thread_id, owner, pid, command, cwd, status, started_at) "
        "VALUES (?, ?, ?, ?, ?, ?, 'running', ?)",
        (id, thread_id, owner, pid, command, cwd, utc_now()),
    )
    return get_bg_process(conn, id)


def get_bg_process(conn: sqlite3.Connection, process_id: str) -> dict:
    """One row (read-only). Raises NotFound."""
    row = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM background_processes WHERE id = ?", (process_id,)).fetchone()
    if row is None:
        raise NotFound(f"no background process {process_id!r}")
    return _row(row)


def list_bg_processes(conn: sqlite3.Connection, thread_id: str) -> list[dict]:
    """A thread's background processes, oldest first (read-only)."""
    rows = conn.execute(
        f"SELECT {', '.join(_COLUMNS)} FROM background_processes WHERE thread_id = ? ORDER BY started_at, rowid",
        (thread_id,),
    ).fetchall()
    return [_row(r) for r in rows]


def received_bg_processes(conn: sqlite3.Connection) -> list[dict]:
    """The exited processes whose exit notice is ``received`` and not yet handled, oldest first
    (read-only)."""
    rows = conn.execute(
        f"SELECT {', '.join(_COLUMNS)} FROM background_processes "
        "WHERE trigger_status = 'received' AND status = 'exited' ORDER BY started_at, rowid"
    ).fetchall()
    return [_row(r) for r in rows]


def update_bg_process(conn: sqlite3.Connection, process_id: str, **changes: Any) -> dict:
    """Change a row's mutable fields (write); returns the row. Raises NotFound, UsageError."""
    unknown = set(changes) - _MUTABLE
    if unknown:
        raise UsageError(f"cannot update background process field(s) {sorted(unknown)}")
    if changes:
        sets = ", ".join(f"{k} = ?" for k in changes)
        cur = conn.execute(f"UPDATE background_processes SET {sets} WHERE id = ?", (*changes.values(), process_id))
        if cur.rowcount == 0:
            raise NotFound(f"no background process {process_id!r}")
    return get_bg_process(conn, process_id)


def mark_lost_bg_processes(conn: sqlite3.Connection, owners: list[str], reason: str) -> list[dict]:
    """Mark the ``running`` rows of ``owners`` (ended processes of Roost) as ``lost`` (write).

    Their waiting trigger becomes ``stopped``. Returns the rows changed.
    """
    changed = []
    for owner in owners:
        ids = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM background_processes WHERE owner = ? AND status = 'running'", (owner,)
            )
        ]
        for process_id in ids:
            conn.execute(
                "UPDATE background_processes SET status = 'lost', reason = ?, ended_at = ?, "
                "trigger_status = CASE trigger_status WHEN 'waiting' THEN 'stopped' ELSE trigger_status END "
                "WHERE id = ?",
                (reason, utc_now(), process_id),
            )
            changed.append(get_bg_process(conn, process_id))
    return changed


def running_owners(conn: sqlite3.Connection) -> list[str]:
    """The owners with ``running`` rows (read-only)."""
    return [r[0] for r in conn.execute("SELECT DISTINCT owner FROM background_processes WHERE status = 'running'")]
