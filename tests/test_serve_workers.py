"""``roost serve --workers N`` (issue 19, "Every core"): the front door starts N-1 headless worker
processes on its store; they claim tasks from the shared queue, their tasks' events reach the
front door's clients (over the node bus), each task runs exactly once (checked in the database:
the process that ran it, its lease token); a worker killed with SIGKILL is restarted and its task
resumed (``task_resumed``); a front door killed with SIGKILL leaves no worker behind."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio
from _helpers.serve_client import open_daemon, write_resume_script
from _helpers.timing import scaled

from roost._paths import usable_cores

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


@pytest.fixture
def script(tmp_path: Path) -> Path:
    return write_resume_script(tmp_path / "script.json")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def _env(home: Path) -> dict[str, str]:
    return {"ROOST_HOME": str(home), "ROOST_TASK_POLL_S": "0.2", "ROOST_LEASE_TTL": "3"}


def _rows(home: Path, sql: str, params: tuple = ()) -> list[tuple]:
    with sqlite3.connect(home / "roost.db") as conn:
        return conn.execute(sql, params).fetchall()


def _pid(owner: str) -> int:
    return int(owner.rsplit(":", 2)[1])


async def _status(client: Any) -> dict:
    start = len(client.events)
    await client.send({"type": "status"})
    return await client.wait_for("status", start=start)


async def _workers(client: Any, pred: Any = lambda ws: all(w["alive"] for w in ws)) -> list[dict]:
    with trio.fail_after(scaled(60)):
        while True:
            workers = (await _status(client))["workers"]
            if workers and pred(workers):
                return workers
            await trio.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _dispatch(client: Any, text: str) -> str:
    start = len(client.events)
    await client.send({"type": "user_input", "text": text})
    return (await client.wait_for("queued", start=start))["sessionId"]


async def test_workers_run_tasks_once_and_their_events_reach_the_front_doors_client(
    tmp_path: Path, script: Path, home: Path
) -> None:
    err = (tmp_path / "serve.err").open("wb")
    async with open_daemon(script=script, env=_env(home), stderr=err, args=["--workers", "2"]) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")
            (worker,) = await _workers(client)
            # slow tasks keep a runner busy: one per process, so both processes run some
            slow = [await _dispatch(client, f"slow {i}") for i in range(2)]
            with trio.fail_after(scaled(60)):
                while len(_rows(home, "SELECT 1 FROM leases WHERE key LIKE 'task:%' AND owner IS NOT NULL")) < 2:
                    await trio.sleep(0.1)
            owners = {_pid(o) for (o,) in _rows(home, "SELECT owner FROM leases WHERE key LIKE 'task:%'")}
            assert owners == {daemon.process.pid, worker["pid"]}
            # the status tells which process runs each task (the worker's: not here, same node)
            # and when the worker started (ISO 8601 UTC)
            with trio.fail_after(scaled(30)):  # (the front door follows the worker's claim every poll)
                while True:
                    status = await _status(client)
                    runs = {_pid(t["runner"]): t for t in status["running"] if t["runner"]}
                    if set(runs) == {daemon.process.pid, worker["pid"]}:
                        break
                    await trio.sleep(0.1)
            assert ISO_UTC.match(status["workers"][0]["startedAt"]) and status["workers"][0]["uptimeSeconds"] >= 0
            assert runs[daemon.process.pid]["runsHere"] is True and runs[worker["pid"]]["runsHere"] is False
            assert {t["runsOn"] for t in runs.values()} == {f"{socket.gethostname()}:{home}"}
            for sid in slow:  # every client sees each task start and stream, whoever runs it
                await client.wait_for("agent_starting", lambda e, s=sid: e["sessionId"] == s)
                await client.wait_for("token", lambda e, s=sid: e["sessionId"] == s and e["text"] == "working")
            start = len(client.events)
            await client.send({"type": "interrupt"})
            for sid in slow:
                await client.wait_for("result", lambda e, s=sid: e["sessionId"] == s, start=start)
            quick = [await _dispatch(client, f"task number {i}") for i in range(6)]
            for sid in quick:
                result = await client.wait_for("result", lambda e, s=sid: e["sessionId"] == s, timeout=scaled(90))
                assert result["succeeded"] is True and result["lastMessage"] == result["task"]
                text = "".join(e["text"] for e in client.of_type("token") if e["sessionId"] == sid)
                assert text == result["task"]
    # in the database: each task claimed once (token 1), one turn each, run by one of the two processes
    ran_on = {}
    for sid in slow + quick:
        assert _rows(home, "SELECT token FROM leases WHERE key = ?", (f"task:{sid}",)) == [(1,)]
        assert len(_rows(home, "SELECT 1 FROM turns WHERE thread_id = ?", (sid,))) == 1
        (payload,), = _rows(home, "SELECT payload FROM daemon_tasks WHERE id = ?", (sid,))
        ran_on[sid] = _pid(json.loads(payload)["ranOn"])
    assert set(ran_on.values()) == {daemon.process.pid, worker["pid"]}
    assert not _alive(worker["pid"])  # stopped with the front door
    # one log file per process: a RotatingFileHandler rotates by renaming, safe for one process only
    logs = home / "logs"
    front_lines = [json.loads(line) for line in (logs / "roost.log").read_text().splitlines()]
    front = [doc["pid"] for doc in front_lines]  # every record's pid is the writer's (the worker's: worker_pid)
    assert any(doc.get("event") == "worker_started" and doc["worker_pid"] == worker["pid"] for doc in front_lines)
    behind = [json.loads(line)["pid"] for line in (logs / f"roost.worker-{worker['index']}.log").read_text().splitlines()]
    assert set(front) == {daemon.process.pid} and set(behind) == {worker["pid"]}


async def test_a_killed_worker_is_restarted_and_its_task_resumed(tmp_path: Path, script: Path, home: Path) -> None:
    err = (tmp_path / "serve.err").open("wb")
    async with open_daemon(script=script, env=_env(home), stderr=err, args=["--workers", "2"]) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")
            (worker,) = await _workers(client)
            slow = [await _dispatch(client, f"slow {i}") for i in range(2)]
            with trio.fail_after(scaled(60)):
                while True:
                    rows = _rows(home, "SELECT key, owner FROM leases WHERE key LIKE 'task:%' AND owner IS NOT NULL")
                    on_worker = [k[5:] for k, o in rows if _pid(o) == worker["pid"]]
                    if on_worker and len(rows) == 2:
                        break
                    await trio.sleep(0.1)
            (sid,) = on_worker
            await client.wait_for("token", lambda e: e["sessionId"] == sid and e["text"] == "working")
            start = len(client.events)
            os.kill(worker["pid"], signal.SIGKILL)
            resumed = await client.wait_for("task_resumed", lambda e: e["sessionId"] == sid, start=start, timeout=scaled(90))
            assert resumed["task"].startswith("slow")
            result = await client.wait_for("result", lambda e: e["sessionId"] == sid, start=start, timeout=scaled(90))
            assert result["succeeded"] is True and result["lastMessage"] == "resumed and done"
            (again,) = await _workers(client, lambda ws: ws[0]["alive"] and ws[0]["pid"] != worker["pid"])
            assert again["restarts"] == 1
            assert slow  # the other slow task still runs on the front door, untouched
    assert _rows(home, "SELECT token FROM leases WHERE key = ?", (f"task:{sid}",)) == [(2,)]
    statuses = [s for (s,) in _rows(home, "SELECT status FROM turns WHERE thread_id = ? ORDER BY rowid", (sid,))]
    assert statuses[-1] == "completed" and len(statuses) == 2


async def test_kill_9_of_the_front_door_stops_its_workers(tmp_path: Path, script: Path, home: Path) -> None:
    err = (tmp_path / "serve.err").open("wb")
    async with open_daemon(script=script, env=_env(home), stderr=err, args=["--workers", "3"]) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")
            workers = await _workers(client, lambda ws: len(ws) == 2 and all(w["alive"] for w in ws))
        daemon.kill9()
        await daemon.process.wait()
        with trio.fail_after(scaled(30)):
            while any(_alive(w["pid"]) for w in workers):
                await trio.sleep(0.1)


async def test_a_task_the_busy_front_door_queues_wakes_an_idle_worker(tmp_path: Path, script: Path, home: Path) -> None:
    # the workers' poll is a minute: the task reaches the idle worker only through the wake-up byte
    env = {**_env(home), "ROOST_TASK_POLL_S": "60"}
    err = (tmp_path / "serve.err").open("wb")
    async with open_daemon(script=script, env=env, stderr=err, args=["--workers", "2"]) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")
            (worker,) = await _workers(client)
            log = home / "logs" / f"roost.worker-{worker['index']}.log"
            with trio.fail_after(scaled(60)):  # its runner has made its first look and sleeps
                while not (log.exists() and '"worker_ready"' in log.read_text()):
                    await trio.sleep(0.1)
            await trio.sleep(scaled(1))
            slow = [await _dispatch(client, f"slow {i}") for i in range(2)]
            with trio.fail_after(scaled(30)):
                while True:
                    rows = _rows(home, "SELECT owner FROM leases WHERE key LIKE 'task:%' AND owner IS NOT NULL")
                    if len(rows) == 2:
                        break
                    await trio.sleep(0.1)
            assert {_pid(o) for (o,) in rows} == {daemon.process.pid, worker["pid"]}
            start = len(client.events)
            await client.send({"type": "interrupt"})
            for sid in slow:
                await client.wait_for("result", lambda e, s=sid: e["sessionId"] == s, start=start)


async def test_workers_auto_runs_one_process_per_usable_core(tmp_path: Path, script: Path, home: Path) -> None:
    cores = usable_cores()
    err = (tmp_path / "serve.err").open("wb")
    async with open_daemon(script=script, env=_env(home), stderr=err, args=["--workers", "auto"]) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")
            if cores == 1:
                assert (await _status(client))["workers"] == []
            else:
                workers = await _workers(client, lambda ws: len(ws) == cores - 1 and all(w["alive"] for w in ws))
                assert {w["index"] for w in workers} == set(range(cores - 1))
                assert daemon.process.pid not in {w["pid"] for w in workers}
