"""A daemon task's events relayed from the node that runs it to the node that dispatched it
(issue 13, "its progress reaches every client ... its approval goes to its dispatcher"; issue 19,
``roost serve --workers``).

A task dispatched on node A records A's bus node id (``QueuedTask.dispatcher``, the lease owner id
of A's process). When node B claims it and A is on the bus (:class:`roost.actors.NodeBus`), B runs
it with a :class:`TaskRelay` as the task's listener: each call is made on B's own listener (B's
clients see the task as before) and also queued for A. A sender task posts the queue in batches,
in order, as ``task.events`` messages (``{task_id, events}``); deltas of one item that follow
each other are coalesced into one (``item/agentMessage/delta``, ``item/toolCall/delta``), so the
bus carries one row per :data:`COALESCE_S` seconds of streaming, not one per token; a batch holds at
most :data:`BATCH_CHARS` characters of text. The task's end, and a full batch, are posted at once:
the runner waits for its relay to drain before it claims its next task, so a final batch that
waited out the window held every task at least :data:`COALESCE_S` seconds (issue 19: a worker of
``roost serve --workers`` ran at most ``max_concurrent / COALESCE_S`` tasks a second).
Only what the daemon events are made of is relayed
(wire-protocol.md "Daemon events": ``turn/started``, tool-call items, tool deltas, the first output
delta of a tool call, ``turn/usage``, the orchestrator's run events, the start and the result).

A's :class:`RelayInbox` hands them to A's listener with A's own record of the task, so A's
clients get the daemon events exactly as if the task ran on A (its translator renders them), the
``result`` included. The task's approvals are ``task.approval`` requests to A, answered by A's
client under A's rules (its reconnect grace); the unattended policy decides on B only when A is
not on the bus or does not take the request (:class:`roost.errors.NodeUnreachable`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import trio

from roost.errors import NodeUnreachable, RoostError

__all__ = ["TaskRelay", "RelayInbox", "COALESCE_S", "BATCH_CHARS"]

log = logging.getLogger("roost.serve")

#: Seconds the sender waits after the first queued event for more to coalesce into one message.
COALESCE_S = 0.05
#: Most characters of text (deltas, run events) one ``task.events`` message carries.
BATCH_CHARS = 64_000
#: Notifications whose consecutive deltas of one item are merged into one.
_DELTAS = frozenset({"item/agentMessage/delta", "item/toolCall/delta"})
#: Notifications relayed (what :class:`roost.protocol._serve_events.TaskEventTranslator` renders).
_RELAYED = frozenset({"turn/started", "item/started", "item/completed", "item/toolCall/outputDelta", "turn/usage"})


def _trimmed(method: str, params: dict, announced: set) -> dict | None:
    """The params relayed for notification ``method`` (None: not relayed)."""
    if method in _DELTAS:
        return {"item_id": params.get("item_id"), "delta": params.get("delta") or ""}
    if method not in _RELAYED:
        return None
    if method in ("item/started", "item/completed"):
        item = params.get("item") or {}
        if item.get("type") != "tool_call":
            return None
        keep = ("id", "type", "name", "arguments")
        return {"item": {k: item.get(k) for k in keep if k in item}}
    if method == "item/toolCall/outputDelta":
        if params.get("item_id") in announced:
            return None  # only the first one announces the call; the output itself is not an event
        announced.add(params.get("item_id"))
        return {"item_id": params.get("item_id")}
    return params


class TaskRelay:
    """The listener of one task that runs here for a client of node ``node`` (see the module doc).

    Args:
        local: this node's listener (its clients); every call is made on it too.
        bus: this node's :class:`~roost.actors.NodeBus`.
        node: the dispatching node's bus id.
        task_id: the task.
    """

    def __init__(self, local: Any, bus: Any, node: str, task_id: str) -> None:
        self.local, self.bus, self.node, self.task_id = local, bus, node, task_id
        self._buf: list[dict] = []
        self._chars = 0
        self._more = trio.Event()
        #: set when the batch being coalesced must go now (the relay closed, or a full batch)
        self._due = trio.Event()
        self._sent = trio.Event()
        self._closed = False
        self._inflight = False
        self._announced: set = set()
        self.messages = 0

    # -- the listener ---------------------------------------------------------------------------

    def task_started(self, task: Any) -> None:
        self.local.task_started(task)
        self._push({"k": "started", "resumed": bool(task.resumed)})

    def task_notification(self, task: Any, method: str, params: dict) -> None:
        self.local.task_notification(task, method, params)
        relayed = _trimmed(method, params, self._announced)
        if relayed is None:
            return
        last = self._buf[-1] if self._buf else None
        if (
            method in _DELTAS
            and last is not None
            and last.get("m") == method
            and last["p"].get("item_id") == relayed["item_id"]
        ):
            last["p"]["delta"] += relayed["delta"]
            self._grow(len(relayed["delta"]))
            return
        self._push({"k": "n", "m": method, "p": relayed}, len(relayed.get("delta") or ""))

    def task_event(self, task: Any, event: dict) -> None:
        self.local.task_event(task, event)
        self._push({"k": "e", "e": event}, len(str((event.get("message") or {}).get("content") or "")))

    async def request_approval(self, task: Any, params: dict) -> bool | None:
        """Ask the dispatching node's client (after the events before it reached that node); the
        local listener (the unattended policy) when that node cannot be asked."""
        await self.flushed()
        try:
            reply = await self.bus.request(self.node, "task.approval", {"task_id": task.id, "params": params})
        except (NodeUnreachable, RoostError) as exc:
            log.warning("task %s: its dispatcher %s cannot answer the approval (%s)", task.id, self.node, exc)
            return await self.local.request_approval(task, params)
        approved = reply.get("approved") if isinstance(reply, dict) else None
        return approved if isinstance(approved, bool) else None

    def task_finished(self, task: Any) -> None:
        self.local.task_finished(task)
        self._push({"k": "finished", "result": task.result})
        self.close()

    # -- sending --------------------------------------------------------------------------------

    def close(self) -> None:
        """No more events: the sender posts what is queued and ends."""
        self._closed = True
        self._more.set()
        self._due.set()

    def _push(self, entry: dict, chars: int = 0) -> None:
        self._buf.append(entry)
        self._grow(chars)

    def _grow(self, chars: int) -> None:
        self._chars += chars
        self._more.set()
        if self._chars >= BATCH_CHARS:
            self._due.set()

    async def flushed(self) -> None:
        """Until every queued event is posted (or the relay is closed and drained)."""
        while self._buf or self._inflight:
            await self._sent.wait()

    async def run(self) -> None:
        """Post the queued events in order, one message per batch, until closed and drained.

        A store failure is logged; that batch is lost for the dispatcher (it still gets the
        result from the task's row, :meth:`roost.actors._taskqueue_shared.SharedQueue._follow`).
        """
        while True:
            await self._more.wait()
            self._more = trio.Event()
            if not self._due.is_set():  # coalesce, but a close or a full batch cuts it short
                with trio.move_on_after(COALESCE_S):
                    await self._due.wait()
            if not self._closed:
                self._due = trio.Event()
            batch, self._buf, self._chars = self._buf, [], 0
            self._inflight = bool(batch)
            if batch:
                try:
                    await self.bus.send(self.node, "task.events", {"task_id": self.task_id, "events": batch})
                    self.messages += 1
                except RoostError as exc:
                    log.warning(
                        "task %s: could not relay %d events to %s: %s", self.task_id, len(batch), self.node, exc
                    )
            self._inflight = False
            self._sent.set()
            self._sent = trio.Event()
            if self._closed and not self._buf:
                return


class RelayInbox:
    """The dispatching node's end: relayed events and approvals of its tasks running elsewhere.

    Args:
        queue: this node's :class:`roost.actors._taskqueue.TaskQueue` (``tasks``, ``listener``).
    """

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def install(self, bus: Any) -> None:
        bus.on("task.events", self._on_events, inline=True)
        bus.on("task.approval", self._on_approval)

    def _on_events(self, message: Any) -> None:
        """Apply relayed events to the task, in order, through this node's listener."""
        data = message.body.get("data") or {}
        task = self.queue.tasks.get(str(data.get("task_id")))
        if task is None:
            return  # collected, or dispatched by an earlier process of this node
        for entry in data.get("events") or ():
            try:
                self._apply(task, entry)
            except Exception:
                log.exception("task %s: could not render a relayed event", task.id)

    def _apply(self, task: Any, entry: dict) -> None:
        listener, kind = self.queue.listener, entry.get("k")
        if kind == "started":
            task.status, task.relayed = "running", True
            task.resumed = bool(entry.get("resumed"))
            with contextlib.suppress(ValueError):
                self.queue._queued.remove(task.id)
            listener.task_started(task)
        elif kind == "n":
            listener.task_notification(task, str(entry.get("m")), entry.get("p") or {})
        elif kind == "e":
            listener.task_event(task, entry.get("e") or {})
        elif kind == "finished" and task.status in ("queued", "running"):
            task.status, task.result = "finished", entry.get("result")
            listener.task_finished(task)

    async def _on_approval(self, message: Any) -> dict:
        """``{task_id, params}``: ``{approved}`` from this node's client (None: nobody answered)."""
        data = message.body.get("data") or {}
        task = self.queue.tasks.get(str(data.get("task_id")))
        if task is None or task.status not in ("queued", "running"):
            return {"approved": None}
        return {"approved": await self.queue.listener.request_approval(task, data.get("params") or {})}
