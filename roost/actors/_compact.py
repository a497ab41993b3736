"""Compaction: replace a thread's model-facing history with a model-written summary.

A long conversation outgrows the model's context window. :class:`~roost.actors._messages.Compact`
asks the model, without tools, to summarise the conversation; the summary is stored as an item of
type ``compaction`` (``text``: the summary) and :func:`roost.actors._views.history_from_items`
starts the engine history at the latest such item: the model then sees one synthetic user message
``"Summary of the conversation so far: <summary>"`` followed by the items after it. Nothing is
deleted: the items before it stay in the thread (the audit transcript is append-only) and in
snapshots, they only leave the model's context.

Design: a compaction is a turn of its own (a *compaction turn*: no user message, one ``compaction``
item). Being a turn gives it what turns already guarantee, with the same code:

* admission: refused with ``thread_busy`` while a turn runs or queued input is starting; the
  thread's execution lease is taken and the turn row written under it (another process never
  compacts or runs a turn at the same time; a dead process's running turns are settled first);
* the model call runs in a task of the actor's nursery, so the mailbox stays free (``turn/interrupt``
  cancels it; input sent meanwhile waits as pending input and starts the next turn afterwards);
* nothing half-written: the ``compaction`` item, the turn's end and the release of the lease commit
  in one transaction (fenced by the lease token), only after the whole summary arrived. An
  interrupted or failed compaction leaves an ``interrupted``/``failed`` turn without any item, and
  the history unchanged;
* notifications: ``turn/started``, ``turn/usage``, ``item/started`` + ``item/completed`` (the
  compaction item, at the end) and one terminal event, like any turn.

The summary request (recognisable by engines and scripts): an
:class:`~roost.engines._types.EngineRequest` with ``agent="compactor"`` (:data:`COMPACTOR_AGENT`),
no tools, the process's system prompt, and the current engine history followed by one user
message, :data:`COMPACTION_PROMPT` (plus ``"\\n\\nAdditional instructions: <instructions>"`` when
given). That message is not synthetic, so the scripted engine matches rules against it
(``match: {agent: compactor}`` or ``match: {prompt: "^Summarize the conversation so far"}``) and
its first step answers; with ``default: echo`` the summary is the prompt itself.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from roost.actors._actor import shielded_cleanup
from roost.actors._messages import Compact, Origin, StartTurn
from roost.actors._turn import TurnActor
from roost.actors._turn_loop import turn_outcome
from roost.actors._views import SUMMARY_SOURCE_ID, history_from_items, latest_compaction
from roost.engines import EngineRequest, Retrying, TextDelta, Usage, UserMessage
from roost.errors import InvalidParams, RoostError, ThreadBusy
from roost.storage import new_id, utc_now

if TYPE_CHECKING:
    from roost.actors._thread import ThreadActor

__all__ = [
    "Compact",
    "COMPACTOR_AGENT",
    "COMPACTION_PROMPT",
    "compact",
    "compact_thread",
    "compactable",
    "compaction_request",
]

log = logging.getLogger("roost.compact")

#: ``EngineRequest.agent`` of the summary request.
COMPACTOR_AGENT = "compactor"
#: The user message that asks for the summary (the last message of the summary request).
COMPACTION_PROMPT = (
    "Summarize the conversation so far. Your summary will replace the conversation in your context, "
    "so keep everything needed to continue the work: the user's goals and requests, decisions and "
    "their reasons, facts learned, files, commands and results that matter, open questions, and "
    "the next steps. Answer with the summary only."
)


def compactable(items: list[dict]) -> bool:
    """Whether ``items`` (item views in thread order) hold history a compaction would replace:
    anything the model sees after the latest completed compaction."""
    return bool(history_from_items(items[latest_compaction(items) + 1 :]))


def compaction_request(actor: ThreadActor, instructions: str | None) -> EngineRequest:
    """The summary request for ``actor``'s current engine history (see the module docstring).

    Raises:
        InvalidParams: there is nothing to compact.
    """
    if not compactable(actor.items):
        raise InvalidParams(f"thread {actor.thread.id} has nothing to compact")
    prompt = COMPACTION_PROMPT
    if instructions and instructions.strip():
        prompt += f"\n\nAdditional instructions: {instructions.strip()}"
    return EngineRequest(
        system=actor.services.system_prompt,
        history=tuple(actor.history) + (UserMessage(text=prompt),),
        tools=(),
        model=actor.thread.model,
        effort=actor.thread.effort,
        agent=COMPACTOR_AGENT,
    )


def _check_idle(actor: ThreadActor) -> None:
    """Raise ThreadBusy while a turn (or compaction) is admitted or queued input is starting."""
    if actor.active is not None:
        raise ThreadBusy(
            f"thread {actor.thread.id} is running turn {actor.active.id}; wait for it or interrupt it before compacting"
        )
    if actor.inputs.dispatching is not None:
        raise ThreadBusy(f"thread {actor.thread.id} is starting a turn with queued input")


async def compact(actor: ThreadActor, msg: Compact) -> dict:
    """Handle :class:`Compact`: admit a compaction turn; reply with its (in-progress) item view.

    Returns:
        ``{"id", "type": "compaction", "status": "in_progress", "turn_id", "thread_id",
        "instructions", "source_id"}`` (a copy; the stored item gets the same id).

    Raises:
        ThreadBusy: a turn is running, queued input is starting, or another process holds the
            thread's execution lease.
        InvalidParams: nothing to compact (no history since the latest compaction).
    """
    _check_idle(actor)
    await actor._refresh_if_changed()  # another process may have added turns meanwhile
    _check_idle(actor)
    if not compactable(actor.items):
        raise InvalidParams(f"thread {actor.thread.id} has nothing to compact")
    turn_id = new_id("turn")
    view = {
        "id": new_id("item"),
        "type": "compaction",
        "status": "in_progress",
        "turn_id": turn_id,
        "thread_id": actor.thread.id,
        "instructions": msg.instructions,
        "source_id": SUMMARY_SOURCE_ID,
    }
    instructions = msg.instructions

    async def body(turn: TurnActor, execution: Any) -> None:
        await _run_compaction(actor, turn, view, instructions, execution)

    # A turn of its own with the compaction as its body (it gets no user message).
    turn = TurnActor(actor, turn_id, msg.origin, start=StartTurn(origin=msg.origin), body=body)
    actor.active = turn
    actor.idle = trio.Event()
    await actor.launch(turn)
    return dict(view)


async def _run_compaction(
    actor: ThreadActor, turn: TurnActor, view: dict, instructions: str | None, execution: Any
) -> None:
    """Ask for the summary and settle the turn; emits exactly one terminal event.

    Cancellation: like :func:`roost.actors._turn_loop.run_turn`: an interrupt or a lost lease ends the
    turn ``interrupted`` after a shielded, bounded clean-up (no compaction item is written).
    """
    try:
        with turn_outcome(turn, execution), turn.scope:
            request = compaction_request(actor, instructions)
            summary = await _summarize(actor, turn, request)
            if not summary:
                raise RoostError("the model returned an empty summary")
            await trio.lowlevel.checkpoint_if_cancelled()  # an interrupt acknowledged meanwhile wins
            view["text"] = summary
            turn.final_text = summary
            turn.status = "completed"
    finally:
        with shielded_cleanup(60.0):
            await _settle(actor, turn, view)


async def _summarize(actor: ThreadActor, turn: TurnActor, request: EngineRequest) -> str:
    """Stream the summary request; return the summary text (stripped; '' if the model gave none).

    Usage is added to the turn (``turn/usage``), provider retries are reported (``turn/event``).
    Reasoning and tool calls (none are offered) are ignored.

    Raises:
        EngineFailure: the model call failed.
    """
    tid = actor.thread.id
    engine = actor.services.engine_for(actor.thread)
    parts: list[str] = []
    async with engine.stream(request) as events:
        async for event in events:
            cls = type(event)
            if cls is TextDelta:
                parts.append(event.text)
            elif cls is Usage:
                for key in ("input_tokens", "output_tokens", "cached_tokens"):
                    turn.usage[key] += getattr(event, key) or 0
                actor.emit("turn/usage", {"thread_id": tid, "turn_id": turn.id, "usage": dict(turn.usage)})
            elif cls is Retrying:
                if event.restart:  # the stream is sent again from its beginning
                    parts.clear()
                actor.emit(
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
    return "".join(parts).strip()


async def _settle(actor: ThreadActor, turn: TurnActor, view: dict) -> None:
    """End the turn: a completed one writes its compaction item in the turn-ending transaction,
    then the engine history restarts from it (before anything else can run on the actor)."""
    turn.completed_at = utc_now()
    done = turn.status == "completed"
    if done:
        actor.emit("item/started", {"thread_id": actor.thread.id, "turn_id": turn.id, "item": dict(view)})
    await turn.finish(
        settle=[view] if done else None, settle_status="completed", open_items={view["id"]: view} if done else None
    )
    if not done:
        return
    if not actor.ephemeral and "seq" not in view:
        # The turn-ending write did not commit (lease lost, store busy): the store has no summary,
        # so neither has the live conversation (a reload must give the same history).
        log.warning("thread %s: compaction %s not persisted; the history is unchanged", actor.thread.id, view["id"])
        actor.items = [item for item in actor.items if item is not view]
        turn.items = [item for item in turn.items if item is not view]
        return
    # No checkpoint since finish_turn made the actor idle: no turn can have started meanwhile.
    actor.history = history_from_items(actor.items)


async def compact_thread(
    actor: ThreadActor, *, instructions: str | None = None, origin: Origin | None = None, timeout: float | None = None
) -> dict:
    """Compact ``actor``'s thread and wait for the end: return the stored compaction item view.

    Args:
        actor: the ThreadActor.
        instructions: extra instructions for the summary, or None.
        origin: who asks (default: nobody to ask).
        timeout: seconds to wait for the whole compaction (None: no limit).

    Returns:
        ``{"id", "type": "compaction", "status": "completed", "turn_id", "thread_id", "text",
        "instructions", "source_id", "seq"?}``.

    Raises:
        ThreadBusy, InvalidParams: from :class:`Compact`.
        RoostError: the compaction turn failed or was interrupted (the message says why).
        trio.TooSlowError: ``timeout`` passed (the compaction goes on).
    """
    started = await actor.ref.ask(Compact(instructions=instructions, origin=origin or Origin()))
    with trio.fail_after(timeout) if timeout is not None else _no_limit():
        turn = await actor.wait_turn_end(started["turn_id"])
    if turn["status"] != "completed":
        error = turn.get("error") or {}
        raise RoostError(f"compaction {turn['status']}: {error.get('message') or 'no summary'}")
    for item in reversed(actor.items):
        if item["id"] == started["id"]:
            return item
    raise RoostError(f"compaction {started['id']} of thread {actor.thread.id} was not persisted")


def _no_limit() -> trio.CancelScope:
    return trio.CancelScope()
