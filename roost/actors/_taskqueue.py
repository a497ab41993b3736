"""The serve daemon's task queue: durable FIFO tasks, positions, N concurrent runners.

DESIGN.md section 2 (``TaskQueue``, permanent) and wire-protocol.md "Daemon events". A task is one
prompt run on its own thread (kind ``orchestration``) with the configured provider: by the team of
agents of its orchestration config (its own, else the daemon's ``roost serve -c`` default, fixed
when it is dispatched), or, without any config, by one agent in one turn.

Tasks are rows of ``daemon_tasks`` (:func:`roost.storage.enqueue_daemon_task`), so a daemon killed
with tasks queued or running keeps them: on start :meth:`TaskQueue.restore` puts running ones first
(they are *resumed*: a new turn on their saved thread continues the work; an orchestrated task's
run continues from the progress saved in its thread's metadata) and queued ones after, in their
order; finished tasks whose result no client collected stay listed for their client.

Task lifecycle (``daemon_tasks.status``)::

    queued -> running -> finished -> collected
                 ^  (daemon restart: running -> running again, resumed)

The queue is protocol-neutral: what a task emits, its approvals and its end go to a
:class:`TaskListener` (the daemon front door), which renders them for clients.

Scheduler integration (issue 7): ``await queue.dispatch(task, config=..., work_dir=..., client_id=None,
source="schedule")`` returns the task id (also its ``sessionId``).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
from typing import Any

import trio

from roost._faults import fault_point
from roost._paths import node_name, positive_env
from roost.actors._messages import InterruptTurn
from roost.actors._task_model import Orchestrations, QueuedTask, TaskListener
from roost.actors._taskqueue_run import TaskRunner
from roost.actors._taskqueue_shared import SharedQueue
from roost.errors import RoostError, ServerOverloaded
from roost.storage import (
    enqueue_daemon_task,
    get_daemon_task,
    list_daemon_tasks,
    new_id,
    update_daemon_task,
    wake_task_claimers,
)

__all__ = ["TaskQueue", "QueuedTask", "TaskListener"]

log = logging.getLogger("roost.serve")


class TaskQueue(TaskRunner, SharedQueue):
    """FIFO of daemon tasks run by ``max_concurrent`` runners.

    Args:
        runtime: the :class:`roost.supervisor.Runtime` (store, thread registry).
        listener: receives task events (see :class:`TaskListener`).
        provider, model: the thread selection of new tasks (the configured provider).
        max_concurrent: runners (tasks executing at once), >= 1.
        max_queued: queued tasks allowed; past it :meth:`dispatch` raises ``ServerOverloaded``.
        unattended_policy: ``"deny"`` or ``"allow"``: the approval decision when nobody can be asked.
        permission_mode: the permission mode of task threads (default ``standard``: mutations ask).
        default_work_dir: a task's working directory when it names none (absolute path).
        default_config: the orchestration config (absolute path) of tasks dispatched without one
            (``roost serve -c``); None: such tasks run one agent's turn.
        engines: the daemon's :class:`roost.protocol._engines.EngineCatalog` (the Orchestrator's
            selector model for ``llm`` selection).
        orchestrations: ``roost.orchestration`` (see :class:`Orchestrations`); None: a task with
            an orchestration config fails with ``ConfigError``.
    """

    def __init__(
        self,
        runtime: Any,
        listener: TaskListener,
        *,
        provider: str | None,
        model: str | None,
        max_concurrent: int = 1,
        max_queued: int = 1000,
        unattended_policy: str = "deny",
        permission_mode: str = "standard",
        default_work_dir: str = ".",
        default_config: str | None = None,
        engines: Any = None,
        orchestrations: Orchestrations | None = None,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        self.runtime = runtime
        self.listener = listener
        self.provider = provider
        self.model = model
        self.max_concurrent = max_concurrent
        self.max_queued = max_queued
        self.unattended_policy = unattended_policy
        self.permission_mode = permission_mode
        self.default_work_dir = default_work_dir
        self.default_config = default_config
        self.engines = engines
        self.orchestrations = orchestrations
        self.tasks: dict[str, QueuedTask] = {}
        #: called with ``(task)`` once a task is queued (the daemon's metrics); must not block
        self.on_accepted: Any = None
        #: called with ``(task)`` when a task is queued and no runner of this process is idle
        #: (``roost serve --workers``: wake a worker); must not block
        self.on_unclaimed: Any = None
        self._queued: collections.deque[str] = collections.deque()
        #: the wake-up events of the runners that wait (or claim), oldest first
        self._sleepers: collections.deque[trio.Event] = collections.deque()
        self._runs = 0
        #: tasks this node's runners execute now (the others it knows run elsewhere, or wait)
        self._local: set[str] = set()
        #: seconds between two looks at the shared queue when idle (``ROOST_TASK_POLL_S``)
        self.poll_s = positive_env("ROOST_TASK_POLL_S", 1.0, unit="seconds")
        #: this node's name (tasks it dispatched carry it; the others are ``foreign``)
        self.node = node_name()
        #: whether this node's runners claim tasks (``roost serve --no-claim``: a front door only)
        self.claims = True

    # -- public API ---------------------------------------------------------------------------------

    async def dispatch(
        self,
        task: str,
        *,
        config: str | None = None,
        work_dir: str | None = None,
        client_id: str | None = None,
        source: str = "client",
        provider: str | None = None,
        model: str | None = None,
        task_id: str | None = None,
        thread_id: str | None = None,
    ) -> str:
        """Queue ``task`` durably and return its id (also its ``sessionId``).

        Args:
            task: the prompt.
            config: the orchestration config the task runs (default: the queue's ``default_config``;
                neither: one agent's turn). A relative path is taken from the task's working
                directory. It is loaded when the task starts: an unusable config fails the task.
            work_dir: the working directory (default: the daemon's).
            client_id: the owning client's key: its approvals and result go to it (None: nobody,
                the unattended policy answers approvals).
            source: who dispatched it (``client``, ``schedule``, ``mcp`` ...).
            provider, model: the task thread's model selection (a schedule's stored settings);
                ``None``: the queue's.
            task_id, thread_id: the task's id (default: a new one; one in use is a store error)
                and the thread it continues (default: a new thread, of the task's id).

        Returns:
            The task id. :meth:`position` gives how many queued tasks are ahead of it (read it
            before the next checkpoint for the position at dispatch).

        Raises:
            ServerOverloaded: ``max_queued`` tasks are already queued.
            StoreError: the task could not be persisted (nothing was queued).

        Cancellation: cancelled before the write commits, nothing is queued.
        """
        if len(self._queued) >= self.max_queued:
            raise ServerOverloaded(f"the task queue is full ({self.max_queued} queued); retry later")
        config = config or self.default_config
        if config:
            config = os.path.join(work_dir or self.default_work_dir, os.path.expanduser(config))
        item = QueuedTask(
            id=task_id or new_id("thr"),
            task=task,
            thread_id=thread_id,
            config=config,
            work_dir=work_dir,
            client_id=client_id,
            source=source,
            provider=provider,
            model=model,
            node=self.node,
            dispatcher=self.runtime.services.owner if self.runtime.services.bus is not None else None,
        )
        # Known before its row exists: a runner (this node's, or a claim racing the write) that
        # claims the row finds this object, never a second copy built from the row.
        self.tasks[item.id] = item
        try:
            await self.runtime.store.writer.submit(_enqueue, item, self.runtime.services.owner)
        except BaseException:
            self.tasks.pop(item.id, None)
            raise
        self._accepted(item)
        return item.id

    def _accepted(self, item: QueuedTask) -> None:
        """After ``item``'s row committed: queue it here (unless a runner took it already), wake
        one idle runner, tell the listener, log it."""
        if item.status == "queued" and item.id not in self._local:
            self._queued.append(item.id)
        if not self._notify_one() and self.on_unclaimed is not None:
            self.on_unclaimed(item)
        if self.on_accepted is not None:
            self.on_accepted(item)
        log.info(
            "task %s accepted from %s (%d queued)",
            item.id,
            item.source,
            len(self._queued),
            extra={
                "event": "task_accepted",
                "task_id": item.id,
                "source": item.source,
                "client": item.client_id,
                "work_dir": item.work_dir or self.default_work_dir,
                "config": item.config,
            },
        )

    def position(self, task_id: str) -> int | None:
        """How many queued tasks are ahead of ``task_id`` (None when it is not queued)."""
        try:
            return self._queued.index(task_id)
        except ValueError:
            return None

    async def lookup(self, task_id: str) -> QueuedTask | None:
        """The task ``task_id`` (in memory, or read back from the store once collected), or None."""
        task = self.tasks.get(task_id)
        if task is not None:
            return task
        store = self.runtime.store

        def read() -> Any:
            with store.read() as conn:
                found = get_daemon_task(conn, task_id)
                return [found] if found is not None else []

        rows = await trio.to_thread.run_sync(read)
        return QueuedTask.from_row(rows[0]) if rows else None

    def in_flight(self, client_id: str) -> list[QueuedTask]:
        """The client's tasks still queued or running, in queue order."""
        return [t for t in self.tasks.values() if t.client_id == client_id and t.status in ("queued", "running")]

    def uncollected(self, client_id: str) -> list[QueuedTask]:
        """The client's finished tasks whose result it has not collected."""
        return [t for t in self.tasks.values() if t.client_id == client_id and t.status == "finished"]

    async def mark_collected(self, task_id: str) -> None:
        """Record that the task's result reached its client (it is no longer pending)."""
        task = self.tasks.get(task_id)
        if task is None or task.status != "finished":
            return
        task.status = "collected"
        await self.runtime.store.writer.submit(update_daemon_task, task_id, status="collected")
        self.tasks.pop(task_id, None)

    def runs_here(self, task_id: str) -> bool:
        """Whether one of this process's runners executes the task now (``roost status``)."""
        return task_id in self._local

    def interrupt(self, client_id: str) -> int:
        """Interrupt the running turns (orchestrated tasks: the runs) of the client's tasks that
        run on this node; return how many were asked to stop (:meth:`interrupt_everywhere` also
        reaches the client's tasks running on other nodes)."""
        tasks = [t for t in self.tasks.values() if self._owns(t, client_id) and t.id in self._local]
        return sum(self._interrupt_task(t) for t in tasks)

    def _interrupt_task(self, task: QueuedTask) -> bool:
        """Ask one task running on this node to stop; return whether it was asked."""
        if task.status != "running":
            return False
        if task.orchestrator is not None:
            task.orchestrator.interrupt("interrupted")
            return True
        if task.orchestrated:  # still starting: its run is interrupted as soon as it exists
            task.interrupt_pending = True
            return True
        if task.actor is not None:
            try:
                task.actor.ref.tell(InterruptTurn(turn_id=task.turn_id, reason="interrupted"))
                return True
            except RoostError:
                log.debug("could not interrupt a task's turn", exc_info=True)
        return False

    # -- lifecycle ----------------------------------------------------------------------------------

    async def restore(self) -> list[QueuedTask]:
        """Load unfinished tasks of a previous daemon; return those that will be resumed.

        Running tasks go to the front (in their order), queued ones after; finished, uncollected
        ones are kept for their clients' next ``hello``.
        """
        store = self.runtime.store

        def read() -> list:
            with store.read() as conn:
                return [t for t in list_daemon_tasks(conn) if t.status in ("queued", "running", "finished")]

        rows = await trio.to_thread.run_sync(read)
        resumed: list[str] = []
        queued: list[str] = []
        for row in rows:
            item = self._known(row)
            self.tasks[item.id] = item
            if row.status == "running":
                item.status, item.resumed = "queued", True
                resumed.append(item.id)
            elif row.status == "queued":
                queued.append(item.id)
        self._queued.extend(resumed + queued)
        if self._queued:
            self._notify()
        return [self.tasks[i] for i in resumed]

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run the runners until cancelled; restartable (a permanent child of the root supervisor).

        A second and later run first rebuilds the queue from the store (:meth:`_rebuild`): the
        tasks the previous runners had started are queued again at the front, and a task whose
        turn is still running on its thread is re-attached to that turn, not started again.

        Cancellation: running tasks stay ``running`` in the store (their turns are interrupted by
        the runtime when it stops) and are resumed by the next daemon.
        """
        self._runs += 1
        self._install_bus()
        if self._runs > 1:
            await self._rebuild()
        async with trio.open_nursery() as nursery:
            if self.claims:  # listening before the first claim: no dispatch falls in between
                await nursery.start(self._listen_for_tasks)
            for _ in range(self.max_concurrent if self.claims else 0):
                nursery.start_soon(self._runner)
            nursery.start_soon(self._follow_elsewhere)
            task_status.started()

    async def _rebuild(self) -> None:
        """After a restart: queue again, at the front, every task that was running (from the store)."""
        store = self.runtime.store

        def read() -> list:
            with store.read() as conn:
                return [t.id for t in list_daemon_tasks(conn) if t.status == "running"]

        running = [i for i in await trio.to_thread.run_sync(read) if i in self.tasks]
        running += [i for i, t in self.tasks.items() if t.status == "running" and i not in running]
        for task_id in running:
            task = self.tasks[task_id]
            task.status, task.resumed = "queued", True
        self._queued = collections.deque(running + [i for i in self._queued if i not in running])
        if self._queued:
            self._notify()
        log.warning("task queue restarted: %d running task(s) queued again", len(running))

    def _notify(self) -> None:
        """Wake every idle runner (and every runner claiming now: it looks again after)."""
        sleepers, self._sleepers = self._sleepers, collections.deque()
        for event in sleepers:
            event.set()

    def _notify_one(self) -> bool:
        """Wake one idle runner (one task became claimable); it wakes the next when it claims one.
        Return whether a runner was idle."""
        if self._sleepers:
            self._sleepers.popleft().set()
            return True
        return False

    def wake_one(self) -> bool:
        """Have one idle runner look at the shared queue now, because another process of this
        store made a task claimable (``roost serve --workers``: the front door's wake-up byte).

        Returns:
            Whether a runner was idle (False: every runner is busy; the first to finish looks).
        """
        return self._notify_one()

    async def _runner(self) -> None:
        """Claim the next task of the shared queue and run it under its lease, forever.

        An idle runner looks again when this node queues a task, when another node does
        (PostgreSQL: its ``NOTIFY``, :meth:`_listen_for_tasks`), or after ``poll_s`` (a lost
        notification, SQLite's other processes, and tasks of a node that died, whose lease
        expired: the bounded polling fallback, issue 13). A new task wakes one idle runner
        (:meth:`_notify_one`), not all of them; a runner that claims a task wakes the next idle
        one, so a burst of tasks is taken by as many runners as it needs.
        """
        while True:
            mine = trio.Event()
            self._sleepers.append(mine)  # registered before the claim: a wake-up during it counts
            try:
                if await self._claim_and_run(mine):
                    continue
                with trio.move_on_after(self.poll_s):
                    await mine.wait()
            finally:
                self._forget(mine)

    def _forget(self, event: trio.Event) -> None:
        with contextlib.suppress(ValueError):
            self._sleepers.remove(event)

    async def _claim_and_run(self, mine: trio.Event) -> bool:
        """Claim one task and run it (False: nothing to claim). A function of its own so that no
        local keeps the finished task (its result, its actor) alive while the runner waits."""
        keeper = self.runtime.services.keeper
        claimed = await self._claim()
        if claimed is None:
            return False
        self._forget(mine)  # busy now
        self._notify_one()  # more may be claimable: the next idle runner looks
        task, lease = claimed
        self._local.add(task.id)
        try:
            async with keeper.adopt(lease) as execution, trio.open_nursery() as relays:
                fault_point("task_queue")  # (a crash here releases the lease: the task is resumed)
                await self._start_relay(task, relays)
                with execution.cancel_scope:
                    await self._run(task, execution)
                self._end_relay(task)
            if execution.lost_reason is not None:
                log.warning(
                    "task %s lost its lease (%s): another node resumes it",
                    task.id,
                    execution.lost_reason,
                    extra={"event": "task_lease_lost", "task_id": task.id},
                )
        finally:
            self._end_relay(task)
            self._local.discard(task.id)
        return True


def _enqueue(conn: Any, item: QueuedTask, sender: str) -> None:
    """Write ``item``'s row and wake the cluster's idle claimers, in one transaction (a writer)."""
    enqueue_daemon_task(conn, payload=item.payload(), id=item.id)
    wake_task_claimers(conn, item.id, sender)
