"""The sampling loop of a turn (the body of a :class:`~roost.actors._turn.TurnActor`):
engine stream -> items -> tools -> approvals.

A turn runs inside its own cancel scope (interrupt = cancel that scope) and under the thread's
execution lease (losing the lease cancels the same scope). Its clean-up runs shielded and bounded:
partial items persist as ``interrupted``, every tool call gets a result, and exactly one terminal
event (turn/completed or turn/error) is emitted. Streamed text is checkpointed while it streams
(:mod:`roost.actors._checkpoint`).

The functions take the thread as a :class:`~roost.actors._turn.TurnHost` (its history, fan-out and
pending steers) and the turn; they never reach into the ThreadActor itself.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import trio

from roost import _trace
from roost._faults import fault_point
from roost.actors._actor import shielded_cleanup
from roost.actors._checkpoint import StreamCheckpoints
from roost.actors._fair import FairEvents
from roost.actors._stream_restart import replace_text, retract_item
from roost.actors._turn import STOP_MESSAGES, TurnActor, TurnHost
from roost.engines import (
    AgentMessage,
    EngineRequest,
    Reasoning,
    ReasoningDelta,
    ReasoningItems,
    Retrying,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolResult,
    ToolSchema,
    Usage,
)
from roost.errors import EngineFailure, RoostError, StaleLease
from roost.storage import new_id, tool_process_hook, utc_now
from roost.tools import ToolContext, run_tool

__all__ = ["run_turn", "turn_outcome"]

log = logging.getLogger("roost.turn")


def _tool_schemas(tools: dict[str, Any]) -> tuple[ToolSchema, ...]:
    return tuple(ToolSchema(name=t.name, description=t.description, parameters=t.parameters) for t in tools.values())


async def run_turn(turn: TurnActor, execution: Any) -> None:
    """Run ``turn`` of ``thread`` to its end; emits exactly one terminal event.

    Cancellation: cancelling ``turn.scope`` (interrupt) or losing the lease ends the turn as
    ``interrupted`` after a shielded, bounded clean-up; the Cancelled does not escape. Cancelled
    from outside (the actor stopping), the turn ends the same way and the Cancelled propagates.
    """
    thread: TurnHost = turn.host
    open_items: dict[str, dict] = {}  # item id -> view, streamed but not yet completed
    try:
        with turn_outcome(turn, execution), turn.scope:
            await _loop(thread, turn, open_items)
            # An interrupt acknowledged while the last (shielded) write ran still wins.
            await trio.lowlevel.checkpoint_if_cancelled()
            turn.status = "completed"
    finally:
        if turn.interrupt_reason is not None:
            _trace.hop("turn_unwound", turn.id)
        # Bounded, shielded clean-up; a root turn's includes freezing its worker tree.
        with shielded_cleanup(60.0):
            await _settle(thread, turn, open_items)


@contextlib.contextmanager
def turn_outcome(turn: TurnActor, execution: Any) -> Iterator[None]:
    """Record how a turn's body ended in ``turn.status`` / ``turn.error``.

    The body sets ``status = "completed"`` itself when it finishes. An engine failure or a
    :class:`RoostError` fails the turn (``failed``, with an error view); any other exception is a
    bug, logged, and fails the turn too: the thread lives on. A superseded lease
    (:class:`StaleLease`) or a cancellation leaves it ``interrupted``, naming who stopped it.
    Cancellation and other BaseExceptions propagate; the rest are absorbed.
    """
    try:
        yield
    except StaleLease:
        pass  # a write found the lease superseded (the scope is cancelled too): interrupted below
    except EngineFailure as failure:
        turn.status = "failed"
        turn.error = _failure_view(failure)
    except RoostError as exc:
        turn.status = "failed"
        turn.error = {"category": "internal", "message": str(exc)}
    except Exception as exc:  # a bug: the turn fails, the thread lives on
        log.exception("turn %s crashed", turn.id)
        turn.status = "failed"
        turn.error = {"category": "internal", "message": f"{type(exc).__name__}: {exc}"}
    finally:
        if turn.status == "running":
            turn.status = "interrupted"
            turn.error = _interruption(turn, execution)


async def _loop(thread: TurnHost, turn: TurnActor, open_items: dict[str, dict]) -> None:
    services = thread.services
    agent = turn.agent
    engine = agent.engine if agent is not None and agent.engine is not None else services.engine_for(thread.thread)
    offered = _tools(thread, turn)
    schemas = _tool_schemas({n: t for n, t in offered.items() if turn.tools is None or n in turn.tools})
    if services.worker_tools:
        tree: Any = thread.tree if thread.tree is not None else (None if thread.worker_id else "root")
        if tree == "root":
            from roost.actors._workers import agent_tool_schemas

            worker_schemas: tuple[ToolSchema, ...] = agent_tool_schemas(can_spawn=True)
        else:
            worker_schemas = tree.tool_schemas(thread) if tree is not None else ()
        schemas += tuple(s for s in worker_schemas if turn.tools is None or s.name in turn.tools)
    start = len(thread.history)  # an agent turn sees earlier turns' messages as input
    while True:
        await turn.admit_steers()
        if turn.model_calls >= services.max_model_calls:
            raise RoostError(f"turn stopped after {turn.model_calls} model calls")
        turn.model_calls += 1
        if agent is None:
            request = EngineRequest(
                system=services.system_prompt,
                history=tuple(thread.history),
                tools=schemas,
                model=thread.thread.model,
                effort=thread.thread.effort,
                agent=thread.agent_name,
            )
        else:
            request = _agent_request(thread, turn, schemas, start)
        calls = await _sample(thread, turn, engine, request, open_items)
        if not calls:
            if not thread.has_steers():
                return
            continue  # steered during this model response: the same turn takes the steer next
        # One response's calls go into history together, then each result as its tool ends.
        thread.history.extend(
            ToolCall(call_id=c["call_id"], name=c["name"], arguments=c["arguments"] or {}) for c in calls
        )
        out_of_rounds = not request.tools and bool(schemas)
        for call in calls:
            if out_of_rounds:  # asked for tools after its last round: answered, not run
                await _refuse_tool_call(
                    thread,
                    turn,
                    call,
                    open_items,
                    f"error: no tool rounds left (MaxToolRounds {agent.max_tool_rounds}); answer without tools",
                )
            else:
                await _run_tool_call(thread, turn, call, open_items)
        turn.tool_rounds += 1
        if out_of_rounds:
            return


def _agent_request(thread: TurnHost, turn: TurnActor, schemas: tuple, start: int) -> EngineRequest:
    """The model call of an orchestration agent's turn: its prompt, model options and view of the
    conversation; past its ``max_tool_rounds`` no tools are offered and a note says so."""
    from roost.engines import UserMessage

    agent = turn.agent
    history = _agent_view(thread.history, start)
    if agent.max_tool_rounds is not None and turn.tool_rounds >= agent.max_tool_rounds and schemas:
        schemas = ()
        history += (
            UserMessage(
                text=f"[Roost] You have used all {agent.max_tool_rounds} tool rounds of this "
                "turn. Answer now, without calling tools.",
                synthetic=True,
            ),
        )
    return EngineRequest(
        system=agent.system_prompt or thread.services.system_prompt,
        history=history,
        tools=schemas,
        model=agent.model or thread.thread.model,
        effort=thread.thread.effort,
        agent=agent.name,
        max_tokens=agent.max_tokens,
        temperature=agent.temperature,
    )


def _agent_view(history: list, start: int) -> tuple:
    """An orchestration agent's history: other turns' agent messages become input (user
    messages), their reasoning is dropped; the current turn (from ``start``) is unchanged."""
    from roost.engines import UserMessage

    earlier = []
    for item in history[:start]:
        if isinstance(item, AgentMessage):
            earlier.append(UserMessage(text=item.text))
        elif not isinstance(item, Reasoning):
            earlier.append(item)
    return tuple(earlier) + tuple(history[start:])


class _Response:
    """The items of one model response while it streams (see :func:`_sample`)."""

    def __init__(self, thread: TurnHost, turn: TurnActor, open_items: dict[str, dict]) -> None:
        self.thread, self.turn, self.open_items = thread, turn, open_items
        self.tid = thread.thread.id
        self.turn_id = turn.id
        self.emit = thread.emit
        self.message: dict | None = None
        self.reasoning: dict | None = None
        self.text_parts: list[str] = []
        self.reasoning_parts: list[str] = []
        self.calls: dict[str, dict] = {}
        self.ended: list[dict] = []
        #: agent message / reasoning items whose text a retry replaced (retracted if left empty)
        self.replaced: set[str] = set()
        self.checkpoints = StreamCheckpoints(turn.checkpoint_stream)

    def start_item(self, kind: str, **fields: Any) -> dict:
        turn = self.turn
        view = {
            "id": new_id("item"),
            "type": kind,
            "status": "in_progress",
            "turn_id": turn.id,
            "thread_id": self.tid,
            **fields,
        }
        self.open_items[view["id"]] = view
        self.thread.emit("item/started", {"thread_id": self.tid, "turn_id": turn.id, "item": view})
        return view

    def on_event(self, event: Any) -> None:
        """Handle one engine event: deltas to the client, items started, usage, retries."""
        cls = type(event)
        if cls is TextDelta and self.text_parts:  # the message streams on (most events)
            parts, message = self.text_parts, self.message
            assert message is not None
            parts.append(event.text)
            self.checkpoints.grew(message, parts, len(event.text))
            self.emit(
                "item/agentMessage/delta",
                {"thread_id": self.tid, "turn_id": self.turn_id, "item_id": message["id"], "delta": event.text},
            )
            return
        turn, tid, emit = self.turn, self.tid, self.emit
        if cls is TextDelta:
            if self.message is None:
                self.message = self.start_item(
                    "agent_message", text="", **({"agent": turn.agent.name} if turn.agent else {})
                )
                self.checkpoints.started(self.message)
            if not self.text_parts:  # the response's (or its retry's) first text
                turn.text_streaming = not self.calls
                self.checkpoints.flush(self.reasoning, self.reasoning_parts)
            self.text_parts.append(event.text)
            self.checkpoints.grew(self.message, self.text_parts, len(event.text))
            emit(
                "item/agentMessage/delta",
                {"thread_id": tid, "turn_id": turn.id, "item_id": self.message["id"], "delta": event.text},
            )
        elif cls is ReasoningDelta:
            if self.reasoning is None:
                self.reasoning = self.start_item("reasoning", text="")
                self.checkpoints.started(self.reasoning)
            self.reasoning_parts.append(event.text)
            self.checkpoints.grew(self.reasoning, self.reasoning_parts, len(event.text))
            emit(
                "item/reasoning/delta",
                {"thread_id": tid, "turn_id": turn.id, "item_id": self.reasoning["id"], "delta": event.text},
            )
        elif cls is ToolCallStart:
            turn.text_streaming = False  # a response that calls tools is not cut
            self.checkpoints.flush(self.message, self.text_parts)
            self.calls[event.call_id] = self.start_item(
                "tool_call", call_id=event.call_id, name=event.name, arguments=None, output=None
            )
        elif cls is ToolCallDelta:
            view = self.calls.get(event.call_id)
            if view is not None:
                emit(
                    "item/toolCall/delta",
                    {"thread_id": tid, "turn_id": turn.id, "item_id": view["id"], "delta": event.delta},
                )
        elif cls is ToolCallEnd:
            turn.text_streaming = False
            view = self.calls.get(event.call_id)
            if view is None:
                view = self.calls[event.call_id] = self.start_item(
                    "tool_call", call_id=event.call_id, name=event.name, arguments=None, output=None
                )
            view["arguments"] = event.arguments
            self.ended.append(view)
        else:
            self._on_rare(event)

    def _on_rare(self, event: Any) -> None:
        """The events a response has a few of: usage, the provider's reasoning blocks, retries."""
        cls, turn, tid, emit = type(event), self.turn, self.tid, self.emit
        if cls is Usage:
            for key in ("input_tokens", "output_tokens", "cached_tokens"):
                turn.usage[key] += getattr(event, key) or 0
            emit("turn/usage", {"thread_id": tid, "turn_id": turn.id, "usage": dict(turn.usage)})
        elif cls is ReasoningItems:
            # the provider's reasoning blocks, replayed unchanged (issue 14, case 4)
            if self.reasoning is None:
                self.reasoning = self.start_item("reasoning", text="")
            self.reasoning["replay"] = {"provider": event.provider, "items": list(event.items)}
        elif cls is Retrying:
            emit(
                "turn/event",
                {
                    "thread_id": tid,
                    "turn_id": turn.id,
                    "event": {
                        "type": "retrying",
                        "attempt": event.attempt,
                        "max_attempts": event.max_attempts,
                        "delay_s": event.delay_s,
                        "reason": event.reason,
                        "restart": event.restart,
                    },
                },
            )
            if event.restart:
                self.restart()

    def restart(self) -> None:
        """The engine sends the request again after this response streamed: its text is replaced
        with ``""``, its tool calls are retracted (:mod:`roost.actors._stream_restart`)."""
        self.turn.text_streaming = False
        for view, parts in ((self.reasoning, self.reasoning_parts), (self.message, self.text_parts)):
            if view is None:
                continue
            parts.clear()
            view.pop("replay", None)
            self.replaced.add(view["id"])
            self.checkpoints.restarted(view)
            replace_text(self.turn, view, "")
        for view in self.calls.values():
            retract_item(self.turn, view, self.open_items)
        self.calls.clear()
        self.ended.clear()

    def close(self, *, cut: bool) -> None:
        """The stream ended (``cut``: for a steer): the text so far goes into history. An item
        whose text a retry replaced and that stayed empty is retracted instead."""
        history = self.thread.history
        if self.reasoning is not None and self._left_empty(self.reasoning, self.reasoning_parts):
            self.reasoning = None
        if self.message is not None and self._left_empty(self.message, self.text_parts):
            self.message = None
        if self.reasoning is not None:
            self.reasoning["text"] = "".join(self.reasoning_parts)
            replay = self.reasoning.get("replay") or {}
            history.append(
                Reasoning(text=self.reasoning["text"], provider=replay.get("provider"), items=replay.get("items") or ())
            )
        if self.message is not None:
            self.message["text"] = "".join(self.text_parts)
            if cut:
                self.message["steered"] = True  # a fragment: the reply was cut here for a steer
            self.turn.final_text = self.message["text"]
            history.append(AgentMessage(text=self.message["text"]))

    def _left_empty(self, view: dict, parts: list[str]) -> bool:
        """Retract ``view`` if a retry replaced its text and streamed none of its own."""
        if view["id"] not in self.replaced or parts or view.get("replay"):
            return False
        retract_item(self.turn, view, self.open_items)
        return True


async def _sample(
    thread: TurnHost, turn: TurnActor, engine: Any, request: EngineRequest, open_items: dict[str, dict]
) -> list[dict]:
    """One model call: stream deltas to the client, return the tool-call item views requested.

    A steer arriving while the response streams text cuts it (:meth:`TurnActor.cut_for_steer`):
    the text so far becomes the agent message (marked ``steered``) and no tool call is returned,
    so the turn loop admits the steer and asks the model again.
    """
    response = _Response(thread, turn, open_items)
    cut = turn.stream_cut = trio.CancelScope()
    try:
        with cut:
            async with engine.stream(request) as events:
                async for event in FairEvents(events):  # bounded slices: control stays ahead
                    fault_point("turn")
                    response.on_event(event)
    finally:
        turn.stream_cut, turn.text_streaming = None, False
        # Settle what was streamed: complete on success, keep as interrupted/failed otherwise.
        response.close(cut=cut.cancelled_caught)
    for view in (response.reasoning, response.message):
        if view is not None:
            await turn.complete_item(view, open_items)
    if cut.cancelled_caught and response.calls:
        # A tool call began in the instant the cut took effect: it never runs.
        for view in response.calls.values():
            thread.history.append(
                ToolCall(call_id=view["call_id"], name=view["name"], arguments=view.get("arguments") or {})
            )
            await _refuse_tool_call(
                thread, turn, view, open_items, "error: not run: the response was cut here for a steer"
            )
        return []
    return response.ended


def _tools(thread: TurnHost, turn: TurnActor) -> Mapping[str, Any]:
    """The tools of the process, with those of the turn's agent's run (``AgentTurn.extra_tools``)."""
    extra = turn.agent.extra_tools if turn.agent is not None else None
    return {**thread.services.tools, **extra} if extra else thread.services.tools


async def _run_tool_call(thread: TurnHost, turn: TurnActor, view: dict, open_items: dict[str, dict]) -> None:
    tid = thread.thread.id
    from roost.actors._workers import AGENT_TOOL_NAMES

    allowed = turn.tools is None or view["name"] in turn.tools
    if view["name"] in AGENT_TOOL_NAMES and thread.services.worker_tools and allowed:
        await _run_agent_tool(thread, turn, view, open_items)
        return
    tool = _tools(thread, turn).get(view["name"]) if allowed else None
    origin = turn.origin

    def on_output(chunk: str) -> None:
        thread.emit(
            "item/toolCall/outputDelta", {"thread_id": tid, "turn_id": turn.id, "item_id": view["id"], "delta": chunk}
        )

    if tool is None:
        await _refuse_tool_call(thread, turn, view, open_items, f"error: unknown tool {view['name']!r}")
        return
    # The call is about to run: make it durable first, so that a process killed while it runs
    # still leaves a record that the command ran (the item settles as interrupted on restart).
    await turn.checkpoint_item(view)
    ctx = ToolContext(
        cwd=thread.cwd,
        permission_mode=thread.thread.permission_mode or "standard",
        on_output=on_output,
        request_approval=functools.partial(turn.request_approval, view),
        unattended_policy=getattr(origin, "unattended_policy", "deny"),
        no_approver=getattr(origin, "no_approver", None),
        agent=turn.agent.name if turn.agent is not None else None,
        on_process=tool_process_hook(thread.services.store.writer, thread.services.owner, tid),
        start_background=thread.services.processes.starter(tid) if thread.services.processes else None,
        ask_question=_question_asker(tid, turn, view),
    )
    result = await run_tool(tool, view["arguments"] or {}, ctx)
    await _finish_tool_call(thread, turn, view, open_items, result.output, result.is_error, result.metadata)


def _question_asker(thread_id: str, turn: TurnActor, view: dict) -> Any:
    """The tool call's ``ToolContext.ask_question``: the origin's ``ask_question`` with the call's
    ids (see :class:`~roost.actors._messages.Origin`), or None when the origin cannot be asked."""
    ask = getattr(turn.origin, "ask_question", None)
    if ask is None:
        return None

    async def ask_question(question: str, options: list[str], allow_other: bool) -> str | None:
        params = {"thread_id": thread_id, "turn_id": turn.id, "item_id": view["id"]}
        return await ask({**params, "question": question, "options": options, "allowOther": allow_other})

    return ask_question


async def _refuse_tool_call(
    thread: TurnHost, turn: TurnActor, view: dict, open_items: dict[str, dict], message: str
) -> None:
    """End a tool call without running it: its result is the error ``message``."""
    await _finish_tool_call(thread, turn, view, open_items, message, True, {})


async def _finish_tool_call(
    thread: TurnHost,
    turn: TurnActor,
    view: dict,
    open_items: dict[str, dict],
    output: str,
    is_error: bool,
    metadata: dict,
) -> None:
    view["output"] = output
    view["is_error"] = is_error
    if metadata:
        view["metadata"] = metadata
    thread.history.append(ToolResult(call_id=view["call_id"], output=output, is_error=is_error))
    await turn.complete_item(view, open_items, status="failed" if is_error else "completed")


def _interruption(turn: TurnActor, execution: Any) -> dict:
    """The ``error`` of an interrupted turn, naming who stopped it (a lost lease first)."""
    lost = getattr(execution, "lost_reason", None)
    if lost is not None:
        return {
            "category": "cancelled",
            "reason": "lease_lost",
            "lease": lost,
            "message": f"the execution lease was lost ({lost}); the turn was stopped and its later writes were refused",
        }
    reason = turn.interrupt_reason or "stopped"
    return {"category": "cancelled", "reason": reason, "message": STOP_MESSAGES.get(reason, f"interrupted ({reason})")}


async def _run_agent_tool(thread: TurnHost, turn: TurnActor, view: dict, open_items: dict[str, dict]) -> None:
    """spawn_agent / send_message / close_agent / wait_agents, served by the thread's WorkerTree."""
    tree = thread.tree if thread.tree is not None else await thread.ensure_tree()
    output, is_error, metadata = await tree.run_tool(thread, turn, view["name"], view["arguments"] or {})
    await _finish_tool_call(thread, turn, view, open_items, output, is_error, metadata)


def _failure_view(failure: EngineFailure) -> dict:
    return {
        "category": failure.category,
        "message": failure.message,
        "retryable": failure.retryable,
        "provider_code": failure.provider_code,
        "http_status": failure.http_status,
        "partial_text": failure.partial_text,
        "recovery": {
            "attempt_count": failure.attempt_count,
            "retry_count": failure.retry_count,
            "submission_count": failure.submission_count,
            "max_attempts": failure.max_attempts,
            "stop_reason": failure.stop_reason,
            "failure_category": failure.category,
            "operation_id": failure.operation_id,
        },
    }


async def _settle(thread: TurnHost, turn: TurnActor, open_items: dict[str, dict]) -> None:
    """Persist partial items, give every tool call a result, settle pending input, emit the end."""
    from roost.engines import INTERRUPTED_OUTPUT

    if turn.status == "interrupted" and thread.tree is not None and thread.worker_id is None:
        # Interrupting the root turn freezes the whole worker tree first (before the partial
        # items are written), and before the root's terminal event, so no worker event follows it.
        await thread.tree.freeze(turn.interrupt_reason or "interrupted")
    partial_status = "interrupted" if turn.status == "interrupted" else "failed"
    views = list(open_items.values())
    called: set[str] | None = None  # the history's call ids, gathered only when a call is open
    for view in views:
        if view["type"] == "tool_call" and view.get("output") is None:
            view["output"] = INTERRUPTED_OUTPUT
            view["is_error"] = True
            if called is None:
                called = {h.call_id for h in thread.history if isinstance(h, ToolCall)}
            if view["call_id"] not in called:
                thread.history.append(
                    ToolCall(call_id=view["call_id"], name=view["name"], arguments=view.get("arguments") or {})
                )
            thread.history.append(ToolResult(call_id=view["call_id"], output=INTERRUPTED_OUTPUT, is_error=True))
    turn.completed_at = utc_now()
    await turn.finish(settle=views, settle_status=partial_status, open_items=open_items)
