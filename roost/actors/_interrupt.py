"""Interrupting a thread's active turn in one step (control before data, issue 19).

Under saturation every hop an interrupt takes (request task, the thread actor's mailbox, the
reply) costs a whole trio scheduling batch, and a batch with 100 streaming turns is long. When the
turn to interrupt is the thread's active one, nothing about the answer needs the actor's mailbox:
cancelling the turn's scope is synchronous and idempotent (:meth:`TurnActor.interrupt`). So the
thread actor's ``InterruptTurn`` handler and the app-server's reader (which applies an interrupt
as it reads the line, when no earlier request of that thread is still being handled) share
:func:`interrupt_active`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["interrupt_active"]


def interrupt_active(actor: Any, turn_id: str | None, reason: str, ack: Any = None) -> dict | None:
    """Interrupt ``actor``'s active turn if it is the one meant; not a checkpoint.

    Args:
        actor: a :class:`~roost.actors.ThreadActor`.
        turn_id: the turn to interrupt (None: whichever is active).
        reason: why (``turn.error`` of the interrupted turn names it).
        ack: a ``trio.Event`` the caller sets once this answer is on its way to the client; the
            turn's terminal notification waits for it (bounded: docs/app-server.md, the
            ``turn/interrupt`` answer comes before the ``turn/completed`` it causes). None: the
            answer is already queued (the app-server reader's path).

    Returns:
        The ``InterruptTurn`` reply (app-server-protocol.md, ``turn/interrupt`` result
        ``{thread_id, turn, interrupted}``): the turn ``interrupting`` and ``interrupted: true``
        (also when asked again while it settles), or ``interrupted: false`` when it is already
        settling with an outcome of its own. None when there is no active turn or ``turn_id``
        names another one (the actor's handler answers those cases).
    """
    active = actor.active
    if active is None or (turn_id is not None and turn_id != active.id):
        return None
    if ack is not None:
        active.terminal_after(ack)
    view = active.view()
    view["thread_id"] = actor.thread.id
    if not active.interrupt(reason):
        # Already settling with an outcome of its own (completed, failed, lease lost).
        return {"thread_id": actor.thread.id, "turn": view, "interrupted": False}
    # Asked again while it settles: the same answer as the first time (idempotent).
    view["status"] = "interrupting"
    return {"thread_id": actor.thread.id, "turn": view, "interrupted": True}
