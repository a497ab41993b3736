"""End-to-end: `roost exec PROMPT` (JSONL and text output, exit codes, SIGINT) with the scripted engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import trio

from _helpers.appserver import open_app_server, roost_argv, scripted_env, script_env
from _helpers.timing import scaled

SCRIPT = """
rules:
  - match: {prompt: "^tool"}
    steps:
      - - {reasoning: "Let me look."}
        - {tool_call: {name: list_dir, arguments: {path: "."}}}
      - - {text: "Listed it."}
  - match: {prompt: "^fail"}
    steps:
      - - {text: "Trying..."}
        - {error: {category: rate_limit, message: "scripted: slow down", retryable: true}}
  - match: {prompt: "^slow"}
    steps:
      - - {text: "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen", tokens_per_second: 4}
default: echo
"""


@pytest.fixture
def env(tmp_path: Path, roost_home: Path) -> dict:
    return script_env(tmp_path, roost_home, SCRIPT)


async def _exec(env: dict, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    with trio.fail_after(scaled(30)):
        return await trio.run_process([*roost_argv(), "exec", *args], env=env, cwd=str(cwd),
                                      capture_stdout=True, capture_stderr=True, check=False,
                                      stdin=subprocess.DEVNULL)


async def test_exec_json_prints_notifications_and_persists_the_thread(env, tmp_path):
    (tmp_path / "marker.txt").write_text("x")
    proc = await _exec(env, "--json", "--permission-mode", "read_only", "tool time", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    methods = [line["method"] for line in lines]
    assert all("id" not in line for line in lines)
    assert methods[0] == "thread/started" and methods[1] == "turn/started" and methods[-1] == "turn/completed"
    assert not any(m.startswith("item/reasoning/") for m in methods)
    thread = lines[0]["params"]["thread"]
    assert thread["cwd"] == str(tmp_path) and thread["permission_mode"] == "read_only"
    turn = lines[-1]["params"]["turn"]
    assert turn["status"] == "completed"
    tool = next(i for i in turn["items"] if i["type"] == "tool_call")
    assert "marker.txt" in tool["output"]
    assert turn["items"][-1]["text"] == "Listed it."
    # the thread is persistent: an app-server can resume it
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": thread["id"]})
        assert snap["turns"][-1]["id"] == turn["id"] and snap["turns"][-1]["status"] == "completed"


async def test_exec_text_output(env, tmp_path):
    other = tmp_path / "work"
    other.mkdir()
    (other / "inside.txt").write_text("x")
    proc = await _exec(env, "--cwd", str(other), "tool please", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == '$ list_dir {"path":"."}\nListed it.\n'
    proc = await _exec(env, "--ephemeral", "plain echo", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.decode() == "plain echo\n"


async def test_exec_failed_turn_exits_1(env, tmp_path):
    proc = await _exec(env, "fail now", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.decode() == "Trying...\n"
    assert "error: rate_limit: scripted: slow down" in proc.stderr.decode()
    proc = await _exec(env, "--json", "fail now", cwd=tmp_path)
    assert proc.returncode == 1
    last = json.loads(proc.stdout.decode().splitlines()[-1])
    assert last["method"] == "turn/error" and last["params"]["turn"]["status"] == "failed"


async def test_exec_without_provider_exits_2_naming_the_settings(tmp_path, roost_home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
    env["ROOST_HOME"] = str(roost_home)
    proc = await _exec(env, "hello", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == b""
    message = proc.stderr.decode()
    assert "ROOST_PROVIDER" in message and "--provider" in message


async def test_exec_sigint_interrupts_the_turn_and_exits_130(env, tmp_path):
    process = await trio.lowlevel.open_process(
        [*roost_argv(), "exec", "--json", "slow reply"], env=env, cwd=str(tmp_path),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    lines: list[dict] = []
    buf = b""
    try:
        with trio.fail_after(scaled(30)):
            while not any(m["method"] == "item/agentMessage/delta" for m in lines):
                data = await process.stdout.receive_some(1 << 16)
                assert data, "roost exec ended before streaming"
                buf += data
                *complete, buf = buf.split(b"\n")
                lines.extend(json.loads(line) for line in complete)
            process.send_signal(signal.SIGINT)
            while data := await process.stdout.receive_some(1 << 16):
                buf += data
            lines.extend(json.loads(line) for line in buf.split(b"\n") if line)
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert code == 130
    terminal = [m for m in lines if m["method"] in ("turn/completed", "turn/error")]
    assert len(terminal) == 1
    turn = terminal[0]["params"]["turn"]
    assert turn["status"] == "interrupted"
    partial = [i for i in turn["items"] if i["type"] == "agent_message"]
    assert partial and partial[0]["status"] == "interrupted"


@pytest.mark.parametrize("as_json", [False, True])
async def test_exec_exits_1_and_stores_output_closed_when_stdout_closes(env, tmp_path, roost_home, as_json):
    """`roost exec slow | head -c 10`: the turn is interrupted, stored with reason
    ``output_closed``, and exec exits 1 as its help says ("1 failed or interrupted")."""
    argv = [*roost_argv(), "exec", *(["--json"] if as_json else []), "slow reply"]
    process = await trio.lowlevel.open_process(argv, env=env, cwd=str(tmp_path), stdin=subprocess.DEVNULL,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with trio.fail_after(scaled(30)):
            assert await process.stdout.receive_some(10)
            await process.stdout.aclose()  # like `head -c 10` exiting
            code = await process.wait()
            stderr = await process.stderr.receive_some(1 << 16)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert code == 1, stderr
    assert b"Traceback" not in stderr
    import sqlite3

    with sqlite3.connect(roost_home / "roost.db") as conn:
        rows = conn.execute("SELECT status, error FROM turns").fetchall()
    assert len(rows) == 1 and rows[0][0] == "interrupted"
    error = json.loads(rows[0][1])
    assert error["reason"] == "output_closed" and "output was closed" in error["message"]


async def test_exec_text_sigint_says_interrupted_once(env, tmp_path):
    """The text output said "interrupted: interrupted (SIGINT)"."""
    process = await trio.lowlevel.open_process(
        [*roost_argv(), "exec", "slow reply"], env=env, cwd=str(tmp_path),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = b""
    try:
        with trio.fail_after(scaled(30)):
            assert await process.stdout.receive_some(1 << 16)  # the reply streams
            process.send_signal(signal.SIGINT)
            while data := await process.stderr.receive_some(1 << 16):
                err += data
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert code == 130
    lines = err.decode().splitlines()
    assert "interrupted by SIGINT" in lines and not any("interrupted: interrupted" in line for line in lines)
