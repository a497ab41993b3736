"""A daemon task as the task queue keeps it, and what the queue tells and uses around it
(split from :mod:`roost.actors._taskqueue`)."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import attrs

from roost._json import loads

__all__ = [
    "QueuedTask",
    "TaskListener",
    "Orchestrations",
    "TaskSink",
    "task_result",
    "mark_complete",
    "resume_prompt",
]

log = logging.getLogger("roost.serve")


@attrs.define(eq=False)
class QueuedTask:
    """One daemon task (``id`` is also its ``sessionId``, and its thread's id unless ``thread_id``)."""

    id: str
    task: str
    #: the thread the task continues (an A2A context's: the id of the context's first task);
    #: None: a thread of its own, whose id is ``id``
    thread_id: str | None = None
    config: str | None = None
    work_dir: str | None = None
    client_id: str | None = None  # the owning client's scoped key (opaque), or None
    source: str = "client"
    provider: str | None = None  # the task's own model settings (a schedule's), else the queue's
    model: str | None = None
    status: str = "queued"
    #: the node that dispatched it (:func:`roost._paths.node_name`); None: written before clusters
    node: str | None = None
    #: dispatched by another node of the cluster (its client is attached there, not here)
    foreign: bool = False
    #: the bus node id (lease owner id) of the process that dispatched it; None: no bus
    dispatcher: str | None = None
    #: the lease owner id of the process that ran it (last), recorded with its result
    ran_on: str | None = None
    #: the lease owner id and node name of its last claim (:func:`roost.storage.claim_daemon_task`)
    claimed_by: str | None = None
    claimed_node: str | None = None
    #: a resumed task: ``{owner, node, reason}`` of the claim before (see ``previous_claim``)
    resumed_from: dict | None = None
    #: on the running node: the :class:`~roost.actors._taskqueue_relay.TaskRelay` to its dispatcher
    relay: Any = None
    #: on the dispatching node: its events arrive relayed from the node running it
    relayed: bool = False
    #: on the dispatching node: when (trio clock) its row was first seen finished elsewhere
    finished_seen: float | None = None
    resumed: bool = False
    result: dict | None = None
    turn_id: str | None = None
    actor: Any = None
    orchestrator: Any = None  # the running Orchestrator of an orchestrated task
    interrupt_pending: bool = False  # interrupted before its Orchestrator existed
    interrupted: bool = False  # it ended interrupted (a client, an operator or a shutdown stopped it)

    @property
    def thread(self) -> str:
        """The id of the thread the task runs on."""
        return self.thread_id or self.id

    @property
    def orchestrated(self) -> bool:
        """True when the task runs an orchestration config (many agents), not one agent's turn."""
        return bool(self.config)

    @classmethod
    def from_row(cls, row: Any) -> QueuedTask:
        """The task of a ``daemon_tasks`` row (:class:`roost.model.DaemonTask`), as stored."""
        payload = row.payload or {}
        return cls(
            id=row.id,
            task=payload.get("task") or "",
            thread_id=payload.get("threadId"),
            config=payload.get("config"),
            work_dir=payload.get("workDir"),
            client_id=payload.get("clientId"),
            source=payload.get("source") or "client",
            status=row.status,
            result=payload.get("result"),
            provider=payload.get("provider"),
            model=payload.get("model"),
            node=payload.get("node"),
            dispatcher=payload.get("dispatcher"),
            ran_on=payload.get("ranOn"),
            claimed_by=payload.get("claimedBy"),
            claimed_node=payload.get("claimedNode"),
            resumed_from=payload.get("resumedFrom"),
        )

    def take_claim(self, row: Any) -> None:
        """Adopt the claim recorded in ``row`` (its ``claimedBy``, ``claimedNode``, ``resumedFrom``)."""
        claimed = QueuedTask.from_row(row)
        self.claimed_by, self.claimed_node, self.resumed_from = (
            claimed.claimed_by,
            claimed.claimed_node,
            claimed.resumed_from,
        )

    def payload(self) -> dict:
        return {
            "task": self.task,
            "threadId": self.thread_id,
            "config": self.config,
            "workDir": self.work_dir,
            "clientId": self.client_id,
            "source": self.source,
            "result": self.result,
            "provider": self.provider,
            "model": self.model,
            "node": self.node,
            "dispatcher": self.dispatcher,
            "ranOn": self.ran_on,
            "claimedBy": self.claimed_by,
            "claimedNode": self.claimed_node,
            "resumedFrom": self.resumed_from,
        }


class TaskListener(Protocol):
    """What the queue tells its front door (all but ``request_approval`` must not block)."""

    def task_started(self, task: QueuedTask) -> None: ...

    def task_notification(self, task: QueuedTask, method: str, params: dict) -> None: ...

    def task_event(self, task: QueuedTask, event: dict) -> None:
        """An orchestrated task's run event (``agent_starting``, ``tool_calling``,
        ``token_budget_warning``, ``agent_message``; camelCase dicts of the Orchestrator)."""

    async def request_approval(self, task: QueuedTask, params: dict) -> bool | None: ...

    async def ask_question(self, task: QueuedTask, params: dict) -> str | None:
        """The task's ``ask_user`` question (``params``: see ``Origin.ask_question``), asked of
        its client like an approval; None: skipped, or nobody answered (optional: a listener
        without it gives tasks no way to ask)."""

    def task_finished(self, task: QueuedTask) -> None: ...


class TaskSink:
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


class Orchestrations(Protocol):
    """What the task queue uses of ``roost.orchestration`` (the daemon passes that package in: the
    actors room sits below it and never imports it, DESIGN section 3)."""

    Orchestrator: Any

    def load_config_file(self, path: str) -> Any:
        """Load and validate an orchestration config; raises ``ConfigInvalid``."""
        ...


def task_result(
    succeeded: bool, error: str | None, last_agent: str | None = None, last_message: str | None = None
) -> dict:
    """A task result: ``{succeeded, errorMessage, lastAgent, lastMessage}`` (wire-protocol ``result``)."""
    return {"succeeded": succeeded, "errorMessage": error, "lastAgent": last_agent, "lastMessage": last_message}


#: What a previous claimer did, by ``resumedFrom.reason`` (:func:`roost.storage.previous_claim`).
_STOPPED_HOW = {
    "stopped": "stopped",
    "died": "died (its process is gone)",
    "lease_lost": "lost its lease (it did not renew it in time: it died, hung or lost the database)",
}
_CONTINUE = "Continue it from where you left off and finish it.\n\nThe task: {task}"


def resume_prompt(task: QueuedTask) -> str:
    """The prompt of the turn that resumes ``task`` on the node that claimed it, saying what happened.

    From the claims recorded on the task (``resumed_from``: who ran it before and why it stopped;
    ``claimed_by``/``claimed_node``: who resumes it): another node (``Node N1 (process P1) died
    ...; node N2 (process P2) resumes it``), another process of the same node (a restarted or
    another worker's daemon), the same process (its task queue restarted), or, for a task claimed
    before claims were recorded, the plain fact that the daemon running it stopped. Every text
    contains ``while you were working on``. Pure.
    """
    me, node = task.claimed_by or "?", task.claimed_node or "?"
    previous = task.resumed_from or {}
    before, before_node = previous.get("owner"), previous.get("node")
    how = _STOPPED_HOW.get(str(previous.get("reason")), "stopped")
    end = _CONTINUE.format(task=task.task)
    if not before:
        return (
            f"The daemon that ran this task stopped while you were working on it; "
            f"node {node} (process {me}) resumes it. {end}"
        )
    if before == me:
        return (
            f"The task queue of this daemon (node {node}, process {me}) restarted "
            f"while you were working on this task. {end}"
        )
    if before_node == node:
        return (
            f"Process {before} of this daemon (node {node}) {how} while you were working on this task; "
            f"process {me} of the same node resumes it. {end}"
        )
    return (
        f"Node {before_node or 'unknown'} (process {before}) {how} while you were working on this task; "
        f"node {node} (process {me}) resumes it. {end}"
    )


def mark_complete(conn: Any, thread_id: str) -> None:
    """Set ``metadata["is_complete"]`` on a task's thread (write; a missing thread is skipped)."""
    from roost.errors import NotFound
    from roost.storage import get_thread, update_thread

    try:
        thread = get_thread(conn, thread_id)
    except NotFound:
        return
    update_thread(conn, thread_id, metadata={**(thread.metadata or {}), "is_complete": True})
