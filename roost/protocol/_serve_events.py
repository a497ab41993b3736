"""Translate a task's app-server notifications into the wire protocol's daemon events (pure).

wire-protocol.md, "Daemon events (serve socket)" and "Run events": a serve task's turn emits
app-server-shaped notifications (``turn/started``, ``item/started``, ``item/agentMessage/delta``,
``item/completed``, ``turn/usage``, ``turn/completed`` ...); clients of ``roost serve`` see camelCase
daemon events instead:

================================  ==================================================================
notification                      daemon event(s)
================================  ==================================================================
``turn/started``                  ``agent_starting`` {agent, sessionId}
``item/agentMessage/delta``       ``token`` {sessionId, agent, text} (additive: the spec allows new
                                  event types; clients ignore ones they do not know)
tool call running or completed    ``tool_calling`` {agent, tool, argsSummary, sessionId}, once per
                                  tool call, as soon as its arguments are known
``turn/usage``                    ``token_budget_warning`` {agent, inputTokens, warnThreshold} once
                                  per task, when a warn threshold is configured and input tokens
                                  reach it
================================  ==================================================================

Everything else is dropped. The translator keeps a little state per task (which tool calls were
announced), so there is one :class:`TaskEventTranslator` per task.

An *orchestrated* task (one run with an orchestration config, many agents taking turns) also has
the :class:`~roost.orchestration._run.Orchestrator`'s run events, fed to :meth:`TaskEventTranslator.run_event`:
its ``agent_starting`` names the agent of the next turn (so ``turn/started`` sends nothing then,
and later ``token``/``tool_calling`` events carry that agent), its ``token_budget_warning`` (from
the config's ``token_budget`` termination) replaces the translator's own warning, and its
``tool_calling`` (the thread's notifications already give it) and ``agent_message`` (not a daemon
event) are dropped. Each daemon event therefore goes out exactly once per occurrence.
"""

from __future__ import annotations

from typing import Any

from roost._json import JSONDecodeError, dumps, loads

__all__ = ["TaskEventTranslator", "args_summary", "approval_event", "result_event", "auto_dispatched_event"]

#: Characters of a tool call's arguments shown in ``argsSummary``.
ARGS_SUMMARY_CHARS = 120


def args_summary(arguments: Any) -> str:
    """A one-line summary of tool arguments, at most 120 characters (wire-protocol.md ``argsSummary``)."""
    if arguments is None:
        return ""
    if isinstance(arguments, dict) and len(arguments) == 1:
        (value,) = arguments.values()
        text = value if isinstance(value, str) else dumps(value).decode()
    else:
        text = arguments if isinstance(arguments, str) else dumps(arguments).decode()
    text = " ".join(str(text).split())
    return text if len(text) <= ARGS_SUMMARY_CHARS else text[: ARGS_SUMMARY_CHARS - 1] + "\u2026"


class TaskEventTranslator:
    """Turns one task's notifications into daemon events (dicts with ``type``).

    Args:
        session_id: the task's ``sessionId``.
        agent: the agent name shown in ``agent`` fields.
        warn_threshold: input tokens at which ``token_budget_warning`` is sent once (None: never).
            For a single turn, the turn's input tokens; for an orchestrated task, the run's input
            tokens so far (the sum of its agent messages' ``inputTokens``). The daemon passes None
            for an orchestrated task whose config has a ``token_budget`` (that budget warns instead).
        orchestrated: the task runs an orchestration: ``agent_starting`` and the token budget
            warning come from :meth:`run_event`, not from the thread's notifications.
    """

    def __init__(
        self, session_id: str, agent: str, *, warn_threshold: int | None = None, orchestrated: bool = False
    ) -> None:
        self.session_id = session_id
        self.agent = agent
        self.orchestrated = orchestrated
        self.warn_threshold = warn_threshold
        self._warned = False
        self._run_input_tokens = 0
        self._calls: dict[str | None, dict] = {}  # item id -> {"name", "args": [str], "announced"}

    def translate(self, method: str, params: dict) -> list[dict]:
        """Return the daemon events for one notification (often none)."""
        if method == "item/agentMessage/delta":
            delta = params.get("delta") or ""
            return (
                [{"type": "token", "sessionId": self.session_id, "agent": self.agent, "text": delta}] if delta else []
            )
        if method == "turn/started":
            if self.orchestrated:  # the orchestrator's own agent_starting came just before
                return []
            return [{"type": "agent_starting", "agent": self.agent, "sessionId": self.session_id}]
        if method == "item/started":
            item = params.get("item") or {}
            if item.get("type") == "tool_call":
                self._calls[item.get("id")] = {"name": item.get("name"), "args": [], "announced": False}
            return []
        if method == "item/toolCall/delta":
            call = self._calls.get(params.get("item_id"))
            if call is not None:
                call["args"].append(params.get("delta") or "")
            return []
        if method == "item/toolCall/outputDelta":
            return self.announce(params.get("item_id"))
        if method == "item/completed":
            item = params.get("item") or {}
            if item.get("type") == "tool_call":
                events = self.announce(item.get("id"), item.get("arguments"), name=item.get("name"))
                self._calls.pop(item.get("id"), None)
                return events
            return []
        if method == "turn/usage" and self.warn_threshold is not None and not self._warned and not self.orchestrated:
            tokens = int((params.get("usage") or {}).get("input_tokens") or 0)
            if tokens >= self.warn_threshold:
                self._warned = True
                return [
                    {
                        "type": "token_budget_warning",
                        "agent": self.agent,
                        "inputTokens": tokens,
                        "warnThreshold": self.warn_threshold,
                        "sessionId": self.session_id,
                    }
                ]
        return []

    def run_event(self, event: dict) -> list[dict]:
        """Return the daemon events for one orchestrator run event (see the module doc).

        Args:
            event: ``{"type": "agent_starting", "agent"}``, ``{"type": "token_budget_warning",
                "agent", "inputTokens", "warnThreshold"}``, ``{"type": "tool_calling", ...}`` or
                ``{"type": "agent_message", "message", "elapsedMs"}``.

        Returns:
            ``[agent_starting {agent, sessionId}]`` (and the agent becomes the current one),
            ``[token_budget_warning {agent, inputTokens, warnThreshold, sessionId}]``,
            ``[mcp_status {server, state, error, sessionId}]``, or ``[]`` for the others.
        """
        kind = event.get("type")
        if kind == "agent_starting":
            self.agent = str(event.get("agent") or self.agent)
            return [{"type": "agent_starting", "agent": self.agent, "sessionId": self.session_id}]
        if kind == "agent_message":
            tokens = (event.get("message") or {}).get("inputTokens")
            self._run_input_tokens += int(tokens or 0)
            if self.warn_threshold is not None and not self._warned and self._run_input_tokens >= self.warn_threshold:
                self._warned = True
                return [
                    {
                        "type": "token_budget_warning",
                        "agent": self.agent,
                        "inputTokens": self._run_input_tokens,
                        "warnThreshold": self.warn_threshold,
                        "sessionId": self.session_id,
                    }
                ]
            return []
        if kind == "mcp_status":  # a server the task's run started for itself changed state
            fields = {k: event.get(k) for k in ("server", "state", "error")}
            return [{"type": "mcp_status", **fields, "sessionId": self.session_id}]
        if kind == "token_budget_warning":
            if self._warned:
                return []
            self._warned = True
            return [
                {
                    "type": "token_budget_warning",
                    "agent": event.get("agent") or self.agent,
                    "inputTokens": event.get("inputTokens"),
                    "warnThreshold": event.get("warnThreshold"),
                    "sessionId": self.session_id,
                }
            ]
        return []

    def announce(self, item_id: Any, arguments: Any = None, *, name: str | None = None) -> list[dict]:
        """The ``tool_calling`` event for tool call ``item_id`` if not yet announced, else ``[]``.

        Called when the call starts running (output, an approval) or completes; ``arguments``
        overrides the streamed argument text. Nothing is sent without an item id or while the
        tool's name is unknown (a ``tool_calling`` always names its tool): the call stays
        unannounced until a later notification names it.
        """
        if item_id is None:
            return []
        call = self._calls.get(item_id)
        if call is None:
            call = self._calls[item_id] = {"name": name, "args": [], "announced": False}
        call["name"] = call["name"] or name
        if call["announced"] or not call["name"]:
            return []
        call["announced"] = True
        if arguments is None and call["args"]:
            raw = "".join(call["args"])
            try:
                arguments = loads(raw)
            except (JSONDecodeError, ValueError):
                arguments = raw
        return [
            {
                "type": "tool_calling",
                "agent": self.agent,
                "tool": call["name"],
                "argsSummary": args_summary(arguments),
                "sessionId": self.session_id,
            }
        ]


def approval_event(session_id: str, params: dict) -> dict:
    """The ``approval_request`` event for a tool's approval ``params`` (wire-protocol.md, "Prompts").

    ``params`` is ``{thread_id, turn_id, item_id, kind, ...fields}``; the kind's fields are kept
    verbatim (``command``; ``plugin, action, detail``; ``plugin, action, path, oldContent,
    newContent``) and ``sessionId`` is added.
    """
    fields = {k: v for k, v in params.items() if k not in ("thread_id", "turn_id", "item_id")}
    return {"type": "approval_request", **fields, "sessionId": session_id}


def result_event(
    *,
    session_id: str,
    task: str,
    succeeded: bool,
    error_message: str | None,
    last_agent: str | None,
    last_message: str | None,
) -> dict:
    """The ``result`` event (wire-protocol.md, "Daemon events"): nullable fields present as null."""
    return {
        "type": "result",
        "sessionId": session_id,
        "task": task,
        "succeeded": succeeded,
        "errorMessage": error_message,
        "lastAgent": last_agent,
        "lastMessage": last_message,
    }


def auto_dispatched_event(*, session_id: str, objective_id: str, task: str) -> dict:
    """The ``auto_dispatched`` event (wire-protocol.md, "Daemon events"): ``roost serve
    --auto-objective`` started ``task`` of ``objective_id`` on its own as task ``session_id``."""
    return {"type": "auto_dispatched", "sessionId": session_id, "objectiveId": objective_id, "task": task}
