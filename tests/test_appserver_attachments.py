"""End-to-end: image attachments are stored once as sha256-addressed blobs and read back with
``thread/attachment/read`` (chunks and a JPEG preview) over the real ``roost app-server``."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import random
import sqlite3
from pathlib import Path

from _helpers.appserver import expect_error, open_app_server, scripted_env
from PIL import Image

CHUNK = 128 * 1024


def _noise_png(width: int, height: int) -> bytes:
    rng = random.Random(7)
    image = Image.frombytes("RGB", (width, height), bytes(rng.getrandbits(8) for _ in range(width * height * 3)))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


async def test_attachment_blobs_chunks_and_preview(tmp_path: Path, roost_home: Path) -> None:
    raw = _noise_png(400, 300)  # incompressible: several 128 KiB chunks
    digest = hashlib.sha256(raw).hexdigest()
    image = {"media_type": "image/png", "data": base64.b64encode(raw).decode()}
    async with open_app_server(env=scripted_env(roost_home), cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        first = (await client.run_turn(tid, "look", images=[image]))["turn"]
        await client.run_turn(tid, "look again", images=[image])  # the same bytes: stored once
        user = first["items"][0]
        assert user["images"][0]["sha256"] == digest
        ref = {"kind": "artifact", "thread_id": tid, "turn_id": first["id"], "item_id": user["id"],
               "content_index": 0, "sha256": digest}
        # chunks at independent offsets, requested concurrently, reassembled by offset
        total = len(raw)
        offsets = list(range(0, total, CHUNK))
        assert len(offsets) >= 3
        # all sent before any answer is read: the server handles them concurrently
        for offset in reversed(offsets):
            await client.send({"id": f"chunk-{offset}", "method": "thread/attachment/read",
                               "params": {**ref, "offset": offset}})
        chunks: dict[int, dict] = {}
        for offset in offsets:
            reply = await client.wait_line(lambda m, o=offset: m.get("id") == f"chunk-{o}")
            chunks[offset] = reply["result"]
        whole = b""
        for offset in offsets:
            chunk = chunks[offset]
            assert chunk["offset"] == offset and chunk["total"] == total and chunk["content_type"] == "image/png"
            data = base64.b64decode(chunk["data"])
            assert len(data) <= CHUNK
            whole += data
        assert hashlib.sha256(whole).hexdigest() == digest and chunks[offsets[-1]]["next_offset"] is None
        assert chunks[0]["next_offset"] == CHUNK
        preview = await client.request("thread/attachment/read", {**ref, "preview": True})
        assert preview["content_type"] == "image/jpeg" and preview["preview"] is True
        thumb = Image.open(io.BytesIO(base64.b64decode(preview["data"])))
        assert thumb.format == "JPEG" and max(thumb.size) <= 320 and (preview["width"], preview["height"]) == thumb.size
        # identity is checked; no path can be named
        await expect_error(client, "thread/attachment/read", {**ref, "sha256": "0" * 64}, "invalid_params",
                           contains="sha256")
        await expect_error(client, "thread/attachment/read", {**ref, "content_index": 1}, "invalid_params")
        await expect_error(client, "thread/attachment/read", {**ref, "turn_id": "turn_other"}, "invalid_params")
        await expect_error(client, "thread/attachment/read", {**ref, "path": "/etc/passwd"}, "invalid_params",
                           contains="path")
        await expect_error(client, "thread/attachment/read", {**ref, "offset": total + 1}, "invalid_params")
        await expect_error(client, "thread/attachment/read", {**ref, "kind": "file"}, "unsupported")
        await expect_error(client, "thread/attachment/read", {**ref, "thread_id": "thr_nope"}, "thread_not_found")
    # after a restart the history still carries the image (hydrated from its blob)
    async with open_app_server(env=scripted_env(roost_home), cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": tid, "response_only": True})
        stored = snap["turns"][0]["items"][0]["images"][0]
        assert stored["sha256"] == digest and base64.b64decode(stored["data"]) == raw
    db = sqlite3.connect(roost_home / "roost.db")
    try:
        assert db.execute("SELECT COUNT(*), MAX(size) FROM blobs").fetchone() == (1, len(raw))
        payloads = [json.loads(p) for (p,) in db.execute("SELECT payload FROM items WHERE type = 'user_message'")]
        assert len(payloads) == 2 and all("data" not in p["images"][0] for p in payloads)  # not inline
    finally:
        db.close()
