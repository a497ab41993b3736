"""End-to-end durability of `roost app-server` (issue 4): interrupt, kill -9, end of input, retries.

Every test runs the real command as a subprocess on the scripted engine and synchronises on the
protocol's events (and on files its tool commands write), never on sleeps.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import trio

from _helpers.appserver import AppServerClient, RemoteError, open_app_server, scripted_env

from roost.engines import INTERRUPTED_OUTPUT
from _helpers.timing import scaled

SLOW_TEXT = " ".join(f"word{i}" for i in range(400))


def write_script(path: Path, pidfile: Path) -> Path:
    """A scripted-engine script (JSON, so the shell command needs no YAML quoting)."""
    command = f"sleep 1000 & echo $$ $! > {pidfile}; echo started; sleep 1000"
    script = {
        "rules": [
            {"match": {"prompt": "^shell-wait"},
             "steps": [[{"tool_call": {"name": "shell", "arguments": {"command": command}}}],
                       [{"text": "unreachable"}]]},
            {"match": {"prompt": "^what happened"},
             "steps": [[{"text": "tool said: {tool_output}"}]]},
            {"match": {"prompt": "^slow"},
             "steps": [[{"text": SLOW_TEXT, "tokens_per_second": 10}]]},
        ],
        "default": "echo",
    }
    path.write_text(json.dumps(script))
    return path


@pytest.fixture
def pidfile(tmp_path: Path) -> Path:
    return tmp_path / "pids"


@pytest.fixture
def env(tmp_path: Path, roost_home: Path, pidfile: Path) -> dict:
    return scripted_env(roost_home, write_script(tmp_path / "script.json", pidfile))


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, killed but not yet reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


async def wait_output(client: AppServerClient, text: str, *, start: int = 0) -> None:
    """Wait until the tool output streamed so far (item/toolCall/outputDelta) contains ``text``."""
    seen: list[str] = []

    def check(line: dict) -> bool:
        if line.get("method") == "item/toolCall/outputDelta":
            seen.append(line["params"]["delta"])
        return text in "".join(seen)

    await client.wait_line(check, start=start)


def terminal_events(client: AppServerClient, turn_id: str) -> list[dict]:
    return [m["params"] for m in client.lines if m.get("method") in ("turn/completed", "turn/error")
            and "id" not in m and m["params"]["turn"]["id"] == turn_id]


async def start_thread(client: AppServerClient, cwd: Path, **params) -> str:
    await client.initialize()
    return (await client.request("thread/start", {"cwd": str(cwd), **params}))["thread"]["id"]


async def test_interrupt_kills_tool_process_group_and_history_keeps_a_result(env, tmp_path, pidfile):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await start_thread(client, tmp_path, permission_mode="unconfined")
        start = len(client.lines)
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "shell-wait"}))["turn"]
        await wait_output(client, "started", start=start)
        shell_pid, background_pid = (int(p) for p in pidfile.read_text().split())
        assert alive(shell_pid) and alive(background_pid)

        reply = await client.request("turn/interrupt", {"thread_id": tid})
        assert reply["interrupted"] is True
        done = await client.wait_terminal(turn["id"], start=start)
        assert done["turn"]["status"] == "interrupted"
        assert done["turn"]["error"]["reason"] == "interrupted"
        # The tool's whole process group is gone (SIGTERM, then SIGKILL after the grace period).
        assert not alive(shell_pid) and not alive(background_pid)
        tool = next(i for i in done["turn"]["items"] if i["type"] == "tool_call")
        assert tool["status"] == "interrupted"
        assert tool["is_error"] is True and tool["output"] == INTERRUPTED_OUTPUT

        # Twice, and after the end: deterministic answers, and still one terminal event.
        again = await client.request("turn/interrupt", {"thread_id": tid, "turn_id": turn["id"]})
        assert again["interrupted"] is False and again["turn"]["status"] == "interrupted"
        latest = await client.request("turn/interrupt", {"thread_id": tid})
        assert latest["interrupted"] is False and latest["turn"]["id"] == turn["id"]
        assert len(terminal_events(client, turn["id"])) == 1

        # The next model request sees a result for the interrupted call.
        after = await client.run_turn(tid, "what happened")
        assert after["turn"]["status"] == "completed"
        assert after["turn"]["items"][-1]["text"] == f"tool said: {INTERRUPTED_OUTPUT}"

    # After a restart the history is rebuilt from SQLite: the item and its result persisted.
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": tid})
        first = snap["turns"][0]
        assert first["status"] == "interrupted"
        stored = next(i for i in first["items"] if i["type"] == "tool_call")
        assert stored["status"] == "interrupted" and stored["output"] == INTERRUPTED_OUTPUT
        again = await client.run_turn(tid, "what happened now")
        assert again["turn"]["items"][-1]["text"] == f"tool said: {INTERRUPTED_OUTPUT}"


async def test_interrupt_in_the_same_write_as_turn_start(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await start_thread(client, tmp_path)
        start = len(client.lines)
        both = [
            {"id": "s1", "method": "turn/start", "params": {"thread_id": tid, "prompt": "slow please"}},
            {"id": "s2", "method": "turn/interrupt", "params": {"thread_id": tid}},
        ]
        await client.send(b"".join(json.dumps(m).encode() + b"\n" for m in both))
        started = await client.wait_line(lambda m: m.get("id") == "s1", start=start)
        turn_id = started["result"]["turn"]["id"]
        stop = await client.wait_line(lambda m: m.get("id") == "s2", start=start)
        assert stop["result"]["interrupted"] is True
        assert stop["result"]["turn"]["id"] == turn_id
        done = await client.wait_terminal(turn_id, start=start)
        assert done["turn"]["status"] == "interrupted"
        # A full round trip later there is still exactly one terminal event for the turn.
        snap = await client.request("thread/resume", {"session_id": tid})
        assert snap["thread"]["status"] == "idle" and snap["turns"][-1]["status"] == "interrupted"
        assert len(terminal_events(client, turn_id)) == 1
        methods = [m.get("method") for m in client.lines[start:] if "id" not in m]
        assert methods.index("turn/started") < methods.index("turn/completed")
        assert (await client.run_turn(tid, "hello"))["turn"]["status"] == "completed"


async def test_kill_9_mid_turn_then_restart(env, tmp_path, roost_home):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await start_thread(client, tmp_path, permission_mode="unconfined")
        start = len(client.lines)
        # a running tool call: a steer waits for the next model step (it is not cut in)
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "shell-wait"}))["turn"]
        await wait_output(client, "started", start=start)
        held = (await client.request("turn/queue", {"thread_id": tid, "prompt": "held one", "hold": True,
                                                    "client_id": "q-1"}))["input"]
        steer = await client.request("turn/steer", {"thread_id": tid, "prompt": "steer one",
                                                    "expected_turn_id": turn["id"], "client_id": "s-1"})
        # Retries with the same client_id return the original input, never a second one.
        retry = (await client.request("turn/queue", {"thread_id": tid, "prompt": "held one", "hold": True,
                                                     "client_id": "q-1"}))["input"]
        assert retry["id"] == held["id"]
        retry_steer = await client.request("turn/steer", {"thread_id": tid, "prompt": "steer one",
                                                          "expected_turn_id": turn["id"], "client_id": "s-1"})
        assert retry_steer["input"]["id"] == steer["input"]["id"]
        # Accepted input is durable before its response: it is in SQLite right now.
        with sqlite3.connect(roost_home / "roost.db") as db:
            rows = db.execute("SELECT id FROM held_input WHERE thread_id = ?", (tid,)).fetchall()
        assert sorted(r[0] for r in rows) == sorted([held["id"], steer["input"]["id"]])
        client.process.kill()  # SIGKILL: no clean-up at all, and its lease is left unexpired
        await client.process.wait()

    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": tid})
        assert snap["thread"]["status"] == "idle"
        killed = snap["turns"][-1]
        assert killed["id"] == turn["id"] and killed["status"] == "interrupted"
        assert killed["error"]["reason"] == "abandoned"  # settled by start-up reconciliation
        assert [i["text"] for i in killed["items"] if i["type"] == "user_message"] == ["shell-wait"]
        assert snap["pending_user_messages"] == []
        assert [(h["prompt"], h["client_id"]) for h in snap["held_user_messages"]] == [
            ("held one", "q-1"), ("steer one", "s-1")]
        # A retry after the restart still finds the original.
        retry = (await client.request("turn/queue", {"thread_id": tid, "prompt": "held one", "hold": True,
                                                     "client_id": "q-1"}))["input"]
        assert retry["id"] == held["id"]
        # The dead process's lease does not block: a new turn is accepted.
        done = await client.run_turn(tid, "after restart")
        assert done["turn"]["status"] == "completed"
        # Sending the held steer starts a turn with it; its client_id is then consumed.
        start = len(client.lines)
        sent = await client.request("turn/steer", {"thread_id": tid, "input_id": steer["input"]["id"]})
        sent_done = await client.wait_terminal(sent["turn"]["id"], start=start)
        users = [i for i in sent_done["turn"]["items"] if i["type"] == "user_message"]
        assert [(u["text"], u["source_id"]) for u in users] == [("steer one", "s-1")]
        with pytest.raises(RemoteError) as exc:
            await client.request("turn/queue", {"thread_id": tid, "prompt": "steer one", "client_id": "s-1"})
        assert exc.value.code == "invalid_params"
        snap = await client.request("thread/resume", {"session_id": tid})
        assert [h["id"] for h in snap["held_user_messages"]] == [held["id"]]
        texts = [i["text"] for t in snap["turns"] for i in t["items"] if i["type"] == "user_message"]
        assert texts == ["shell-wait", "after restart", "steer one"]


async def test_end_of_input_mid_turn_exits_0_and_persists_the_interruption(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await start_thread(client, tmp_path)
        start = len(client.lines)
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "slow reply"}))["turn"]
        await client.wait_for("item/agentMessage/delta", start=start)
        await client.request("turn/queue", {"thread_id": tid, "prompt": "queued one"})
        await client.close_stdin()
        with trio.fail_after(scaled(20)):
            code = await client.process.wait()
        assert code == 0
        # The terminal event still went out before the process exited.
        (done,) = terminal_events(client, turn["id"])
        assert done["turn"]["status"] == "interrupted" and done["turn"]["error"]["reason"] == "shutdown"

    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": tid})
        last = snap["turns"][-1]
        # Persisted by the exiting process itself (reconciliation would not name the reason).
        assert last["status"] == "interrupted" and last["error"]["reason"] == "shutdown"
        assert any(i["type"] == "agent_message" and i["status"] == "interrupted" for i in last["items"])
        assert [h["prompt"] for h in snap["held_user_messages"]] == ["queued one"]
        assert (await client.run_turn(tid, "hello again"))["turn"]["status"] == "completed"


async def test_interrupt_right_after_queueing_on_an_idle_thread(env, tmp_path):
    """turn/queue on an idle thread starts a turn; an interrupt in the same write stops it either
    before it started (the input becomes held work) or as an interrupted turn, never completed."""
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await start_thread(client, tmp_path)
        start = len(client.lines)
        both = [
            {"id": "q1", "method": "turn/queue", "params": {"thread_id": tid, "prompt": "slow queued"}},
            {"id": "q2", "method": "turn/interrupt", "params": {"thread_id": tid}},
        ]
        await client.send(b"".join(json.dumps(m).encode() + b"\n" for m in both))
        queued = (await client.wait_line(lambda m: m.get("id") == "q1", start=start))["result"]["input"]
        stop = (await client.wait_line(lambda m: m.get("id") == "q2", start=start))["result"]
        assert stop["interrupted"] is True
        if "input" in stop:  # withdrawn before its turn was admitted
            assert stop["input"]["id"] == queued["id"]
            await client.wait_for("turn/held", lambda p: p["input"]["id"] == queued["id"], start=start)
            snap = await client.request("thread/resume", {"session_id": tid})
            assert [h["id"] for h in snap["held_user_messages"]] == [queued["id"]]
            assert snap["turns"] == []
        else:
            turn_id = stop["turn"]["id"]
            done = await client.wait_terminal(turn_id, start=start)
            assert done["turn"]["status"] == "interrupted"
            assert [i["text"] for i in done["turn"]["items"] if i["type"] == "user_message"] == ["slow queued"]
            snap = await client.request("thread/resume", {"session_id": tid})
            assert len(terminal_events(client, turn_id)) == 1
            assert snap["held_user_messages"] == [] and snap["pending_user_messages"] == []
        assert snap["thread"]["status"] == "idle"


async def test_sigterm_shuts_down_like_end_of_input(tmp_path, roost_home):
    import signal as _signal

    script = tmp_path / "slow.yaml"
    script.write_text('rules:\n  - steps:\n      - - {text: "a b c d e f g h i j k l m n o p", tokens_per_second: 4}\n')
    env = scripted_env(roost_home, script)
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "go"}))["turn"]
        await client.wait_for("item/agentMessage/delta")
        client.process.send_signal(_signal.SIGTERM)
        done = await client.wait_terminal(turn["id"])
        assert done["turn"]["status"] == "interrupted"
        assert await client.process.wait() == 0
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": tid})
        assert snap["turns"][-1]["status"] == "interrupted"
        partial = [i for i in snap["turns"][-1]["items"] if i["type"] == "agent_message"]
        assert partial and partial[0]["text"].startswith("a ")


async def test_kill_9_while_a_tool_runs_keeps_the_call_and_reaps_its_processes(env, tmp_path, pidfile):
    """The started tool call is durable before it runs: after kill -9 and a restart it is in the
    history as interrupted (the model is told it was cut short), and its processes are gone."""
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await start_thread(client, tmp_path, permission_mode="unconfined")
        start = len(client.lines)
        await client.request("turn/start", {"thread_id": tid, "prompt": "shell-wait"})
        await wait_output(client, "started", start=start)
        shell_pid, background_pid = (int(p) for p in pidfile.read_text().split())
        client.process.kill()
        await client.process.wait()

    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        with trio.fail_after(scaled(10)):  # start-up reconciliation reaped the dead process's tool group
            while alive(shell_pid) or alive(background_pid):
                await trio.sleep(0.05)
        snap = await client.request("thread/resume", {"session_id": tid})
        killed = snap["turns"][-1]
        assert killed["status"] == "interrupted" and killed["error"]["reason"] == "abandoned"
        tool = next(i for i in killed["items"] if i["type"] == "tool_call")
        assert tool["status"] == "interrupted" and tool["name"] == "shell"
        assert "sleep 1000" in tool["arguments"]["command"]
        after = await client.run_turn(tid, "what happened")
        assert after["turn"]["items"][-1]["text"] == f"tool said: {INTERRUPTED_OUTPUT}"
