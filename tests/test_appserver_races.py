"""Races and losses of pending input (issue 15, "Races and losses found"), end to end through
`roost app-server`: steers racing a turn's start and end, client_id retries across a restart,
input for a thread that executes in another app-server, selection changes while workers run,
``initialize.max_parallel``, and pending-input notifications that tell each change apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
from _helpers.appserver import AppServerClient, RemoteError, expect_error, open_app_server, scripted_env
from _helpers.timing import scaled

SLOW = " ".join(f"w{i}" for i in range(400))


def write_script(path: Path) -> Path:
    script = {
        "rules": [
            {"match": {"prompt": "^slow"}, "steps": [[{"text": SLOW, "tokens_per_second": 20}]]},
        ],
        "default": "echo",
    }
    path.write_text(json.dumps(script))
    return path


@pytest.fixture
def env(tmp_path: Path, roost_home: Path) -> dict:
    return scripted_env(roost_home, write_script(tmp_path / "script.json"))


async def new_thread(client: AppServerClient, cwd: Path) -> str:
    await client.initialize()
    return (await client.request("thread/start", {"cwd": str(cwd)}))["thread"]["id"]


async def settled(client: AppServerClient, tid: str) -> dict:
    """The thread's snapshot once it is idle with no pending input (waits on notifications)."""
    with trio.fail_after(scaled(60)):
        while True:
            start = len(client.lines)
            snap = await client.request("thread/resume", {"session_id": tid})
            if snap["thread"]["status"] == "idle" and not snap["pending_user_messages"]:
                return snap
            await client.wait_line(lambda m: m.get("method") in ("turn/completed", "turn/error", "turn/held"),
                                   start=start)


def user_texts(snap: dict) -> list[str]:
    return [i["text"] for t in snap["turns"] for i in t["items"] if i["type"] == "user_message"]


async def test_steer_right_after_start_and_racing_the_end_is_always_accepted(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await new_thread(client, tmp_path)
        rounds = 30
        for n in range(rounds):
            # Pipelined: the steer arrives while the turn is admitted, streaming or ending (the
            # reply is short, so its end often races the steer's acceptance write).
            start_id, steer_id = f"s{n}", f"x{n}"
            await client.send({"id": start_id, "method": "turn/start",
                               "params": {"thread_id": tid, "prompt": f"turn {n}"}})
            await client.send({"id": steer_id, "method": "turn/steer",
                               "params": {"thread_id": tid, "prompt": f"steer {n}", "client_id": f"c{n}"}})
            started = await client.wait_line(lambda m, rid=start_id: m.get("id") == rid)
            steered = await client.wait_line(lambda m, rid=steer_id: m.get("id") == rid)
            assert "error" not in started or started["error"]["code"] == "thread_busy", started
            assert "error" not in steered, steered  # an accepted steer is answered accepted
            assert steered["result"]["delivery"] in ("active_turn", "queued")
        snap = await settled(client, tid)
        texts = user_texts(snap) + [h["prompt"] for h in snap["held_user_messages"]]
        for n in range(rounds):  # nothing lost, nothing twice: every steer ran in a turn
            assert texts.count(f"steer {n}") == 1, (n, texts)


async def test_steer_retry_with_the_same_client_id_after_a_restart_runs_once(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await new_thread(client, tmp_path)
        start = len(client.lines)
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "slow"}))["turn"]
        await client.wait_for("item/agentMessage/delta", start=start)
        first = await client.request("turn/steer", {"thread_id": tid, "prompt": "steer once",
                                                    "expected_turn_id": turn["id"], "client_id": "st-1"})
        client.process.kill()  # the steer was accepted (durable) but never admitted
        await client.process.wait()

    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": tid})
        if not snap["held_user_messages"] and "steer once" in user_texts(snap):
            # Under load the kill can land just after the running turn admitted the steer: it is
            # in history once, and the retry after the restart is refused as consumed.
            await expect_error(client, "turn/steer", {"thread_id": tid, "prompt": "steer once", "client_id": "st-1"},
                               "invalid_params")
            snap = await settled(client, tid)
            assert user_texts(snap).count("steer once") == 1 and snap["held_user_messages"] == []
            return
        assert [h["client_id"] for h in snap["held_user_messages"]] == ["st-1"]
        # The retry after the restart returns the original input; it does not run it again.
        retry = await client.request("turn/steer", {"thread_id": tid, "prompt": "steer once", "client_id": "st-1"})
        assert retry["input"]["id"] == first["input"]["id"] and retry["delivery"] == "queued"
        assert retry["input"]["held"] is True and "turn" not in retry
        snap = await client.request("thread/resume", {"session_id": tid})
        assert snap["thread"]["status"] == "idle" and "steer once" not in user_texts(snap)
        # Sending the held item runs it once; a retry after that is refused as consumed.
        start = len(client.lines)
        sent = await client.request("turn/steer", {"thread_id": tid, "input_id": first["input"]["id"]})
        await client.wait_terminal(sent["turn"]["id"], start=start)
        await expect_error(client, "turn/steer", {"thread_id": tid, "prompt": "steer once", "client_id": "st-1"},
                           "invalid_params")
        snap = await settled(client, tid)
        assert user_texts(snap).count("steer once") == 1 and snap["held_user_messages"] == []


async def test_input_for_a_thread_executing_in_another_app_server_is_delivered_there(env, tmp_path):
    """Issue 15: input for a thread another app-server executes reaches that process (over the node
    bus, tests/test_crossnode.py has the details); it is never lost and never runs twice."""
    async with open_app_server(env=env, cwd=tmp_path) as first, open_app_server(env=env, cwd=tmp_path) as second:
        tid = await new_thread(first, tmp_path)
        start = len(first.lines)
        turn = (await first.request("turn/start", {"thread_id": tid, "prompt": "slow"}))["turn"]
        await first.wait_for("item/agentMessage/delta", start=start)
        await second.initialize()
        await second.request("thread/resume", {"session_id": tid})
        mark = len(second.lines)
        queued = (await second.request("turn/queue", {"thread_id": tid, "prompt": "from second",
                                                      "client_id": "q2"}))["input"]
        assert queued["held"] is False  # queued in the executing process, which will start it
        note = await second.wait_for("turn/queued", lambda p: p["input"]["id"] == queued["id"], start=mark)
        assert note["state"] == "queued"
        steered = await second.request("turn/steer", {"thread_id": tid, "prompt": "steer second", "client_id": "s2"})
        assert steered["delivery"] == "active_turn" and steered["turn_id"] == turn["id"]
        # Retries are deduplicated by the executing process's rules (or refused once consumed).
        try:
            again = await second.request("turn/steer", {"thread_id": tid, "prompt": "steer second",
                                                        "client_id": "s2"})
            assert again["input"]["id"] == steered["input"]["id"]
        except RemoteError as exc:
            assert exc.code == "invalid_params" and "consumed" in exc.error["message"]
        await second.request("turn/interrupt", {"thread_id": tid})
        await second.wait_terminal(turn["id"], start=mark)
        # Input no turn took is held work (shown by both), never lost; it is sent explicitly.
        snap = await settled(first, tid)
        held = {h["prompt"]: h for h in snap["held_user_messages"]}
        if "from second" in held:
            mark = len(second.lines)
            sent = await second.request("turn/steer", {"thread_id": tid, "input_id": held["from second"]["id"]})
            done = await second.wait_terminal(sent["turn"]["id"], start=mark)
            assert done["turn"]["status"] == "completed"
        snap = await settled(first, tid)
        texts = user_texts(snap) + [h["prompt"] for h in snap["held_user_messages"]]
        assert texts.count("from second") == 1 and texts.count("steer second") == 1


WORKER_SCRIPT = """
rules:
  - match: {agent: "sleeper.*"}
    steps:
      - - {text: "z1 z2 z3 z4 z5 z6 z7 z8", tokens_per_second: 8}
  - match: {prompt: "^bgsleep"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: sleeper, prompt: "s", run_in_background: true}}}
      - - {text: "started a sleeper"}
default: echo
"""


async def test_selection_change_is_thread_busy_while_a_background_worker_runs(tmp_path, roost_home):
    (tmp_path / "workers.yaml").write_text(WORKER_SCRIPT)
    env = scripted_env(roost_home, tmp_path / "workers.yaml")
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path), "permission_mode": "unconfined"}))[
            "thread"]["id"]
        done = await client.run_turn(tid, "bgsleep")
        assert done["turn"]["status"] == "completed"  # the root turn ended; its worker still runs
        await client.wait_for("agent/updated", lambda p: p["agent"]["status"] == "running")
        await expect_error(client, "config/model/update", {"thread_id": tid, "permission_mode": "read_only"},
                           "thread_busy")
        mark = len(client.lines)
        await client.wait_for("agent/updated", lambda p: p["agent"]["status"] == "completed")
        # the worker's result resumes the root in a turn of its own
        resumed = await client.wait_for("turn/started", lambda p: p["turn"]["id"] != done["turn"]["id"], start=mark)
        await client.wait_terminal(resumed["turn"]["id"], start=mark)
        updated = await client.request("config/model/update", {"thread_id": tid, "permission_mode": "read_only"})
        assert updated["thread"]["permission_mode"] == "read_only"


async def test_initialize_reports_the_effective_max_parallel(env, tmp_path):
    for value, expected in (("3", 3), (None, 5)):
        run_env = dict(env)
        run_env.pop("ROOST_MAX_PARALLEL", None)
        if value is not None:
            run_env["ROOST_MAX_PARALLEL"] = value
        async with open_app_server(env=run_env, cwd=tmp_path) as client:
            assert (await client.initialize())["max_parallel"] == expected


async def test_pending_input_notifications_tell_each_change_apart(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await new_thread(client, tmp_path)
        start = len(client.lines)
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "slow"}))["turn"]
        await client.wait_for("item/agentMessage/delta", start=start)
        queued = (await client.request("turn/queue", {"thread_id": tid, "prompt": "later"}))["input"]
        dropped = (await client.request("turn/queue", {"thread_id": tid, "prompt": "never"}))["input"]
        await client.request("turn/update-queued", {"thread_id": tid, "input_id": queued["id"], "prompt": "later!"})
        await client.request("turn/dequeue", {"thread_id": tid, "input_id": dropped["id"]})
        # the steer cuts the streaming reply; the turn then ends and the queued input starts
        steer = (await client.request("turn/steer", {"thread_id": tid, "prompt": "steer me"}))["input"]
        await client.wait_terminal(turn["id"], start=start)
        await settled(client, tid)

        def changes(input_id: str) -> list[tuple[str, str]]:
            return [(m["method"], m["params"]["state"]) for m in client.lines[start:]
                    if m.get("method", "").startswith("turn/") and "id" not in m
                    and (m["params"].get("input") or {}).get("id") == input_id]

        assert changes(steer["id"]) == [("turn/steered", "pending"), ("turn/steered", "admitted")]
        assert changes(queued["id"]) == [("turn/queued", "queued"), ("turn/queued", "updated"),
                                         ("turn/dequeued", "dispatched")]
        assert changes(dropped["id"]) == [("turn/queued", "queued"), ("turn/dequeued", "withdrawn")]


async def test_turn_start_retried_with_a_consumed_client_id_is_refused_after_a_restart(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await new_thread(client, tmp_path)
        done = await client.run_turn(tid, "once only", client_id="start-1")
        assert done["turn"]["status"] == "completed"
        held = (await client.request("turn/queue", {"thread_id": tid, "prompt": "kept", "hold": True,
                                                    "client_id": "held-1"}))["input"]
        client.process.kill()
        await client.process.wait()

    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        await expect_error(client, "turn/start", {"thread_id": tid, "prompt": "once only", "client_id": "start-1"},
                           "invalid_params", contains="consumed")
        await expect_error(client, "turn/start", {"thread_id": tid, "prompt": "kept", "client_id": "held-1"},
                           "invalid_params", contains=held["id"])
        snap = await settled(client, tid)
        assert user_texts(snap) == ["once only"] and [h["id"] for h in snap["held_user_messages"]] == [held["id"]]
        assert (await client.run_turn(tid, "new input", client_id="start-2"))["turn"]["status"] == "completed"
