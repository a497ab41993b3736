"""Interrupting a thread's work (app-server-protocol.md, "Interruption"): the ThreadActor's
handler of :class:`~roost.actors._messages.InterruptTurn`, answered deterministically in every state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from roost.actors._interrupt import interrupt_active
from roost.actors._messages import InterruptTurn
from roost.actors._thread_inputs import public_input
from roost.errors import ThreadBusy, TurnNotFound

if TYPE_CHECKING:
    from roost.actors._thread import ThreadActor

__all__ = ["interrupt"]


async def interrupt(actor: ThreadActor, msg: InterruptTurn) -> dict:
    """Interrupt the active turn; answered deterministically in every state.

    Active (admitted, also before turn/started went out, or already settling): its scope is
    cancelled (idempotent) and the reply says ``interrupted: true`` with the turn ``interrupting``.
    Queued input about to start a turn: the start is withdrawn, the input becomes held work,
    ``interrupted: true``. Otherwise the latest (or named) turn as it is, ``interrupted: false``.
    """
    tid = actor.thread.id
    active = actor.active
    inputs = actor.inputs
    if active is None and inputs.dispatching is not None and msg.turn_id is None:
        if inputs.dispatch_cancelled is None:
            inputs.dispatch_cancelled = msg.reason
        latest = actor.turns[-1] if actor.turns else None
        return {"thread_id": tid, "turn": latest, "interrupted": True, "input": public_input(inputs.dispatching)}
    answer = interrupt_active(actor, msg.turn_id, msg.reason, msg.ack)  # (the app-server reader's path too)
    if answer is not None:
        return answer
    if not actor.ephemeral and await actor.busy_elsewhere():
        # The turn runs in another process: this one cannot interrupt it (app-server-protocol.md
        # answers run/interrupt of a run attached elsewhere the same way, run_not_attached).
        raise ThreadBusy(f"thread {tid} is executing in another process; interrupt it through that app-server")
    if msg.turn_id is not None and actor.turn_view(msg.turn_id) is None:
        await actor.refresh_if_changed()  # a turn another process ran on this thread
    if msg.turn_id is not None:
        for turn in actor.turns:
            if turn["id"] == msg.turn_id:
                return {"thread_id": tid, "turn": turn, "interrupted": False}
        raise TurnNotFound(f"thread {tid} has no turn {msg.turn_id}")
    latest = actor.turns[-1] if actor.turns else None
    if actor.tree is not None and actor.worker_id is None and actor.tree.live:
        # No active turn, but live workers: freeze them (each emits its terminal agent/updated).
        frozen = await actor.tree.freeze(msg.reason)
        actor.emit("thread/updated", {"thread": actor.view()})
        return {"thread_id": tid, "turn": latest, "interrupted": True, "workers_frozen": frozen}
    return {"thread_id": tid, "turn": latest, "interrupted": False}
