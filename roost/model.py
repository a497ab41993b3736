"""The domain's plain data: threads, turns, items, runs, workers, held input, schedules and more.

These attrs classes carry no behaviour and import nothing of Roost, so every room may use them.
The storage room (:mod:`roost.storage`) reads and writes them; the protocol dialects render them.

Conventions:

* Ids are strings (the store generates ``<prefix>_<uuid hex>`` when the caller gives none).
* Timestamps (``created_at``, ``started_at``...) are ISO 8601 UTC strings with microseconds and a
  ``Z`` suffix, e.g. ``"2026-01-31T12:00:00.000000Z"``; they sort lexicographically in time order.
  Lease expiry is the exception: unix wall-clock seconds (float), see :mod:`roost.storage.leases`.
* JSON-valued fields (``metadata``, ``payload``, ``error``, ``usage``, ``result``) hold decoded
  Python values (dicts, lists, primitives) or ``None``.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = [
    "THREAD_KINDS",
    "TURN_STATUSES",
    "HELD_INPUT_KINDS",
    "Thread",
    "Turn",
    "Item",
    "Run",
    "HeldInput",
    "Worker",
    "DaemonTask",
    "MemoryEntry",
    "ContextFile",
    "SearchHit",
]

#: The kinds of thread: a human conversation, an orchestration session, or a subagent's thread.
THREAD_KINDS = ("chat", "orchestration", "worker")
#: Turn (and run) statuses; ``running`` is the only non-terminal one besides ``queued``.
TURN_STATUSES = ("queued", "running", "completed", "interrupted", "failed")
#: Held/pending user input: ``steer`` joins the active turn, ``queue`` waits for the next one.
HELD_INPUT_KINDS = ("steer", "queue")


@attrs.define(kw_only=True)
class Thread:
    """A persisted conversation (app-server "thread", wire-protocol "session")."""

    id: str
    kind: str = "chat"
    parent_thread_id: str | None = None
    title: str | None = None
    cwd: str | None = None
    provider: str | None = None
    model: str | None = None
    effort: str | None = None
    permission_mode: str | None = None
    pinned: bool = False
    archived: bool = False
    created_at: str = ""
    updated_at: str = ""
    metadata: dict[str, Any] = attrs.field(factory=dict)


@attrs.define(kw_only=True)
class Turn:
    """One model loop from an input to a final answer, an interruption or a failure."""

    id: str
    thread_id: str
    status: str = "running"
    run_id: str | None = None
    started_at: str = ""
    completed_at: str | None = None
    error: Any = None
    usage: Any = None


@attrs.define(kw_only=True)
class Item:
    """One unit of a turn (user message, agent message, reasoning, tool call, error, compaction).

    ``seq`` is the item's position in its thread: 1, 2, 3... without gaps, assigned by the store.
    ``text`` is the searchable text (full-text index), or ``None``.
    """

    id: str
    thread_id: str
    seq: int
    type: str
    turn_id: str | None = None
    status: str = "completed"
    payload: Any = None
    text: str | None = None
    created_at: str = ""


@attrs.define(kw_only=True)
class Run:
    """An invocation that may span several turns (continuation, orchestration, serve task)."""

    id: str
    thread_id: str | None = None
    kind: str = "turn"
    status: str = "running"
    owner: str | None = None
    started_at: str = ""
    completed_at: str | None = None
    error: Any = None
    metadata: dict[str, Any] = attrs.field(factory=dict)


@attrs.define(kw_only=True)
class HeldInput:
    """User input waiting for a turn: pending (``held=False``) or held work (``held=True``).

    ``client_id`` makes acceptance idempotent: one row per (thread, client_id).
    """

    id: str
    thread_id: str
    position: int
    kind: str = "queue"
    payload: Any = None
    held: bool = False
    client_id: str | None = None
    created_at: str = ""


@attrs.define(kw_only=True)
class Worker:
    """A subagent in a tree under a root thread; ``thread_id`` is its own (kind ``worker``) thread."""

    id: str
    thread_id: str
    root_thread_id: str
    parent_id: str | None = None
    name: str | None = None
    status: str = "queued"
    depth: int = 0
    spawn_order: int = 0
    result: Any = None
    created_at: str = ""
    updated_at: str = ""


@attrs.define(kw_only=True)
class DaemonTask:
    """A task queued on the ``serve`` daemon; ``position`` orders the queue."""

    id: str
    position: int
    status: str = "queued"
    payload: Any = None
    run_id: str | None = None
    client_id: str | None = None
    error: Any = None
    created_at: str = ""
    updated_at: str = ""


@attrs.define(kw_only=True)
class MemoryEntry:
    """A remembered value under (scope, key), e.g. scope ``"workspace:/path"``."""

    id: str
    scope: str
    key: str
    value: Any = None
    created_at: str = ""
    updated_at: str = ""


@attrs.define(kw_only=True)
class ContextFile:
    """A file attached to a thread's context (its path and the content as read)."""

    id: str
    thread_id: str
    path: str
    content: str = ""
    created_at: str = ""


@attrs.define(kw_only=True, frozen=True)
class SearchHit:
    """One full-text match: the item that matched and a snippet with ``[`` ``]`` around hits."""

    thread_id: str
    item_id: str
    seq: int
    snippet: str
