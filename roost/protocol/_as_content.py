"""Deferred notification content (app-server-protocol.md, "Transport and initialization") and
``thread/content/read``.

A client that sets ``capabilities.deferred_notification_content: true`` in ``initialize`` gets
large content as references in terminal turn notifications (``turn/completed``, ``turn/error``)
and in thread snapshots carried by notifications (``thread/started`` of a paged fork). Item
identities, order, membership and status stay complete; RPC responses and stored history are
unchanged. References:

- an item's ``text``, ``output`` or ``arguments`` string longer than :data:`DEFER_BYTES` (UTF-8)
  becomes ``{type: "content_ref", method: "thread/content/read", thread_id, turn_id, item_id,
  field, bytes, sha256}``; ``thread/content/read`` with those ids and ``field`` returns it;
- each image in ``images`` becomes ``{type: "attachment_ref", method: "thread/attachment/read",
  kind: "artifact", thread_id, turn_id, item_id, content_index, sha256, media_type, size}``;
  ``thread/attachment/read`` with those fields returns its bytes; each file (PDF) in ``files``
  too, its ``content_index`` counting on after the images.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from roost._json import dumps_line, loads
from roost.errors import InvalidParams, NotFound
from roost.protocol._appserver import AppServerSession, method
from roost.protocol._as_common import read_store, thread_actor, thread_snapshot
from roost.protocol._params import STR, check_params
from roost.storage import get_item

__all__ = ["DEFERRED_FIELDS", "DEFER_BYTES", "defer_item", "defer_line", "find_item"]

#: Item strings longer than this (UTF-8 bytes) travel as references to deferring clients.
DEFER_BYTES = 16 * 1024
#: The item fields that may be deferred (and that ``thread/content/read`` serves).
DEFERRED_FIELDS = ("text", "output", "arguments")
_DEFERRED_METHODS = (b'"method":"turn/completed"', b'"method":"turn/error"', b'"method":"thread/started"')


def defer_item(item: dict, thread_id: str | None, turn_id: str | None) -> None:
    """Replace, in place, ``item``'s strings over :data:`DEFER_BYTES` and its images by references."""
    ids = {"thread_id": thread_id, "turn_id": turn_id, "item_id": item.get("id")}
    for field in DEFERRED_FIELDS:
        value = item.get(field)
        if isinstance(value, str):
            raw = value.encode()
            if len(raw) > DEFER_BYTES:
                item[field] = {
                    "type": "content_ref",
                    "method": "thread/content/read",
                    **ids,
                    "field": field,
                    "bytes": len(raw),
                    "sha256": hashlib.sha256(raw).hexdigest(),
                }
    images = item.get("images")
    if isinstance(images, list):
        item["images"] = [_image_ref(image, index, ids) for index, image in enumerate(images)]
    files = item.get("files")  # PDFs: content_index counts on after the images
    if isinstance(files, list):
        first = len(images) if isinstance(images, list) else 0
        item["files"] = [_image_ref(f, first + index, ids) for index, f in enumerate(files)]


def _image_ref(image: Any, index: int, ids: dict) -> Any:
    if not isinstance(image, dict) or not isinstance(image.get("data"), str):
        return image
    digest, size = image.get("sha256"), image.get("size")
    if not isinstance(digest, str) or not isinstance(size, int):
        try:
            raw = base64.b64decode(image["data"])
        except (binascii.Error, ValueError):
            return image
        digest, size = hashlib.sha256(raw).hexdigest(), len(raw)
    return {
        "type": "attachment_ref",
        "method": "thread/attachment/read",
        "kind": "artifact",
        **ids,
        "content_index": index,
        "sha256": digest,
        "media_type": image.get("media_type"),
        "size": size,
    }


def _defer_turn(turn: Any, thread_id: str | None) -> None:
    if isinstance(turn, dict) and isinstance(turn.get("items"), list):
        for item in turn["items"]:
            if isinstance(item, dict):
                defer_item(item, thread_id, turn.get("id"))


def defer_line(line: bytes) -> bytes:
    """``line`` (one notification) with large content replaced by references, for a client that
    opted into ``deferred_notification_content``; other lines are returned unchanged."""
    head = line[:48]
    if not any(m in head for m in _DEFERRED_METHODS):
        return line
    if b'"images"' not in line and b'"files"' not in line and len(line) <= DEFER_BYTES:
        return line  # nothing in it can be large
    message = loads(line)
    params = message.get("params") or {}
    thread_id = params.get("thread_id") or (params.get("thread") or {}).get("id")
    _defer_turn(params.get("turn"), thread_id)
    for turn in params.get("turns") or ():
        _defer_turn(turn, thread_id)
    return dumps_line(message)


async def find_item(session: AppServerSession, thread_id: str, turn_id: str, item_id: str) -> dict:
    """The item view ``{id, type, ..., payload fields}``: from the store, else (an ephemeral or
    not yet persisted item) from the loaded thread's snapshot.

    Raises:
        ThreadNotFound: no such thread. InvalidParams: no such item in that thread and turn.
    """

    def stored(conn: Any) -> dict | None:
        try:
            item = get_item(conn, item_id)
        except NotFound:
            return None
        return {"thread_id": item.thread_id, "turn_id": item.turn_id, **(item.payload or {})}

    await thread_actor(session, thread_id)  # ThreadNotFound first
    found = await read_store(session, stored)
    if found is None:
        snapshot = await thread_snapshot(session, thread_id)
        for turn in snapshot.get("turns") or ():
            for item in turn.get("items") or ():
                if item.get("id") == item_id:
                    found = dict(item)
    if found is None or found.get("thread_id") != thread_id or found.get("turn_id") != turn_id:
        raise InvalidParams(f"no item {item_id!r} in turn {turn_id!r} of thread {thread_id!r}")
    return found


@method("thread/content/read")
async def content_read(session: AppServerSession, params: Any) -> dict:
    """``thread/content/read``: resolve a ``content_ref`` (module docstring).

    Params: **thread_id**, **turn_id**, **item_id**, **field** (``text``, ``output`` or
    ``arguments``). Result ``{thread_id, turn_id, item_id, field, content, bytes, sha256}``.

    Raises:
        ThreadNotFound: no such thread.
        InvalidParams: an unknown field, no such item in that thread and turn, or the item has no
            string in that field.
    """
    p = check_params(
        "thread/content/read",
        params,
        {
            "thread_id": (STR, True),
            "turn_id": (STR, True),
            "item_id": (STR, True),
            "field": (STR, True),
        },
    )
    if p["field"] not in DEFERRED_FIELDS:
        raise InvalidParams(f"field must be one of {', '.join(DEFERRED_FIELDS)}")
    item = await find_item(session, p["thread_id"], p["turn_id"], p["item_id"])
    content = item.get(p["field"])
    if not isinstance(content, str):
        raise InvalidParams(f"item {p['item_id']!r} has no {p['field']} content")
    raw = content.encode()
    return {
        "thread_id": p["thread_id"],
        "turn_id": p["turn_id"],
        "item_id": p["item_id"],
        "field": p["field"],
        "content": content,
        "bytes": len(raw),
        "sha256": hashlib.sha256(raw).hexdigest(),
    }
