"""Content-addressed attachment blobs: an item's image and file (PDF) bytes are stored once, by sha256.

app-server-protocol.md ("Attachments", ``thread/attachment/read``): attachments are kept as
immutable bytes addressed by the sha256 of the decoded bytes, not inline in every item. The item
store calls :func:`externalize` before writing a payload (each ``images[i]`` with base64 ``data``
becomes ``{media_type, sha256, size, original?}`` plus one ``blobs`` row, ``ON CONFLICT DO NOTHING`` so
the same bytes are stored once) and :func:`hydrate` after reading one (the ``data`` is put back
from its blob), so every reader of items sees the same shape as before, with ``sha256`` added.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from ._portable import execute
from ._rows import utc_now

__all__ = ["externalize", "hydrate", "read_blob", "read_blob_chunk"]


#: The payload fields holding attachments: images, and files the provider reads (PDFs).
_FIELDS = ("images", "files")


def _images(payload: Any, field: str = "images") -> list | None:
    if isinstance(payload, dict):
        images = payload.get(field)
        if isinstance(images, list) and images:
            return images
    return None


def externalize(conn: Any, payload: Any) -> Any:
    """``payload`` with each inline attachment (in ``images`` and ``files``) replaced by a blob
    reference (write; stores the blobs).

    Attachments without base64 ``data`` (already references) and undecodable data are kept as
    they are. Returns ``payload`` itself when it has no attachments.
    """
    for field in _FIELDS:
        payload = _externalize(conn, payload, field)
    return payload


def _externalize(conn: Any, payload: Any, field: str) -> Any:
    images = _images(payload, field)
    if images is None:
        return payload
    out = []
    for image in images:
        if not isinstance(image, dict) or not isinstance(image.get("data"), str):
            out.append(image)
            continue
        try:
            raw = base64.b64decode(image["data"], validate=True)
        except (binascii.Error, ValueError):
            out.append(image)
            continue
        import hashlib  # ~3 ms to import, only for a blob's digest (issue 19: start-up)

        digest = hashlib.sha256(raw).hexdigest()
        media = str(image.get("media_type") or "application/octet-stream")
        execute(
            conn,
            "INSERT INTO blobs (sha256, content_type, size, data, created_at) VALUES (?, ?, ?, ?, ?)"
            " ON CONFLICT (sha256) DO NOTHING",
            (digest, media, len(raw), raw, utc_now()),
        )
        ref = {k: v for k, v in image.items() if k != "data"}
        ref.update(sha256=digest, size=len(raw), media_type=media)
        out.append(ref)
    return {**payload, field: out}


def hydrate(conn: Any, payload: Any) -> Any:
    """``payload`` with each attachment reference's base64 ``data`` read back from its blob
    (read-only).

    A reference whose blob is missing keeps no ``data`` (and gets ``missing: true``).
    """
    for field in _FIELDS:
        payload = _hydrate(conn, payload, field)
    return payload


def _hydrate(conn: Any, payload: Any, field: str) -> Any:
    images = _images(payload, field)
    if images is None or not any(isinstance(i, dict) and "data" not in i and "sha256" in i for i in images):
        return payload
    out = []
    for image in images:
        if isinstance(image, dict) and "data" not in image and isinstance(image.get("sha256"), str):
            row = execute(conn, "SELECT data FROM blobs WHERE sha256 = ?", (image["sha256"],)).fetchone()
            image = {**image, "data": base64.b64encode(row[0]).decode()} if row else {**image, "missing": True}
        out.append(image)
    return {**payload, field: out}


def read_blob(conn: Any, sha256: str) -> tuple[str, bytes] | None:
    """``(content_type, bytes)`` of a blob, or None (read-only)."""
    row = execute(conn, "SELECT content_type, data FROM blobs WHERE sha256 = ?", (sha256,)).fetchone()
    return (row[0], bytes(row[1])) if row else None


def read_blob_chunk(conn: Any, sha256: str, offset: int, size: int) -> tuple[str, int, bytes] | None:
    """``(content_type, total bytes, bytes[offset:offset+size])`` of a blob, or None (read-only).

    Reads only the requested range (SQLite ``substr`` on the BLOB, 1-based).
    """
    row = execute(
        conn, "SELECT content_type, size, substr(data, ?, ?) FROM blobs WHERE sha256 = ?", (offset + 1, size, sha256)
    ).fetchone()
    return (row[0], int(row[1]), bytes(row[2] or b"")) if row else None
