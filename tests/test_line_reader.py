"""One line reader for every input path (issue 12, item 7): an oversized line gets an error and
never becomes input, end to end through the real ``roost`` command on each path.

``ROOST_MAX_LINE_BYTES`` lowers the limit of every path so the tests need no 64 MiB of input.
The app-server stdio path is covered by ``test_appserver_turns.py``
(``test_malformed_and_oversized_lines_then_reading_goes_on``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
from _helpers.appserver import roost_argv, script_env
from _helpers.serve_client import UnixClient, WsClient, open_daemon
from trio_websocket import open_websocket_url

from roost.protocol import FrameError, LineDecoder
from _helpers.timing import scaled

LIMIT = 200
TIMEOUT = scaled(30.0)
SCRIPT = {"rules": [{"match": {"agent": "Solo"}, "steps": [[{"text": "one two three four", "tokens_per_second": 8}]]}],
          "default": "echo"}
SCRIPT_TEXT = json.dumps(SCRIPT)   # JSON is YAML
TEAM = """
Orchestration:
  Name: Solo
  Agents:
    - {Name: Solo, Instructions: "Answer."}
  Selection: {Type: sequential}
  Termination: {Type: maxiterations, MaxIterations: 1}
"""
OVERSIZED = "x" * 1000


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(SCRIPT))
    return path


def test_text_mode_decoder_keeps_blank_lines_and_drops_every_part_of_an_oversized_one() -> None:
    decoder = LineDecoder(max_line_bytes=8, parse=False)
    frames = decoder.feed(b"one\r\n\n" + b"y" * 20) + decoder.feed(b"tail of it\nok\n")
    assert frames[:2] == ["one", ""]
    assert isinstance(frames[2], FrameError) and frames[2].oversized
    assert frames[3:] == ["ok"]   # the tail of the oversized line is not a line
    assert decoder.feed(b"\xffz\n") == ["\ufffdz"]


async def _check_serve_client(conn: UnixClient | WsClient, stream: trio.SocketStream | None = None) -> None:
    await conn.wait_for("hello")
    start = len(conn.events)
    if stream is not None:   # the long line arrives in pieces, as over a real socket
        await stream.send_all(OVERSIZED[:600].encode())
        await trio.sleep(0.05)
    await conn.send(OVERSIZED)
    await conn.send("after the long line")
    error = await conn.wait_for("error", start=start)
    assert error["code"] == "parse_error" and f"limit of {LIMIT} bytes" in error["text"]
    queued = await conn.wait_for("queued", start=start)
    await conn.wait_for("result", lambda e: e.get("sessionId") == queued["sessionId"], start=start)
    # Nothing of the oversized line became a task: one queued task, the line after it.
    assert len(conn.of_type("queued")) == 1
    assert conn.of_type("result")[-1]["task"] == "after the long line"


async def test_serve_socket_oversized_line_is_an_error_not_a_task(script: Path) -> None:
    async with open_daemon(script=script, env={"ROOST_MAX_LINE_BYTES": str(LIMIT)}) as daemon, \
            trio.open_nursery() as nursery:
        stream = await trio.open_unix_socket(daemon.socket)
        conn = UnixClient(stream)
        nursery.start_soon(conn.reader)
        await _check_serve_client(conn, stream)
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_websocket_attach_oversized_line_is_an_error_not_a_task(script: Path) -> None:
    async with open_daemon(script=script, env={"ROOST_MAX_LINE_BYTES": str(LIMIT)}) as daemon, \
            trio.open_nursery() as nursery:
        async with open_websocket_url(f"ws://127.0.0.1:{daemon.port}/attach") as ws:
            conn = WsClient(ws)
            nursery.start_soon(conn.reader)
            await _check_serve_client(conn)
        nursery.cancel_scope.cancel()


async def _stdio(argv: list[str], env: dict, cwd: Path, lines: bytes) -> tuple[list[dict], str]:
    with trio.fail_after(TIMEOUT * 2):
        done = await trio.run_process(argv, stdin=lines, capture_stdout=True, capture_stderr=True,
                                      check=False, env=env, cwd=str(cwd))
    events = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return events, done.stderr.decode()


async def test_repl_vscode_stdin_oversized_line(tmp_path: Path, roost_home: Path) -> None:
    env = dict(script_env(tmp_path, roost_home, SCRIPT_TEXT), ROOST_MAX_LINE_BYTES=str(LIMIT))
    lines = (json.dumps({"type": "user_input", "text": OVERSIZED}) + "\n"
             + json.dumps({"type": "user_input", "text": "short one"}) + "\n").encode()
    events, _err = await _stdio([*roost_argv(), "repl", "--vscode", "--no-banner"], env, tmp_path, lines)
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 1 and f"limit of {LIMIT} bytes" in errors[0]["text"], events
    starts = [e for e in events if e["type"] == "turn_start"]
    assert len(starts) == 1, events   # only the short input became a turn
    streamed = "".join(e["text"] for e in events if e["type"] == "token")
    assert streamed.startswith("short") and "xxx" not in streamed, events


async def test_bridge_stdin_oversized_line(tmp_path: Path, roost_home: Path) -> None:
    config = tmp_path / "team.yaml"
    config.write_text(TEAM)
    env = dict(script_env(tmp_path, roost_home, SCRIPT_TEXT), ROOST_MAX_LINE_BYTES=str(LIMIT))
    lines = (json.dumps({"type": "approval_response", "approved": True, "pad": OVERSIZED}) + "\n").encode()
    events, _err = await _stdio([*roost_argv(), "run", "--bridge", "-c", str(config), "Task"], env, tmp_path, lines)
    errors = [e for e in events if e["type"] == "error"]
    assert any(f"limit of {LIMIT} bytes" in e["text"] for e in errors), events
    assert events[-1]["type"] == "result" and events[-1]["succeeded"] is True, events[-1]


async def test_attach_stdin_oversized_line_is_reported_and_not_sent(script: Path) -> None:
    async with open_daemon(script=script, env={"ROOST_MAX_LINE_BYTES": str(LIMIT)}) as daemon:
        environ = {k: v for k, v in os.environ.items() if k not in ("FUSERAFT_SERVE_TOKEN", "ROOST_SERVE_TOKEN")}
        environ["ROOST_MAX_LINE_BYTES"] = str(LIMIT)
        with trio.fail_after(TIMEOUT):
            done = await trio.run_process([*roost_argv(), "attach", daemon.socket],
                                          stdin=(OVERSIZED + "\nplain task\n").encode(), capture_stdout=True,
                                          capture_stderr=True, check=False, env=environ)
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, (out, err)
    assert f"input line ignored: line exceeds the limit of {LIMIT} bytes" in err
    assert out.count("queued, position") == 1 and "result: succeeded ('plain task')" in out
    assert "xxxx" not in out


async def test_terminal_repl_stdin_oversized_line(tmp_path: Path, roost_home: Path) -> None:
    env = dict(script_env(tmp_path, roost_home, SCRIPT_TEXT), ROOST_MAX_LINE_BYTES=str(LIMIT))
    with trio.fail_after(TIMEOUT * 2):
        done = await trio.run_process([*roost_argv(), "repl", "--no-banner"],
                                      stdin=(OVERSIZED + "\nhi there\n").encode(), capture_stdout=True,
                                      capture_stderr=True, check=False, env=env, cwd=str(tmp_path))
    out, err = done.stdout.decode(), done.stderr.decode()
    assert f"input line ignored: line exceeds the limit of {LIMIT} bytes" in err, (out, err)
    assert "hi there" in out and "xxxx" not in out
