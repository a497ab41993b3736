"""The task queue's side of the cluster (issue 13): claiming the next task of the queue shared by
every node on the database, following the tasks this node knows that run on other nodes, and
interrupting them there.

An ``interrupt`` line of a client on node A (wire-protocol.md, "Input": it cancels the client's
running task) reaches its tasks that run on node B too: A reads each such task's ``task:<id>``
lease and, when its owner is a node on the bus (:class:`roost.actors.NodeBus`), asks it with a
``task.interrupt`` request; B interrupts the task exactly as a local ``interrupt`` would. Its
``result`` (``succeeded: false``) reaches the client on A as any task run elsewhere does. An owner
that is not on the bus (dead: its lease expires and another node resumes the task) is not asked.

Approvals go the other way: a task B runs that A dispatched asks its approvals of its client on A
(:meth:`SharedQueue.ask_dispatcher`, a ``task.approval`` request to the dispatching process, which
asks its client as for a task it runs itself: reconnect grace, newest connection). When that
process is gone (or was restarted: the task names the process, not the home), nobody can be asked
and the unattended policy decides.

:class:`SharedQueue` is a part of :class:`roost.actors._taskqueue.TaskQueue` (its attributes:
``runtime``, ``listener``, ``tasks``, ``_queued``, ``_local``, ``node``, ``poll_s``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import trio

from roost.actors._task_model import QueuedTask, task_result
from roost.actors._taskqueue_relay import RelayInbox, TaskRelay
from roost.errors import NodeUnreachable, RoostError
from roost.storage import (
    claim_daemon_task,
    get_daemon_task,
    leases,
    list_daemon_tasks,
    task_lease_key,
    task_wake_listener,
    withdraw_daemon_task,
)

__all__ = ["SharedQueue"]

log = logging.getLogger("roost.serve")

#: Seconds a dispatcher waits for the relayed events of a task another process finished before
#: it tells the task's result from the store row alone (the relay lost, or never started).
RELAY_GRACE_S = 3.0
#: Longest single wait of the wake-up listener, seconds (a cancelled wait ends within it).
WAKE_WAIT_S = 5.0
#: Most seconds before a failed wake-up listener is opened again.
WAKE_RETRY_S = 5.0


class SharedQueue:
    """Claims and cross-node bookkeeping of the daemon task queue (mixed into ``TaskQueue``)."""

    runtime: Any
    listener: Any
    tasks: dict[str, QueuedTask]
    _queued: Any
    _local: set[str]
    node: str
    poll_s: float
    interrupt: Any
    _interrupt_task: Any
    lookup: Any
    _notify_one: Any

    # -- interrupts across nodes ----------------------------------------------------------------

    @staticmethod
    def _owns(task: QueuedTask, client_id: str) -> bool:
        """Whether ``task`` is the task of this node's client ``client_id``: its key, and for an
        anonymous client (``<scope>/conn-<n>``, numbered per process) a task this node dispatched
        (another node's anonymous client of the same key is another client)."""
        return task.client_id == client_id and not (task.foreign and "/conn-" in client_id)

    def _install_bus(self) -> None:
        """Serve other nodes' ``task.interrupt`` for this node's running tasks (idempotent)."""
        bus = self.runtime.services.bus
        if bus is not None:
            bus.on("task.interrupt", self._on_interrupt)
            RelayInbox(self).install(bus)  # task.events and task.approval

    async def ask_dispatcher(self, task: QueuedTask, params: dict) -> bool | None:
        """Ask the client of ``task`` (dispatched by another process on the bus) to approve, there;
        its answer, or None when nobody could be asked (the dispatcher is not on the bus, or it
        stopped answering). Waits as long as the dispatcher lives (its client's reconnect grace)."""
        bus, dispatcher = self.runtime.services.bus, task.dispatcher
        if bus is None or not dispatcher or dispatcher == bus.node_id or not await bus.node_alive(dispatcher):
            return None
        try:
            reply = await bus.request(dispatcher, "task.approval", {"task_id": task.id, "params": params})
        except RoostError as exc:  # NodeUnreachable, or the dispatcher's error
            log.warning("task %s: approval not answered by %s (%s)", task.id, dispatcher, exc)
            return None
        approved = reply.get("approved") if isinstance(reply, dict) else None
        return approved if isinstance(approved, bool) else None

    # -- events of tasks dispatched by another node ---------------------------------------------

    def _listener(self, task: QueuedTask) -> Any:
        """Where the task's events go: its relay to the dispatching node, else this node's listener."""
        return task.relay if task.relay is not None else self.listener

    async def _start_relay(self, task: QueuedTask, nursery: trio.Nursery) -> None:
        """Relay the task's events to its dispatcher when that is another node on the bus (then
        the task is ``foreign`` here: its client is attached there). The sender runs in ``nursery``."""
        bus, me = self.runtime.services.bus, self.runtime.services.owner
        if bus is None or task.dispatcher in (None, me):
            return
        try:
            alive = await bus.node_alive(str(task.dispatcher))
        except RoostError as exc:
            log.warning("task %s: cannot tell whether its dispatcher is on the bus: %s", task.id, exc)
            alive = False
        if alive:
            task.relay = TaskRelay(self.listener, bus, str(task.dispatcher), task.id)
            task.foreign = True
            nursery.start_soon(task.relay.run)

    def _relay_due(self, task: QueuedTask) -> bool:
        """Whether a task this process dispatched, seen finished in the store, still waits for its
        relayed events (for at most :data:`RELAY_GRACE_S` s: then the row's result is told)."""
        if self.runtime.services.bus is None or task.dispatcher != self.runtime.services.owner:
            return False
        now = trio.current_time()
        if task.finished_seen is None:
            task.finished_seen = now
        return now - task.finished_seen < RELAY_GRACE_S

    def _end_relay(self, task: QueuedTask) -> None:
        if task.relay is not None:
            task.relay.close()
            task.relay = None

    async def _on_interrupt(self, message: Any) -> dict:
        """``{task_id, client_id}`` from another node: ``{interrupted}`` (False when the task does
        not run here, or is not that client's)."""
        data = message.body.get("data") or {}
        task = self.tasks.get(str(data.get("task_id")))
        if task is None or task.id not in self._local or task.client_id != data.get("client_id"):
            return {"interrupted": False}
        return {"interrupted": self._interrupt_task(task)}

    async def interrupt_everywhere(self, client_id: str) -> int:
        """Interrupt the client's running tasks, on this node (:meth:`TaskQueue.interrupt`) and on
        the nodes of the bus that run the others; return how many were asked to stop.

        A node that does not take the request in time, or an owner not on the bus, is skipped
        (logged): that task is not counted.
        """
        count = self.interrupt(client_id)
        bus = self.runtime.services.bus
        elsewhere = [
            t.id
            for t in self.tasks.values()
            if self._owns(t, client_id) and t.id not in self._local and t.status in ("queued", "running")
        ]
        if bus is None or not elsewhere:
            return count
        for task_id, owner in (await self._owners(elsewhere)).items():
            count += await self._ask_interrupt(owner, task_id, client_id)
        return count

    async def interrupt_task(self, task: QueuedTask) -> bool:
        """Ask one task to stop wherever it runs: on this node as :meth:`TaskQueue.interrupt`
        does, else on the node of the bus holding its ``task:<id>`` lease (``task.interrupt``,
        the path of :meth:`interrupt_everywhere`). ``task`` may be one this node never knew
        (read back from the store: another node dispatched it).

        Returns:
            Whether it was asked to stop. False: it is not running (queued, finished, or claimed
            and not started yet: ask again), its owner is not on the bus, or it did not take the
            request (logged).
        """
        if task.id in self._local:
            local = self.tasks.get(task.id)
            return local is not None and self._interrupt_task(local)
        if self.runtime.services.bus is None:
            return False
        owner = (await self._owners([task.id])).get(task.id)
        return owner is not None and await self._ask_interrupt(owner, task.id, task.client_id)

    async def _ask_interrupt(self, owner: str, task_id: str, client_id: str | None) -> bool:
        """Ask node ``owner`` to interrupt its task ``task_id`` of ``client_id``; whether it did."""
        bus = self.runtime.services.bus
        try:
            if not await bus.node_alive(owner):
                return False
            reply = await bus.request(owner, "task.interrupt", {"task_id": task_id, "client_id": client_id})
        except (NodeUnreachable, RoostError) as exc:
            log.warning("task %s: interrupt not taken by %s (%s)", task_id, owner, exc)
            return False
        return bool(isinstance(reply, dict) and reply.get("interrupted"))

    async def withdraw(self, task_id: str, reason: str) -> QueuedTask | None:
        """Cancel a task that is still queued, at once: it never runs, and ends as an interrupted
        one does (``succeeded: false``, ``errorMessage`` ``reason``, the listener's
        ``task_finished``: its client's ``result``, the daemon's metrics and outcomes).

        Safe against claims, here and on every node on the database: the store decides
        (:func:`roost.storage.withdraw_daemon_task`), so a task a runner claimed meanwhile is
        not withdrawn (interrupt it instead).

        A task this node does not know (another node dispatched it) is withdrawn in the store
        alone: the node that dispatched it follows its row and tells its own listener.

        Returns:
            The finished task, or None when it is not queued (unknown, claimed, running,
            finished) or the store could not be written (logged).
        """
        known = self.tasks.get(task_id)
        task = known if known is not None else await self.lookup(task_id)
        if task is None or task.status != "queued":
            return None
        result = task_result(False, reason)
        try:
            won = await self.runtime.store.writer.submit(
                withdraw_daemon_task, task_id, {**task.payload(), "result": result}
            )
        except RoostError as exc:
            log.warning("task %s could not be withdrawn: %s", task_id, exc)
            return None
        if not won:
            return None
        task.status, task.result, task.interrupted = "finished", result, True
        with contextlib.suppress(ValueError):
            self._queued.remove(task_id)
        if known is None:
            log.info("task %s of another node withdrawn before it started: %s", task_id, reason)
            return task
        log.info(
            "task %s withdrawn before it started: %s",
            task_id,
            reason,
            extra={"event": "task_withdrawn", "task_id": task_id, "source": task.source},
        )
        self.listener.task_finished(task)
        return task

    async def _owners(self, task_ids: list[str]) -> dict[str, str]:
        """``task_id -> owner`` of those tasks whose lease another owner holds live now: one query
        for all of them (:func:`roost.storage.leases.held_elsewhere_many`; on PostgreSQL expiry
        is judged by the database's clock, not this host's)."""
        store, me = self.runtime.store, self.runtime.services.owner
        keys = {task_lease_key(i): i for i in task_ids}

        def read() -> dict[str, str]:
            with store.read() as conn:
                held = leases.held_elsewhere_many(conn, list(keys), me)
            return {keys[key]: str(row["owner"]) for key, row in held.items()}

        try:
            return await trio.to_thread.run_sync(read)
        except RoostError as exc:
            log.warning("could not read the leases of tasks running elsewhere: %s", exc)
            return {}

    async def _listen_for_tasks(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Wake this node's idle runners when another node makes a task claimable (PostgreSQL's
        ``NOTIFY roost_tasks``, :func:`roost.storage.task_wake_listener`), until cancelled.

        Started once listening (or once that failed): a task dispatched after the queue started
        wakes an idle runner at once. Without a listener (SQLite) it returns at once. A failing
        connection is logged and opened again after at most :data:`WAKE_RETRY_S` seconds; the
        runners poll meanwhile (a lost notification delays a task by at most ``poll_s``).
        """
        store, owner = self.runtime.store, self.runtime.services.owner
        announced = False
        while True:
            listener, error = None, None
            try:
                listener = await trio.to_thread.run_sync(task_wake_listener, store, owner)
            except RoostError as exc:
                error = exc
            if not announced:
                announced = True
                task_status.started()
            if listener is None and error is None:
                return  # SQLite: the runners poll
            if listener is not None:
                try:
                    while True:
                        if await trio.to_thread.run_sync(listener.wait, WAKE_WAIT_S, abandon_on_cancel=True):
                            self._notify_one()
                except RoostError as exc:
                    error = exc
                finally:
                    listener.close()
            log.warning("task queue: not woken by other nodes (%s); polling every %g s", error, self.poll_s)
            await trio.sleep(min(self.poll_s, WAKE_RETRY_S))

    async def _claim(self) -> tuple[QueuedTask, Any] | None:
        """Claim a task for this node (:func:`roost.storage.claim_daemon_task`), or None.

        A store failure is logged and answers None (the runner looks again after ``poll_s``).
        """
        services = self.runtime.services
        try:
            claimed = await self.runtime.store.writer.submit(
                claim_daemon_task, services.owner, services.lease_ttl, node=self.node
            )
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
        task.take_claim(row)
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
        may be attached to this node); one collected elsewhere (its client took the result on
        another node) is forgotten, so it is never told twice.
        """
        store = self.runtime.store
        while True:
            await trio.sleep(self.poll_s)
            pending = [
                i
                for i, t in self.tasks.items()
                if i not in self._local and t.status in ("queued", "running", "finished")
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
        if row.status == "running":
            task.take_claim(row)  # which node runs it (roost status: runsOn)
        if row.status == "running" and task.status == "queued":
            task.status = "running"
            with contextlib.suppress(ValueError):
                self._queued.remove(row.id)
        elif row.status == "finished" and task.status in ("queued", "running"):
            if self._relay_due(task):
                return  # its relayed events and result (in order) are due first
            task.status, task.result = "finished", (row.payload or {}).get("result")
            with contextlib.suppress(ValueError):
                self._queued.remove(row.id)
            self.listener.task_finished(task)
        elif row.status == "collected":
            self.tasks.pop(row.id, None)
            with contextlib.suppress(ValueError):
                self._queued.remove(row.id)

    async def adopt_client(self, client_id: str) -> None:
        """Know the store's unfinished and uncollected tasks of ``client_id`` (before its ``hello``).

        A client that reconnects to another node of the cluster finds its tasks there: those
        still queued or running are followed from here (their result is told here when they
        finish, :meth:`_follow`), those finished while it was away are its ``pendingResults``.
        A task this node knows that finished elsewhere takes its stored result; one collected
        elsewhere is forgotten (its result is never told twice). Nothing is told to a listener.
        A store failure is logged: the node's memory answers alone.
        """
        store = self.runtime.store
        known = [i for i, t in self.tasks.items() if t.client_id == client_id]

        def read() -> list[Any]:
            with store.read() as conn:
                rows = [
                    row
                    for status in ("queued", "running", "finished")
                    for row in list_daemon_tasks(conn, status=status)
                    if (row.payload or {}).get("clientId") == client_id
                ]
                seen = {row.id for row in rows}
                rows += [row for i in known if i not in seen and (row := get_daemon_task(conn, i)) is not None]
                return rows

        try:
            rows = await trio.to_thread.run_sync(read)
        except RoostError as exc:
            log.warning("could not read the tasks of client %s: %s", client_id, exc)
            return
        for row in rows:
            if row.id in self._local:
                continue
            task = self.tasks.get(row.id)
            if row.status == "collected":
                self.tasks.pop(row.id, None)
            elif task is None:
                self.tasks[row.id] = self._known(row)
                if row.status == "queued":
                    self._queued.append(row.id)
            elif row.status == "finished" and task.status in ("queued", "running"):
                # finished elsewhere (a known task's other changes are this node's, or followed)
                task.status, task.result = "finished", (row.payload or {}).get("result")
                with contextlib.suppress(ValueError):
                    self._queued.remove(row.id)
