"""Rows of issue 15 ("The rest of the app-server contract") that had no end-to-end test of their
own, through the real ``roost app-server``: the ``client_id`` rules of ``turn/queue`` across a
restart (app-server-protocol.md, "Turns and execution runs": "a pending queue duplicate returns
the original accepted input, while consumed IDs are rejected across input methods"; "A restarted
server exposes unconsumed input through held_user_messages")."""

from __future__ import annotations

import json
from pathlib import Path

from _helpers.appserver import expect_error, open_app_server, scripted_env
from _helpers.timing import scaled

SLOW = " ".join(f"w{i}" for i in range(400))


def _env(tmp_path: Path, home: Path) -> dict:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({
        "rules": [{"match": {"prompt": "^slow"}, "steps": [[{"text": SLOW, "tokens_per_second": 20}]]}],
        "default": "echo",
    }))
    return scripted_env(home, script)


def _user_texts(snap: dict) -> list[str]:
    return [i["text"] for t in snap["turns"] for i in t["items"] if i["type"] == "user_message"]


async def test_queue_client_id_rules_hold_across_a_restart(tmp_path: Path, roost_home: Path) -> None:
    env = _env(tmp_path, roost_home)
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        done = await client.run_turn(tid, "first", client_id="start-1")
        assert done["turn"]["status"] == "completed"
        start = len(client.lines)
        await client.request("turn/start", {"thread_id": tid, "prompt": "slow"})
        await client.wait_for("item/agentMessage/delta", start=start)
        queued = (await client.request("turn/queue", {"thread_id": tid, "prompt": "later", "client_id": "q-1"}))[
            "input"]
        # a retry while pending returns the original input
        again = (await client.request("turn/queue", {"thread_id": tid, "prompt": "later", "client_id": "q-1"}))[
            "input"]
        assert again["id"] == queued["id"]
        client.process.kill()  # the queued input was accepted (durable) but never dispatched
        await client.process.wait()

    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": tid})
        # never reconstructed as a runnable queue: held work, visible
        assert snap["pending_user_messages"] == []
        assert [(h["id"], h["client_id"]) for h in snap["held_user_messages"]] == [(queued["id"], "q-1")]
        retry = (await client.request("turn/queue", {"thread_id": tid, "prompt": "later", "client_id": "q-1"}))[
            "input"]
        assert retry["id"] == queued["id"] and retry["held"] is True  # the original, not a second copy
        # an id a turn consumed before the restart is refused by every input method
        for method in ("turn/queue", "turn/steer", "turn/start"):
            await expect_error(client, method, {"thread_id": tid, "prompt": "first", "client_id": "start-1"},
                               "invalid_params", contains="consumed")
        mark = len(client.lines)
        sent = await client.request("turn/steer", {"thread_id": tid, "input_id": queued["id"]})
        await client.wait_terminal(sent["turn"]["id"], start=mark)
        await expect_error(client, "turn/queue", {"thread_id": tid, "prompt": "later", "client_id": "q-1"},
                           "invalid_params", contains="consumed")
        snap = await client.request("thread/resume", {"session_id": tid})
        assert _user_texts(snap).count("later") == 1 and snap["held_user_messages"] == []


PROCESS_SCRIPT = {
    "rules": [
        {"match": {"prompt": "^bg quick"}, "steps": [
            [{"tool_call": {"name": "shell", "arguments": {
                "command": "while [ ! -f go ]; do sleep 0.05; done; echo done-bg; exit 3", "background": True}}}],
            [{"text": "started it"}]]},
        {"match": {"prompt": "^slow"}, "steps": [[{"text": SLOW, "tokens_per_second": 20}]]},
    ],
    "default": "echo",
}


async def _process(client, tid: str, predicate) -> dict:
    import trio

    with trio.fail_after(scaled(30)):
        while True:
            (proc,) = (await client.request("process/list", {"thread_id": tid}))["processes"]
            if predicate(proc):
                return proc
            await trio.sleep(0.05)


async def test_an_exit_notice_pending_when_roost_dies_is_delivered_after_the_restart(tmp_path: Path,
                                                                                    roost_home: Path) -> None:
    script = tmp_path / "procs.json"
    script.write_text(json.dumps(PROCESS_SCRIPT))
    env = scripted_env(roost_home, script)
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path), "permission_mode": "unconfined"}))[
            "thread"]["id"]
        assert (await client.run_turn(tid, "bg quick"))["turn"]["status"] == "completed"
        start = len(client.lines)
        await client.request("turn/start", {"thread_id": tid, "prompt": "slow"})
        await client.wait_for("item/agentMessage/delta", start=start)
        (tmp_path / "go").write_text("")  # it exits while the thread is busy: the notice waits
        proc = await _process(client, tid, lambda p: p["status"] == "exited")
        # the exit is recorded and available, but no turn has taken it yet
        assert proc["exit_code"] == 3 and proc["trigger"]["status"] == "received"
        client.process.kill()  # Roost dies before the running turn admits the notice
        await client.process.wait()

    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        await client.request("thread/resume", {"session_id": tid})
        proc = await _process(client, tid, lambda p: p["trigger"]["status"] == "handled")
        snap = await client.request("thread/resume", {"session_id": tid, "response_only": True})
        notices = [i["text"] for t in snap["turns"] for i in t["items"]
                   if i["type"] == "user_message" and f"background process {proc['id']} exited" in i["text"]]
        assert len(notices) == 1 and "status 3" in notices[0] and "done-bg" in notices[0]


async def test_selection_change_is_thread_busy_under_another_servers_execution_lease(tmp_path: Path,
                                                                                     roost_home: Path) -> None:
    env = _env(tmp_path, roost_home)
    async with open_app_server(env=env, cwd=tmp_path) as first, open_app_server(env=env, cwd=tmp_path) as second:
        await first.initialize()
        tid = (await first.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        start = len(first.lines)
        turn = (await first.request("turn/start", {"thread_id": tid, "prompt": "slow"}))["turn"]
        await first.wait_for("item/agentMessage/delta", start=start)
        await second.initialize()
        await second.request("thread/resume", {"session_id": tid})
        await expect_error(second, "config/model/update", {"thread_id": tid, "permission_mode": "read_only"},
                           "thread_busy")
        await first.request("turn/interrupt", {"thread_id": tid})
        await first.wait_terminal(turn["id"], start=start)
        changed = await second.request("config/model/update", {"thread_id": tid, "permission_mode": "read_only"})
        assert changed["thread"]["permission_mode"] == "read_only"
