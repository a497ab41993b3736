"""End-to-end tests of ``roost attach`` against a real ``roost serve`` (Unix socket and WebSocket).

The attach command runs as a subprocess with piped stdin/stdout; tests write stdin lines only after
seeing the output they answer (the ``approve? [y/N]`` prompt, a ``result``), never after sleeps.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import trio

from _helpers.appserver import roost_argv
from _helpers.serve_client import open_daemon
from _helpers.timing import scaled

TIMEOUT = scaled(30.0)
SCRIPT = {
    "rules": [
        {"match": {"prompt": "^approve"},
         "steps": [[{"tool_call": {"name": "shell", "arguments": {"command": "echo approved-run"}}}],
                   [{"text": "tool said: {tool_output}"}]]},
    ],
    "default": "echo",
}


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(SCRIPT))
    return path


class Attach:
    """A running ``roost attach``: ``out`` accumulates stdout, ``err`` stderr."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.out = ""
        self.err = ""
        self._changed = trio.Event()
        self._eof = 0

    async def _pump(self, stream: trio.abc.ReceiveStream, name: str) -> None:
        while data := await stream.receive_some(1 << 16):
            setattr(self, name, getattr(self, name) + data.decode())
            self._changed.set()
            self._changed = trio.Event()
        self._eof += 1
        self._changed.set()

    async def wait_text(self, text: str, *, count: int = 1) -> None:
        """Wait until ``text`` occurs ``count`` times on stdout."""
        with trio.fail_after(TIMEOUT):
            while self.out.count(text) < count:
                if self._eof == 2:
                    raise AssertionError(f"attach ended before {text!r}:\n{self.out}\n{self.err}")
                await self._changed.wait()

    def lines(self) -> list[dict]:
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]

    async def wait_event(self, kind: str, *, count: int = 1) -> dict:
        with trio.fail_after(TIMEOUT):
            while len(found := [e for e in self.lines() if e.get("type") == kind]) < count:
                if self._eof == 2:
                    raise AssertionError(f"attach ended before {kind!r}:\n{self.out}\n{self.err}")
                await self._changed.wait()
        return found[count - 1]

    async def send(self, line: str) -> None:
        await self.process.stdin.send_all(line.encode() + b"\n")

    async def finish(self) -> int:
        """Close stdin and wait for the exit status (and all output)."""
        await self.process.stdin.aclose()
        with trio.fail_after(TIMEOUT):
            code = await self.process.wait()
            while self._eof < 2:
                await self._changed.wait()
        return code


async def _run(nursery: trio.Nursery, args: list[str], *, env: dict | None = None,
               cwd: str | None = None) -> Attach:
    environ = dict(os.environ)
    environ.pop("FUSERAFT_SERVE_TOKEN", None)
    environ.pop("ROOST_SERVE_TOKEN", None)
    environ.update(env or {})
    process = await trio.lowlevel.open_process([*roost_argv(), "attach", *args], stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                               env=environ, cwd=cwd)
    attach = Attach(process)
    nursery.start_soon(attach._pump, process.stdout, "out")
    nursery.start_soon(attach._pump, process.stderr, "err")
    return attach


async def test_json_passes_lines_through_over_the_socket(script: Path) -> None:
    async with open_daemon(script=script) as daemon, trio.open_nursery() as nursery:
        attach = await _run(nursery, ["--json", daemon.socket])
        hello = await attach.wait_event("hello")
        assert hello == {"type": "hello", "protocolVersion": 1, "clientId": None, "readOnly": False,
                         "inFlight": None, "pendingResults": []}
        await attach.send(json.dumps({"type": "user_input", "text": "hi json"}))
        first = await attach.wait_event("result")
        assert first["task"] == "hi json" and first["succeeded"] is True and first["lastMessage"] == "hi json"
        # a plain text line is forwarded unchanged (the daemon takes it as a task too)
        await attach.send("approve please")
        request = await attach.wait_event("approval_request")
        assert request["kind"] == "shell_command" and request["command"] == "echo approved-run"
        await attach.send(json.dumps({"type": "approval_response", "approved": True}))
        second = await attach.wait_event("result", count=2)
        assert second["task"] == "approve please" and "approved-run" in second["lastMessage"]
        assert await attach.finish() == 0
        # every stdout line is a daemon line, compact JSON exactly as the daemon wrote it
        for line in attach.out.splitlines():
            assert json.dumps(json.loads(line), separators=(",", ":"), ensure_ascii=False) == line
        types = [e["type"] for e in attach.lines()]
        assert types[0] == "hello" and types.count("queued") == 2 and "agent_starting" in types
        assert "tool_calling" in types and "token" in types and types[-1] == "result"


async def test_readable_mode_dispatches_and_answers_approvals(script: Path) -> None:
    async with open_daemon(script=script) as daemon, trio.open_nursery() as nursery:
        attach = await _run(nursery, [daemon.socket])
        await attach.wait_text(f"attached to {daemon.socket} (protocol 1, read-write)")
        await attach.send("approve the first")
        await attach.wait_text("approve? [y/N] ")
        assert "queued, position 0" in attach.out and "assistant is starting" in attach.out
        assert "assistant calls shell: echo approved-run" in attach.out
        assert "approval needed: shell_command\n  command: echo approved-run\n" in attach.out
        await attach.send("y")
        await attach.wait_text("result: succeeded ('approve the first')")
        await attach.wait_text("  assistant: tool said: approved-run")
        await attach.send("approve the second")
        await attach.wait_text("approve? [y/N] ", count=2)
        await attach.send("n")
        await attach.wait_text("result: succeeded ('approve the second')")
        await attach.wait_text("  assistant: tool said: Denied")
        assert await attach.finish() == 0
        assert "approved\n" in attach.out and "denied\n" in attach.out
        after_denial = attach.out.split("approve? [y/N] ")[2]
        assert "tool said: approved-run" not in after_denial     # the denied command never ran


async def test_approval_after_stdin_closed_is_denied_and_exit_waits_for_result(script: Path) -> None:
    async with open_daemon(script=script) as daemon, trio.open_nursery() as nursery:
        attach = await _run(nursery, [daemon.socket])
        await attach.send("approve nobody answers")
        assert await attach.finish() == 0
        assert "(stdin is closed: denied)" in attach.out
        assert "result: succeeded ('approve nobody answers')" in attach.out
        assert "tool said: Denied" in attach.out


async def _piped(daemon_socket: str, lines: str) -> tuple[int, str, str]:
    """Run ``roost attach`` with all of ``lines`` on a pipe at once (read ahead of any event)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("FUSERAFT_SERVE_TOKEN", "ROOST_SERVE_TOKEN")}
    with trio.fail_after(TIMEOUT):
        done = await trio.run_process([*roost_argv(), "attach", daemon_socket], stdin=lines.encode(),
                                      capture_stdout=True, capture_stderr=True, check=False, env=environ)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_piped_stdin_answers_approvals_with_the_lines_after_the_task(script: Path) -> None:
    # `printf 'approve piped\ny\ny\n' | roost attach`: the "y" lines read while the task is in
    # flight are held; the approval takes the first, the one left over becomes the next task
    async with open_daemon(script=script) as daemon:
        code, out, err = await _piped(daemon.socket, "approve piped\ny\ny\n")
    assert code == 0, (out, err)
    assert "approval needed: shell_command\n  command: echo approved-run\napprove? [y/N] approved\n" in out
    assert "stdin is closed" not in out
    assert "result: succeeded ('approve piped')\n  assistant: tool said: approved-run" in out
    assert out.count("queued, position") == 2                 # "approve piped", then the left-over "y"
    assert out.index("result: succeeded ('approve piped')") < out.index("result: succeeded ('y')")


async def test_piped_stdin_tasks_and_answers_in_order(script: Path) -> None:
    # each task takes the answers after it; a blank answer denies; lines left are the next tasks
    lines = "approve one\nyes\napprove two\n\nplain three\n"
    async with open_daemon(script=script) as daemon:
        code, out, err = await _piped(daemon.socket, lines)
    assert code == 0, (out, err)
    results = [line for line in out.splitlines() if "] result: " in line]
    assert [r.split("] ", 1)[1] for r in results] == [
        "result: succeeded ('approve one')", "result: succeeded ('approve two')",
        "result: succeeded ('plain three')"]
    first, second = out.split("approve? [y/N] ")[1:]
    assert first.startswith("approved\n") and "tool said: approved-run" in first
    assert second.startswith("denied\n") and "tool said: Denied" in second
    assert out.count("queued, position") == 3


async def test_piped_approval_with_no_line_left_is_denied(script: Path) -> None:
    async with open_daemon(script=script) as daemon:
        code, out, err = await _piped(daemon.socket, "approve nobody\n")
    assert code == 0, (out, err)
    assert "approve? [y/N] n (stdin is closed: denied)\n" in out
    assert "result: succeeded ('approve nobody')" in out and "tool said: Denied" in out


async def test_websocket_with_token_and_client_id(script: Path) -> None:
    async with open_daemon(script=script, token="s3cret") as daemon, trio.open_nursery() as nursery:
        url = f"ws://127.0.0.1:{daemon.port}/attach"
        # the token comes from the environment (ROOST_ spelling); --token would override it
        attach = await _run(nursery, [url, "--client-id", "alice"], env={"ROOST_SERVE_TOKEN": "s3cret"})
        await attach.wait_text(f"attached to {url} (protocol 1, client id alice, read-write)")
        await attach.send("over the websocket")
        await attach.wait_text("result: succeeded ('over the websocket')")
        assert await attach.finish() == 0
        # --json over the WebSocket with --token
        attach = await _run(nursery, ["--json", "--token", "s3cret", url])
        await attach.send("json over ws")
        result = await attach.wait_event("result")
        assert result["lastMessage"] == "json over ws"
        assert await attach.finish() == 0
        # a wrong token: the handshake is refused, exit 1 naming the URL
        attach = await _run(nursery, [url, "--token", "wrong"])
        assert await attach.finish() == 1
        assert f"cannot attach to the daemon at {url}: HTTP 401" in attach.err


async def test_unreachable_daemon_and_usage_errors(tmp_path: Path, roost_home: Path) -> None:
    async with trio.open_nursery() as nursery:
        missing = str(tmp_path / "none.sock")
        attach = await _run(nursery, [missing])
        assert await attach.finish() == 1
        # an explicit path: it does not exist, and no guess about this directory's daemon
        assert f"cannot connect to the daemon at {missing}: the socket does not exist" in attach.err
        assert "running for this directory" not in attach.err
        # the default target: the daemon of the current directory, under $ROOST_HOME/run
        attach = await _run(nursery, [], cwd=str(tmp_path))
        assert await attach.finish() == 1
        assert f"cannot connect to the daemon at {roost_home / 'run'}/" in attach.err
        assert "(is `roost serve` running for this directory?)" in attach.err
        attach = await _run(nursery, ["ws://127.0.0.1:1/attach"])
        assert await attach.finish() == 1
        assert "cannot attach to the daemon at ws://127.0.0.1:1/attach" in attach.err
        for args in (["http://127.0.0.1:1/attach"], ["--client-id", "not valid!"], ["--nope"]):
            attach = await _run(nursery, args)
            assert await attach.finish() == 2, args
            assert attach.out == ""


def test_renderer_file_write_diff_unknown_kind_and_token_lines() -> None:
    from roost.cli._attach import Renderer

    out: list[str] = []
    renderer = Renderer(out.append)
    renderer.event({"type": "token", "sessionId": "thr_0123456789", "agent": "a", "text": "hel"}, where="x")
    renderer.event({"type": "token", "sessionId": "thr_0123456789", "agent": "a", "text": "lo"}, where="x")
    renderer.event({"type": "approval_request", "kind": "file_write", "plugin": "files", "action": "write",
                    "path": "f.txt", "oldContent": "one\ntwo\n", "newContent": "one\nTWO\n",
                    "sessionId": "thr_0123456789"}, where="x")
    renderer.event({"type": "approval_request", "kind": "teleport", "where": "mars",
                    "sessionId": "thr_0123456789"}, where="x")
    renderer.event({"type": "something_new", "sessionId": "thr_0123456789"}, where="x")
    text = "".join(out)
    resumed: list[str] = []
    Renderer(resumed.append).event({"type": "task_resumed", "sessionId": "thr_0123456789", "task": "t"}, where="x")
    # resumed after a daemon restart, a killed worker or a dead node alike: no claim of which
    assert resumed == ["[thr_0123456789] resumed (the process that ran it stopped or lost it): 't'\n"]
    # the whole session id (as `roost sessions --show` takes it), never a shortened one
    assert text.startswith("[thr_0123456789] a: hello\n[thr_0123456789] approval needed: file_write\n")
    assert "  files.write f.txt\n  --- a/f.txt\n  +++ b/f.txt\n" in text
    assert "  -two\n  +TWO\n" in text
    assert "approval needed: teleport\n" in text and '"where": "mars"' in text
    # a line rendered while a prompt is open starts on a fresh line
    assert "  +TWO\napprove? [y/N] \n[thr_0123456789] approval needed: teleport\n" in text
    assert text.endswith("approve? [y/N] ") and text.count("approve? [y/N] ") == 2
    renderer.answer("denied")
    assert "".join(out).endswith("approve? [y/N] denied\n")


async def test_terminal_stdin_sends_each_line_at_once_and_piped_stdin_holds_it() -> None:
    from roost.cli._attach import AttachClient

    class Link:
        def __init__(self) -> None:
            self.sent: list[dict] = []

        async def send(self, line: str) -> None:
            self.sent.append(json.loads(line))

    for hold in (False, True):
        link, out = Link(), []
        client = AttachClient(link, json_mode=False, where="x", write=out.append, hold_lines=hold)
        await client._track({"type": "hello", "protocolVersion": 1, "inFlight": None})
        await client.stdin_line("first")
        await client._track({"type": "queued", "sessionId": "s1", "position": 0})
        await client.stdin_line("second")        # typed while "first" runs
        sent = [m.get("text") for m in link.sent]
        assert sent == (["first", "second"] if not hold else ["first"]), hold
        await client._track({"type": "approval_request", "kind": "shell_command", "command": "ls",
                             "sessionId": "s1"})
        if hold:   # the held line answered the approval (it was not "y": denied)
            assert link.sent[-1] == {"type": "approval_response", "approved": False}
        else:      # a terminal user answers after the prompt
            await client.stdin_line("y")
            assert link.sent[-1] == {"type": "approval_response", "approved": True}
        await client._track({"type": "result", "sessionId": "s1", "task": "first", "succeeded": True})
        await client.stdin_ended()
        assert client.done.is_set() is hold          # the terminal's "second" still awaits its result


SLOW_SCRIPT = {
    "rules": [{"match": {"prompt": "^sleepy"},
               "steps": [[{"text": "a slow reply of many many words indeed", "tokens_per_second": 2}]]}],
    "default": "echo",
}


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
async def test_daemon_going_away_with_stdin_still_open_exits_1_cleanly(tmp_path: Path, how: str) -> None:
    # `(printf 'sleepy term\ny\n'; sleep 20) | roost attach SOCK`, then the daemon dies: attach's
    # stdin reader thread is still blocked in a read; the process must still exit 1 cleanly (it
    # used to abort with "Fatal Python error: _enter_buffered_busy", exit 134)
    import signal

    path = tmp_path / "slow.json"
    path.write_text(json.dumps(SLOW_SCRIPT))
    async with open_daemon(script=path) as daemon, trio.open_nursery() as nursery:
        attach = await _run(nursery, [daemon.socket])
        await attach.send("sleepy term")
        await attach.send("y")               # held: stdin stays open after it
        await attach.wait_text("assistant: ")  # the slow reply is streaming
        daemon.process.send_signal(getattr(signal, how))
        with trio.fail_after(TIMEOUT):
            code = await attach.process.wait()
            while attach._eof < 2:
                await attach._changed.wait()
        assert code == 1, (attach.out, attach.err)
        assert "roost attach: " in attach.err and "the daemon closed the connection" in attach.err \
            or "connection lost" in attach.err, attach.err
        assert "Fatal Python error" not in attach.err and "Traceback" not in attach.err, attach.err
        await attach.process.stdin.aclose()


async def test_session_ids_are_shown_whole_and_accepted_by_sessions_show(script: Path) -> None:
    import re

    async with open_daemon(script=script) as daemon:
        code, out, err = await _piped(daemon.socket, "hello ids\n")
        assert code == 0, (out, err)
        ids = set(re.findall(r"^\[([^\]]+)\] ", out, re.M))
        assert len(ids) == 1, out
        (sid,) = ids
        with trio.fail_after(TIMEOUT):
            shown = await trio.run_process([*roost_argv(), "sessions", "--show", sid], capture_stdout=True,
                                           capture_stderr=True, check=False)
    assert shown.returncode == 0, (sid, shown.stderr.decode())
    assert "hello ids" in shown.stdout.decode()


async def test_a_task_refused_for_a_read_token_exits_non_zero_with_a_message(script: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("full fulltoken\nread readtoken\n")
    environ = {k: v for k, v in os.environ.items() if k not in ("FUSERAFT_SERVE_TOKEN", "ROOST_SERVE_TOKEN")}
    async with open_daemon(script=script, args=["--tokens-file", str(tokens)]) as daemon:
        target = f"ws://127.0.0.1:{daemon.port}/attach"
        with trio.fail_after(TIMEOUT):
            done = await trio.run_process([*roost_argv(), "attach", target, "--token", "readtoken"],
                                          stdin=b"do something\n", capture_stdout=True, capture_stderr=True,
                                          check=False, env=environ)
    err = done.stderr.decode()
    assert done.returncode == 1, (done.stdout, err)
    assert "roost attach: 1 task(s) refused by the daemon" in err and "read token" in err, err


@pytest.mark.parametrize(("target", "words"), [("ws://[bad", "is not a valid URL"),
                                               ("ws://host:notaport/attach", "is not a valid URL"),
                                               ("ws:///attach", "names no host")])
def test_a_malformed_ws_url_is_a_usage_error(roost_home: Path, target: str, words: str) -> None:
    done = subprocess.run([*roost_argv(), "attach", target], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=scaled(60), check=False)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert f"Invalid value for TARGET: {target!r} {words}" in done.stderr and "Traceback" not in done.stderr


async def test_no_target_finds_the_work_dirs_daemon_on_a_custom_socket(script: Path, tmp_path: Path,
                                                                       roost_home: Path) -> None:
    """`roost serve --socket X` in a directory, then `roost attach` there with no TARGET: the
    daemon is found through the registry `roost status` reads, not only the default path."""
    work = tmp_path / "work"
    work.mkdir()
    async with open_daemon(script=script, args=["--work-dir", str(work)]) as daemon, \
            trio.open_nursery() as nursery:
        attach = await _run(nursery, [], cwd=str(work))
        await attach.wait_text(f"attached to {daemon.socket} (protocol 1, read-write)")
        await attach.send("hi there")
        await attach.wait_text("result: succeeded ('hi there')")
        assert await attach.finish() == 0


async def test_empty_target_is_a_usage_error(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        attach = await _run(nursery, [""], cwd=str(tmp_path))
        assert await attach.finish() == 2
    assert "TARGET" in attach.err and "Invalid argument" not in attach.err
