"""App-server views of domain rows (snake_case dicts, the shapes of app-server-protocol.md).

Items are stored with their view fields in ``payload`` so a view is one dict merge, and history for
the engines is rebuilt from the same rows (:func:`history_from_items`).
"""

from __future__ import annotations

from typing import Any

from roost.engines import (
    INTERRUPTED_OUTPUT,
    AgentMessage,
    Document,
    Image,
    Reasoning,
    ToolCall,
    ToolResult,
    UserMessage,
)

__all__ = [
    "thread_view",
    "turn_view",
    "item_view",
    "input_view",
    "history_from_items",
    "latest_compaction",
    "summary_message",
    "SUMMARY_PREFIX",
    "SUMMARY_SOURCE_ID",
    "item_payload",
    "user_item_view",
]

#: The text before a compaction's summary in the user message that stands for the compacted history.
SUMMARY_PREFIX = "Summary of the conversation so far: "
#: ``source_id`` of that (synthetic, Roost-injected) message.
SUMMARY_SOURCE_ID = "roost:compaction"


def thread_view(thread: Any, *, ephemeral: bool, status: str, active_turn_id: str | None) -> dict:
    """The ``thread`` object of thread/* results and notifications."""
    return {
        "id": thread.id,
        "kind": thread.kind,
        "title": thread.title,
        "cwd": thread.cwd,
        "provider": thread.provider,
        "model": thread.model,
        "effort": thread.effort,
        "permission_mode": thread.permission_mode,
        "pinned": bool(thread.pinned),
        "archived": bool(thread.archived),
        "ephemeral": ephemeral,
        "parent_thread_id": thread.parent_thread_id,
        "worktree": (thread.metadata or {}).get("worktree"),
        "workspace_id": (thread.metadata or {}).get("workspace_id"),
        "model_options": (thread.metadata or {}).get("model_options") or {},
        "status": status,
        "active_turn_id": active_turn_id,
        "created_at": thread.created_at,
        "updated_at": thread.updated_at,
    }


def turn_view(turn: dict) -> dict:
    """The ``turn`` object: id, thread_id, status, run_id, timestamps, error, usage, items."""
    return turn


def item_view(
    item_id: str,
    item_type: str,
    status: str,
    turn_id: str | None,
    thread_id: str,
    payload: dict | None,
    seq: int | None = None,
) -> dict:
    view: dict[str, Any] = {
        "id": item_id,
        "type": item_type,
        "status": status,
        "turn_id": turn_id,
        "thread_id": thread_id,
    }
    if seq is not None:
        view["seq"] = seq
    if payload:
        view.update(payload)
    return view


def item_payload(view: dict) -> tuple[dict, str | None]:
    """An item view's stored ``payload`` (every field without a column of its own, whatever the
    item type carries) and its searchable ``text`` (user and agent messages only)."""
    payload = {k: v for k, v in view.items() if k not in ("id", "type", "status", "turn_id", "thread_id", "seq")}
    text = view.get("text") if view["type"] in ("agent_message", "user_message") else None
    return payload, text


def user_item_view(
    thread_id: str, turn_id: str, prompt: str, *, source_id: str | None, images: Any = None, content_parts: Any = None
) -> dict:
    """A new ``user_message`` item view of turn ``turn_id`` (a fresh id; ``source_id``: the input's
    ``client_id``)."""
    from roost.storage import new_id

    view: dict[str, Any] = {
        "id": new_id("item"),
        "type": "user_message",
        "status": "completed",
        "turn_id": turn_id,
        "thread_id": thread_id,
        "text": prompt,
        "source_id": source_id,
    }
    view.update(attachment_fields(images))
    if content_parts is not None:
        view["content_parts"] = content_parts
    return view


def attachment_fields(attachments: Any) -> dict[str, list]:
    """The wire fields of a message's attachments (one tuple inside Roost, images and PDFs in
    order): ``{"images": [image/* ...], "files": [the others]}``, empty lists left out."""
    images = [a for a in attachments or () if str(a.get("media_type", "")).startswith("image/")]
    files = [a for a in attachments or () if not str(a.get("media_type", "")).startswith("image/")]
    return {k: v for k, v in (("images", images), ("files", files)) if v}


def attachments_of(entry: dict) -> tuple:
    """The attachment tuple of a user item or input ``entry`` (its ``images``, then its ``files``)."""
    return tuple(entry.get("images") or ()) + tuple(entry.get("files") or ())


def input_view(row: dict) -> dict:
    """A pending or held user input (turn/queued, held_user_messages...)."""
    return row


def latest_compaction(items: list[dict]) -> int:
    """The index in ``items`` (item views in thread order) of the latest completed ``compaction``
    item, or -1 when there is none."""
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if item["type"] == "compaction" and item.get("status", "completed") == "completed":
            return index
    return -1


def summary_message(item: dict) -> UserMessage:
    """The engine message standing for the history a ``compaction`` item replaced: a synthetic
    user message ``"Summary of the conversation so far: <summary>"``."""
    return UserMessage(text=SUMMARY_PREFIX + (item.get("text") or ""), synthetic=True)


def history_from_items(items: list[dict]) -> list:
    """Engine history from item views in thread order.

    History starts at the latest completed ``compaction`` item: the model sees its summary as a
    synthetic user message (:func:`summary_message`), then the items after it; the items before it
    stay in the thread (the transcript is append-only) but leave the model's context.

    Consecutive tool calls (one model response asking for several tools) come first, then their
    results in the same order, as providers expect; every call gets a result (an interrupted one an
    error result).
    """
    history: list = []
    results: list = []  # results of the current run of tool calls
    start = latest_compaction(items)
    if start >= 0:
        history.append(summary_message(items[start]))
        items = items[start + 1 :]

    def flush() -> None:
        history.extend(results)
        results.clear()

    for item in items:
        kind = item["type"]
        if kind != "tool_call":
            flush()
        if kind == "user_message":
            images = tuple(
                Image(media_type=i.get("media_type", "image/png"), data=i.get("data", ""))
                for i in item.get("images") or ()
            )
            documents = tuple(
                Document(
                    media_type=f.get("media_type", "application/pdf"),
                    data=f.get("data", ""),
                    filename=f.get("filename"),
                )
                for f in item.get("files") or ()
            )
            synthetic = str(item.get("source_id") or "").startswith("roost:")
            history.append(
                UserMessage(text=item.get("text") or "", images=images, synthetic=synthetic, documents=documents)
            )
        elif kind == "agent_message":
            if item.get("text"):
                history.append(AgentMessage(text=item["text"]))
        elif kind == "reasoning":
            replay = item.get("replay") or {}
            if item.get("text") or replay.get("items"):
                history.append(
                    Reasoning(
                        text=item.get("text") or "", provider=replay.get("provider"), items=replay.get("items") or ()
                    )
                )
        elif kind == "tool_call":
            history.append(
                ToolCall(
                    call_id=item.get("call_id") or item["id"], name=item["name"], arguments=item.get("arguments") or {}
                )
            )
            output = item.get("output")
            if output is None:
                output, is_error = INTERRUPTED_OUTPUT, True
            else:
                is_error = bool(item.get("is_error"))
            results.append(ToolResult(call_id=item.get("call_id") or item["id"], output=output, is_error=is_error))
    flush()
    return history
