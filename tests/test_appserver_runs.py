"""End-to-end: runs (``run/start``, ``run/interrupt``, run/started, run/updated) over `roost app-server`.

app-server-protocol.md, "Turns and execution runs" and "Interruption". The scripted engine's rules
are matched against each turn's prompt, so a correction turn (whose prompt names the validation
error) can get a different reply from the first turn.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from _helpers.appserver import RemoteError, open_app_server, scripted_env, script_env

SCRIPT = r"""
rules:
  - match: {prompt: '"count"'}
    steps:
      - - {text: '{"count": "many"}'}
  - match: {prompt: "did not match the required output schema"}
    steps:
      - - {text: '{"summary": "fixed on the second try"}'}
  - match: {prompt: "^good json"}
    steps:
      - - {text: "```json\n{\"summary\": \"all good\"}\n```"}
  - match: {prompt: "^bad json"}
    steps:
      - - {text: "Sure! Here is a summary: all good."}
  - match: {prompt: "^slow"}
    steps:
      - - {text: "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty", tokens_per_second: 5}
  - match: {prompt: "^fail"}
    steps:
      - - {error: {category: invalid_request, message: "scripted failure"}}
default: echo
"""

SUMMARY = {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"],
           "additionalProperties": False}
COUNT = {"type": "object", "properties": {"count": {"type": "integer"}}, "required": ["count"]}
TERMINAL = ("completed", "failed", "interrupted", "timed_out", "cancelled")


@pytest.fixture
def env(tmp_path: Path, roost_home: Path) -> dict:
    return script_env(tmp_path, roost_home, SCRIPT)


async def _thread(client, tmp_path: Path, **extra) -> str:
    await client.initialize()
    return (await client.request("thread/start", {"cwd": str(tmp_path), **extra}))["thread"]["id"]


async def _run_to_end(client, params: dict) -> tuple[dict, dict]:
    """Start a run; return (the run/start result's run, the terminal run of run/updated)."""
    run = (await client.request("run/start", params))["run"]
    done = await client.wait_for("run/updated", lambda p: p["run"]["id"] == run["id"]
                                 and p["run"]["status"] in TERMINAL)
    return run, done["run"]


async def test_run_completes_with_notifications_in_order(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await _thread(client, tmp_path)
        run, final = await _run_to_end(client, {"thread_id": tid, "prompt": "hello run",
                                                "request": {"mode": "start"}})
        assert run["status"] == "running" and run["thread_id"] == tid
        assert run["request"]["mode"] == "start" and run["request"]["prompt"] == "hello run"
        assert run["runtime"]["provider"] == "scripted" and run["workspace"]["cwd"] == str(tmp_path)
        assert [t["purpose"] for t in run["turns"]] == ["start"]
        assert final["status"] == "completed" and final["error"] is None
        turn_id = run["turns"][0]["id"]
        assert final["turns"] == [{"id": turn_id, "status": "completed", "purpose": "start"}]
        assert final["result"]["turn_id"] == turn_id and final["result"]["exit_code"] == 0
        assert final["completed_at"] is not None
        # the result names the final agent message of the final turn
        completed = await client.wait_for("turn/completed", lambda p: p["turn"]["id"] == turn_id)
        assert completed["turn"]["run_id"] == run["id"]
        message = completed["turn"]["items"][-1]
        assert message["type"] == "agent_message" and message["text"] == "hello run"
        assert final["result"]["item_id"] == message["id"]
        # response, then run/started, then the turn's notifications
        index = {}
        for n, line in enumerate(client.lines):
            key = "response" if line.get("result", {}).get("run") else line.get("method")
            index.setdefault(key, n)
        assert index["response"] < index["run/started"] < index["turn/started"]
        assert len([p for p in (m["params"] for m in client.notifications("run/updated"))
                    if p["run"]["status"] in TERMINAL]) == 1


async def test_output_schema_valid_first_time(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await _thread(client, tmp_path)
        run, final = await _run_to_end(client, {"thread_id": tid, "prompt": "good json please",
                                                "request": {"mode": "start"}, "output_schema": SUMMARY})
        assert final["status"] == "completed"
        assert final["result"]["output"] == {"summary": "all good"}
        assert len(final["turns"]) == 1
        assert final["request"]["output_schema"] == SUMMARY


async def test_invalid_output_gets_a_correction_turn_in_the_same_run(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await _thread(client, tmp_path)
        run, final = await _run_to_end(client, {"thread_id": tid, "prompt": "bad json first",
                                                "output_schema": SUMMARY, "max_turns": 3})
        assert final["status"] == "completed"
        assert final["result"]["output"] == {"summary": "fixed on the second try"}
        assert [t["purpose"] for t in final["turns"]] == ["start", "correction"]
        assert all(t["status"] == "completed" for t in final["turns"])
        correction_id = final["turns"][1]["id"]
        assert final["result"]["turn_id"] == correction_id
        done = await client.wait_for("turn/completed", lambda p: p["turn"]["id"] == correction_id)
        assert done["turn"]["run_id"] == run["id"]
        prompt = done["turn"]["items"][0]["text"]
        assert "not valid JSON" in prompt and '"summary"' in prompt
        # the correction turn was announced as part of the run before it ended
        updates = [m["params"]["run"] for m in client.notifications("run/updated") if m["params"]["run"]["id"] == run["id"]]
        assert [u["status"] for u in updates] == ["running", "completed"]
        assert len(updates[0]["turns"]) == 2


async def test_max_turns_exhausted_fails(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await _thread(client, tmp_path)
        run, final = await _run_to_end(client, {"thread_id": tid, "prompt": "count things",
                                                "output_schema": COUNT, "max_turns": 2})
        assert final["status"] == "failed"
        assert final["error"]["code"] == "output_invalid" and "2 turn(s)" in final["error"]["message"]
        assert "'many' is not of type 'integer'" in final["error"]["message"]
        assert [t["purpose"] for t in final["turns"]] == ["start", "correction"]
        assert final["result"]["exit_code"] == 1 and final["result"]["output"] is None


async def test_failed_turn_fails_the_run(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await _thread(client, tmp_path)
        run, final = await _run_to_end(client, {"thread_id": tid, "prompt": "fail please", "output_schema": SUMMARY})
        assert final["status"] == "failed" and final["error"]["code"] == "turn_failed"
        assert final["error"]["turn_error"]["category"] == "invalid_request"
        assert len(final["turns"]) == 1  # a failed turn is never corrected


async def test_timeout_ms_times_the_run_out(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await _thread(client, tmp_path)
        run, final = await _run_to_end(client, {"thread_id": tid, "prompt": "slow please", "timeout_ms": 300})
        assert final["status"] == "timed_out"
        assert final["error"]["code"] == "timed_out" and "300 ms" in final["error"]["message"]
        assert final["result"]["exit_code"] == 124
        assert final["turns"][0]["status"] == "interrupted"
        ended = await client.wait_terminal(final["turns"][0]["id"])
        assert ended["turn"]["status"] == "interrupted" and ended["turn"]["run_id"] == run["id"]
        # the thread is free again afterwards
        assert (await client.run_turn(tid, "after the timeout"))["turn"]["status"] == "completed"


async def test_run_interrupt_then_again_returns_as_is(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await _thread(client, tmp_path)
        run = (await client.request("run/start", {"thread_id": tid, "prompt": "slow reply"}))["run"]
        await client.wait_for("item/agentMessage/delta", lambda p: p["turn_id"] == run["turns"][0]["id"])
        stopped = (await client.request("run/interrupt", {"run_id": run["id"]}))["run"]
        assert stopped["status"] == "interrupted" and stopped["error"]["code"] == "interrupted"
        assert stopped["turns"][0]["status"] == "interrupted"
        assert stopped["result"]["item_id"] is not None  # the partial agent message is kept
        again = (await client.request("run/interrupt", {"run_id": run["id"], "reason": "timeout"}))["run"]
        assert again == stopped
        # a second run, interrupted with reason timeout, settles as timed_out
        run2 = (await client.request("run/start", {"thread_id": tid, "prompt": "slow again"}))["run"]
        await client.wait_for("turn/started", lambda p: p["turn"]["id"] == run2["turns"][0]["id"])
        timed = (await client.request("run/interrupt", {"run_id": run2["id"], "reason": "timeout"}))["run"]
        assert timed["status"] == "timed_out" and timed["result"]["exit_code"] == 124
        statuses = [m["params"]["run"]["status"] for m in client.notifications("run/updated")
                    if m["params"]["run"]["id"] in (run["id"], run2["id"])]
        assert statuses == ["interrupted", "timed_out"]


async def test_run_not_found_and_not_attached_and_stored_terminal(env, tmp_path, roost_home):
    from roost.storage import create_run, open_store

    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await _thread(client, tmp_path)
        with pytest.raises(RemoteError) as exc:
            await client.request("run/interrupt", {"run_id": "run_missing"})
        assert exc.value.code == "run_not_found"
        # a live run that another app-server owns
        store = open_store(roost_home / "roost.db")
        try:
            with store.transaction() as conn:
                other = create_run(conn, thread_id=tid, kind="run", status="running", owner="roost-elsewhere")
        finally:
            store.close()
        with pytest.raises(RemoteError) as exc:
            await client.request("run/interrupt", {"run_id": other.id})
        assert exc.value.code == "run_not_attached" and "roost-elsewhere" in exc.value.error["message"]
        run, final = await _run_to_end(client, {"thread_id": tid, "prompt": "good json", "output_schema": SUMMARY})
    # after a restart, the stored terminal run is returned as-is
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        stored = (await client.request("run/interrupt", {"run_id": run["id"]}))["run"]
        assert stored["status"] == "completed"
        assert stored["result"] == final["result"] and stored["turns"] == final["turns"]
        assert stored["request"] == final["request"] and stored["runtime"] == final["runtime"]


async def test_invalid_params_and_busy_thread(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await _thread(client, tmp_path)
        bad = [
            {"thread_id": tid, "prompt": "x", "output_schema": {"type": "nope"}},
            {"thread_id": tid, "prompt": "x", "output_schema": {"properties": {"a": {"minimum": "zero"}}}},
            {"thread_id": tid, "prompt": "x", "request": {"mode": "resume"}},
            {"thread_id": tid, "prompt": "x", "max_turns": 0},
            {"thread_id": tid, "prompt": "x", "timeout_ms": 0},
            {"thread_id": tid, "prompt": "/compact now"},
            {"thread_id": tid},
            {"prompt": "x"},
        ]
        for params in bad:
            with pytest.raises(RemoteError) as exc:
                await client.request("run/start", params)
            assert exc.value.code == "invalid_params", params
        with pytest.raises(RemoteError) as exc:
            await client.request("run/start", {"thread_id": tid, "prompt": "x", "output_schema": {"type": "nope"}})
        assert "output_schema" in exc.value.error["message"]
        with pytest.raises(RemoteError) as exc:
            await client.request("run/start", {"thread_id": "thr_missing", "prompt": "x"})
        assert exc.value.code == "thread_not_found"
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "slow turn"}))["turn"]
        with pytest.raises(RemoteError) as exc:
            await client.request("run/start", {"thread_id": tid, "prompt": "x"})
        assert exc.value.code == "thread_busy"
        await client.request("turn/interrupt", {"thread_id": tid})
        await client.wait_terminal(turn["id"])
        assert client.notifications("run/started") == []


async def test_turn_interrupt_and_end_of_input_settle_live_runs(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await _thread(client, tmp_path)
        # turn/interrupt of the run's turn interrupts the run
        run = (await client.request("run/start", {"thread_id": tid, "prompt": "slow one"}))["run"]
        await client.wait_for("turn/started", lambda p: p["turn"]["id"] == run["turns"][0]["id"])
        await client.request("turn/interrupt", {"thread_id": tid})
        done = await client.wait_for("run/updated", lambda p: p["run"]["id"] == run["id"])
        assert done["run"]["status"] == "interrupted"
        # end of input while a run is live: the run is cancelled and that is persisted
        live = (await client.request("run/start", {"thread_id": tid, "prompt": "slow two"}))["run"]
        await client.wait_for("item/agentMessage/delta", lambda p: p["turn_id"] == live["turns"][0]["id"])
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        stored = (await client.request("run/interrupt", {"run_id": live["id"]}))["run"]
        assert stored["status"] == "cancelled" and stored["error"]["code"] == "cancelled"
        assert stored["turns"][0]["status"] == "interrupted"
        snap = await client.request("thread/resume", {"session_id": tid})
        assert [t["run_id"] for t in snap["turns"]] == [run["id"], live["id"]]


async def test_run_on_an_ephemeral_thread_lives_in_memory(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await _thread(client, tmp_path, ephemeral=True)
        run, final = await _run_to_end(client, {"thread_id": tid, "prompt": "bad json", "output_schema": SUMMARY})
        assert final["status"] == "completed" and len(final["turns"]) == 2
        again = (await client.request("run/interrupt", {"run_id": run["id"]}))["run"]
        assert again == final
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        with pytest.raises(RemoteError) as exc:
            await client.request("run/interrupt", {"run_id": run["id"]})
        assert exc.value.code == "run_not_found"
