"""Issue 18, findings 2 and 3: a crash at a bad moment leaves nothing unknown or unsettled.

The kills land at exact points through ``ROOST_FAULTS`` (:mod:`roost._faults`), so each test hits
the moment a random kill hits only sometimes.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest
import trio
from _helpers.appserver import open_app_server, script_env
from _helpers.timing import scaled

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and prctl")

SCRIPT = r"""
rules:
  - match: {prompt: "^spawn (.*)$"}
    steps:
      - - {tool_call: {name: shell, arguments: {command: "sleep 300 & echo $! > {pidfile}; kill -9 $PPID; wait"}}}
      - - {text: "done"}
default: echo
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] not in (b"Z", b"X")


def _db_rows(home: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(home / "roost.db")
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


async def test_a_run_killed_during_run_start_is_settled_at_restart(tmp_path: Path, roost_home: Path) -> None:
    env = script_env(tmp_path, roost_home, "default: echo\n")
    async with open_app_server(env={**env, "ROOST_FAULTS": "run.accepted=kill"}, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        await client.send({"id": "r1", "method": "run/start", "params": {"thread_id": tid, "prompt": "hi"}})
        with trio.fail_after(scaled(30)):
            assert await client.process.wait() == -9
    [(run_id, status)] = _db_rows(roost_home, "SELECT id, status FROM runs WHERE kind = 'run'")
    assert status == "accepted"   # the crash left it there
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        stored = (await client.request("run/interrupt", {"run_id": run_id}))["run"]
        assert stored["status"] == "interrupted"
        assert "ended before" in stored["error"]["message"]
        # the thread is usable again
        done = await client.run_turn(tid, "again")
        assert done["turn"]["status"] == "completed"
    assert _db_rows(roost_home, "SELECT status FROM runs WHERE status IN ('accepted', 'running')") == []


@linux_only
async def test_a_tool_process_started_just_before_a_kill_is_reaped_at_restart(tmp_path: Path,
                                                                              roost_home: Path) -> None:
    pidfile = tmp_path / "job.pid"
    env = script_env(tmp_path, roost_home, SCRIPT.replace("{pidfile}", str(pidfile)))
    # Stall right after the fork: the command then kills Roost before anything else happens.
    crashing = {**env, "ROOST_FAULTS": "tool.spawned=stall"}
    job = None
    try:
        async with open_app_server(env=crashing, cwd=tmp_path) as client:
            await client.initialize()
            tid = (await client.request("thread/start", {"cwd": str(tmp_path),
                                                         "permission_mode": "unconfined"}))["thread"]["id"]
            await client.send({"id": "t1", "method": "turn/start", "params": {"thread_id": tid, "prompt": "spawn x"}})
            with trio.fail_after(scaled(30)):
                assert await client.process.wait() == -9
        job = int(pidfile.read_text())
        assert _alive(job)   # PDEATHSIG reached sh, not its background child: the store must know it
        async with open_app_server(env=env, cwd=tmp_path) as client:
            await client.initialize()
            with trio.fail_after(scaled(20)):
                while _alive(job):
                    await trio.sleep(0.05)
        assert _db_rows(roost_home, "SELECT * FROM tool_processes") == []
    finally:
        if job is not None and _alive(job):
            os.kill(job, 9)


async def test_a_crashed_thread_actor_does_not_end_a_vscode_chat(tmp_path: Path, roost_home: Path) -> None:
    from test_repl import open_repl

    env = script_env(tmp_path, roost_home, "default: echo\n")
    async with open_repl({**env, "ROOST_FAULTS": "thread.StartTurn=raise"}, tmp_path) as repl:
        await repl.wait("ready")
        start = await repl.say("first")
        error = await repl.wait("error", start=start)
        assert "crash" in error["text"].lower() or "fault" in error["text"].lower(), error
        # The chat keeps working: the next input gets a reply, not MailboxClosed.
        start = await repl.say("second")
        end = await repl.wait("message_end", start=start)
        later = repl.events[start:end["_index"] + 1]
        assert not any("MailboxClosed" in (e.get("text") or "") for e in later), later
        assert "second" in json.dumps(later)
        assert await repl.close() == 0
