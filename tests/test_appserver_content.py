"""End-to-end: ``capabilities.deferred_notification_content`` sends large content as references
in terminal turn notifications, and ``thread/content/read`` / ``thread/attachment/read`` resolve
them, over the real ``roost app-server``."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest
from _helpers.appserver import expect_error, open_app_server, script_env

LONG = "word " * 5000  # 25 000 bytes: over the 16 KiB threshold
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
SCRIPT = f"""
rules:
  - match: {{prompt: "^big"}}
    steps:
      - - {{tool_call: {{name: read_file, arguments: {{path: big.txt}}}}}}
      - - {{text: "{LONG}"}}
default: echo
"""


@pytest.mark.parametrize("ephemeral", [False, True])
async def test_deferred_content_references_resolve(tmp_path: Path, roost_home: Path, ephemeral: bool) -> None:
    (tmp_path / "big.txt").write_text("line of the big file\n" * 2000)
    env = script_env(tmp_path, roost_home, SCRIPT)
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize(capabilities={"deferred_notification_content": True})
        tid = (await client.request("thread/start", {"cwd": str(tmp_path), "ephemeral": ephemeral}))["thread"]["id"]
        start = len(client.lines)
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "big please",
                                                    "images": [{"media_type": "image/png", "data": PIXEL}]}))["turn"]
        done = (await client.wait_terminal(turn["id"], start=start))["turn"]
        assert done["status"] == "completed"
        types = [i["type"] for i in done["items"]]
        assert types == ["user_message", "tool_call", "agent_message"]  # identities and order complete
        user, tool, reply = done["items"]
        (image,) = user["images"]
        assert image["type"] == "attachment_ref" and "data" not in image
        out = tool["output"]
        assert out["type"] == "content_ref" and out["field"] == "output" and out["item_id"] == tool["id"]
        text = reply["text"]
        assert text["type"] == "content_ref" and text["bytes"] > 16 * 1024
        # the references resolve
        got = await client.request("thread/content/read", {k: out[k] for k in ("thread_id", "turn_id", "item_id", "field")})
        assert "line of the big file" in got["content"] and hashlib.sha256(got["content"].encode()).hexdigest() == out["sha256"]
        got = await client.request("thread/content/read", {k: text[k] for k in ("thread_id", "turn_id", "item_id", "field")})
        assert got["content"].strip() == LONG.strip() and got["bytes"] == text["bytes"]
        params = {k: image[k] for k in ("kind", "thread_id", "turn_id", "item_id", "content_index", "sha256")}
        chunk = await client.request("thread/attachment/read", params)  # an ephemeral thread's too (in memory)
        assert base64.b64decode(chunk["data"]) == base64.b64decode(PIXEL) and chunk["next_offset"] is None
        # RPC responses are unchanged: the snapshot carries the content inline
        snap = await client.request("thread/resume", {"session_id": tid, "response_only": True})
        assert isinstance(snap["turns"][0]["items"][1]["output"], str)
        await expect_error(client, "thread/content/read", {**{k: out[k] for k in ("thread_id", "turn_id", "item_id")},
                                                           "field": "payload"}, "invalid_params")
        await expect_error(client, "thread/content/read", {"thread_id": tid, "turn_id": "turn_x",
                                                           "item_id": tool["id"], "field": "output"}, "invalid_params")


async def test_without_the_capability_content_is_inline(tmp_path: Path, roost_home: Path) -> None:
    (tmp_path / "big.txt").write_text("line of the big file\n" * 2000)
    async with open_app_server(env=script_env(tmp_path, roost_home, SCRIPT), cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        done = (await client.run_turn(tid, "big please"))["turn"]
        assert isinstance(done["items"][1]["output"], str) and isinstance(done["items"][2]["text"], str)


async def test_paged_fork_history_in_thread_started_is_deferred(tmp_path: Path, roost_home: Path) -> None:
    (tmp_path / "big.txt").write_text("line of the big file\n" * 2000)
    async with open_app_server(env=script_env(tmp_path, roost_home, SCRIPT), cwd=tmp_path) as client:
        await client.initialize(capabilities={"deferred_notification_content": True})
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        await client.run_turn(tid, "big please")
        start = len(client.lines)
        fork = await client.request("thread/fork", {"thread_id": tid, "history_page": True})
        started = await client.wait_for("thread/started", lambda p: p["thread"]["id"] == fork["thread"]["id"],
                                        start=start)
        tool = started["turns"][0]["items"][1]
        assert tool["output"]["type"] == "content_ref"  # the notification's snapshot: a reference
        assert isinstance(fork["turns"][0]["items"][1]["output"], str)  # the RPC response: inline
        got = await client.request("thread/content/read", {k: tool["output"][k] for k in
                                                           ("thread_id", "turn_id", "item_id", "field")})
        assert "line of the big file" in got["content"]
