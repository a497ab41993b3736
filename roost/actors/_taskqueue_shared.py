"""The task queue's side of the cluster (issue 13): claiming the next task of the queue shared by
every node on the database, and following the tasks this node knows that run on other nodes.

:class:`SharedQueue` is a part of :class:`roost.actors._taskqueue.TaskQueue` (its attributes:
``runtime``, ``listener``, ``tasks``, ``_queued``, ``_local``, ``node``, ``poll_s``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import trio

from roost.actors._task_model import QueuedTask
from roost.errors import RoostError
from roost.storage import claim_daemon_task, get_daemon_task

__all__ = ["SharedQueue"]

log = logging.getLogger("roost.serve")


class SharedQueue:
    """Claims and cross-node bookkeeping of the daemon task queue (mixed into ``TaskQueue``)."""

    runtime: Any
    listener: Any
    tasks: dict[str, QueuedTask]
    _queued: Any
    _local: set[str]
    node: str
    poll_s: float

    async def _claim(self) -> tuple[QueuedTask, Any] | None:
        """Claim a task for this node (:func:`roost.storage.claim_daemon_task`), or None.

        A store failure is logged and answers None (the runner looks again after ``poll_s``).
        """
        services = self.runtime.services
        try:
            claimed = await self.runtime.store.writer.submit(claim_daemon_task, services.owner, services.lease_ttl)
        except RoostError as exc:
            log.warning("could not claim a task: %s", exc)
            return None
        if claimed is None:
            return None
        row, lease, resumed = claimed
        task = self.tasks.get(row.id)
        if task is None:  # queued by another node (or before this one started)
            task = self.tasks[row.id] = self._known(row)
        with contextlib.suppress(ValueError):
            self._queued.remove(row.id)
        task.resumed = task.resumed or resumed
        return task, lease

    def _known(self, row: Any) -> QueuedTask:
        """The task of a store row, ``foreign`` when another node dispatched it."""
        task = QueuedTask.from_row(row)
        task.foreign = task.node is not None and task.node != self.node
        return task

    async def _follow_elsewhere(self) -> None:
        """Every ``poll_s``: follow the tasks this node knows that run (or ran) on other nodes.

        A task another node claimed leaves this node's queue (positions stay right); one that
        finished there gets its result told here (:meth:`TaskListener.task_finished`: its client
        may be attached to this node); one collected elsewhere is forgotten.
        """
        store = self.runtime.store
        while True:
            await trio.sleep(self.poll_s)
            pending = [
                i
                for i, t in self.tasks.items()
                if i not in self._local
                and (t.status in ("queued", "running") or (t.foreign and t.status == "finished"))
            ]
            if not pending:
                continue

            def read(ids: list[str] = pending) -> list[Any]:
                with store.read() as conn:
                    return [get_daemon_task(conn, i) for i in ids]

            try:
                rows = await trio.to_thread.run_sync(read)
            except RoostError as exc:
                log.warning("could not follow the cluster's tasks: %s", exc)
                continue
            for row in rows:
                if row is not None and row.id not in self._local:
                    self._follow(row)

    def _follow(self, row: Any) -> None:
        task = self.tasks.get(row.id)
        if task is None:
            return
        if row.status == "running" and task.status == "queued":
            task.status = "running"
            with contextlib.suppress(ValueError):
                self._queued.remove(row.id)
        elif row.status == "finished" and task.status in ("queued", "running"):
            task.status, task.result = "finished", (row.payload or {}).get("result")
            with contextlib.suppress(ValueError):
                self._queued.remove(row.id)
            self.listener.task_finished(task)
        elif row.status == "collected":
            self.tasks.pop(row.id, None)
            with contextlib.suppress(ValueError):
                self._queued.remove(row.id)
