"""Objectives (`roost objective`) and `roost serve --auto-objective`, through the real commands.

wire-protocol.md appendix "Objectives" and "Daemon events" (`auto_dispatched`).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import trio
from _helpers.appserver import roost_argv
from _helpers.serve_client import open_daemon
from test_docs_wire_fields import documented_fields
from _helpers.timing import scaled

SCRIPT = {
    "rules": [
        {"match": {"prompt": "broken"},
         "steps": [[{"error": {"category": "invalid_request", "message": "always fails", "retryable": False}}]]},
    ],
    "default": "echo",
}


def roost(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*roost_argv(), *args], capture_output=True, text=True, timeout=scaled(60))


def status(objective_id: str) -> dict:
    out = roost("objective", "status", objective_id, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)["item"]


async def wait_status(objective_id: str, wanted: str) -> dict:
    with trio.fail_after(scaled(60)):
        while True:
            item = status(objective_id)
            if item["status"] == wanted:
                return item
            await trio.sleep(0.2)


def test_objective_create_list_status_envelopes(roost_home: Path) -> None:
    created = roost("objective", "create", "--title", "Ship it", "--description", "the release",
                    "--tasks", "write notes", "--tasks", "tag the release", "--json")
    assert created.returncode == 0, created.stderr
    item = json.loads(created.stdout)
    assert item["protocolVersion"] == 1
    obj = item["item"]
    assert obj["id"] == "OBJ-0001" and obj["title"] == "Ship it" and obj["description"] == "the release"
    assert obj["status"] == "active"
    assert [(t["index"], t["task"], t["outcome"], t["failures"], t["sessionId"]) for t in obj["tasks"]] == [
        (0, "write notes", "pending", 0, None), (1, "tag the release", "pending", 0, None)]
    second = roost("objective", "create", "--title", "Later", "--tasks", "x", "--status", "paused")
    assert second.returncode == 0 and second.stdout == "OBJ-0002\n"
    listed = json.loads(roost("objective", "list", "--json").stdout)
    assert [o["id"] for o in listed["items"]] == ["OBJ-0001", "OBJ-0002"]
    assert listed["items"][1]["status"] == "paused"
    assert status("OBJ-0001") == obj
    text = roost("objective", "status", "OBJ-0001")
    assert "OBJ-0001  Ship it  [active]  0/2 done" in text.stdout and "[pending] tag the release" in text.stdout
    missing = roost("objective", "status", "OBJ-0099", "--json")
    assert missing.returncode == 1
    assert json.loads(missing.stdout) == {"protocolVersion": 1, "error": "no objective 'OBJ-0099'"}
    empty = roost("objective", "create", "--title", "  ", "--tasks", "a", "--json")
    assert empty.returncode == 1 and "non-empty title" in json.loads(empty.stdout)["error"]
    assert "Traceback" not in empty.stderr


async def test_auto_objective_runs_tasks_skips_after_three_failures_and_survives_restart(
        tmp_path: Path, roost_home: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    # the objective is created once the watcher is attached (an --auto-objective id that does not
    # exist yet is picked up when it does), so the watcher sees every auto_dispatched
    async with open_daemon(script=script, args=["--auto-objective", "OBJ-0001"]) as daemon:
        async with daemon.ws(client_id="watcher") as client:
            await client.wait_for("hello")
            created = roost("objective", "create", "--title", "Obj", "--tasks", "alpha", "--tasks", "broken task",
                            "--tasks", "gamma")
            assert created.stdout == "OBJ-0001\n", created.stderr
            await client.wait_for("auto_dispatched", lambda e: e["task"] == "gamma", timeout=scaled(90))
            final = await wait_status("OBJ-0001", "completed")
    dispatched = client.of_type("auto_dispatched")
    assert [e["task"] for e in dispatched] == ["alpha", "broken task", "broken task", "broken task", "gamma"]
    assert all(e["objectiveId"] == "OBJ-0001" and e["sessionId"].startswith("thr_") for e in dispatched)
    assert set(dispatched[0]) == {"type", "sessionId", "objectiveId", "task"}
    assert set(dispatched[0]) - {"type"} <= documented_fields("Daemon events (`roost serve`)")["auto_dispatched"]
    assert [(t["outcome"], t["failures"]) for t in final["tasks"]] == [
        ("succeeded", 0), ("skipped", 3), ("succeeded", 0)]
    assert final["tasks"][2]["sessionId"] == dispatched[-1]["sessionId"]

    # a new daemon: the stored outcomes hold, so OBJ-0001 has nothing left and the next objective
    # is the first (and only) thing dispatched
    async with open_daemon(script=script, args=["--auto-objective", "OBJ-0001",
                                                "--auto-objective", "OBJ-0002"]) as daemon:
        async with daemon.ws() as client:
            await client.wait_for("hello")
            second = roost("objective", "create", "--title", "Next", "--tasks", "delta")
            assert second.stdout == "OBJ-0002\n"
            first = await client.wait_for("auto_dispatched")
            await wait_status("OBJ-0002", "completed")
    assert (first["objectiveId"], first["task"]) == ("OBJ-0002", "delta")
    assert [t["outcome"] for t in status("OBJ-0001")["tasks"]] == ["succeeded", "skipped", "succeeded"]


async def test_attempt_running_when_the_daemon_died_is_settled_not_rerun(tmp_path: Path, roost_home: Path) -> None:
    from _helpers.serve_client import short_socket_path, start_daemon

    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps({"rules": [{"match": {"prompt": "slow one"},
                                           "steps": [[{"text": "working"}, {"delay": 60}, {"text": "done"}]]}],
                                "default": "echo"}))
    fast = tmp_path / "fast.json"
    fast.write_text(json.dumps({"rules": [], "default": "echo"}))
    socket_path = short_socket_path()
    args = ["--auto-objective", "OBJ-0001"]
    async with trio.open_nursery() as nursery:
        first = await start_daemon(nursery, script=slow, socket=socket_path, args=args)
        try:
            async with first.ws() as client:
                await client.wait_for("hello")
                assert roost("objective", "create", "--title", "Durable", "--tasks", "slow one",
                             "--tasks", "after").stdout == "OBJ-0001\n"
                sid = (await client.wait_for("auto_dispatched"))["sessionId"]
                await client.wait_for("token", lambda e: e["sessionId"] == sid)
            assert status("OBJ-0001")["tasks"][0]["outcome"] == "running"
        finally:
            first.kill9()
            await first.process.wait()
        second = await start_daemon(nursery, script=fast, socket=socket_path, args=args)
        try:
            # the resumed attempt may finish and "after" start before any client could attach:
            # the stored outcome says what ran
            final = await wait_status("OBJ-0001", "completed")
        finally:
            second.process.send_signal(15)
            await second.process.wait()
    # the interrupted attempt was resumed and settled, never dispatched again (that would have
    # recorded a new session id), and the next task ran after it
    assert [(t["outcome"], t["failures"]) for t in final["tasks"]] == [("succeeded", 0), ("succeeded", 0)]
    assert final["tasks"][0]["sessionId"] == sid and final["tasks"][1]["sessionId"] not in (None, sid)
    sessions = {s["sessionId"]: s for s in json.loads(roost("sessions", "--all", "--json").stdout)["items"]}
    assert sessions[sid]["isComplete"] is True and sessions[sid]["turnCount"] >= 2   # resumed on its thread
