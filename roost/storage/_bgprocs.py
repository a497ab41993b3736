"""Background processes of threads and their exit triggers (table ``background_processes``).

Writers run inside a write transaction (:meth:`StoreWriter.submit`); readers are read-only.
Rows: ``{id, thread_id, owner, pid, command, cwd, status, exit_code, trigger_status, on_exit,
output_tail, reason, started_at, ended_at}``; ``status`` is ``running``, ``exited``, ``stopped``
or ``lost`` (its owner ended while it ran); ``trigger_status`` is ``waiting``, ``received``,
``handled``, ``cancelled`` or ``stopped``.
"""

from __future__ import annotations

from typing import Any

from roost.errors import NotFound, UsageError

from ._portable import execute, is_sqlite
from ._rows import utc_now

__all__ = [
    "get_bg_process",
    "insert_bg_process",
    "list_bg_processes",
    "received_bg_processes",
    "record_bg_exit",
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
    conn: Any, *, id: str, thread_id: str, owner: str, pid: int | None, command: str, cwd: str | None
) -> dict:
    """Record a started background process (write); returns the row."""
    execute(
        conn,
        "INSERT INTO background_processes (id, thread_id, owner, pid, command, cwd, status, started_at) "
        "VALUES (?, ?, ?, ?, ?, ?, 'running', ?)",
        (id, thread_id, owner, pid, command, cwd, utc_now()),
    )
    return get_bg_process(conn, id)


def get_bg_process(conn: Any, process_id: str) -> dict:
    """One row (read-only). Raises NotFound."""
    row = execute(
        conn, f"SELECT {', '.join(_COLUMNS)} FROM background_processes WHERE id = ?", (process_id,)
    ).fetchone()
    if row is None:
        raise NotFound(f"no background process {process_id!r}")
    return _row(row)


def list_bg_processes(conn: Any, thread_id: str) -> list[dict]:
    """A thread's background processes, oldest first (read-only)."""
    rows = execute(
        conn,
        f"SELECT {', '.join(_COLUMNS)} FROM background_processes WHERE thread_id = ?"
        f" ORDER BY started_at, {'rowid' if is_sqlite(conn) else 'id'}",
        (thread_id,),
    ).fetchall()
    return [_row(r) for r in rows]


def received_bg_processes(conn: Any) -> list[dict]:
    """The exited processes whose exit notice is ``received`` and not yet handled, oldest first
    (read-only)."""
    rows = execute(
        conn,
        f"SELECT {', '.join(_COLUMNS)} FROM background_processes "
        "WHERE trigger_status = 'received' AND status = 'exited' ORDER BY started_at, id",
    ).fetchall()
    return [_row(r) for r in rows]


def record_bg_exit(conn: Any, process_id: str, *, exit_code: int | None, ended_at: str, output_tail: str) -> dict:
    """Record that a background process exited (write); returns the row. Raises NotFound.

    ``status`` becomes ``exited`` and, in the same statement, a ``waiting`` exit trigger becomes
    ``received``: a crash can never leave an exited row whose notice is still ``waiting``, which
    no restart would deliver (:func:`received_bg_processes` is what a restart redelivers). A
    trigger already ``cancelled`` or ``stopped`` is kept.
    """
    cur = execute(
        conn,
        "UPDATE background_processes SET status = 'exited', exit_code = ?, ended_at = ?, output_tail = ?, "
        "trigger_status = CASE WHEN trigger_status = 'waiting' THEN 'received' ELSE trigger_status END "
        "WHERE id = ?",
        (exit_code, ended_at, output_tail, process_id),
    )
    if cur.rowcount == 0:
        raise NotFound(f"no background process {process_id!r}")
    return get_bg_process(conn, process_id)


def update_bg_process(conn: Any, process_id: str, **changes: Any) -> dict:
    """Change a row's mutable fields (write); returns the row. Raises NotFound, UsageError."""
    unknown = set(changes) - _MUTABLE
    if unknown:
        raise UsageError(f"cannot update background process field(s) {sorted(unknown)}")
    if changes:
        sets = ", ".join(f"{k} = ?" for k in changes)
        cur = execute(conn, f"UPDATE background_processes SET {sets} WHERE id = ?", (*changes.values(), process_id))
        if cur.rowcount == 0:
            raise NotFound(f"no background process {process_id!r}")
    return get_bg_process(conn, process_id)


def mark_lost_bg_processes(conn: Any, owners: list[str], reason: str) -> list[dict]:
    """Mark the ``running`` rows of ``owners`` (ended processes of Roost) as ``lost`` (write).

    Their waiting trigger becomes ``stopped``. Returns the rows changed.
    """
    changed = []
    for owner in owners:
        ids = [
            r[0]
            for r in execute(
                conn, "SELECT id FROM background_processes WHERE owner = ? AND status = 'running'", (owner,)
            )
        ]
        for process_id in ids:
            execute(
                conn,
                "UPDATE background_processes SET status = 'lost', reason = ?, ended_at = ?, "
                "trigger_status = CASE trigger_status WHEN 'waiting' THEN 'stopped' ELSE trigger_status END "
                "WHERE id = ?",
                (reason, utc_now(), process_id),
            )
            changed.append(get_bg_process(conn, process_id))
    return changed


def running_owners(conn: Any) -> list[str]:
    """The owners with ``running`` rows (read-only)."""
    return [r[0] for r in execute(conn, "SELECT DISTINCT owner FROM background_processes WHERE status = 'running'")]
