"""End-to-end tests of ``roost serve``'s input lines: plain text is a task, broken JSON is not.

wire-protocol.md "Input": on the serve socket a plain text line is dispatched as a task; a line that
starts like JSON (``{`` or ``[``) but is not a JSON object is an input error (an ``error`` event,
nothing queued: ``parse_error`` when it does not parse, ``invalid_request`` when it is JSON of
another kind, the app-server's codes), on the Unix socket and on the WebSocket alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from _helpers.appserver import roost_argv
from _helpers.serve_client import open_daemon

#: (line, code): not JSON and a truncated object are parse_error, JSON that is not an object
#: invalid_request, as on the app-server (docs/app-server.md, "Errors")
BROKEN = [("{not json", "parse_error"), ("[1,2]", "invalid_request"),
          ('{"type": "user_input", "text": "hi"', "parse_error"),
          ('[{"type": "user_input", "text": "hi"}]', "invalid_request")]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"default": "echo"}))
    return path


async def _refused_then_plain_text_runs(client) -> None:
    """Send each broken line (each gets an error, none is queued), then a plain text task."""
    await client.wait_for("hello")
    for line, code in BROKEN:
        start = len(client.events)
        await client.send(line)
        error = await client.wait_for("error", start=start)
        words = "does not parse" if code == "parse_error" else "not a JSON object"
        assert error["code"] == code and words in error["text"], (line, error)
    await client.send("plain text still works")
    result = await client.wait_for("result")
    assert result["task"] == "plain text still works" and result["lastMessage"] == "plain text still works"
    assert len(client.of_type("queued")) == 1 and len(client.of_type("error")) == len(BROKEN)
    assert len(client.of_type("result")) == 1


async def test_broken_json_on_the_unix_socket_is_an_error_not_a_task(script: Path) -> None:
    async with open_daemon(script=script) as daemon:
        async with daemon.unix() as client:
            await _refused_then_plain_text_runs(client)
    sessions = json.loads((await trio.run_process([*roost_argv(), "sessions", "--json", "--all"],
                                                  capture_stdout=True)).stdout)["items"]
    assert [s["task"] for s in sessions] == ["plain text still works"]


async def test_broken_json_on_the_websocket_is_an_error_not_a_task(script: Path) -> None:
    async with open_daemon(script=script) as daemon:
        async with daemon.ws(client_id="w") as client:
            await _refused_then_plain_text_runs(client)


async def test_attach_json_mode_does_not_wait_for_a_refused_line(script: Path) -> None:
    # `roost attach --json` forwards a broken JSON line unchanged; it does not count it as a task
    # (the daemon refuses it), so attach ends at end of stdin once its real task has its result
    lines = "{broken\n[1,2]\nplain task\n"
    async with open_daemon(script=script) as daemon:
        done = await trio.run_process([*roost_argv(), "attach", "--json", daemon.socket], stdin=lines.encode(),
                                      capture_stdout=True, capture_stderr=True, check=False)
    events = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert done.returncode == 0, done.stderr.decode()
    assert [e["code"] for e in events if e["type"] == "error"] == ["parse_error", "invalid_request"]
    assert [e["task"] for e in events if e["type"] == "result"] == ["plain task"]
    assert len([e for e in events if e["type"] == "queued"]) == 1


async def _bad_utf8_is_a_parse_error(client, send_raw) -> None:
    await client.wait_for("hello")
    start = len(client.events)
    await send_raw(b"\xff\xfe")
    error = await client.wait_for("error", start=start)
    assert error["code"] == "parse_error" and "UTF-8" in error["text"]
    await client.send("plain text still works")
    result = await client.wait_for("result")
    assert result["task"] == "plain text still works"
    assert len(client.of_type("queued")) == 1 and len(client.of_type("result")) == 1


async def test_invalid_utf8_on_the_unix_socket_is_a_parse_error_not_a_task(script: Path) -> None:
    async with open_daemon(script=script) as daemon:
        async with daemon.unix() as client:
            await _bad_utf8_is_a_parse_error(client, lambda data: client.stream.send_all(data + b"\n"))
    sessions = json.loads((await trio.run_process([*roost_argv(), "sessions", "--json", "--all"],
                                                  capture_stdout=True)).stdout)["items"]
    assert [s["task"] for s in sessions] == ["plain text still works"]


async def test_invalid_utf8_on_the_websocket_is_a_parse_error_not_a_task(script: Path) -> None:
    async with open_daemon(script=script) as daemon:
        async with daemon.ws(client_id="w") as client:
            await _bad_utf8_is_a_parse_error(client, client.ws.send_message)  # bytes: a binary message


async def test_a_websocket_message_is_exactly_one_line(script: Path) -> None:
    # docs/wire.md: each message is one line; a newline inside it is a parse_error, not two tasks
    async with open_daemon(script=script) as daemon:
        async with daemon.ws(client_id="w") as client:
            await client.wait_for("hello")
            await client.send("one\ntwo")
            error = await client.wait_for("error")
            assert error["code"] == "parse_error" and "one line" in error["text"]
            await client.send("three\n")  # one terminator at the end is allowed
            result = await client.wait_for("result")
            assert result["task"] == "three"
            assert len(client.of_type("queued")) == 1 and len(client.of_type("result")) == 1


async def test_a_huge_integer_on_the_unix_socket_is_valid_json(script: Path) -> None:
    """A 400-digit integer is valid JSON (orjson alone refused it as "number is infinity"): the
    line is read as the input message it is, not refused as a parse_error."""
    async with open_daemon(script=script) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")
            await client.send('{"type": "user_input", "text": "big number", "n": %s}' % ("9" * 400))
            result = await client.wait_for("result")
            assert result["task"] == "big number"
            assert client.of_type("error") == []


async def test_an_input_object_without_a_type_says_the_field_is_missing(script: Path) -> None:
    """A fresh-user trial got ``unknown input type None`` for ``{"text": "hi"}``: the error now
    names the missing ``type`` field (code invalid_request, as before); an unknown type still says
    unknown, and neither is queued."""
    async with open_daemon(script=script) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")
            errors = []
            for line in ('{"text": "hi"}', "{}", '{"type": "frobnicate"}'):
                start = len(client.events)
                await client.send(line)
                errors.append(await client.wait_for("error", start=start))
    missing, empty, unknown = errors
    for error in (missing, empty):
        assert error["code"] == "invalid_request" and 'no "type" field' in error["text"], error
        assert "None" not in error["text"] and "user_input" in error["text"], error
    assert unknown["code"] == "invalid_request" and "unknown input type 'frobnicate'" in unknown["text"], unknown
    assert client.of_type("queued") == []
