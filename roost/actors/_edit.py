"""Rewinding a thread's active conversation: ``thread/edit-message`` and history import for forks.

app-server-protocol.md, "Session methods": for the built-in engine, ``thread/edit-message``
"retracts the selected user message and later messages from the active conversation"; the
physical transcript stays append-only. Roost therefore never deletes a row: a retracted item keeps
its payload (plus a ``retraction`` record) and gets ``status = "retracted"``; a turn left without
any visible item gets ``status = "retracted"`` too. Retracted rows are hidden from snapshots,
history pages, search and the engine history (the ThreadActor skips them when it loads).

The handlers here run inside the ThreadActor (one message at a time), so a rewind never races a
turn admission.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from roost.actors._views import history_from_items
from roost.errors import InvalidParams, ThreadBusy, TurnNotFound
from roost.storage import get_item, new_id, update_item, update_thread, update_turn, utc_now

if TYPE_CHECKING:
    from roost.actors._thread import ThreadActor

__all__ = ["RetractFrom", "ImportHistory", "RETRACTED", "retract_from", "import_history", "stored_payload"]

#: The status of an item (or turn) removed from the active conversation by an edit.
RETRACTED = "retracted"
_VIEW_KEYS = ("id", "type", "status", "turn_id", "thread_id", "seq")


@attrs.frozen(kw_only=True)
class RetractFrom:
    """Retract user message ``item_id`` of turn ``turn_id`` and everything after it.

    Reply: ``{"draft": {...}, "retracted_item_ids": [...], "retracted_turn_ids": [...]}``.
    Errors: ThreadBusy (a turn is running), TurnNotFound, InvalidParams (no such item in that turn,
    or it is not a user message).
    """

    turn_id: str
    item_id: str


@attrs.frozen(kw_only=True)
class ImportHistory:
    """Seed a new, empty *ephemeral* thread with copied turn and item views (a fork).

    Reply: None. Errors: InvalidParams (the thread already has turns or is persistent).
    """

    turns: tuple = ()
    items: tuple = ()


async def retract_from(actor: ThreadActor, msg: RetractFrom) -> dict:
    """Handle :class:`RetractFrom` (see there); persists before answering.

    The retraction is one write transaction: either every row is marked or none is.

    Cancellation: if cancelled while the write is queued the rows may still be marked; the in-memory
    state is only changed after the write committed.
    """
    tid = actor.thread.id
    if actor.active is not None:
        raise ThreadBusy(f"thread {tid} is running turn {actor.active.id}; interrupt it before editing")
    refresh = getattr(actor, "_refresh_if_changed", None)
    if refresh is not None:  # another process may have added turns since this actor last looked
        await refresh()
    turn_ids = [t["id"] for t in actor.turns]
    if msg.turn_id not in turn_ids:
        raise TurnNotFound(f"thread {tid} has no turn {msg.turn_id}")
    start = next(
        (n for n, item in enumerate(actor.items) if item["id"] == msg.item_id and item.get("turn_id") == msg.turn_id),
        None,
    )
    if start is None:
        raise InvalidParams(f"turn {msg.turn_id} has no item {msg.item_id}")
    selected = actor.items[start]
    if selected["type"] != "user_message":
        raise InvalidParams(f"item {msg.item_id} is a {selected['type']}; only a user message can be edited")
    retracted_items = actor.items[start:]
    keeps_items = any(i.get("turn_id") == msg.turn_id for i in actor.items[:start])
    first = turn_ids.index(msg.turn_id) + (1 if keeps_items else 0)
    retracted_turns = actor.turns[first:]
    record = {"edit_id": new_id("edit"), "at": utc_now(), "item_id": msg.item_id, "turn_id": msg.turn_id}

    def write(conn: Any) -> None:
        for view in retracted_items:
            row = get_item(conn, view["id"])
            payload = dict(row.payload or {})
            payload["retraction"] = {**record, "status": row.status}
            update_item(conn, view["id"], status=RETRACTED, payload=payload)
        for turn in retracted_turns:
            update_turn(conn, turn["id"], status=RETRACTED)
        update_thread(conn, tid, updated_at=record["at"])

    if not actor.ephemeral:
        await actor.services.store.writer.submit(write)
    actor.items = actor.items[:start]
    gone = {t["id"] for t in retracted_turns}
    actor.turns = [t for t in actor.turns if t["id"] not in gone]
    actor.history = history_from_items(actor.items)
    actor.thread.updated_at = record["at"]
    draft = {
        "prompt": selected.get("text") or "",
        "images": list(selected.get("images") or []),
        **({"files": list(selected["files"])} if selected.get("files") else {}),
        "content_parts": selected.get("content_parts"),
        "client_id": selected.get("source_id"),
        "turn_id": msg.turn_id,
        "item_id": msg.item_id,
    }
    actor.emit("thread/updated", {"thread": actor.view()})
    return {
        "draft": draft,
        "edit_id": record["edit_id"],
        "retracted_item_ids": [i["id"] for i in retracted_items],
        "retracted_turn_ids": [t["id"] for t in retracted_turns],
    }


async def import_history(actor: ThreadActor, msg: ImportHistory) -> None:
    """Handle :class:`ImportHistory`: the fork of an ephemeral thread starts from copied history."""
    if not actor.ephemeral or actor.turns or actor.items or actor.active is not None:
        raise InvalidParams("history can only be imported into a new, empty ephemeral thread")
    tid = actor.thread.id
    actor.turns = [dict(t, thread_id=tid) for t in msg.turns]
    actor.items = [dict(i, thread_id=tid) for i in msg.items]
    actor.history = history_from_items(actor.items)


def stored_payload(view: dict) -> dict:
    """The payload of an item view (everything but the columns of the items table)."""
    return {k: v for k, v in view.items() if k not in _VIEW_KEYS}
