"""``roost serve --a2a``: the daemon side of hosted A2A agents (calls as daemon tasks).

wire-protocol.md, "Daemon events" (``a2a_call {agent, sessionId}``: an A2A caller started a call to
a hosted agent) and the appendix ("A2A (``serve --a2a``)"). The A2A SDK side (agent cards, the
JSON-RPC methods) is :mod:`roost.protocol._a2a_app`; this module has no SDK import, so a daemon
pays for the SDK only on its first A2A request.

Every A2A ``message/send`` / ``message/stream`` is one task of the daemon's
:class:`~roost.actors.TaskQueue` (``source: "a2a"``): queued, leased, persisted with its result,
resumed after a daemon restart, its approvals answered by the unattended policy (the caller is not
an attached client: the task's client key is an anonymous one, ``<token scope>/conn-a2a-<n>``, so
nobody is asked and its result is marked collected at once). The A2A task id is the task's
``sessionId``; the context id its thread's (:meth:`A2AHost._context`). A repeated ``messageId``
of one token scope answers the task it started (:meth:`A2AHost.call`); ``tasks/cancel``
interrupts the task wherever in the cluster it runs (:meth:`A2AHost.cancel`).

:class:`A2AHost` sits in front of the daemon as the queue's :class:`~roost.actors.TaskListener`:
it forwards every call to the daemon unchanged (a method it does not define, such as
``ask_question``, is delegated by ``__getattr__``, so a listener method added later reaches the
daemon too) and wakes the A2A requests waiting on a task
(``message/send`` blocking, ``message/stream``, ``tasks/cancel``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import re
from collections.abc import Iterator
from typing import Any

import attrs
import trio

from roost.errors import InvalidParams, RoostError

__all__ = ["A2AHost", "HostedAgent", "install_a2a", "TERMINAL"]

log = logging.getLogger("roost.serve")

#: Queue statuses after which a task never changes again.
TERMINAL = ("finished", "collected")
#: Seconds between store reads while waiting on a task whose wake-up may have been missed
#: (a task finished by a previous daemon, or before this request started waiting).
_RECHECK = 2.0
#: Most seconds between two attempts of ``tasks/cancel`` to interrupt a task not started yet.
_RETRY_S = 0.5
#: A2A calls whose agent name (``metadata.agent``), cancel request and ``messageId`` are remembered.
_CALLS_KEPT = 1000
_calls = itertools.count(1)
#: An A2A context id a caller may give (it becomes a task and thread id).
_CONTEXT_ID = re.compile(r"[A-Za-z0-9_-]{1,100}")
#: The error message of an A2A call's task cancelled while it was still queued.
_WITHDRAWN = "cancelled by the A2A caller (tasks/cancel) before it started"


@attrs.frozen
class HostedAgent:
    """One agent the daemon hosts: ``name`` (the URL segment of ``/a2a/<name>/``) and ``description``."""

    name: str
    description: str


@attrs.define(eq=False)
class _Call:
    """An A2A call's daemon task as this daemon saw it."""

    agent: str | None
    client_key: str
    changed: trio.Event = attrs.field(factory=trio.Event)
    cancel_requested: bool = False
    interrupted: bool = False
    #: the reply text streamed so far (``item/agentMessage/delta``), kept while someone follows
    chunks: list[str] = attrs.field(factory=list)
    followers: int = 0

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


class A2AHost:
    """The hosted agents, the A2A calls in flight, and the queue listener in front of the daemon.

    Args:
        daemon: the :class:`~roost.protocol.ServeDaemon` (its queue, options, ``broadcast``).
        agents: the hosted agents, the default (served at the root well-known path) first.
    """

    def __init__(self, daemon: Any, agents: list[HostedAgent]) -> None:
        self.daemon = daemon
        self.queue = daemon.queue
        self.agents = agents
        self.calls: dict[str, _Call] = {}
        #: ``(token scope, messageId) -> sessionId`` of the latest calls (an Event: being sent)
        self.sent: dict[tuple[str, str], str | trio.Event] = {}
        self.inner = daemon.queue.listener
        self.queue.listener = self
        self._app: Any = None

    def asgi_app(self) -> Any:
        """The A2A endpoint's ASGI app (:func:`roost.protocol._a2a_app.build_a2a_app`), built on
        the first A2A request (importing the SDK takes a while); :mod:`roost.protocol._serve_http`
        routes every ``/a2a/`` and ``/.well-known/agent*`` request of the port to it."""
        if self._app is None:
            from roost.protocol._a2a_app import build_a2a_app

            self._app = build_a2a_app(self.daemon)
        return self._app

    # -- TaskListener (forwarded to the daemon) ------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        """Any listener method this host does not define (``ask_question``, ...) is the daemon's
        listener's own (AttributeError when that has none either: the queue then asks nobody)."""
        if name == "inner":  # not set yet (during __init__): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def task_started(self, task: Any) -> None:
        self.inner.task_started(task)
        self._progress(task)

    def task_notification(self, task: Any, method: str, params: dict) -> None:
        self.inner.task_notification(task, method, params)
        call = self.calls.get(task.id)
        if call is not None and call.followers and method == "item/agentMessage/delta" and params.get("delta"):
            call.chunks.append(params["delta"])
        self._progress(task)

    def task_event(self, task: Any, event: dict) -> None:
        self.inner.task_event(task, event)
        self._progress(task)

    def task_finished(self, task: Any) -> None:
        self.inner.task_finished(task)
        call = self.calls.get(task.id)
        if call is not None:
            call.notify()
        while len(self.calls) > _CALLS_KEPT:  # the oldest calls' agent names are forgotten
            self.calls.pop(next(iter(self.calls)))

    def _progress(self, task: Any) -> None:
        call = self.calls.get(task.id)
        if call is None:
            return
        if call.cancel_requested and not call.interrupted:
            call.interrupted = self.queue.interrupt(call.client_key) > 0
        call.notify()

    # -- A2A calls ----------------------------------------------------------------------------------

    def agent(self, name: str) -> HostedAgent | None:
        """The hosted agent called ``name`` (None: no such agent)."""
        return next((a for a in self.agents if a.name == name), None)

    async def call(
        self, agent: str, text: str, scope: str, context_id: str | None = None, message_id: str | None = None
    ) -> str:
        """Queue ``text`` as a daemon task for hosted ``agent`` and broadcast ``a2a_call``.

        Idempotent per message: a ``message_id`` this token scope sent before (one of the latest
        :data:`_CALLS_KEPT` calls of this daemon) answers the task it started, queuing nothing
        (A2A spec 0.3: ``messageId`` identifies the message; a client retrying a send it got no
        answer to must not start the work twice). Two sends of one id at once start one task.

        Args:
            agent: the hosted agent's name.
            text: the caller's message text (non-empty).
            scope: the caller's token scope (:class:`~roost.protocol._serve_auth.Grant`).
            context_id: the message's ``contextId`` (see :meth:`_context`); None: a new context.
            message_id: the message's ``messageId``; None: not idempotent.

        Returns:
            The task's ``sessionId`` (the A2A task id).

        Raises:
            InvalidParams: ``context_id`` cannot be used (see :meth:`_context`).
            ServerOverloaded: the queue is full.
            RoostError: the task could not be queued (nothing was).
        """
        if message_id is None:
            return await self._dispatch(agent, text, scope, context_id)
        key = (scope, message_id)
        while isinstance(sent := self.sent.get(key), trio.Event):
            await sent.wait()  # the same message, being sent now
        if isinstance(sent, str):
            log.info("A2A message %s sent again: task %s", message_id, sent, extra={"task_id": sent})
            return sent
        pending = self.sent[key] = trio.Event()
        try:
            session_id = await self._dispatch(agent, text, scope, context_id)
            self.sent[key] = session_id
            while len(self.sent) > _CALLS_KEPT:
                self.sent.pop(next(iter(self.sent)))
            return session_id
        finally:
            if self.sent.get(key) is pending:  # not queued: the next send of it tries again
                del self.sent[key]
            pending.set()

    async def _dispatch(self, agent: str, text: str, scope: str, context_id: str | None) -> str:
        key = f"{scope}/conn-a2a-{next(_calls)}"
        task_id, thread_id = await self._context(context_id, scope)
        session_id: str = await self.queue.dispatch(
            text, client_id=key, source="a2a", task_id=task_id, thread_id=thread_id
        )
        self.calls.setdefault(session_id, _Call(agent=agent, client_key=key))
        log.info("A2A call to %s: task %s", agent, session_id, extra={"event": "a2a_call", "task_id": session_id})
        self.daemon.broadcast({"type": "a2a_call", "agent": agent, "sessionId": session_id})
        return session_id

    async def _context(self, context_id: str | None, scope: str) -> tuple[str | None, str | None]:
        """``(task_id, thread_id)`` for :meth:`TaskQueue.dispatch` of a message with ``context_id``.

        An A2A context is a Roost thread, whose id is the context id and the id of the context's
        first task (A2A spec 0.3, "Life of a task": the same ``contextId`` continues the previous
        interaction). No context id: a new context (a new task on its own thread, its id the
        context id the answer carries). A context of the same token scope: the task continues
        its thread (the model sees the earlier messages). An unknown context id starts a context
        of that id, as the official SDK's request handler does with a client-chosen
        ``contextId`` (its first task gets that id).

        Raises:
            InvalidParams: ``context_id`` is not 1-100 of ``A-Z a-z 0-9 _ -``; it names a task
                that is not the first of an A2A context of this token scope; or the context's
                previous task has not ended yet (its messages run one after another).
        """
        if context_id is None:
            return None, None
        if not _CONTEXT_ID.fullmatch(context_id):
            raise InvalidParams("contextId must be 1-100 of A-Z a-z 0-9 _ - (an id this agent gave, or a new one)")
        first = await self.queue.lookup(context_id)
        if first is None:
            return context_id, None
        if first.source != "a2a" or first.thread_id is not None or not (first.client_id or "").startswith(f"{scope}/"):
            raise InvalidParams(f"contextId {context_id!r} is not a context of this caller")
        busy = [t.id for t in self.queue.tasks.values() if t.thread == context_id and t.status in ("queued", "running")]
        if busy:
            raise InvalidParams(
                f"the previous task {busy[0]} of context {context_id!r} has not ended: "
                "wait for it (or cancel it) before sending the next message"
            )
        return None, context_id

    @contextlib.contextmanager
    def following(self, session_id: str) -> Iterator[list[str]]:
        """Follow a call's streamed reply text: yields its live list of text chunks (empty for a
        task this daemon did not start); the chunks are dropped when the last follower leaves."""
        call = self.calls.get(session_id)
        if call is None:
            yield []
            return
        call.followers += 1
        try:
            yield call.chunks
        finally:
            call.followers -= 1
            if not call.followers:
                call.chunks = []

    def agent_of(self, session_id: str) -> str | None:
        """The hosted agent a call addressed (None after a daemon restart or for an old call)."""
        call = self.calls.get(session_id)
        return call.agent if call is not None else None

    async def lookup(self, session_id: str) -> Any:
        """The A2A call's task (a :class:`~roost.actors.QueuedTask`), or None when ``session_id``
        names no task or a task that no A2A call started."""
        task = await self.queue.lookup(session_id)
        if task is None or task.source != "a2a":
            return None
        return task

    async def wait_change(self, session_id: str, seen: str | None) -> Any:
        """Wait until the task's status differs from ``seen`` (or it progresses); return it (None:
        gone). Returns at once when the task already is in another status than ``seen``."""
        while True:
            task = await self.lookup(session_id)
            if task is None or task.status != seen or task.status in TERMINAL:
                return task
            call = self.calls.get(session_id)
            with trio.move_on_after(_RECHECK):
                if call is not None:
                    await call.changed.wait()
                    return await self.lookup(session_id)
                await trio.sleep_forever()

    async def wait_finished(self, session_id: str, *, limit: float | None = None) -> Any:
        """The task once it finished (or as it is after ``limit`` seconds; None: no such task)."""
        with trio.move_on_after(limit if limit is not None else float("inf")):
            while True:
                task = await self.lookup(session_id)
                if task is None or task.status in TERMINAL:
                    return task
                await self.wait_change(session_id, task.status)
        return await self.lookup(session_id)

    async def cancel(self, task: Any, *, limit: float) -> None:
        """Ask the call's task to stop: a queued task is withdrawn at once (it never runs and
        ends ``canceled``, told to the daemon's listener as any finished task); a running turn
        (or run) is interrupted where it runs, on this node or on the node of the cluster that
        claimed it (over the node bus, as an attached client's ``interrupt``:
        :meth:`TaskQueue.interrupt_task`). A task claimed but not started yet is asked again as
        it progresses (every :data:`_RETRY_S` s at most), for at most ``limit`` seconds; on this
        node also later, as soon as it shows progress."""
        task_id = task.id
        call = self.calls.get(task_id)
        if call is None:  # a task of a previous daemon (or of another node)
            call = self.calls[task_id] = _Call(agent=None, client_key=task.client_id or "")
        call.cancel_requested = True
        how = f"{task.status}: not interrupted within {limit:g} s"
        with trio.move_on_after(limit):
            while True:
                if task.status == "queued" and await self.queue.withdraw(task_id, _WITHDRAWN) is not None:
                    how = "withdrawn before it started"
                    break
                if call.interrupted or await self._interrupt(task):
                    call.interrupted, how = True, "interrupted"
                    break
                changed = call.changed
                with trio.move_on_after(_RETRY_S):
                    await changed.wait()
                task = await self.lookup(task_id)
                if task is None or task.status in TERMINAL:
                    how = "it ended before it could be interrupted"
                    break
        log.info("A2A cancel of task %s (%s)", task_id, how, extra={"event": "a2a_cancel", "task_id": task_id})

    async def _interrupt(self, task: Any) -> bool:
        try:
            return bool(await self.queue.interrupt_task(task))
        except RoostError:
            log.debug("could not interrupt A2A task %s yet", task.id, exc_info=True)
            return False

    def was_cancelled(self, session_id: str) -> bool:
        """True when this daemon was asked to cancel the task."""
        call = self.calls.get(session_id)
        return call is not None and call.cancel_requested


def a2a_unhostable(name: str) -> str | None:
    """Why ``roost serve --a2a`` cannot host an agent named ``name``, or None when it can.

    A hosted agent's name is one path segment of ``/a2a/<name>/`` (RFC 3986, section 3.3; other
    characters are percent-encoded in the cards' ``url``): a ``/`` would split it, and a ``{``
    would read as a route parameter of the HTTP router.
    """
    if "/" in name or "{" in name:
        return "its name cannot be one URL segment of /a2a/<name>/ (it holds '/' or '{')"
    return None


def install_a2a(daemon: Any) -> A2AHost:
    """Host the daemon's agents over A2A (``roost serve --a2a``); returns the host, also set as
    ``daemon.a2a`` (which :mod:`roost.protocol._serve_http` routes ``/a2a/`` and
    ``/.well-known/agent*.json`` to).

    The hosted agents: with a ``-c`` orchestration config, its agents (a call to any of them is a
    task of the daemon's team: the config's selection decides who speaks first); without one, the
    daemon's single agent (``assistant``). A name is one URL segment (``/a2a/<name>/``, spaces
    percent-encoded in the cards' ``url``); an agent whose name holds ``/`` or ``{`` is not hosted
    (a warning is logged).

    Raises:
        ConfigError: the ``-c`` config cannot be loaded.
    """
    import roost.orchestration

    config_path = daemon.options.config
    if config_path:
        config = roost.orchestration.load_config_file(config_path)
        team = config.name or "team"
        agents = [
            HostedAgent(a.name, a.description or f"{a.name}, an agent of the Roost team {team}") for a in config.agents
        ]
    else:
        agents = [HostedAgent(daemon.options.agent_name, "A Roost agent: one turn on the daemon's model per task")]
    for agent in [a for a in agents if a2a_unhostable(a.name)]:
        log.warning("agent %r is not hosted over A2A: %s", agent.name, a2a_unhostable(agent.name))
        agents.remove(agent)
    host = A2AHost(daemon, agents)
    daemon.a2a = host
    return host
