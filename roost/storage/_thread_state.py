"""Reads and writes a ThreadActor needs to reconcile its thread with the store (blocking; pass
writers to :meth:`StoreWriter.submit`, call readers on :meth:`Store.read`)."""

from __future__ import annotations

from typing import Any

from ._portable import execute

__all__ = ["thread_has_workers", "thread_changed_since", "interrupt_open_items"]


def thread_has_workers(conn: Any, thread_id: str) -> bool:
    """Whether thread ``thread_id`` is the root of a worker tree (read-only)."""
    row = execute(conn, "SELECT 1 FROM workers WHERE root_thread_id = ? LIMIT 1", (thread_id,)).fetchone()
    return row is not None


def thread_changed_since(conn: Any, thread_id: str, turn_rows: int, max_seq: int) -> bool:
    """Whether the store holds other turns or items of ``thread_id`` than a reader that saw
    ``turn_rows`` turn rows and items up to ``seq`` ``max_seq`` (read-only)."""
    if execute(conn, "SELECT 1 FROM items WHERE thread_id = ? AND seq > ? LIMIT 1", (thread_id, max_seq)).fetchone():
        return True
    return execute(conn, "SELECT COUNT(*) FROM turns WHERE thread_id = ?", (thread_id,)).fetchone()[0] != turn_rows


def interrupt_open_items(conn: Any, turn_id: str) -> int:
    """Mark the items of ``turn_id`` still ``in_progress`` (checkpointed tool calls, streamed
    text) ``interrupted`` (write); return how many."""
    return execute(
        conn, "UPDATE items SET status = 'interrupted' WHERE turn_id = ? AND status = 'in_progress'", (turn_id,)
    ).rowcount
