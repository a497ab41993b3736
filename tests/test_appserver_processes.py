"""End-to-end: background processes (the shell tool's ``background: true``), their exit trigger
and the ``process/*`` methods, over the real ``roost app-server``."""

from __future__ import annotations

from pathlib import Path

import trio
from _helpers.appserver import expect_error, open_app_server, script_env
from _helpers.timing import scaled

SCRIPT = r"""
rules:
  - match: {prompt: "^bg quick"}
    steps:
      - - {tool_call: {name: shell, arguments: {command: "while [ ! -f go ]; do sleep 0.05; done; echo done-bg; exit 3", background: true}}}
      - - {text: "started it"}
  - match: {prompt: "^bg slow"}
    steps:
      - - {tool_call: {name: shell, arguments: {command: "echo slow-start; sleep 60", background: true}}}
      - - {text: "started the slow one"}
  - match: {prompt: "^bg quiet"}
    steps:
      - - {tool_call: {name: shell, arguments: {command: "while [ ! -f go2 ]; do sleep 0.05; done; echo quiet", background: true}}}
      - - {text: "started the quiet one"}
default: echo
"""


async def _until(client, tid: str, pid: str, predicate) -> dict:
    """Re-read process/list until the process satisfies ``predicate`` (bounded)."""
    with trio.fail_after(scaled(20)):
        while True:
            procs = {p["id"]: p for p in (await client.request("process/list", {"thread_id": tid}))["processes"]}
            if predicate(procs[pid]):
                return procs[pid]
            await trio.sleep(0.05)


async def test_background_process_lifecycle(tmp_path: Path, roost_home: Path) -> None:
    env = script_env(tmp_path, roost_home, SCRIPT)
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path), "permission_mode": "unconfined"}))["thread"]["id"]
        other = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        done = (await client.run_turn(tid, "bg quick"))["turn"]
        assert done["status"] == "completed"
        pid = done["items"][1]["metadata"]["process_id"]
        (proc,) = (await client.request("process/list", {"thread_id": tid}))["processes"]
        assert proc["id"] == pid and proc["status"] == "running" and proc["trigger"]["status"] == "waiting"
        assert (await client.request("process/list", {"thread_id": other}))["processes"] == []  # only its own
        await expect_error(client, "process/read", {"thread_id": other, "process_id": pid}, "invalid_params")
        # exit -> a continuation turn with the exit status and output
        start = len(client.lines)
        (tmp_path / "go").write_text("")
        started = await client.wait_for("turn/started", lambda p: p["thread_id"] == tid, start=start)
        continuation = (await client.wait_terminal(started["turn"]["id"], start=start))["turn"]
        notice = continuation["items"][0]["text"]
        assert f"background process {pid} exited with status 3" in notice and "done-bg" in notice
        proc = await _until(client, tid, pid, lambda p: p["trigger"]["status"] == "handled")
        assert proc["status"] == "exited" and proc["exit_code"] == 3
        read = await client.request("process/read", {"thread_id": tid, "process_id": pid})
        assert "done-bg" in read["output"]
        # stop: no continuation
        slow = (await client.run_turn(tid, "bg slow"))["turn"]["items"][1]["metadata"]["process_id"]
        with trio.fail_after(scaled(20)):  # its first output has arrived
            while "slow-start" not in (await client.request("process/read", {"thread_id": tid,
                                                                            "process_id": slow}))["output"]:
                await trio.sleep(0.05)
        stopped = (await client.request("process/stop", {"thread_id": tid, "process_id": slow}))["process"]
        assert stopped["status"] == "stopped" and stopped["trigger"]["status"] == "stopped"
        assert "slow-start" in (await client.request("process/read", {"thread_id": tid, "process_id": slow}))["output"]
        # cancel-notifications: the process keeps running, its exit admits nothing
        quiet = (await client.run_turn(tid, "bg quiet"))["turn"]["items"][1]["metadata"]["process_id"]
        cancelled = (await client.request("process/cancel-notifications", {"thread_id": tid, "process_id": quiet}))
        assert cancelled["process"]["status"] == "running" and cancelled["process"]["trigger"]["status"] == "cancelled"
        turns_before = len(client.notifications("turn/started"))
        (tmp_path / "go2").write_text("")
        proc = await _until(client, tid, quiet, lambda p: p["status"] == "exited")
        assert proc["trigger"]["status"] == "cancelled"
        assert len(client.notifications("turn/started")) == turns_before
        # a process still running when the server exits is reported, not forgotten
        await client.run_turn(tid, "bg slow")
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        procs = (await client.request("process/list", {"thread_id": tid}))["processes"]
        assert [p["status"] for p in procs] == ["exited", "stopped", "exited", "lost"]
        assert procs[-1]["reason"] and procs[-1]["trigger"]["status"] == "stopped"
        await expect_error(client, "process/list", {"thread_id": "thr_nope"}, "thread_not_found")


async def test_process_of_a_killed_server_is_reported_lost(tmp_path: Path, roost_home: Path) -> None:
    env = script_env(tmp_path, roost_home, SCRIPT)
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path), "permission_mode": "unconfined"}))["thread"]["id"]
        slow = (await client.run_turn(tid, "bg slow"))["turn"]["items"][1]["metadata"]["process_id"]
        client.process.kill()  # SIGKILL: no clean shutdown records anything
        await client.process.wait()
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        (proc,) = (await client.request("process/list", {"thread_id": tid}))["processes"]
        assert proc["id"] == slow and proc["status"] == "lost" and "Roost ended" in proc["reason"]
        assert proc["trigger"]["status"] == "stopped"
