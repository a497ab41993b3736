"""Usage records: the token usage each turn reported, for ``usage/overview`` and ``settings/usage``.

Read-only; reads the ``turns.usage`` column and the owning thread's attribution (kind, parent,
provider), never conversation content.
"""

from __future__ import annotations

from typing import Any

from roost._json import loads

from ._portable import execute, is_sqlite

__all__ = ["list_usage_records"]


def list_usage_records(conn: Any) -> list[dict]:
    """Every turn with recorded usage, oldest first (read-only).

    Returns:
        ``[{thread_id, root_thread_id, kind, provider, started_at, input_tokens, output_tokens,
        cached_tokens}]``: ``started_at`` is the turn's ISO 8601 UTC start (the request time);
        ``root_thread_id`` is the worker's root thread (its ``workers`` row, else its parent)
        for a ``worker`` thread, else the thread itself. Turns whose usage is absent, or reports
        no tokens at all, are left out (they reported nothing).
    """
    rows = execute(
        conn,
        "SELECT t.thread_id, t.started_at, t.usage, th.kind, "
        "COALESCE((SELECT w.root_thread_id FROM workers w WHERE w.thread_id = t.thread_id LIMIT 1), "
        "th.parent_thread_id), th.provider "
        "FROM turns t JOIN threads th ON th.id = t.thread_id "
        "WHERE t.usage IS NOT NULL ORDER BY t.started_at, " + ("t.rowid" if is_sqlite(conn) else "t.id"),
    ).fetchall()
    out: list[dict] = []
    for thread_id, started_at, usage_json, kind, parent, provider in rows:
        try:
            usage = loads(usage_json)
        except ValueError:  # not JSON: no usage was recorded
            continue
        if not isinstance(usage, dict):
            continue
        counts = {k: int(usage.get(k) or 0) for k in ("input_tokens", "output_tokens", "cached_tokens")}
        if not any(counts.values()):
            continue
        root = parent if kind == "worker" and parent else thread_id
        out.append(
            {
                "thread_id": thread_id,
                "root_thread_id": root,
                "kind": kind,
                "provider": provider,
                "started_at": started_at,
                **counts,
            }
        )
    return out
