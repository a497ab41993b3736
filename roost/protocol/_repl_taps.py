"""Following a chat's subagents in ``roost repl --vscode``: a worker's tool calls are sent as
``tool_call`` with ``agent`` set to its name (wire-protocol.md, "Live sessions"; they are not
counted in the chat's ``message_end.toolCalls``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from roost._json import loads
from roost.protocol._repl_events import ChatTranslator

if TYPE_CHECKING:
    from roost.protocol._repl import ReplSession

__all__ = ["WorkerTaps"]


class WorkerTaps:
    """The subagent threads one chat follows (a component of :class:`ReplSession`)."""

    def __init__(self, session: ReplSession) -> None:
        self.session = session
        self._taps: dict[str, _WorkerTap] = {}  # worker thread id -> its tap

    def announce(self, item_id: Any) -> None:
        """Send a worker's pending ``tool_call`` of ``item_id`` (before its ``approval_request``)."""
        for tap in self._taps.values():
            tap.announce(item_id)

    def clear(self) -> None:
        """Stop following every subagent (the chat is ending)."""
        registry = self.session.registry
        for thread_id, tap in list(self._taps.items()):
            if registry is not None:
                registry.remove_subscriber(thread_id, tap)
        self._taps.clear()

    def follow(self, agent: dict) -> None:
        """Follow (or, once it ended, stop following) the worker of an ``agent/updated`` ``agent``.

        Called synchronously from the root hub's ``agent/updated``, which a new worker's tree emits
        before the worker's turn starts, so no call of it is missed. The tap joins the registry's
        shared subscriber list of the worker thread (it outlives restarts of that actor).
        """
        session = self.session
        registry = session.registry
        thread_id = agent.get("thread_id")
        if registry is None or not isinstance(thread_id, str):
            return
        tap = self._taps.get(thread_id)
        if agent.get("status") in ("completed", "failed", "interrupted", "cancelled"):
            if tap is not None:
                registry.remove_subscriber(thread_id, tap)
            self._taps.pop(thread_id, None)
        elif tap is None:
            # The call that spawned the worker (the chat's, or its parent worker's) is running:
            # announce it before the worker's own calls.
            parent = next((t for t in self._taps.values() if t.worker_id == agent.get("parent_id")), None)
            if parent is not None:
                parent.announce_running()
            else:
                for event in session.translator.announce_running():
                    session.emit(event)
            tap = self._taps[thread_id] = _WorkerTap(session, str(agent.get("name") or "agent"), agent.get("id"))
            registry.add_subscriber(thread_id, tap)


class _WorkerTap:
    """A subscriber of one subagent's thread: its tool calls become ``tool_call {.., agent}``."""

    def __init__(self, session: ReplSession, name: str, worker_id: Any) -> None:
        self.session = session
        self.name = name
        self.worker_id = worker_id
        self.translator = ChatTranslator(cwd=session.actor.facts().cwd)

    def _emit(self, events: list[dict]) -> None:
        for event in events:
            if event["type"] == "tool_call":
                self.session.emit({**event, "agent": self.name})

    def deliver(self, line: bytes) -> None:
        message = loads(line)
        method = message.get("method") or ""
        if method in ("item/started", "item/completed", "item/toolCall/delta", "item/toolCall/outputDelta"):
            self._emit(self.translator.translate(method, message.get("params") or {}))

    def announce(self, item_id: Any) -> None:
        self._emit(self.translator.announce_tool_call(item_id))

    def announce_running(self) -> None:
        self._emit(self.translator.announce_running())
