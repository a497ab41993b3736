"""The serve daemon's task queue: durable FIFO tasks, positions, N concurrent runners.

DESIGN.md section 2 (``TaskQueue``, permanent) and wire-protocol.md "Daemon events". A task is one
prompt run on its own thread (kind ``orchestration``) by one agent with the configured provider.
Tasks are rows of ``daemon_tasks`` (:func:`roost.storage.enqueue_daemon_task`), so a daemon killed
with tasks queued or running keeps them: on start :meth:`TaskQueue.restore` puts running ones first
(they are *resumed*: a new turn on their saved thread continues the work) and queued ones after,
in their order; finished tasks whose result no client collected stay listed for their client.

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
import functools
import logging
from typing import Any, Protocol

import attrs
import trio

from roost._json import loads
from roost.actors._actor import shielded_cleanup
from roost.actors._messages import InterruptTurn, Origin, StartTurn, Subscribe, Unsubscribe
from roost.errors import RoostError, ServerOverloaded, ThreadNotFound
from roost.storage import enqueue_daemon_task, list_daemon_tasks, new_id, update_daemon_task, utc_now

__all__ = ["TaskQueue", "QueuedTask", "TaskListener", "RESUME_PROMPT"]

log = logging.getLogger("roost.serve")

#: The prompt of the turn that resumes a task interrupted by a daemon restart.
RESUME_PROMPT = ("The daemon restarted while you were working on this task. Continue it from where "
                 "you left off and finish it.\n\nThe task: {task}")
#: Seconds a runner's clean-up (unsubscribe, persist the end) may take.
_CLEANUP = 10.0


@attrs.define(eq=False)
class QueuedTask:
    """One daemon task (``id`` is also its ``sessionId`` and its thread's id)."""

    id: str
    task: str
    config: str | None = None
    work_dir: str | None = None
    client_id: str | None = None       # the owning client's scoped key (opaque), or None
    source: str = "client"
    status: str = "queued"
    resumed: bool = False
    result: dict | None = None
    turn_id: str | None = None
    actor: Any = None

    def payload(self) -> dict:
        return {"task": self.task, "config": self.config, "workDir": self.work_dir, "clientId": self.client_id,
                "source": self.source, "result": self.result}


class TaskListener(Protocol):
    """What the queue tells its front door (all but ``request_approval`` must not block)."""

    def task_started(self, task: QueuedTask) -> None: ...

    def task_notification(self, task: QueuedTask, method: str, params: dict) -> None: ...

    async def request_approval(self, task: QueuedTask, params: dict) -> bool | None: ...

    def task_finished(self, task: QueuedTask) -> None: ...


class _Sink:
    """Hub subscriber for one task's thread: decodes each line and hands it to the listener."""

    def __init__(self, task: QueuedTask, listener: TaskListener) -> None:
        self.task = task
        self.listener = listener

    def deliver(self, line: bytes) -> None:
        try:
            message = loads(line)
            self.listener.task_notification(self.task, message.get("method") or "", message.get("params") or {})
        except Exception:
            log.exception("task %s: could not render a notification", self.task.id)


class TaskQueue:
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
    """

    def __init__(self, runtime: Any, listener: TaskListener, *, provider: str | None, model: str | None,
                 max_concurrent: int = 1, max_queued: int = 1000, unattended_policy: str = "deny",
                 permission_mode: str = "standard", default_work_dir: str = ".") -> None:
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
        self.tasks: dict[str, QueuedTask] = {}
        self._queued: collections.deque[str] = collections.deque()
        self._wake = trio.Event()

    # -- public API ---------------------------------------------------------------------------------

    async def dispatch(self, task: str, *, config: str | None = None, work_dir: str | None = None,
                       client_id: str | None = None, source: str = "client") -> str:
        """Queue ``task`` durably and return its id (also its ``sessionId``).

        Args:
            task: the prompt.
            config: the orchestration config path it names (recorded; the configured provider runs it).
            work_dir: the working directory (default: the daemon's).
            client_id: the owning client's key: its approvals and result go to it (None: nobody,
                the unattended policy answers approvals).
            source: who dispatched it (``client``, ``schedule``, ``mcp`` ...).

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
        item = QueuedTask(id=new_id("thr"), task=task, config=config, work_dir=work_dir, client_id=client_id,
                          source=source)
        await self.runtime.store.writer.submit(enqueue_daemon_task, payload=item.payload(), id=item.id)
        self.tasks[item.id] = item
        self._queued.append(item.id)
        self._wake.set()
        return item.id

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
                row = conn.execute("SELECT id FROM daemon_tasks WHERE id = ?", (task_id,)).fetchone()
                return [t for t in list_daemon_tasks(conn) if t.id == task_id] if row else []

        rows = await trio.to_thread.run_sync(read)
        if not rows:
            return None
        row, payload = rows[0], rows[0].payload or {}
        return QueuedTask(id=row.id, task=payload.get("task") or "", config=payload.get("config"),
                          work_dir=payload.get("workDir"), client_id=payload.get("clientId"),
                          source=payload.get("source") or "client", status=row.status, result=payload.get("result"))

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

    def interrupt(self, client_id: str) -> int:
        """Interrupt the running turns of the client's tasks; return how many were asked to stop."""
        count = 0
        for task in self.tasks.values():
            if task.client_id == client_id and task.status == "running" and task.actor is not None:
                try:
                    task.actor.ref.tell(InterruptTurn(turn_id=task.turn_id, reason="interrupted by client"))
                    count += 1
                except RoostError:
                    pass
        return count

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
            payload = row.payload or {}
            item = QueuedTask(id=row.id, task=payload.get("task") or "", config=payload.get("config"),
                              work_dir=payload.get("workDir"), client_id=payload.get("clientId"),
                              source=payload.get("source") or "client", status=row.status,
                              result=payload.get("result"))
            self.tasks[item.id] = item
            if row.status == "running":
                item.status, item.resumed = "queued", True
                resumed.append(item.id)
            elif row.status == "queued":
                queued.append(item.id)
        self._queued.extend(resumed + queued)
        if self._queued:
            self._wake.set()
        return [self.tasks[i] for i in resumed]

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run the runners until cancelled. Cancellation: running tasks stay ``running`` in the store
        (their turns are interrupted by the runtime) and are resumed by the next daemon."""
        async with trio.open_nursery() as nursery:
            for _ in range(self.max_concurrent):
                nursery.start_soon(self._runner)
            task_status.started()

    async def _runner(self) -> None:
        while True:
            while not self._queued:
                self._wake = trio.Event() if self._wake.is_set() else self._wake
                await self._wake.wait()
            task = self.tasks[self._queued.popleft()]
            await self._run(task)

    async def _run(self, task: QueuedTask) -> None:
        task.status = "running"
        succeeded, error, last = False, None, None
        sink = _Sink(task, self.listener)
        actor = None
        try:
            await self.runtime.store.writer.submit(update_daemon_task, task.id, status="running")
            self.listener.task_started(task)
            actor = await self._thread(task)
            task.actor = actor
            await actor.ref.ask(Subscribe(sink))
            origin = Origin(client_id=task.client_id or "serve",
                            request_approval=functools.partial(self.listener.request_approval, task),
                            unattended_policy=self.unattended_policy)
            prompt = RESUME_PROMPT.format(task=task.task) if task.resumed else task.task
            turn = await actor.ref.ask(StartTurn(prompt=prompt, origin=origin, client_id=task.client_id))
            task.turn_id = turn["id"]
            view = await actor.wait_turn_end(turn["id"])
            succeeded = view.get("status") == "completed"
            if not succeeded:
                error = (view.get("error") or {}).get("message") or f"the turn ended {view.get('status')}"
            last = actor.last_agent_text() or None
        except RoostError as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.warning("task %s failed: %s", task.id, error)
        finally:
            with shielded_cleanup(_CLEANUP):
                if actor is not None:
                    try:
                        await actor.ref.ask(Unsubscribe(sink))
                    except RoostError:
                        pass
        task.actor = None
        task.result = {"succeeded": succeeded, "errorMessage": error, "lastAgent": "assistant" if last else None,
                       "lastMessage": last}
        task.status = "finished"
        try:
            await self.runtime.store.writer.submit(update_daemon_task, task.id, status="finished",
                                                   payload=task.payload())
            if succeeded:  # the session is complete (``roost sessions --json`` lists incomplete ones)
                await self.runtime.store.writer.submit(_mark_complete, task.id)
        except RoostError:
            log.exception("task %s: could not persist its result", task.id)
        self.listener.task_finished(task)

    async def _thread(self, task: QueuedTask) -> Any:
        """The task's thread actor: loaded when it exists (a resumed task), else created."""
        from roost.model import Thread

        if task.resumed:
            try:
                return await self.runtime.registry.get(task.id)
            except ThreadNotFound:
                pass
        now = utc_now()
        thread = Thread(id=task.id, kind="orchestration", title=task.task[:120], cwd=task.work_dir or self.default_work_dir,
                        provider=self.provider, model=self.model, permission_mode=self.permission_mode,
                        created_at=now, updated_at=now, metadata={"serveTask": True, "config": task.config})
        return await self.runtime.registry.create(thread, ephemeral=False)


def _mark_complete(conn: Any, thread_id: str) -> None:
    """Set ``metadata["is_complete"]`` on a task's thread (write; a missing thread is skipped)."""
    from roost.errors import NotFound
    from roost.storage import _threads

    try:
        thread = _threads.get_thread(conn, thread_id)
    except NotFound:
        return
    _threads.update_thread(conn, thread_id, metadata={**(thread.metadata or {}), "is_complete": True})
