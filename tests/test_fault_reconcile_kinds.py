"""Issue 18, finding 3, per kind: a kill -9 at the state a row is non-terminal in, then a restart
that settles it (runs: tests/test_fault_crash_settles.py; turns, items: test_appserver_durability;
workers: test_workers; leases and every kind on both backends: test_store).

Each kill lands exactly at its state through ``ROOST_FAULTS`` (:mod:`roost._faults`).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import pytest
import trio
from _helpers.appserver import open_app_server, script_env
from _helpers.serve_client import open_daemon
from _helpers.timing import scaled

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and prctl")

BACKGROUND = r"""
rules:
  - match: {prompt: "^bg"}
    steps:
      - - {tool_call: {name: shell, arguments: {background: true,
                                                 command: "sleep 300 & echo $! > {pidfile}; kill -9 $PPID; wait"}}}
      - - {text: "started"}
default: echo
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2:].split()[0] not in (b"Z", b"X")


def _rows(home: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(home / "roost.db")
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


@linux_only
async def test_a_background_process_forked_just_before_a_kill_is_reaped_at_restart(tmp_path: Path,
                                                                                   roost_home: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    env = script_env(tmp_path, roost_home, BACKGROUND.replace("{pidfile}", str(pidfile)))
    job = None
    try:
        # Stall right after the fork (before the process's row): the command then kills Roost.
        async with open_app_server(env={**env, "ROOST_FAULTS": "process.spawned=stall"}, cwd=tmp_path) as client:
            await client.initialize()
            tid = (await client.request("thread/start", {"cwd": str(tmp_path),
                                                         "permission_mode": "unconfined"}))["thread"]["id"]
            await client.send({"id": "t1", "method": "turn/start", "params": {"thread_id": tid, "prompt": "bg"}})
            with trio.fail_after(scaled(30)):
                assert await client.process.wait() == -9
        job = int(pidfile.read_text())
        assert _alive(job)       # sh's child outlived Roost: only the recorded intent can find it
        assert _rows(roost_home, "SELECT count(*) FROM tool_processes") != [(0,)]
        async with open_app_server(env=env, cwd=tmp_path) as client:
            await client.initialize()
            with trio.fail_after(scaled(20)):
                while _alive(job):
                    await trio.sleep(0.05)
        assert _rows(roost_home, "SELECT * FROM tool_processes") == []
        assert _rows(roost_home, "SELECT status FROM background_processes WHERE status = 'running'") == []
    finally:
        if job is not None and _alive(job):
            os.kill(job, 9)


async def test_a_daemon_task_killed_as_it_starts_running_is_finished_by_the_next_daemon(tmp_path: Path,
                                                                                       roost_home: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("default: echo\n")
    env = {"ROOST_HOME": str(roost_home)}
    async with open_daemon(script=script, env={**env, "ROOST_FAULTS": "task.running=kill"}) as daemon:
        async with daemon.unix() as client:
            await client.send({"type": "user_input", "text": "keep me"})
            with trio.fail_after(scaled(30)):
                assert await daemon.process.wait() == -9
    assert _rows(roost_home, "SELECT status FROM daemon_tasks") == [("running",)]
    async with open_daemon(script=script, env=env) as daemon:
        with trio.fail_after(scaled(30)):
            while _rows(roost_home, "SELECT status FROM daemon_tasks WHERE status IN ('queued', 'running')"):
                await trio.sleep(0.05)
    [(status,)] = _rows(roost_home, "SELECT status FROM daemon_tasks")
    assert status in ("finished", "collected")   # resumed, run to its end and recorded
    assert _rows(roost_home, "SELECT status FROM turns WHERE status IN ('queued', 'running')") == []
