"""Running an orchestration: agents take turns on one conversation thread of kind ``orchestration``.

A run is a thread of kind ``orchestration`` (``roost sessions`` lists it; its metadata holds
``task``, ``config_path``, ``is_complete``, the run's progress and its ``RemoteAgent`` proxies'
remote context ids, ``remote_contexts``, so ``--resume`` continues it).
Each agent is an :class:`~roost.orchestration._agents.AgentActor` under the run's supervisor
(:func:`~roost.orchestration._agents.run_supervisor`); the :class:`Orchestrator` asks the chosen
agent to ``Speak`` and the agent takes a turn of the run's thread with its own instructions, tools,
model and tool-round limit. The first turn's input is the task (agent ``Human``); each later turn
continues the conversation without new input, or with a correction from ``Orchestrator`` (a user
message whose ``source_id`` is ``roost:orchestrator``) or a human's message (``--hitl``). The turn
loop shows an agent the earlier agents' messages as input (``roost.actors._turn._agent_view``).

Events (wire-protocol.md, "Run events (run bridge)") go to ``emit`` as camelCase dicts:
``agent_starting``, ``tool_calling``, ``token_budget_warning``, ``agent_message``; the caller sends
``ready`` and ``result``. Approvals (the tools' ``shell_command``/``file_write``/``tool_action`` and
keyword selection's ``route_approval``) go to ``request_approval(params) -> bool | None``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from roost._json import dumps, loads
from roost.orchestration._agents import Speak, agent_child_id, model_options, resolve_agents, run_supervisor
from roost.orchestration._config import AgentSpec, OrchestrationConfig
from roost.orchestration._policy import (
    WARN_FRACTION,
    Progress,
    first_agent,
    keyword_handoff,
    next_sequential,
    terminated,
    token_budget,
)

__all__ = ["Orchestrator", "RunOutcome", "ORCHESTRATOR_SOURCE", "HUMAN_SOURCE", "STOP", "args_summary"]

log = logging.getLogger("roost.orchestration")

#: The ``source_id`` of an injected correction (``roost:`` marks input from Roost itself).
ORCHESTRATOR_SOURCE = "roost:orchestrator"
#: The ``source_id`` of a human's message typed between agent turns (``--hitl``).
HUMAN_SOURCE = "human"
#: What an ``after_turn`` hook returns to stop the run (resumable, like an interrupt).
STOP = object()
_ARGS_SUMMARY_CHARS = 120
_SELECTOR_SYSTEM = (
    "You choose which agent of a team speaks next. Reply with exactly one agent name from the list, and nothing else."
)


def args_summary(arguments: Any) -> str:
    """A one-line summary of tool arguments (the single value, else compact JSON), <= 120 chars."""
    if isinstance(arguments, dict) and len(arguments) == 1:
        (value,) = arguments.values()
        text = value if isinstance(value, str) else dumps(value).decode()
    else:
        text = dumps(arguments if arguments is not None else {}).decode()
    text = " ".join(text.split())
    return text if len(text) <= _ARGS_SUMMARY_CHARS else text[: _ARGS_SUMMARY_CHARS - 1] + "…"


@attrs.define(kw_only=True)
class RunOutcome:
    """How a run ended: ``status`` ``completed``, ``failed`` or ``interrupted``."""

    status: str
    error_message: str | None = None
    reason: str | None = None


#: Notifications the run does not translate (hub lines start with ``{"method":"<method>"``).
_IGNORED = tuple(
    b'{"method":"%s"' % m for m in (b"item/agentMessage/delta", b"item/reasoning/delta", b"turn/usage", b"turn/event")
)


class _TurnWatch:
    """A thread subscriber translating one run's notifications into run events, synchronously.

    Translation happens in :meth:`deliver` (called by the thread's hub as each notification is
    emitted), so a tool's ``tool_calling`` is always out before that tool's ``approval_request``.
    """

    def __init__(self, emit: Callable[[dict], None]) -> None:
        self.emit = emit
        self.agent: str | None = None
        self.turn_id: str | None = None
        self.calls: dict[str, dict] = {}  # item id -> {name, args, announced}
        self.ended: dict[str, dict] = {}  # turn id -> the terminal turn view (with items)
        self.changed = trio.Event()

    def announce(self, item_id: str | None) -> None:
        """Emit ``tool_calling`` for tool-call item ``item_id`` once (no-op if unknown/done)."""
        call = self.calls.get(item_id or "")
        if call is None or call["announced"]:
            return
        call["announced"] = True
        try:
            arguments = call["arguments"] if call["arguments"] is not None else loads("".join(call["deltas"]) or "{}")
        except ValueError:
            arguments = "".join(call["deltas"])
        self.emit(
            {"type": "tool_calling", "agent": self.agent, "tool": call["name"], "argsSummary": args_summary(arguments)}
        )

    def deliver(self, line: bytes) -> None:
        if line.startswith(_IGNORED):  # the hot path: a streamed delta is not decoded here
            return
        message = loads(line)
        method, params = message.get("method"), message.get("params") or {}
        item = params.get("item") or {}
        if method == "item/started" and item.get("type") == "tool_call":
            self.calls[item["id"]] = {"name": item.get("name"), "arguments": None, "deltas": [], "announced": False}
        elif method == "item/toolCall/delta":
            call = self.calls.get(str(params.get("item_id")))
            if call is not None:
                call["deltas"].append(params.get("delta") or "")
        elif method == "item/toolCall/outputDelta":
            self.announce(params.get("item_id"))
        elif method == "item/completed" and item.get("type") == "tool_call":
            call = self.calls.get(item["id"])
            if call is not None:
                call["arguments"] = item.get("arguments")
            self.announce(item["id"])
        elif method in ("turn/completed", "turn/error"):
            turn = params.get("turn") or {}
            self.ended[str(turn.get("id"))] = turn
            self.changed.set()
            self.changed = trio.Event()


class Orchestrator:
    """Drives one orchestration run on an open runtime.

    Args:
        config: the loaded config.
        actor: the run's ThreadActor (a thread of kind ``orchestration``).
        engines: the :class:`roost.protocol._engines.EngineCatalog` (agents' and the selector's
            models; the thread's engine for agents without a ``Model``).
        emit: sends one run event (a camelCase dict); must not block.
        request_approval: ``await request_approval(params) -> bool | None`` with ``params`` =
            ``{kind, ...fields}``; None means nobody can be asked (denied).
        after_turn: ``--hitl``: ``await after_turn(agent, text)`` after each agent turn that does
            not end the run, returning None (go on), a message from the human for the next agent
            (str), or :data:`STOP` (end the run as interrupted; ``--resume`` continues it).
        ask_question: ``await ask_question(params) -> str | None``: the agents' ``ask_user``
            questions (see ``roost.actors.Origin``); None: agents cannot ask.
        tool_groups: more ``Plugins`` groups (an MCP server's name -> its tools' names): the
            MCP servers the caller runs (their tools are the process's).
        mcp_servers: the MCP servers the run starts for itself (default: each of the config's
            ``McpServers`` whose name is not a group of ``tool_groups``); see :meth:`_own_servers`.

    Raises:
        ConfigError: an agent's model cannot be used (see
            :func:`~roost.orchestration._agents.resolve_agents`).
    """

    def __init__(
        self,
        config: OrchestrationConfig,
        actor: Any,
        *,
        engines: Any,
        emit: Callable[[dict], None],
        request_approval: Any,
        after_turn: Any = None,
        ask_question: Any = None,
        tool_groups: Mapping[str, tuple[str, ...]] | None = None,
        mcp_servers: Sequence[Any] | None = None,
    ) -> None:
        self.config = config
        self.actor = actor
        self.engines = engines
        self.emit = emit
        self.request_approval = request_approval
        self.after_turn = after_turn
        self.ask_question = ask_question
        self.agents: dict[str, AgentSpec] = {a.name: a for a in config.agents}
        meta = actor.thread.metadata or {}
        saved_contexts = meta.get("remote_contexts")
        #: the run's remote A2A context ids (``RemoteAgent`` proxy name -> ``contextId``), saved
        #: with the progress (thread metadata ``remote_contexts``) and kept by a follow-up run
        self.remote_contexts: dict[str, str] = (
            {str(k): str(v) for k, v in saved_contexts.items()} if isinstance(saved_contexts, dict) else {}
        )
        self.agent_turns = resolve_agents(config, engines, tool_groups, self.remote_contexts)
        self.tool_groups = dict(tool_groups or {})
        if mcp_servers is None:
            mcp_servers = [s for s in config.mcp_servers if s.name not in self.tool_groups]
        self.mcp_servers = list(mcp_servers)
        self.supervisor: Any = None
        #: how the run ended (set when :meth:`run` returns)
        self.outcome: RunOutcome | None = None
        saved = meta.get("orchestration")
        if not isinstance(saved, dict):
            saved = {}
        fields = {a.name for a in attrs.fields(Progress)}
        self.progress = Progress(**{k: v for k, v in saved.items() if k in fields})
        self.watch = _TurnWatch(emit)
        self.active_turn: str | None = None
        self.scope = trio.CancelScope()
        self.interrupted: str | None = None
        self.starting = False
        #: the run is a follow-up on a thread with earlier runs (see :meth:`run`)
        self.follow_up = False

    # -- control ------------------------------------------------------------------------------

    def interrupt(self, reason: str = "interrupted") -> None:
        """Stop the run: interrupt the running agent turn (it persists as interrupted), or cancel
        whatever the run waits on. Idempotent; not a checkpoint."""
        from roost.actors import InterruptTurn
        from roost.errors import RoostError

        if self.interrupted is not None:
            return
        self.interrupted = reason
        if self.starting:
            return  # the turn being admitted is interrupted as soon as its id is known
        if self.active_turn is not None:
            try:
                self.actor.ref.tell(InterruptTurn(turn_id=self.active_turn, reason=reason))
                return
            except RoostError:
                log.debug("could not interrupt the agent's turn", exc_info=True)
        self.scope.cancel()

    async def tool_approval(self, params: dict) -> bool | None:
        """The Origin hook of agent turns: announce the tool call, then ask the client."""
        self.watch.announce(params.get("item_id"))
        return await self.request_approval(params)

    # -- the run ------------------------------------------------------------------------------

    async def run(self, task: str, *, follow_up: bool = False) -> RunOutcome:
        """Run agent turns until termination, failure or interruption.

        ``follow_up``: ``task`` is a new message on a thread that holds earlier runs (an A2A
        context continued): the run starts afresh (new progress, the first agent) and its first
        agent is given ``task`` after the whole earlier conversation.

        Returns:
            The outcome; the thread's metadata records the progress and ``is_complete``.

        Cancellation: :meth:`interrupt` ends the run as ``interrupted`` (the running turn is
        persisted as interrupted, and ``--resume`` continues with the same agent).
        """
        from roost.actors import Subscribe, Unsubscribe

        if follow_up:
            self.progress = Progress()
        self.follow_up = follow_up
        await self.actor.ref.ask(Subscribe(self.watch))
        outcome: RunOutcome | None = None
        try:
            with self.scope:
                async with self._own_servers(), trio.open_nursery() as nursery:
                    sup = run_supervisor(self.actor.thread.id, self.agent_turns, self.actor.ref)
                    self.supervisor = await nursery.start(sup.run)
                    outcome = await self._loop(task)
                    nursery.cancel_scope.cancel()  # stops the agent actors, in reverse order
            if self.scope.cancelled_caught or outcome is None:  # None: interrupted before _loop returned
                outcome = RunOutcome(status="interrupted", error_message=_interrupted(self.interrupted))
            self.outcome = outcome
            return outcome
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await self.actor.ref.ask(Unsubscribe(self.watch), timeout=5)

    @contextlib.asynccontextmanager
    async def _own_servers(self) -> AsyncIterator[None]:
        """Run the run's own MCP servers (:attr:`mcp_servers`, through the ``mcp`` plugin host)
        while the block runs: each agent gets their tools beside the process's
        (``AgentTurn.extra_tools``; a ``Plugins`` entry naming a server gives all its tools, as
        for the caller's servers), gated like any tool (``tool_action`` approvals of mutating
        ones). A server that fails to start does not stop the run: the agents go on without its
        tools (it is retried in the background); one that dies or hangs mid-run makes a call of
        its tools a clear tool error while it is reconnected. Each status change is the run
        event ``mcp_status {server, state, error}`` (state ``connecting``, ``connected`` or
        ``failed``; error null or why). Leaving stops every server (stdio ones are terminated).

        Cancellation: an interrupt while the servers start cancels their start (bounded by
        their connect timeouts otherwise).
        """
        if not self.mcp_servers:
            yield
            return
        from roost.plugins import open_mcp_host

        def status(change: dict) -> None:
            event = {"server": change.get("name"), "state": change.get("state"), "error": change.get("error")}
            self.emit({"type": "mcp_status", **event})

        async with open_mcp_host(self.mcp_servers, on_status=status) as host:
            tools: dict[str, Any] = {}
            host.attach(tools)  # kept current: a server that connects later adds its tools
            groups = {**self.tool_groups, **host.groups()}
            turns = resolve_agents(self.config, self.engines, groups, self.remote_contexts)
            self.agent_turns = {name: attrs.evolve(turn, extra_tools=tools) for name, turn in turns.items()}
            yield

    async def _latest_turn(self) -> str | None:
        """The id of the thread's latest turn (None: it has none)."""
        from roost.actors import Snapshot

        snapshot = await self.actor.ref.ask(Snapshot(history_turns=1))
        return snapshot["turns"][-1]["id"] if snapshot["turns"] else None

    async def _loop(self, task: str) -> RunOutcome:
        from roost.actors import Origin

        p = self.progress
        latest = None if self.follow_up else await self._latest_turn()  # a follow-up starts with the task
        if p.next_agent is None:
            p.next_agent = first_agent(self.config)
        origin = Origin(
            client_id="run",
            request_approval=self.tool_approval,
            unattended_policy="deny",
            ask_question=self.ask_question,
        )
        if p.selecting and p.last_agent is not None:  # interrupted while choosing: choose again
            outcome = await self._choose(p.last_agent, p.last_text)
            if outcome is not None:
                return outcome
        while True:
            if self.interrupted:
                return RunOutcome(status="interrupted", error_message=_interrupted(self.interrupted))
            agent = self.agents[p.next_agent]
            if latest is None:
                speak = Speak(prompt=task, origin=origin)
            elif p.human_input is not None:
                speak = Speak(prompt=p.human_input, client_id=HUMAN_SOURCE, origin=origin)
            elif p.correction is not None:
                speak = Speak(prompt=p.correction, client_id=ORCHESTRATOR_SOURCE, origin=origin)
                self._emit_message("Orchestrator", "user", p.correction, None, 0.0)
            else:
                speak = Speak(resume_after_turn_id=latest, origin=origin)
            self.watch.agent = agent.name
            self.emit({"type": "agent_starting", "agent": agent.name})
            began = trio.current_time()
            self.starting = True
            try:
                view = await self.supervisor.child_value(agent_child_id(agent.name)).ask(speak)
            finally:
                self.starting = False
            latest = self.active_turn = self.watch.turn_id = view["id"]
            if self.interrupted:  # asked while the turn was being admitted
                reason, self.interrupted = self.interrupted, None
                self.interrupt(reason=reason)
            while view["id"] not in self.watch.ended:
                await self.watch.changed.wait()
            turn = self.watch.ended[view["id"]]
            self.active_turn = None
            p.correction = p.human_input = None
            usage = turn.get("usage") or {}
            p.input_tokens += int(usage.get("input_tokens") or 0)
            p.output_tokens += int(usage.get("output_tokens") or 0)
            p.tokens = p.input_tokens + p.output_tokens
            text = self._emit_turn(agent.name, turn, trio.current_time() - began)
            if turn.get("status") != "completed":
                await self._save(complete=False)
                error = turn.get("error") or {}
                if turn.get("status") == "interrupted":
                    return RunOutcome(status="interrupted", error_message=error.get("message") or "interrupted")
                return RunOutcome(
                    status="failed", error_message=f"{agent.name}: {error.get('message') or 'the turn failed'}"
                )
            p.iterations += 1
            self._budget_warning(agent.name)
            reason = terminated(self.config.termination, p, agent.name, text)
            if reason is not None:
                await self._save(complete=True)
                return RunOutcome(status="completed", reason=reason)
            if self.after_turn is not None:
                p.selecting, p.last_agent, p.last_text = True, agent.name, text  # resumed: choose next
                await self._save(complete=False)
                answer = await self.after_turn(agent.name, text)
                if answer is STOP:
                    return RunOutcome(status="interrupted", error_message="stopped by the human (--hitl)")
                if isinstance(answer, str) and answer.strip():
                    p.human_input = answer.strip()
                    self._emit_message("Human", "user", p.human_input, None, 0.0)
            outcome = await self._choose(agent.name, text)
            if outcome is not None:
                return outcome

    # -- helpers ------------------------------------------------------------------------------

    async def _choose(self, speaker: str, text: str) -> RunOutcome | None:
        """Choose the next agent (saving first, so a resumed run chooses again); an outcome when
        sequential selection has run out of agents."""
        p = self.progress
        p.selecting, p.last_agent, p.last_text = True, speaker, text
        await self._save(complete=False)
        nxt = await self._select(speaker, text)
        p.selecting = False
        if nxt is None:
            await self._save(complete=True)
            return RunOutcome(status="completed", reason="every agent has spoken (sequential selection)")
        p.next_agent = nxt
        await self._save(complete=False)
        return None

    async def _select(self, speaker: str, text: str) -> str | None:
        kind = self.config.selection.type
        if kind == "sequential":
            return next_sequential(self.config, speaker, cycle=False)
        if kind == "roundrobin":
            return next_sequential(self.config, speaker, cycle=True)
        if kind == "llm":
            return await self._llm_select(speaker, text)
        handoff = keyword_handoff(self.config, speaker, text)
        self.progress.correction = handoff.correction
        route = handoff.route
        if route is not None and route.require_human_approval:
            approved = await self.request_approval(
                {"kind": "route_approval", "keyword": route.keyword, "sourceAgent": speaker, "targetAgent": route.agent}
            )
            if approved is not True:
                self.progress.correction = (
                    f"The handoff from {speaker} to {route.agent} was not approved by a "
                    f"human. {speaker}, continue without handing off to {route.agent}."
                )
                return speaker
        return handoff.agent

    async def _llm_select(self, speaker: str, text: str) -> str:
        """Ask the selector model (scripted: rules for agent ``selector``) who speaks next."""
        from roost.engines import EngineRequest, Retrying, TextDelta, Usage, UserMessage

        sel = self.config.selection
        roster = "\n".join(f"- {a.name}: {a.description or ''}".rstrip() for a in self.config.agents)
        prompt = (
            f"Task: {(self.actor.thread.metadata or {}).get('task', '')}\n\nAgents:\n{roster}\n\n"
            f"Last message from {speaker}:\n{text}\n\nWhich agent speaks next?"
        )
        request = EngineRequest(
            system=sel.prompt or _SELECTOR_SYSTEM, history=(UserMessage(text=prompt),), agent="selector"
        )
        parts: list[str] = []
        engine, model, max_tokens, temperature = model_options(self.config.resolve_model(sel), self.engines)
        if engine is None:
            engine = self.engines.engine_for(self.actor.thread)
        request = attrs.evolve(
            request, model=model or self.actor.thread.model, max_tokens=max_tokens, temperature=temperature
        )
        async with engine.stream(request) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    parts.append(event.text)
                elif isinstance(event, Retrying) and event.restart:  # sent again from its beginning
                    parts.clear()
                elif isinstance(event, Usage):
                    self.progress.input_tokens += event.input_tokens or 0
                    self.progress.output_tokens += event.output_tokens or 0
        self.progress.tokens = self.progress.input_tokens + self.progress.output_tokens
        answer = "".join(parts).strip()
        names = [a.name for a in self.config.agents]
        for name in names:
            if answer.lower().strip(" .'\"`*") == name.lower():
                return name
        hits = sorted((answer.lower().find(n.lower()), n) for n in names if n.lower() in answer.lower())
        if hits:
            return hits[0][1]
        log.warning("selector answered %r, not an agent name; %s speaks next", answer, first_agent(self.config))
        return first_agent(self.config)

    def _budget_warning(self, agent: str) -> None:
        budget = token_budget(self.config.termination)
        if budget is None or self.progress.warned:
            return
        threshold = int(budget * WARN_FRACTION)
        if self.progress.tokens >= threshold:
            self.progress.warned = True
            self.emit(
                {
                    "type": "token_budget_warning",
                    "agent": agent,
                    "inputTokens": self.progress.tokens,
                    "warnThreshold": threshold,
                }
            )

    def _emit_message(
        self,
        agent: str,
        role: str,
        content: str,
        turn: dict | None,
        elapsed: float,
        calls: list[dict[str, Any]] | None = None,
    ) -> None:
        """Send an ``agent_message`` run event; its ``message`` is the wire's AgentMessage
        (wire-protocol.md, camelCase; ``roost.protocol`` renders the same shape from its attrs type,
        and tests/test_orchestration_run.py checks the two agree)."""
        usage = (turn or {}).get("usage") or {}
        message = {
            "agentName": agent,
            "role": role,
            "content": content,
            "turnIndex": len(self.actor.turns) - (0 if turn is None else 1),
            "timestamp": (turn or {}).get("completed_at") or _now(),
            "inputTokens": usage.get("input_tokens") if turn else None,
            "outputTokens": usage.get("output_tokens") if turn else None,
            "isCompactionSummary": False,
            "toolCalls": calls or [],
        }
        self.emit({"type": "agent_message", "message": message, "elapsedMs": int(elapsed * 1000)})

    def _emit_turn(self, agent: str, turn: dict, elapsed: float) -> str:
        """Send the turn's ``agent_message``; return its text (the last agent message of the turn)."""
        items = turn.get("items") or []
        texts = [i.get("text") or "" for i in items if i.get("type") == "agent_message" and i.get("text")]
        calls = [
            {
                "name": str(i.get("name") or ""),
                "argsSummary": args_summary(i.get("arguments")),
                "succeeded": i.get("status") == "completed" and not i.get("is_error"),
            }
            for i in items
            if i.get("type") == "tool_call"
        ]
        text = texts[-1] if texts else ""
        if texts or calls or turn.get("status") == "completed":
            self._emit_message(agent, "assistant", text, turn, elapsed, calls)
        return text

    async def _save(self, *, complete: bool) -> None:
        from roost.actors import UpdateThread

        meta = dict(self.actor.thread.metadata or {})
        meta["orchestration"] = attrs.asdict(self.progress)
        meta["is_complete"] = complete
        if self.remote_contexts:
            meta["remote_contexts"] = dict(self.remote_contexts)
        with trio.CancelScope(shield=True):
            await self.actor.ref.ask(UpdateThread(changes={"metadata": meta}), timeout=30)


def _interrupted(reason: str | None) -> str:
    """The run's error message for an interrupt with ``reason`` (as a turn's would read)."""
    from roost.actors import STOP_MESSAGES as _STOP_MESSAGES

    if reason in _STOP_MESSAGES:
        return _STOP_MESSAGES[reason]
    if reason is not None and reason.startswith("interrupted"):
        return reason
    return f"interrupted ({reason})"


def _now() -> str:
    from roost.storage import utc_now

    return utc_now()
