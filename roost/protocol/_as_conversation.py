"""Conversation paging (app-server-protocol.md, "Session methods": ``conversation_history`` on
``thread/resume``, and ``thread/activity/read``).

A *process region* of a settled turn is a maximal run of consecutive non-user items (agent
messages, reasoning, tool calls...) that holds at least one tool call and is not the turn's final
answer (a trailing agent message after the last tool call). In a conversation page each region is
replaced by one ``process_summary`` item whose ``id`` is the region's first item id, with
``activity: {last_item_id, item_count, tool_count, failed_count}``; each settled turn gets
``has_final_answer``. Active turns keep their live items. Pages hold up to 100 turns and about
1 MiB of serialized items (:data:`CONVERSATION_PAGE_BYTES`); their ``history_cursor`` continues
in conversation form through ``thread/history/read``. Only the turns of the requested page are
projected.

``thread/activity/read`` pages a summary's detail items forward: up to 100 items and 256 KiB per
page, oversized fields as ``content_ref``/``attachment_ref`` references
(:mod:`roost.protocol._as_content`), ``next_cursor`` until the region ends. A summary whose
boundary no longer exists (the turn was edited, or the region regrouped) fails explicitly.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

from roost._json import dumps, loads
from roost.errors import InvalidParams, TurnNotFound
from roost.protocol._appserver import AppServerSession, method
from roost.protocol._as_common import (
    HISTORY_PAGE_BYTES,
    encode_cursor,
    page_start,
    thread_snapshot,
)
from roost.protocol._as_content import defer_item
from roost.protocol._params import STR, check_params

__all__ = ["CONVERSATION_PAGE_BYTES", "conversation_page", "conversation_turn", "is_conversation_cursor"]

#: Serialized item bytes per conversation page (app-server-protocol.md: 1 MiB).
CONVERSATION_PAGE_BYTES = 1024 * 1024
#: Detail items per thread/activity/read page.
ACTIVITY_PAGE_ITEMS = 100
_ACTIVE = ("running", "queued", "interrupting")


def _regions(items: list[dict]) -> list[tuple[int, int]]:
    """``[(start, end)]`` index ranges (end exclusive) of the process regions of a turn's items."""
    last_tool = max((i for i, item in enumerate(items) if item.get("type") == "tool_call"), default=-1)
    out: list[tuple[int, int]] = []
    start = None
    for index, item in enumerate(items[: last_tool + 1]):
        if item.get("type") == "user_message":
            if start is not None:
                out.append((start, index))
                start = None
        elif start is None:
            start = index
    if start is not None:
        out.append((start, last_tool + 1))
    return [(a, b) for a, b in out if any(i.get("type") == "tool_call" for i in items[a:b])]


def _failed(item: dict) -> bool:
    return item.get("status") == "failed" or (item.get("type") == "tool_call" and item.get("is_error") is True)


def conversation_turn(turn: dict) -> dict:
    """``turn`` in conversation form (module docstring); an active turn is returned unchanged."""
    if turn.get("status") in _ACTIVE:
        return turn
    items = list(turn.get("items") or ())
    out: list[dict] = []
    cursor = 0
    for start, end in _regions(items):
        out.extend(items[cursor:start])
        region = items[start:end]
        out.append(
            {
                "id": region[0]["id"],
                "type": "process_summary",
                "status": "failed" if any(_failed(i) for i in region) else "completed",
                "turn_id": turn.get("id"),
                "thread_id": turn.get("thread_id"),
                "activity": {
                    "last_item_id": region[-1]["id"],
                    "item_count": len(region),
                    "tool_count": sum(1 for i in region if i.get("type") == "tool_call"),
                    "failed_count": sum(1 for i in region if _failed(i)),
                },
            }
        )
        cursor = end
    out.extend(items[cursor:])
    last = items[-1] if items else None
    final = last is not None and last.get("type") == "agent_message" and bool(last.get("text"))
    return {**turn, "items": out, "has_final_answer": final}


def is_conversation_cursor(cursor: str) -> bool:
    """Whether a history cursor was issued by a conversation page."""
    try:
        data = loads(base64.urlsafe_b64decode(cursor.encode()))
    except (ValueError, TypeError):  # not ours: decode_cursor reports it
        return False
    return isinstance(data, dict) and data.get("v") == "conversation"


def conversation_page(thread_id: str, turns: list[dict], end: int, limit: int) -> dict:
    """The conversation page of the turns before ``turns[end]``: ``{turns, has_more,
    history_cursor, items_view: "conversation"}``."""
    window_start = max(0, end - limit)
    projected = [conversation_turn(t) for t in turns[window_start:end]]
    start = page_start(projected, len(projected), limit, CONVERSATION_PAGE_BYTES)
    page = projected[start:]
    has_more = window_start + start > 0
    cursor = None
    if has_more and page:
        raw = loads(base64.urlsafe_b64decode(encode_cursor(thread_id, page[0]["id"]).encode()))
        cursor = base64.urlsafe_b64encode(dumps({**raw, "v": "conversation"})).decode()
    return {"turns": page, "has_more": has_more, "history_cursor": cursor, "items_view": "conversation"}


def _activity_cursor(thread_id: str, item_id: str, next_id: str) -> str:
    return base64.urlsafe_b64encode(dumps({"t": thread_id, "a": item_id, "n": next_id})).decode()


def _decode_activity_cursor(cursor: str, thread_id: str, item_id: str) -> str:
    try:
        data = loads(base64.urlsafe_b64decode(cursor.encode()))
        ok = (
            isinstance(data, dict)
            and data.get("t") == thread_id
            and data.get("a") == item_id
            and isinstance(data.get("n"), str)
        )
    except (ValueError, TypeError):
        ok = False
    if not ok:
        raise InvalidParams("cursor is not an activity cursor of this summary")
    return data["n"]


@method("thread/activity/read")
async def activity_read(session: AppServerSession, params: Any) -> dict:
    """``thread/activity/read``: the detail items of a ``process_summary``, paged forward.

    Params: **thread_id**, **turn_id**, **item_id** (the summary id), **last_item_id** (its
    ``activity.last_item_id``), ``cursor``. Result ``{thread_id, turn: {id, thread_id, status,
    items}, next_cursor}``.

    Raises:
        ThreadNotFound, TurnNotFound: no such thread or turn.
        InvalidParams: the boundary was removed or regrouped, or a foreign cursor.
    """
    p = check_params(
        "thread/activity/read",
        params,
        {
            "thread_id": (STR, True),
            "turn_id": (STR, True),
            "item_id": (STR, True),
            "last_item_id": (STR, True),
            "cursor": (STR, False),
        },
    )
    snapshot = await thread_snapshot(session, p["thread_id"])
    turn = next((t for t in snapshot["turns"] if t["id"] == p["turn_id"]), None)
    if turn is None:
        raise TurnNotFound(f"thread {p['thread_id']} has no turn {p['turn_id']}")
    items = list(turn.get("items") or ())
    region = next((items[a:b] for a, b in _regions(items) if items[a]["id"] == p["item_id"]), None)
    if region is None or turn.get("status") in _ACTIVE or region[-1]["id"] != p["last_item_id"]:
        raise InvalidParams(
            f"the activity {p['item_id']}..{p['last_item_id']} no longer exists in turn "
            f"{p['turn_id']} (edited, or regrouped); read the conversation again"
        )
    index = 0
    if p.get("cursor"):
        next_id = _decode_activity_cursor(p["cursor"], p["thread_id"], p["item_id"])
        ids = [i["id"] for i in region]
        if next_id not in ids:
            raise InvalidParams("the cursor's boundary was removed from this activity")
        index = ids.index(next_id)
    page: list[dict] = []
    size = 0
    while index < len(region) and len(page) < ACTIVITY_PAGE_ITEMS:
        item = copy.deepcopy(region[index])
        defer_item(item, p["thread_id"], p["turn_id"])
        cost = len(dumps(item))
        if page and size + cost > HISTORY_PAGE_BYTES:
            break
        page.append(item)
        size += cost
        index += 1
    next_cursor = _activity_cursor(p["thread_id"], p["item_id"], region[index]["id"]) if index < len(region) else None
    return {
        "thread_id": p["thread_id"],
        "turn": {"id": turn["id"], "thread_id": p["thread_id"], "status": turn["status"], "items": page},
        "next_cursor": next_cursor,
    }
