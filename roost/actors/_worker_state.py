"""The record of one worker of a worker tree (in memory; mirrored in the ``workers`` table).

:class:`WorkerState` is what :class:`~roost.actors._workers.WorkerTree` keeps per worker and what
``agent/updated`` shows (:meth:`WorkerState.view`); :func:`worker_thread` is the thread row a new
worker gets (its root thread's selection). States: pending, queued, running, waiting_children
(nonterminal); :data:`TERMINAL` ones end a worker's work.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from roost.model import Thread
from roost.storage import new_id

__all__ = ["TERMINAL", "WorkerState", "worker_thread"]

#: Worker statuses after which a worker does no more work (until a ``send_message`` revives it).
TERMINAL = frozenset({"completed", "failed", "cancelled", "interrupted"})


@attrs.define(eq=False)
class WorkerState:
    """One worker of a tree (in memory; mirrored in the ``workers`` table)."""

    id: str
    thread_id: str
    parent_id: str | None
    parent_thread_id: str
    name: str
    description: str
    prompt: str
    depth: int
    spawn_order: int
    status: str = "pending"
    model: str | None = None
    result: str | None = None
    partial: bool = False
    delivered: bool = False
    turn_id: str | None = None
    created_at: str = ""
    updated_at: str = ""
    children: list[str] = attrs.field(factory=list)
    child_results: list[dict] = attrs.field(factory=list)
    ended: trio.Event = attrs.field(factory=trio.Event)

    def view(self, root_thread_id: str) -> dict:
        return {
            "id": self.id,
            "thread_id": self.thread_id,
            "root_thread_id": root_thread_id,
            "parent_id": self.parent_id,
            "name": self.name,
            "description": self.description,
            "status": self.status,
            "depth": self.depth,
            "spawn_order": self.spawn_order,
            "model": self.model,
            "result": self.result,
            "partial": self.partial,
            "delivered": self.delivered,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }

    @classmethod
    def from_row(cls, row: Any, parent_thread_id: str) -> WorkerState:
        """The state of a stored worker row (:func:`roost.storage.list_workers`); a terminal one
        comes back ended."""
        data = row.result if isinstance(row.result, dict) else {}
        worker = cls(
            id=row.id,
            thread_id=row.thread_id,
            parent_id=row.parent_id,
            parent_thread_id=parent_thread_id,
            name=row.name or row.id,
            description=data.get("description") or "",
            prompt=data.get("prompt") or "",
            depth=row.depth + 1,
            spawn_order=row.spawn_order,
            status=row.status,
            model=data.get("model"),
            result=data.get("text"),
            partial=bool(data.get("partial")),
            delivered=bool(data.get("delivered")),
            created_at=row.created_at,
            updated_at=row.updated_at,
        )
        if worker.status in TERMINAL:
            worker.ended.set()
        return worker


def worker_thread(src: Thread, *, name: str, model: str | None, parent_thread_id: str, now: str) -> Thread:
    """The thread row of a new worker named ``name`` under root thread ``src``: the root's cwd and
    selection (``model`` overrides the model), kind ``worker``, its root and agent name in metadata."""
    return Thread(
        id=new_id("thr"),
        kind="worker",
        title=name,
        cwd=src.cwd,
        provider=src.provider,
        model=model or src.model,
        effort=src.effort,
        permission_mode=src.permission_mode,
        parent_thread_id=parent_thread_id,
        created_at=now,
        updated_at=now,
        metadata={"root_thread_id": src.id, "agent_name": name},
    )
