"""Admission of a turn: its row and its user input made durable in one transaction, under the lease.

Under the thread's execution lease the store is the truth (app-server-protocol.md, "Turns and
execution runs"): turns a dead or superseded execution left ``running`` are settled as
interrupted, and if another process changed the thread since its actor last looked, the
conversation is reloaded before the turn is added. :meth:`ThreadActor.admit
<roost.actors._thread.ThreadActor.admit>` (the :class:`~roost.actors._turn_host.TurnHost`
callback a turn calls first) prepares an :class:`Admission`; the turn commits its write in the
transaction that takes the execution lease (:meth:`roost.storage.LeaseKeeper.hold_with`: one
commit per admission, not two, issue 12), then awaits :meth:`Admission.admitted`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from roost import storage
from roost.actors._thread_store import apply_state, read_state, settle_abandoned, store_changed
from roost.actors._views import history_from_items, user_item_view
from roost.errors import NotFound

if TYPE_CHECKING:
    from roost.actors._thread import ThreadActor
    from roost.actors._turn import TurnActor

__all__ = ["Admission", "prepare_admission"]

log = logging.getLogger("roost.thread")


class Admission:
    """A turn's admission, prepared by :func:`prepare_admission`.

    Attributes:
        write: the admission's storage write, ``write(conn) -> (state, row)`` (blocking; run it
            under the thread's execution lease: in the lease's acquisition transaction, or fenced).
    """

    __slots__ = ("_actor", "_turn", "_user", "write")

    def __init__(self, actor: ThreadActor, turn: TurnActor, user: dict | None, write: Any) -> None:
        self._actor, self._turn, self._user, self.write = actor, turn, user, write

    async def admitted(self, result: tuple[dict | None, Any] | None) -> dict | None:
        """Apply the committed admission (``result``: what :attr:`write` returned; None when
        nothing was written, an ephemeral thread) to the thread's memory; return the user item
        view (None: the turn has no user message).

        Raises:
            StaleLease: reloading a thread another process changed found the lease superseded.
        """
        actor, turn, user = self._actor, self._turn, self._user
        tid = actor.thread.id
        msg = turn.start
        state, row = result or (None, None)
        if state is not None:
            log.info("thread %s: changed by another process; reloaded at admission", tid)
            keep = frozenset({msg.input_id}) if msg.input_id else frozenset()
            await actor.inputs.persist_held(apply_state(actor, state, keep=keep), reason="abandoned")
        actor.stored_turns += 1
        actor.turns.append(
            {
                "id": turn.id,
                "thread_id": tid,
                "status": "running",
                "run_id": msg.run_id,
                "started_at": turn.started_at,
                "completed_at": None,
                "error": None,
                "usage": None,
            }
        )
        if user is None:
            return None
        if row is not None:
            user["seq"] = row.seq
            actor.stored_max_seq = max(actor.stored_max_seq, row.seq)
        actor.items.append(user)
        turn.items.append(user)
        actor.history.extend(history_from_items([user]))
        return user


def prepare_admission(actor: ThreadActor, turn: TurnActor) -> Admission:
    """Prepare the admission of ``turn`` of ``actor``'s thread: its write (turn row, user item,
    the held input it consumes; settling turns an abandoned execution left ``running`` and
    reading the thread back if another process changed it) and what follows the commit."""
    tid = actor.thread.id
    msg = turn.start
    meta = {"resume_after_turn_id": msg.resume_after_turn_id} if msg.resume_after_turn_id else None
    user = None
    if msg.prompt or msg.images:
        user = user_item_view(
            tid,
            turn.id,
            msg.prompt or "",
            source_id=msg.client_id,
            images=msg.images,
            content_parts=msg.content_parts,
        )
    payload = {k: v for k, v in (user or {}).items() if k not in ("id", "type", "status", "turn_id", "thread_id")}
    text, user_id = (user["text"], user["id"]) if user is not None else (None, None)
    turn_rows, max_seq = actor.stored_turns, actor.stored_max_seq
    # plain values only: the writer looks through a control write's closure for its size
    turn_id, run_id, input_id = turn.id, msg.run_id, msg.input_id

    def write(conn: Any) -> tuple[dict | None, Any]:
        state = None
        if settle_abandoned(conn, tid) or store_changed(conn, tid, turn_rows, max_seq):
            state = read_state(conn, tid)
        storage.create_turn(conn, tid, id=turn_id, run_id=run_id)
        if meta:
            storage.update_turn(conn, turn_id, error=meta)
        row = None
        if text is not None:
            if input_id is not None:
                with contextlib.suppress(NotFound):  # withdrawn meanwhile: nothing to remove
                    storage.remove_held_input(conn, input_id)
            row = storage.append_item(
                conn, tid, type="user_message", payload=payload, text=text, turn_id=turn_id, id=user_id
            )
        return state, row

    return Admission(actor, turn, user, write)
