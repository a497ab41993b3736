"""``thread/attachment/read`` (app-server-protocol.md, "Session methods": published image
snapshots): an attachment of a stored item, by identity, never by path.

The client names ``kind: "artifact"``, the ``thread_id``, ``turn_id`` and ``item_id`` of the item,
the ``content_index`` of the attachment (its index in ``images``; a file (PDF) in ``files``
counts on after the images) and its ``sha256`` (of the decoded bytes, as the item reports it).
The server finds that item in the store, checks that it belongs to that thread and turn, that
the attachment at that index has that digest, and reads the immutable
bytes from the content-addressed blob store (:mod:`roost.storage._blobs`). There is no path
parameter (an unknown param is ``invalid_params``), so a client can never make the server read a
file.

Results: original content in base64 chunks of at most :data:`CHUNK_BYTES` (128 KiB) of decoded
bytes, ``{..., content_type, offset, total, data, next_offset}`` (``next_offset`` null on the last
chunk); independent offsets may be read concurrently. ``preview: true`` returns a JPEG thumbnail
no larger than :data:`PREVIEW_PIXELS` on either side (Pillow), ``{..., preview: true,
content_type: "image/jpeg", width, height, offset: 0, total, data}``.
"""

from __future__ import annotations

import base64
import hashlib
import io
from typing import Any

import trio

from roost.errors import InvalidParams, NotFound, Unsupported
from roost.protocol._appserver import AppServerSession, method
from roost.protocol._as_common import read_store
from roost.protocol._params import BOOL, INT, STR, check_params
from roost.storage import get_item, get_thread, read_blob, read_blob_chunk

__all__ = ["CHUNK_BYTES", "PREVIEW_PIXELS", "make_preview"]

#: Largest chunk of decoded bytes one response carries (app-server-protocol.md: 128 KiB).
CHUNK_BYTES = 128 * 1024
#: A preview's longest side, in pixels.
PREVIEW_PIXELS = 320
#: JPEG quality of previews (Pillow's 1..95 scale).
PREVIEW_QUALITY = 80


def make_preview(raw: bytes) -> tuple[bytes, int, int]:
    """A JPEG thumbnail of image bytes: ``(jpeg bytes, width, height)``, longest side at most
    :data:`PREVIEW_PIXELS`.

    Raises:
        InvalidParams: the bytes are not an image Pillow can decode (or a decompression bomb).
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as image:
            image.thumbnail((PREVIEW_PIXELS, PREVIEW_PIXELS))
            rgb = image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidParams(f"cannot make a preview of this attachment: {exc}") from None
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=PREVIEW_QUALITY)
    return out.getvalue(), rgb.width, rgb.height


def _attachments(payload: Any) -> list:
    """An item's attachments in content order: its ``images``, then its ``files`` (PDFs)."""
    if not isinstance(payload, dict):
        return []
    return [*(payload.get("images") or ()), *(payload.get("files") or ())]


def _check_image(images: Any, p: dict) -> dict:
    index = p["content_index"]
    if not isinstance(images, list) or not 0 <= index < len(images):
        raise InvalidParams(f"item {p['item_id']!r} has no attachment at content_index {index}")
    image = images[index]
    if not isinstance(image, dict) or image.get("sha256") != p["sha256"]:
        raise InvalidParams("sha256 does not match the stored attachment at that content_index")
    return image


def _locate(conn: Any, p: dict) -> dict | None:
    """The image reference ``p`` names, checked against the stored item (read-only); None when the
    item is not in the store.

    Raises:
        InvalidParams: see :func:`attachment_read`.
    """
    try:
        get_thread(conn, p["thread_id"])
    except NotFound:
        return None  # not stored: an ephemeral thread's (else thread_not_found from memory)
    try:
        item = get_item(conn, p["item_id"])
    except NotFound:
        return None  # not stored (an ephemeral thread): look in memory
    if item.thread_id != p["thread_id"] or item.turn_id != p["turn_id"]:
        raise InvalidParams(f"item {p['item_id']!r} is not in turn {p['turn_id']!r} of thread {p['thread_id']!r}")
    return _check_image(_attachments(item.payload), p)


async def _in_memory(session: AppServerSession, p: dict) -> tuple[str, bytes]:
    """The bytes of an attachment of an item that is not stored (an ephemeral thread's), from the
    loaded thread's snapshot, checked against ``sha256``.

    Raises:
        ThreadNotFound, InvalidParams: as :func:`attachment_read`.
    """
    from roost.protocol._as_content import find_item

    item = await find_item(session, p["thread_id"], p["turn_id"], p["item_id"])
    image = _check_image(_attachments(item), p)
    raw = base64.b64decode(image.get("data") or "")
    if hashlib.sha256(raw).hexdigest() != p["sha256"]:
        raise InvalidParams("the attachment bytes do not match their sha256")
    return str(image.get("media_type") or "application/octet-stream"), raw


@method("thread/attachment/read")
async def attachment_read(session: AppServerSession, params: Any) -> dict:
    """``thread/attachment/read``: a chunk (or a preview) of a stored image attachment.

    Params: **kind** (``artifact``), **thread_id**, **turn_id**, **item_id**, **content_index**,
    **sha256**, ``offset`` (decoded bytes, default 0), ``preview``. Result: see the module
    docstring.

    Raises:
        ThreadNotFound: no such thread.
        InvalidParams: a missing/unknown param, no such item in that thread and turn, no image at
            ``content_index``, a digest that does not match, an offset past the end, or bytes
            that no longer hash to the digest.
        Unsupported: another ``kind``.
    """
    p = check_params(
        "thread/attachment/read",
        params,
        {
            "kind": (STR, True),
            "thread_id": (STR, True),
            "turn_id": (STR, True),
            "item_id": (STR, True),
            "content_index": (INT, True),
            "sha256": (STR, True),
            "offset": (INT, False),
            "preview": (BOOL, False),
        },
    )
    if p["kind"] != "artifact":
        raise Unsupported(f'attachment kind {p["kind"]!r} is not supported; Roost serves kind: "artifact"')
    offset = p.get("offset") or 0
    if offset < 0:
        raise InvalidParams("offset must be >= 0")
    memory = None if await read_store(session, _locate, p) is not None else await _in_memory(session, p)
    base = {
        "thread_id": p["thread_id"],
        "turn_id": p["turn_id"],
        "item_id": p["item_id"],
        "content_index": p["content_index"],
        "sha256": p["sha256"],
    }
    if p.get("preview"):
        blob = memory if memory is not None else await read_store(session, read_blob, p["sha256"])
        if blob is None or hashlib.sha256(blob[1]).hexdigest() != p["sha256"]:
            raise InvalidParams("the stored attachment bytes are missing or do not match their sha256")
        jpeg, width, height = await trio.to_thread.run_sync(make_preview, blob[1])
        return {
            **base,
            "preview": True,
            "content_type": "image/jpeg",
            "width": width,
            "height": height,
            "offset": 0,
            "total": len(jpeg),
            "data": base64.b64encode(jpeg).decode(),
            "next_offset": None,
        }
    if memory is not None:
        chunk = (memory[0], len(memory[1]), memory[1][offset : offset + CHUNK_BYTES])
    else:
        chunk = await read_store(session, read_blob_chunk, p["sha256"], offset, CHUNK_BYTES)
    if chunk is None:
        raise InvalidParams("the stored attachment bytes are missing")
    content_type, total, data = chunk
    if offset > total:
        raise InvalidParams(f"offset {offset} is past the end of the attachment ({total} bytes)")
    end = offset + len(data)
    return {
        **base,
        "preview": False,
        "content_type": content_type,
        "offset": offset,
        "total": total,
        "data": base64.b64encode(data).decode(),
        "next_offset": end if end < total else None,
    }
