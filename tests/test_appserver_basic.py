"""End-to-end: `roost app-server` over stdio with the scripted engine (the core path)."""

from __future__ import annotations

import contextlib
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from _helpers.appserver import RemoteError, open_app_server, scripted_env, script_env
from _helpers.timing import scaled

SCRIPT = """
rules:
  - match: {prompt: "^tool"}
    steps:
      - - {text: "Listing."}
        - {tool_call: {name: list_dir, arguments: {path: "."}}}
      - - {text: "Done listing."}
  - match: {prompt: "^slow"}
    steps:
      - - {text: "one two three four five six seven eight nine ten", tokens_per_second: 4}
default: echo
"""


@pytest.fixture
def env(tmp_path: Path, roost_home: Path) -> dict:
    return script_env(tmp_path, roost_home, SCRIPT)


async def test_initialize_thread_and_turn(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        init = await client.initialize()
        assert init["protocol_version"] == "wuu-app-server/v0.1"
        assert init["status"] == "ready"
        thread = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]
        assert thread["status"] == "idle" and thread["cwd"] == str(tmp_path)
        done = await client.run_turn(thread["id"], "hello there", client_id="c-1")
        turn = done["turn"]
        assert turn["status"] == "completed"
        kinds = [i["type"] for i in turn["items"]]
        assert kinds == ["user_message", "agent_message"]
        assert turn["items"][0]["source_id"] == "c-1"
        deltas = [n["params"]["delta"] for n in client.notifications("item/agentMessage/delta")]
        assert "".join(deltas) == "hello there"
        assert turn["items"][1]["text"] == "hello there"
        # response before turn/started, exactly one terminal event
        methods = [m.get("method") or "response" for m in client.lines]
        assert methods.index("turn/started") > 0
        assert len(client.notifications("turn/completed")) == 1


async def test_errors_are_structured_and_reading_goes_on(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.send(b"this is not json\n")
        bad = await client.wait_line(lambda m: "error" in m)
        assert bad["error"]["code"] == "parse_error"
        await client.send(b"[1,2]\n")
        await client.wait_line(lambda m: m.get("error", {}).get("code") == "invalid_request")
        with pytest.raises(RemoteError) as exc:
            await client.request("no/such/method")
        assert exc.value.code == "method_not_found"
        with pytest.raises(RemoteError) as exc:
            await client.request("initialize", {"protocol_version": "other/v9"})
        assert exc.value.code == "invalid_params"
        for client_info in ({"name": 5}, {"name": "c", "version": 1}):  # wrong JSON types of client
            with pytest.raises(RemoteError) as exc:
                await client.initialize(client=client_info)
            assert exc.value.code == "invalid_params" and "must be a string" in exc.value.error["message"]
        for value in (1, "yes", {}):  # capabilities.deferred_notification_content is a boolean
            with pytest.raises(RemoteError) as exc:
                await client.initialize(capabilities={"deferred_notification_content": value})
            assert exc.value.code == "invalid_params"
            assert "deferred_notification_content must be true or false" in exc.value.error["message"]
        with pytest.raises(RemoteError) as exc:
            await client.request("thread/start", {"bogus": 1})
        assert exc.value.code == "invalid_params" and "bogus" in exc.value.error["message"]
        with pytest.raises(RemoteError) as exc:
            await client.request("turn/start", {"thread_id": "thr_missing", "prompt": "x"})
        assert exc.value.code == "thread_not_found"
        with pytest.raises(RemoteError) as exc:
            await client.request("turn/start", {"thread_id": 5, "prompt": "x"})
        assert exc.value.code == "invalid_params"
        await client.send(b'{"method":"thread/list"}\n')  # no id: nothing to echo, so an error
        await client.wait_line(lambda m: m.get("id") is None and "id is required" in m.get("error", {}).get("message", ""))
        with pytest.raises(RemoteError) as exc:
            await client.request("engine/update", {})  # a spec method for a feature Roost lacks
        assert exc.value.code == "unsupported" and "external engines" in exc.value.error["message"]
        for name in ("engine/auth/methods", "engine/authenticate", "engine/auth/cancel"):
            with pytest.raises(RemoteError) as exc:
                await client.request(name, {"engine_id": "acp"})
            assert exc.value.code == "unsupported" and name in exc.value.error["message"]
            assert "sign-in of external ACP engines" in exc.value.error["message"]
        assert (await client.initialize())["status"] == "ready"


async def test_an_integer_beyond_64_bits_is_out_of_range_not_a_float(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        await client.send(b'{"id":"big","method":"thread/list","params":{"limit":123456789012345678901234567890}}\n')
        reply = await client.wait_line(lambda m: m.get("id") == "big")
        assert reply["error"]["code"] == "invalid_params"
        assert reply["error"]["message"] == "limit is out of range: an integer from -2^63 to 2^63-1 is expected"
        with pytest.raises(RemoteError) as exc:  # a real float is still called one
            await client.request("thread/list", {"limit": 2.5})
        assert exc.value.error["message"] == "limit must be an integer, not float"


async def test_tool_call_round_trip(env, tmp_path):
    (tmp_path / "marker.txt").write_text("x")
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        thread = (await client.request("thread/start", {"cwd": str(tmp_path), "permission_mode": "read_only"}))["thread"]
        done = await client.run_turn(thread["id"], "tool please")
        items = done["turn"]["items"]
        tool = next(i for i in items if i["type"] == "tool_call")
        assert tool["name"] == "list_dir" and "marker.txt" in tool["output"]
        assert items[-1]["text"] == "Done listing."


async def test_interrupt_persists_partial_and_moves_input_to_held(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        thread = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]
        tid = thread["id"]
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "slow reply"}))["turn"]
        await client.wait_for("item/agentMessage/delta")
        # the steer cuts the streaming reply and joins the turn, whose next reply is slow again
        await client.request("turn/steer", {"thread_id": tid, "prompt": "slow steer", "expected_turn_id": turn["id"]})
        await client.wait_for("turn/steered")
        first = await client.wait_for("item/started", lambda p: p["item"]["type"] == "agent_message")
        await client.wait_for("item/started", lambda p: p["item"]["type"] == "agent_message"
                              and p["item"]["id"] != first["item"]["id"])
        await client.request("turn/queue", {"thread_id": tid, "prompt": "queued"})
        reply = await client.request("turn/interrupt", {"thread_id": tid})
        assert reply["interrupted"] is True
        done = await client.wait_terminal(turn["id"])
        assert done["turn"]["status"] == "interrupted"
        partial = [i for i in done["turn"]["items"] if i["type"] == "agent_message"]
        assert partial[0]["steered"] is True and partial[-1]["status"] == "interrupted"
        assert [i["text"] for i in done["turn"]["items"] if i["type"] == "user_message"] == ["slow reply", "slow steer"]
        # interrupt again, and after the end: deterministic answers
        again = await client.request("turn/interrupt", {"thread_id": tid, "turn_id": turn["id"]})
        assert again["interrupted"] is False and again["turn"]["status"] == "interrupted"
        snap = await client.request("thread/resume", {"session_id": tid})
        held = [h["prompt"] for h in snap["held_user_messages"]]
        assert held == ["queued"]
        assert snap["pending_user_messages"] == []
    # a new process sees the same durable state
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": tid})
        assert [h["prompt"] for h in snap["held_user_messages"]] == ["queued"]
        assert snap["turns"][-1]["status"] == "interrupted"
        done = await client.run_turn(tid, "after restart")
        assert done["turn"]["status"] == "completed"


async def test_ephemeral_thread_is_not_persisted(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        thread = (await client.request("thread/start", {"ephemeral": True}))["thread"]
        assert thread["ephemeral"] is True
        done = await client.run_turn(thread["id"], "memory only")
        assert done["turn"]["status"] == "completed"
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        with pytest.raises(RemoteError) as exc:
            await client.request("thread/resume", {"session_id": thread["id"]})
        assert exc.value.code == "thread_not_found"


async def test_needs_setup_without_provider(tmp_path, roost_home):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_PROVIDER")}
    env["ROOST_HOME"] = str(roost_home)
    async with open_app_server(env=env, cwd=tmp_path) as client:
        init = await client.initialize()
        assert init["status"] == "needs_setup"
        assert any("ROOST_PROVIDER" in issue for issue in init["issues"])
        thread = (await client.request("thread/start", {}))["thread"]
        with pytest.raises(RemoteError) as exc:
            await client.request("turn/start", {"thread_id": thread["id"], "prompt": "x"})
        assert exc.value.code == "invalid_params" and "ROOST_PROVIDER" in exc.value.error["message"]


def test_a_first_initialize_with_a_wrong_client_type_is_invalid_params(env, tmp_path):
    # the first line waits before the server starts (roost/protocol/_as_early.py): the same check
    import subprocess

    from _helpers.appserver import roost_argv

    line = b'{"id":1,"method":"initialize","params":{"protocol_version":"wuu-app-server/v0.1","client":{"name":5}}}\n'
    done = subprocess.run([*roost_argv(), "app-server"], input=line, env=env, cwd=tmp_path, capture_output=True,
                          timeout=scaled(60))
    first = json.loads(done.stdout.splitlines()[0])
    assert first["id"] == 1 and first["error"]["code"] == "invalid_params", first
    assert "client.name must be a string" in first["error"]["message"]
    # the early answer (before the runtime loads) refuses what the session refuses
    line = (b'{"id":1,"method":"initialize","params":{"protocol_version":"wuu-app-server/v0.1",'
            b'"capabilities":{"deferred_notification_content":1}}}\n')
    done = subprocess.run([*roost_argv(), "app-server"], input=line, env=env, cwd=tmp_path, capture_output=True,
                          timeout=scaled(60))
    first = json.loads(done.stdout.splitlines()[0])
    assert first["id"] == 1 and first["error"]["code"] == "invalid_params", first
    assert "deferred_notification_content must be true or false" in first["error"]["message"]


def _flood(proc: Any, lines: Any) -> None:
    """Write ``lines`` to ``proc``'s stdin, never reading its stdout, until they are all written
    or the server closes its end (a dropped client: the writes then fail and the flood is over)."""
    with contextlib.suppress(BrokenPipeError, OSError, ValueError):
        for line in lines:
            proc.stdin.write(line)


def test_a_client_that_stops_reading_is_disconnected_with_exit_status_3(env, tmp_path):
    # docs/app-server.md: the slow-consumer disconnect is not a clean end of input (exit 0)
    import subprocess
    import threading

    from _helpers.appserver import roost_argv

    init = b'{"id":0,"method":"initialize","params":{"protocol_version":"wuu-app-server/v0.1"}}\n'
    proc = subprocess.Popen([*roost_argv(), "app-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**env, "ROOST_OUTBOX_BYTES": "4096"}, cwd=tmp_path)

    # answers pile up in the pipe, then in the outbox: never read
    lines = (init.replace(b'"id":0', b'"id":%d' % i) for i in range(100_000))
    threading.Thread(target=_flood, args=(proc, lines), daemon=True).start()
    try:
        status = proc.wait(timeout=scaled(60))
    finally:
        proc.kill()
    err = proc.stderr.read().decode()
    assert status == 3, err
    assert "roost app-server: error: the client stopped reading stdout" in err


def test_a_dropped_slow_client_gets_whole_lines_and_distinct_words(env, tmp_path):
    # docs/app-server.md: the slow-consumer disconnect ends stdout at a line boundary (a write cut
    # in a line is given the rest of it), exit status 3, words unlike a closed stdout's (exit 0)
    import subprocess
    import threading

    from _helpers.appserver import roost_argv

    # each answer is a ~20 kB line: the 64 KiB pipe fills inside one, the outbox then passes
    # 8 x 64 KiB (an immediate drop) while that write is blocked: a cut in a line is all but certain
    big = "x" * 20_000
    init = b'{"id":0,"method":"initialize","params":{"protocol_version":"wuu-app-server/v0.1"}}\n'
    start = b'{"id":"t","method":"thread/start","params":{"title":"%s"}}\n' % big.encode()
    proc = subprocess.Popen([*roost_argv(), "app-server", "-v"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**env, "ROOST_OUTBOX_BYTES": "65536"}, cwd=tmp_path)
    dropped = threading.Event()
    err: list[bytes] = []

    def watch_stderr() -> None:
        for line in proc.stderr:
            err.append(line)
            # the drop has cut the write (the rest of its line waits), or the session ended
            if b"waits for the client" in line or b"the session ended" in line:
                dropped.set()

    lines = itertools.chain([init], (start.replace(b'"id":"t"', b'"id":"t%d"' % i) for i in range(2_000)))
    threading.Thread(target=_flood, args=(proc, lines), daemon=True).start()
    threading.Thread(target=watch_stderr, daemon=True).start()
    try:
        assert dropped.wait(scaled(60)), b"".join(err).decode()
        out = proc.stdout.read()      # the client reads again once it was dropped (not before)
        status = proc.wait(timeout=scaled(60))
    finally:
        proc.kill()
    text = b"".join(err).decode()
    assert status == 3, text
    assert out and out.endswith(b"\n"), out[-200:]
    for line in out.splitlines():
        json.loads(line)              # no line is cut
    assert "roost app-server: error: the client stopped reading stdout (its outbox overflowed)" in text
    assert "closed stdout" not in text


def test_a_client_that_closes_stdout_ends_with_exit_0_and_says_so(env, tmp_path):
    import subprocess

    from _helpers.appserver import roost_argv

    proc = subprocess.Popen([*roost_argv(), "app-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    proc.stdin.write(b'{"id":1,"method":"initialize","params":{}}\n')
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["id"] == 1
    proc.stdout.close()               # the client closes its end; the server's next write fails
    proc.stdin.write(b'{"id":2,"method":"thread/start","params":{}}\n')
    proc.stdin.flush()
    try:
        status = proc.wait(timeout=scaled(60))
    finally:
        proc.kill()
    text = proc.stderr.read().decode()
    assert status == 0, text
    assert "the client closed stdout; the session ends" in text
    assert "stopped reading" not in text and "Traceback" not in text


async def test_an_answer_to_an_unknown_server_request_is_logged_with_its_id(env, tmp_path):
    """``{"id": "roost-999", "result": {}}`` answers a server request this session never sent: it
    gets no reply (it is a response itself), but stderr names it so an operator can see it; the
    session goes on. It used to be dropped without a word."""
    log_file = tmp_path / "stderr.log"
    with log_file.open("wb") as stderr:
        async with open_app_server(env=env, cwd=tmp_path, stderr=stderr) as client:
            await client.initialize(capabilities={"reverse_rpc": {"methods": ["approval/request"]}})
            await client.send({"id": "roost-999", "result": {}})
            await client.send({"id": 7, "error": {"code": "x", "message": "y"}})
            assert (await client.request("thread/list", {})) is not None  # still served, in order
    logged = log_file.read_text()
    assert "WARNING" in logged and "'roost-999'" in logged and "no such request was sent" in logged, logged
    assert "server request 7:" in logged, logged
    assert not [line for line in client.lines if line.get("id") in ("roost-999", 7)]
