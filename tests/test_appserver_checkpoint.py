"""Streamed text survives a crash (issue 12, item 3): agent text and reasoning are checkpointed
through the group-commit writer while they stream; after kill -9 of `roost app-server` and a
restart, the reply's prefix is in the thread's history, marked interrupted with its turn."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import trio

from _helpers.appserver import open_app_server, scripted_env
from _helpers.timing import scaled

WORDS = [f"word{i}" for i in range(600)]
SLOW_TEXT = " ".join(WORDS)
SLOW_THOUGHT = " ".join(f"thought{i}" for i in range(40))


def write_script(path: Path) -> Path:
    script = {
        "rules": [
            {"match": {"prompt": "^slow"},
             "steps": [[{"reasoning": SLOW_THOUGHT, "tokens_per_second": 400},
                        {"text": SLOW_TEXT, "tokens_per_second": 20}]]},
            {"match": {"prompt": "^fast"}, "steps": [[{"text": "quick answer"}]]},
        ],
        "default": "echo",
    }
    path.write_text(json.dumps(script))
    return path


def stored_items(db: Path, turn_id: str) -> list[tuple[str, str, dict]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT type, status, payload FROM items WHERE turn_id = ? ORDER BY seq",
                            (turn_id,)).fetchall()
    return [(kind, status, json.loads(payload or "{}")) for kind, status, payload in rows]


async def wait_checkpointed(db: Path, turn_id: str, words: int) -> str:
    """Wait until the store holds the turn's agent message in progress with at least ``words``
    words (the checkpoints are asynchronous); return its stored text."""
    with trio.fail_after(scaled(60)):
        while True:
            for kind, status, payload in stored_items(db, turn_id):
                if kind == "agent_message" and status == "in_progress" and \
                        len(payload.get("text", "").split()) >= words:
                    return payload["text"]
            await trio.sleep(0.05)


async def wait_renewed(db: Path, key: str) -> None:
    """Wait until lease ``key``'s expiry moves (a renewal committed)."""
    def expiry() -> float:
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT expires_at FROM leases WHERE key = ?", (key,)).fetchone()[0]

    first = expiry()
    with trio.fail_after(scaled(10)):
        while expiry() == first:
            await trio.sleep(0.002)


async def test_kill_9_mid_reply_keeps_the_streamed_prefix(tmp_path, roost_home):
    env = scripted_env(roost_home, write_script(tmp_path / "script.json"))
    db = roost_home / "roost.db"
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        # A short reply settles with one write: no checkpoint row is ever left in progress.
        done = await client.run_turn(tid, "fast")
        assert [(k, s) for k, s, _ in stored_items(db, done["turn"]["id"])] == [
            ("user_message", "completed"), ("agent_message", "completed")]
        start = len(client.lines)
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "slow"}))["turn"]
        await client.wait_for("item/agentMessage/delta", start=start)
        stored = await wait_checkpointed(db, turn["id"], 5)
        deltas = [m["params"]["delta"] for m in client.lines[start:]
                  if m.get("method") == "item/agentMessage/delta"]
        # Checkpoints are batched: far fewer writes than deltas (the row is replaced in place).
        assert len(deltas) > 5 and len(stored_items(db, turn["id"])) == 3
        client.process.kill()  # SIGKILL: no clean-up at all
        await client.process.wait()
    assert SLOW_TEXT.startswith(stored)

    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": tid})
        killed = snap["turns"][-1]
        assert killed["id"] == turn["id"] and killed["status"] == "interrupted"
        kinds = [(i["type"], i["status"]) for i in killed["items"]]
        assert kinds == [("user_message", "completed"), ("reasoning", "interrupted"),
                         ("agent_message", "interrupted")]
        reasoning, message = killed["items"][1], killed["items"][2]
        assert reasoning["text"] == SLOW_THOUGHT  # streamed in full before the text began
        assert message["text"].startswith(stored) and SLOW_TEXT.startswith(message["text"])
        assert len(message["text"].split()) >= 5
        # The prefix is conversation history: the next turn runs after it and the thread lives on.
        after = await client.run_turn(tid, "fast")
        assert after["turn"]["status"] == "completed"
        snap = await client.request("thread/resume", {"session_id": tid})
        assert [i["text"] for i in snap["turns"][1]["items"] if i["type"] == "agent_message"] == [message["text"]]


async def test_checkpoints_are_fenced_by_the_lease_token(tmp_path, roost_home):
    env = scripted_env(roost_home, write_script(tmp_path / "script.json"), ROOST_LEASE_TTL="0.5")
    db = roost_home / "roost.db"
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        start = len(client.lines)
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "slow"}))["turn"]
        await wait_checkpointed(db, turn["id"], 3)
        # Right after a renewal (its expiry moves), so the turn streams on for most of a renewal
        # interval (ttl / 3) before it finds the lease lost: supersede just after one.
        await wait_renewed(db, f"thread:{tid}")
        # In one transaction: read the checkpoint, and let another owner supersede the lease.
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            before = conn.execute("SELECT payload FROM items WHERE turn_id = ? AND type = 'agent_message'",
                                  (turn["id"],)).fetchone()[0]
            conn.execute("UPDATE leases SET owner = 'intruder:1:x', token = token + 1, expires_at = ? "
                         "WHERE key = ?", (time.time() + 600, f"thread:{tid}"))
            conn.execute("COMMIT")
        finally:
            conn.close()
        done = await client.wait_terminal(turn["id"], start=start)
        assert done["turn"]["status"] == "interrupted" and done["turn"]["error"]["reason"] == "lease_lost"
        # Every checkpoint after the supersession was refused: the row is as the intruder found it.
        with sqlite3.connect(db) as conn:
            after = conn.execute("SELECT payload, status FROM items WHERE turn_id = ? AND type = 'agent_message'",
                                 (turn["id"],)).fetchone()
        assert after == (before, "in_progress")
        streamed = "".join(m["params"]["delta"] for m in client.lines[start:]
                           if m.get("method") == "item/agentMessage/delta")
        assert len(streamed) > len(json.loads(before)["text"])  # text streamed on, unsaved
