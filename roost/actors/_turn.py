"""The turn loop (the TurnActor of DESIGN.md): engine stream -> items -> tools -> approvals.

A turn runs as a task in its ThreadActor's nursery, inside its own cancel scope (interrupt = cancel
that scope) and under the thread's execution lease (losing the lease cancels the same scope). Its
clean-up runs shielded and bounded: partial items persist as ``interrupted``, every tool call gets a
result, and exactly one terminal event (turn/completed or turn/error) is emitted.

An interrupted turn's ``error`` says who stopped it (STYLE.md: attributed cancellation):
``{"category": "cancelled", "reason": ..., "message": ...}`` with ``reason`` one of
``interrupted`` (turn/interrupt), ``shutdown`` (end of input), ``timeout``/other run reasons,
``lease_lost`` (the execution lease was superseded or expired; ``lease`` then names how, and every
later write of the turn was refused), or ``stopped`` (the thread actor was stopped).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import trio

from roost.actors._actor import shielded_cleanup
from roost.engines._types import (
    AgentMessage, EngineRequest, Finish, Reasoning, ReasoningDelta, Retrying, TextDelta, ToolCall,
    ToolCallDelta, ToolCallEnd, ToolCallStart, ToolResult, ToolSchema, Usage,
)
from roost.errors import EngineFailure, RoostError, StaleLease
from roost.storage._processes import tool_process_hook
from roost.storage._rows import new_id, utc_now
from roost.tools import ToolContext, run_tool

if TYPE_CHECKING:
    from roost.actors._thread import ThreadActor

__all__ = ["TurnState", "run_turn"]

log = logging.getLogger("roost.turn")


class TurnState:
    """The live state of one admitted turn (owned by its ThreadActor)."""

    def __init__(self, turn_id: str, origin: Any, *, run_id: str | None = None) -> None:
        self.id = turn_id
        self.origin = origin
        self.run_id = run_id
        self.scope = trio.CancelScope()
        self.status = "running"
        self.started_at = utc_now()
        self.completed_at: str | None = None
        self.error: dict | None = None
        self.usage = {"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0}
        self.items: list[dict] = []
        self.interrupt_reason: str | None = None
        self.done = trio.Event()
        self.token: int | None = None
        #: the :class:`roost.storage.Execution` holding the thread's lease (None when ephemeral)
        self.execution: Any = None
        #: the turn this one continues (``turn/start`` with ``resume_after_turn_id``), or None
        self.resume_after_turn_id: str | None = None
        self.model_calls = 0
        self.final_text = ""
        #: orchestration agent turn: the agent's settings (:class:`AgentTurn`), else None
        self.agent: Any = None
        self.tool_rounds = 0
        #: ids of this turn's items stored while still in progress (their end is an update)
        self.checkpointed: set[str] = set()
        #: the model response streaming now (cancelled to cut it for a steer), and whether it is
        #: streaming text with no tool call started (only then is it cut)
        self.stream_cut: trio.CancelScope | None = None
        self.text_streaming = False

    def cut_for_steer(self) -> None:
        """Cut the model response streaming text now, for a steer (app-server-protocol.md:
        "steering during an active model response closes the visible assistant item at that
        point, persists the prefix as a non-terminal steered fragment, admits the user item after
        it, and continues the same turn with the next model request"). A response that started a
        tool call, or a turn between responses, is not cut: the steer waits for the next step."""
        if self.stream_cut is not None and self.text_streaming:
            self.stream_cut.cancel()

    @property
    def tools(self) -> tuple[str, ...] | None:
        """The tool names this turn may use (None: every tool)."""
        return self.agent.tools if self.agent is not None else None

    def view(self, *, with_items: bool = False) -> dict:
        view = {
            "id": self.id, "thread_id": None, "status": self.status, "run_id": self.run_id,
            "started_at": self.started_at, "completed_at": self.completed_at,
            "error": self.error, "usage": dict(self.usage),
        }
        if with_items:
            view["items"] = list(self.items)
        return view


def _tool_schemas(tools: dict[str, Any]) -> tuple[ToolSchema, ...]:
    return tuple(ToolSchema(name=t.name, description=t.description, parameters=t.parameters)
                 for t in tools.values())


async def run_turn(thread: ThreadActor, turn: TurnState, execution: Any) -> None:
    """Run ``turn`` of ``thread`` to its end; emits exactly one terminal event.

    Cancellation: cancelling ``turn.scope`` (interrupt) or losing the lease ends the turn as
    ``interrupted`` after a shielded, bounded clean-up; the Cancelled does not escape. Cancelled
    from outside (the actor stopping), the turn ends the same way and the Cancelled propagates.
    """
    open_items: dict[str, dict] = {}  # item id -> view, streamed but not yet completed
    try:
        with turn_outcome(turn, execution), turn.scope:
            await _loop(thread, turn, open_items)
            # An interrupt acknowledged while the last (shielded) write ran still wins.
            await trio.lowlevel.checkpoint_if_cancelled()
            turn.status = "completed"
    finally:
        # Bounded, shielded clean-up; a root turn's includes freezing its worker tree.
        with shielded_cleanup(60.0):
            await _settle(thread, turn, open_items)


@contextlib.contextmanager
def turn_outcome(turn: TurnState, execution: Any) -> Iterator[None]:
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


async def _loop(thread: ThreadActor, turn: TurnState, open_items: dict[str, dict]) -> None:
    services = thread.services
    agent = turn.agent
    engine = agent.engine if agent is not None and agent.engine is not None else services.engine_for(thread.thread)
    schemas = _tool_schemas({n: t for n, t in services.tools.items() if turn.tools is None or n in turn.tools})
    if services.worker_tools:
        tree = thread.tree if thread.tree is not None else (None if thread.worker_id else "root")
        if tree == "root":
            from roost.actors._workers import agent_tool_schemas

            worker_schemas = agent_tool_schemas(can_spawn=True)
        else:
            worker_schemas = tree.tool_schemas(thread) if tree is not None else ()
        schemas += tuple(s for s in worker_schemas if turn.tools is None or s.name in turn.tools)
    start = len(thread.history)  # an agent turn sees earlier turns' messages as input
    while True:
        await thread.admit_steers(turn)
        if turn.model_calls >= services.max_model_calls:
            raise RoostError(f"turn stopped after {turn.model_calls} model calls")
        turn.model_calls += 1
        if agent is None:
            request = EngineRequest(
                system=services.system_prompt, history=tuple(thread.history), tools=schemas,
                model=thread.thread.model, effort=thread.thread.effort, agent=thread.agent_name,
            )
        else:
            request = _agent_request(thread, turn, schemas, start)
        calls = await _sample(thread, turn, engine, request, open_items)
        if not calls:
            if not any(p["kind"] == "steer" and not p.get("_foreign") for p in thread.pending):
                return
            continue  # steered during this model response: the same turn takes the steer next
        # One response's calls go into history together, then each result as its tool ends.
        thread.history.extend(ToolCall(call_id=c["call_id"], name=c["name"], arguments=c["arguments"] or {})
                              for c in calls)
        out_of_rounds = not request.tools and bool(schemas)
        for call in calls:
            if out_of_rounds:  # asked for tools after its last round: answered, not run
                await _refuse_tool_call(thread, turn, call, open_items, f"error: no tool rounds left "
                                        f"(MaxToolRounds {agent.max_tool_rounds}); answer without tools")
            else:
                await _run_tool_call(thread, turn, call, open_items)
        turn.tool_rounds += 1
        if out_of_rounds:
            return


def _agent_request(thread: ThreadActor, turn: TurnState, schemas: tuple, start: int) -> EngineRequest:
    """The model call of an orchestration agent's turn: its prompt, model options and view of the
    conversation; past its ``max_tool_rounds`` no tools are offered and a note says so."""
    from roost.engines._types import UserMessage

    agent = turn.agent
    history = _agent_view(thread.history, start)
    if agent.max_tool_rounds is not None and turn.tool_rounds >= agent.max_tool_rounds and schemas:
        schemas = ()
        history += (UserMessage(text=f"[Roost] You have used all {agent.max_tool_rounds} tool rounds of this "
                                     "turn. Answer now, without calling tools.", synthetic=True),)
    return EngineRequest(
        system=agent.system_prompt or thread.services.system_prompt, history=history, tools=schemas,
        model=agent.model or thread.thread.model, effort=thread.thread.effort, agent=agent.name,
        max_tokens=agent.max_tokens, temperature=agent.temperature,
    )


def _agent_view(history: list, start: int) -> tuple:
    """An orchestration agent's history: other turns' agent messages become input (user
    messages), their reasoning is dropped; the current turn (from ``start``) is unchanged."""
    from roost.engines._types import UserMessage

    earlier = []
    for item in history[:start]:
        if isinstance(item, AgentMessage):
            earlier.append(UserMessage(text=item.text))
        elif not isinstance(item, Reasoning):
            earlier.append(item)
    return tuple(earlier) + tuple(history[start:])


async def _sample(thread: ThreadActor, turn: TurnState, engine: Any, request: EngineRequest,
                  open_items: dict[str, dict]) -> list[dict]:
    """One model call: stream deltas to the client, return the tool-call item views requested.

    A steer arriving while the response streams text cuts it (:meth:`TurnState.cut_for_steer`):
    the text so far becomes the agent message (marked ``steered``) and no tool call is returned,
    so the turn loop admits the steer and asks the model again.
    """
    emit = thread.emit
    tid = thread.thread.id
    message: dict | None = None
    reasoning: dict | None = None
    text_parts: list[str] = []
    reasoning_parts: list[str] = []
    calls: dict[str, dict] = {}
    ended: list[dict] = []

    def start_item(kind: str, **fields: Any) -> dict:
        view = {"id": new_id("item"), "type": kind, "status": "in_progress", "turn_id": turn.id,
                "thread_id": tid, **fields}
        open_items[view["id"]] = view
        emit("item/started", {"thread_id": tid, "turn_id": turn.id, "item": view})
        return view

    cut = turn.stream_cut = trio.CancelScope()
    try:
        with cut:
            async with engine.stream(request) as events:
                async for event in events:
                    cls = type(event)
                    if cls is TextDelta:
                        if message is None:
                            message = start_item("agent_message", text="",
                                                 **({"agent": turn.agent.name} if turn.agent else {}))
                            turn.text_streaming = not calls
                        text_parts.append(event.text)
                        emit("item/agentMessage/delta",
                             {"thread_id": tid, "turn_id": turn.id, "item_id": message["id"], "delta": event.text})
                    elif cls is ReasoningDelta:
                        if reasoning is None:
                            reasoning = start_item("reasoning", text="")
                        reasoning_parts.append(event.text)
                        emit("item/reasoning/delta",
                             {"thread_id": tid, "turn_id": turn.id, "item_id": reasoning["id"], "delta": event.text})
                    elif cls is ToolCallStart:
                        turn.text_streaming = False  # a response that calls tools is not cut
                        calls[event.call_id] = start_item("tool_call", call_id=event.call_id, name=event.name,
                                                          arguments=None, output=None)
                    elif cls is ToolCallDelta:
                        view = calls.get(event.call_id)
                        if view is not None:
                            emit("item/toolCall/delta", {"thread_id": tid, "turn_id": turn.id,
                                                         "item_id": view["id"], "delta": event.delta})
                    elif cls is ToolCallEnd:
                        turn.text_streaming = False
                        view = calls.get(event.call_id)
                        if view is None:
                            view = calls[event.call_id] = start_item(
                                "tool_call", call_id=event.call_id, name=event.name, arguments=None, output=None)
                        view["arguments"] = event.arguments
                        ended.append(view)
                    elif cls is Usage:
                        for key in ("input_tokens", "output_tokens", "cached_tokens"):
                            turn.usage[key] += getattr(event, key) or 0
                        emit("turn/usage", {"thread_id": tid, "turn_id": turn.id, "usage": dict(turn.usage)})
                    elif cls is Finish:
                        pass
                    elif cls is Retrying:
                        emit("turn/event", {"thread_id": tid, "turn_id": turn.id, "event": {
                            "type": "retrying", "attempt": event.attempt, "max_attempts": event.max_attempts,
                            "delay_s": event.delay_s, "reason": event.reason}})
    finally:
        turn.stream_cut, turn.text_streaming = None, False
        # Settle what was streamed: complete on success, keep as interrupted/failed otherwise.
        if reasoning is not None:
            reasoning["text"] = "".join(reasoning_parts)
            thread.history.append(Reasoning(text=reasoning["text"]))
        if message is not None:
            message["text"] = "".join(text_parts)
            if cut.cancelled_caught:
                message["steered"] = True  # a fragment: the reply was cut here for a steer
            turn.final_text = message["text"]
            thread.history.append(AgentMessage(text=message["text"]))
    for view in (reasoning, message):
        if view is not None:
            await thread.complete_item(turn, view, open_items)
    if cut.cancelled_caught and calls:
        # A tool call began in the instant the cut took effect: it never runs.
        for view in calls.values():
            thread.history.append(ToolCall(call_id=view["call_id"], name=view["name"],
                                           arguments=view.get("arguments") or {}))
            await _refuse_tool_call(thread, turn, view, open_items,
                                    "error: not run: the response was cut here for a steer")
        return []
    return ended


async def _run_tool_call(thread: ThreadActor, turn: TurnState, view: dict, open_items: dict[str, dict]) -> None:
    tid = thread.thread.id
    from roost.actors._workers import AGENT_TOOL_NAMES

    allowed = turn.tools is None or view["name"] in turn.tools
    if view["name"] in AGENT_TOOL_NAMES and thread.services.worker_tools and allowed:
        await _run_agent_tool(thread, turn, view, open_items)
        return
    tool = thread.services.tools.get(view["name"]) if allowed else None
    origin = turn.origin

    def on_output(chunk: str) -> None:
        thread.emit("item/toolCall/outputDelta",
                    {"thread_id": tid, "turn_id": turn.id, "item_id": view["id"], "delta": chunk})

    if tool is None:
        await _refuse_tool_call(thread, turn, view, open_items, f"error: unknown tool {view['name']!r}")
        return
    # The call is about to run: make it durable first, so that a process killed while it runs
    # still leaves a record that the command ran (the item settles as interrupted on restart).
    await thread.checkpoint_item(turn, view)
    ctx = ToolContext(
        cwd=thread.cwd, permission_mode=thread.thread.permission_mode or "standard",
        on_output=on_output,
        request_approval=functools.partial(thread.request_approval, turn, view),
        unattended_policy=getattr(origin, "unattended_policy", "deny"),
        agent=turn.agent.name if turn.agent is not None else None,
        on_process=tool_process_hook(thread.services.store.writer, thread.services.owner, tid),
        start_background=thread.services.processes.starter(tid) if thread.services.processes else None,
    )
    result = await run_tool(tool, view["arguments"] or {}, ctx)
    await _finish_tool_call(thread, turn, view, open_items, result.output, result.is_error, result.metadata)


async def _refuse_tool_call(thread: ThreadActor, turn: TurnState, view: dict, open_items: dict[str, dict],
                            message: str) -> None:
    """End a tool call without running it: its result is the error ``message``."""
    await _finish_tool_call(thread, turn, view, open_items, message, True, {})


async def _finish_tool_call(thread: ThreadActor, turn: TurnState, view: dict, open_items: dict[str, dict],
                            output: str, is_error: bool, metadata: dict) -> None:
    view["output"] = output
    view["is_error"] = is_error
    if metadata:
        view["metadata"] = metadata
    thread.history.append(ToolResult(call_id=view["call_id"], output=output, is_error=is_error))
    await thread.complete_item(turn, view, open_items, status="failed" if is_error else "completed")


_STOP_MESSAGES = {
    "interrupted": "interrupted by the client",
    "shutdown": "interrupted: the server is shutting down (end of input or SIGTERM)",
    "stopped": "interrupted: the thread was stopped",
}


def _interruption(turn: TurnState, execution: Any) -> dict:
    """The ``error`` of an interrupted turn, naming who stopped it (a lost lease first)."""
    lost = getattr(execution, "lost_reason", None)
    if lost is not None:
        return {"category": "cancelled", "reason": "lease_lost", "lease": lost,
                "message": f"the execution lease was lost ({lost}); the turn was stopped and its "
                           "later writes were refused"}
    reason = turn.interrupt_reason or "stopped"
    return {"category": "cancelled", "reason": reason,
            "message": _STOP_MESSAGES.get(reason, f"interrupted ({reason})")}


async def _run_agent_tool(thread: ThreadActor, turn: TurnState, view: dict, open_items: dict[str, dict]) -> None:
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


async def _settle(thread: ThreadActor, turn: TurnState, open_items: dict[str, dict]) -> None:
    """Persist partial items, give every tool call a result, settle pending input, emit the end."""
    from roost.engines import INTERRUPTED_OUTPUT

    if turn.status == "interrupted" and thread.tree is not None and thread.worker_id is None:
        # Interrupting the root turn freezes the whole worker tree first (before the partial
        # items are written), and before the root's terminal event, so no worker event follows it.
        await thread.tree.freeze(turn.interrupt_reason or "interrupted")
    partial_status = "interrupted" if turn.status == "interrupted" else "failed"
    views = list(open_items.values())
    called = {h.call_id for h in thread.history if isinstance(h, ToolCall)}
    for view in views:
        if view["type"] == "tool_call" and view.get("output") is None:
            view["output"] = INTERRUPTED_OUTPUT
            view["is_error"] = True
            if view["call_id"] not in called:
                thread.history.append(ToolCall(call_id=view["call_id"], name=view["name"],
                                               arguments=view.get("arguments") or {}))
            thread.history.append(ToolResult(call_id=view["call_id"], output=INTERRUPTED_OUTPUT, is_error=True))
    turn.completed_at = utc_now()
    await thread.finish_turn(turn, settle=views, settle_status=partial_status, open_items=open_items)
