"""Admission of a turn: its row and its user input made durable in one transaction, under the lease.

Under the thread's execution lease the store is the truth (app-server-protocol.md, "Turns and
execution runs"): turns a dead or superseded execution left ``running`` are settled as
interrupted, and if another process changed the thread since its actor last looked, the
conversation is reloaded before the turn is added. :meth:`ThreadActor.admit
<roost.actors._thread.ThreadActor.admit>` (the :class:`~roost.actors._turn_host.TurnHost`
callback a turn awaits first) runs :func:`admit_turn`.
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

__all__ = ["admit_turn"]

log = logging.getLogger("roost.thread")


async def admit_turn(actor: ThreadActor, turn: TurnActor) -> dict | None:
    """Admit ``turn`` of ``actor``'s thread; return the user item view (None: no user message).

    Raises:
        StaleLease: the lease was superseded before the write (nothing was written).
    """
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

    turn_rows, max_seq = actor.stored_turns, actor.stored_max_seq

    def write(conn: Any) -> tuple[dict | None, Any]:
        state = None
        if settle_abandoned(conn, tid) or store_changed(conn, tid, turn_rows, max_seq):
            state = read_state(conn, tid)
        storage.create_turn(conn, tid, id=turn.id, run_id=msg.run_id)
        if meta:
            storage.update_turn(conn, turn.id, error=meta)
        row = None
        if user is not None:
            if msg.input_id is not None:
                with contextlib.suppress(NotFound):  # withdrawn meanwhile: nothing to remove
                    storage.remove_held_input(conn, msg.input_id)
            row = storage.append_item(
                conn, tid, type="user_message", payload=payload, text=user["text"], turn_id=turn.id, id=user["id"]
            )
        return state, row

    # an admission is control (issue 19): ahead of the streams' queued writes; the turn's own
    # writes are all awaited, and its thread's earlier ones were too (a settled turn's end)
    state, row = await turn.persist(write, control=True) or (None, None)
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
