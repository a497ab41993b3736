"""Issue 18, finding 3, per kind: a kill -9 at the state a row is non-terminal in, then a restart
that settles it (runs: tests/test_fault_crash_settles.py; turns, items: test_appserver_durability;
workers: test_workers; leases and every kind on both backends: test_store).

Each kill lands exactly at its state through ``ROOST_FAULTS`` (:mod:`roost._faults`).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from _helpers.appserver import open_app_server, roost_argv, script_env
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


def _roost(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*roost_argv(), *args], capture_output=True, text=True, timeout=scaled(60), check=False)


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


def _run_status(home: Path, run_id: str) -> tuple:
    [row] = _rows(home, f"SELECT status, outcome, session_id FROM schedule_runs WHERE id = '{run_id}'")
    return row


@pytest.mark.parametrize("at", ["schedule.claimed", "schedule.running"])
async def test_a_schedule_run_killed_while_open_is_settled_by_the_next_daemon(tmp_path: Path, roost_home: Path,
                                                                              at: str) -> None:
    """Killed after the claim (no task yet): the next daemon records it ``done``/``interrupted``,
    never dispatching it twice; killed with its task running: the task is resumed and the run
    records that task's outcome."""
    script = tmp_path / "script.yaml"
    script.write_text("default: echo\n")
    env = {"ROOST_HOME": str(roost_home)}
    args = ["--work-dir", str(tmp_path)]
    added = _roost("schedule", "add", "yearly", "--cron", "0 0 1 1 *", "--task", "scheduled work",
                   "--work-dir", str(tmp_path))
    assert added.returncode == 0, added.stderr
    async with open_daemon(script=script, args=args, env={**env, "ROOST_FAULTS": f"{at}=kill"}) as daemon:
        requested = _roost("schedule", "run", "yearly", "--json")
        assert requested.returncode == 0, requested.stderr
        with trio.fail_after(scaled(30)):
            assert await daemon.process.wait() == -9
    [(run_id,)] = _rows(roost_home, "SELECT id FROM schedule_runs")
    status, _, session = _run_status(roost_home, run_id)
    assert status == ("claimed" if at == "schedule.claimed" else "running")
    async with open_daemon(script=script, args=args, env=env):
        with trio.fail_after(scaled(30)):
            while _run_status(roost_home, run_id)[0] in ("claimed", "running"):
                await trio.sleep(0.05)
    tasks = _rows(roost_home, "SELECT id, status FROM daemon_tasks")
    if at == "schedule.claimed":
        assert _run_status(roost_home, run_id) == ("done", "interrupted", None)
        assert tasks == []   # never dispatched by the dead daemon, and not by the next one either
    else:
        assert _run_status(roost_home, run_id) == ("done", "succeeded", session)
        [(task_id, task_status)] = tasks   # the one task, resumed and run to its end
        assert task_id == session and task_status in ("finished", "collected")
