"""The ObjectiveRunner: runs objectives' remaining tasks on an idle daemon and records outcomes.

wire-protocol.md, appendix "Objectives" and "Daemon events" (``auto_dispatched``). ``roost serve``
starts one as a permanent child of the root supervisor, whether or not ``--auto-objective`` is
given, because it also records the outcome of objective tasks dispatched over MCP
(``dispatch_task`` with an ``objectiveId``).

Each pass (every ``poll`` seconds, real trio time; a read of the objectives' rows):

* every objective task recorded ``running`` with a session id that nobody awaits yet gets a
  waiter: when its daemon task ends, :func:`roost.storage.finish_objective_task` records the
  outcome (success; or one more consecutive failure, skipped at 3). This is also how a restarted
  daemon settles the attempt that was running when it died: the TaskQueue resumes that task and
  the waiter records its end, so a task that succeeded is never dispatched again;
* for the ``--auto-objective`` ids, in the order given: when the daemon is idle (``idle()``: no
  task queued or running) and nothing of ours is in flight, the first remaining task of the first
  active objective that has one is dispatched (no client: approvals follow the unattended
  policy), recorded ``running`` with its session id, and ``auto_dispatched {sessionId,
  objectiveId, task}`` is broadcast.

Injected coroutine functions are those of the Scheduler (see :mod:`roost.actors._scheduler`):
``dispatch(task, *, client_id, source) -> task_id`` and ``wait_task(task_id) -> outcome``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from roost.errors import RoostError
from roost.storage import finish_objective_task, list_objectives, start_objective_task

__all__ = ["ObjectiveRunner"]

log = logging.getLogger("roost.serve")


class ObjectiveRunner:
    """See the module doc.

    Args:
        store: the process's :class:`~roost.storage.Store`.
        dispatch: ``async dispatch(task, *, client_id=None, source="objective") -> task id``.
        wait_task: ``async wait_task(task_id) -> "succeeded" | "failed" | "interrupted"``;
            raises ``LookupError`` for a task the queue does not know (counted as a failure).
        announce: ``announce(session_id, objective_id, task)`` after an automatic dispatch (the
            daemon broadcasts ``auto_dispatched``); must not block.
        idle: True when the daemon has no task queued or running.
        auto_objectives: the ``--auto-objective`` ids, in priority order.
        poll: seconds between passes.
    """

    def __init__(
        self,
        store: Any,
        *,
        dispatch: Callable[..., Awaitable[str]],
        wait_task: Callable[[str], Awaitable[str]],
        announce: Callable[[str, str, str], None],
        idle: Callable[[], bool],
        auto_objectives: Sequence[str] = (),
        poll: float = 0.5,
    ) -> None:
        self.store = store
        self.dispatch = dispatch
        self.wait_task = wait_task
        self.announce = announce
        self.idle = idle
        self.auto_objectives = list(auto_objectives)
        self.poll = poll
        self._awaited: set[str] = set()
        self._warned: set[str] = set()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run passes until cancelled (see the module doc)."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                objectives = await trio.to_thread.run_sync(self._read)
                self._track(nursery, objectives)
                if not self._awaited and self.idle():
                    await self._auto(nursery, objectives)
                await trio.sleep(self.poll)

    def _read(self) -> list[Any]:
        with self.store.read() as conn:
            return list_objectives(conn)

    def _track(self, nursery: trio.Nursery, objectives: list[Any]) -> None:
        for objective in objectives:
            for task in objective.tasks:
                if task.outcome == "running" and task.session_id and task.session_id not in self._awaited:
                    self._awaited.add(task.session_id)
                    nursery.start_soon(self._settle, objective.id, task.index, task.session_id)

    async def _auto(self, nursery: trio.Nursery, objectives: list[Any]) -> None:
        by_id = {o.id: o for o in objectives}
        for objective_id in self.auto_objectives:
            objective = by_id.get(objective_id)
            if objective is None:
                if objective_id not in self._warned:
                    self._warned.add(objective_id)
                    log.warning(
                        "--auto-objective %s: no such objective (create it with roost objective create)", objective_id
                    )
                continue
            task = objective.next_task() if objective.status == "active" else None
            if task is None or task.outcome != "pending":
                continue
            try:
                session_id = await self.dispatch(task.task, client_id=None, source="objective")
            except RoostError as exc:
                log.warning("objective %s task %d could not be queued: %s", objective.id, task.index + 1, exc)
                return
            await self.store.writer.submit(start_objective_task, objective.id, task.index, session_id)
            self._awaited.add(session_id)
            self.announce(session_id, objective.id, task.task)
            nursery.start_soon(self._settle, objective.id, task.index, session_id)
            return

    async def _settle(self, objective_id: str, index: int, session_id: str) -> None:
        try:
            try:
                outcome = await self.wait_task(session_id)
            except LookupError:
                log.warning(
                    "objective %s task %d: session %s is unknown to the queue; counted as failed",
                    objective_id,
                    index + 1,
                    session_id,
                )
                outcome = "failed"
            try:
                await self.store.writer.submit(finish_objective_task, objective_id, index, outcome == "succeeded")
            except RoostError:
                log.exception("objective %s task %d: the outcome could not be saved", objective_id, index + 1)
        finally:
            self._awaited.discard(session_id)
