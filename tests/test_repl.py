"""End-to-end: `roost repl --vscode --no-banner` (wire-protocol.md "Live sessions", stdio) on the scripted engine.

Each test runs the real command as a subprocess and talks JSONL over its stdin/stdout; waits are on
events, each under a deadline, never on sleeps.
"""

from __future__ import annotations

import json
import signal
import subprocess
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import pytest
import trio

from _helpers.appserver import roost_argv, scripted_env, iter_lines, script_env
from _helpers.timing import scaled

TIMEOUT = scaled(20.0)

SCRIPT = """
rules:
  - match: {prompt: "^write"}
    steps:
      - - {text: "Writing."}
        - {tool_call: {name: write_file, arguments: {path: "out.txt", content: "one\\ntwo\\n"}}}
      - - {text: "Result: {tool_output}"}
  - match: {prompt: "^shell"}
    steps:
      - - {tool_call: {name: shell, arguments: {command: "echo hi"}}}
      - - {text: "Shell: {tool_output}"}
  - match: {prompt: "^list"}
    steps:
      - - {reasoning: "Let me look."}
        - {tool_call: {name: list_dir, arguments: {path: "."}}}
      - - {text: "Listed."}
  - match: {prompt: "^ask"}
    steps:
      - - {tool_call: {name: ask_user, arguments: {question: "Which colour?", options: [red, blue], allowOther: false}}}
      - - {text: "Noted: {tool_output}"}
  - match: {agent: "helper.*"}
    steps:
      - - {tool_call: {name: list_dir, arguments: {path: "."}}}
      - - {text: "helper saw {tool_output}"}
  - match: {prompt: "^team"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: helper, description: "lists", prompt: "List it."}}}
      - - {tool_call: {name: wait_agents, arguments: {targets: [helper]}}}
      - - {text: "Team done."}
  - match: {prompt: "^flaky"}
    steps:
      - - {retrying: {attempt: 1, max: 3, reason: rate_limit}}
        - {text: "recovered"}
  - match: {prompt: "^slow"}
    steps:
      - - {text: "a b c d e f g h i j k l m n o p q r s t u v w x y z a b c d e f g h i j k l m n o p", tokens_per_second: 5}
default: echo
"""


class ReplClient:
    """The client side of one `roost repl --vscode` process: every stdout line parsed, in order."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.events: list[dict] = []
        self.eof = False
        self._changed = trio.Event()

    async def _reader(self) -> None:
        assert self.process.stdout is not None
        async for line in iter_lines(self.process.stdout):
            self.events.append(json.loads(line))  # stdout carries protocol lines only
            self._wake()
        self.eof = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def send(self, obj: Any) -> None:
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode() + b"\n"
        assert self.process.stdin is not None
        await self.process.stdin.send_all(data)

    async def say(self, text: str, **extra: Any) -> int:
        """Send user_input; return the index of the next event (to wait from)."""
        start = len(self.events)
        await self.send({"type": "user_input", "text": text, **extra})
        return start

    async def wait(self, kind: str, predicate: Callable[[dict], bool] = lambda e: True, *,
                   start: int = 0) -> dict:
        index = start
        with trio.fail_after(TIMEOUT):
            while True:
                while index < len(self.events):
                    event = self.events[index]
                    index += 1
                    if event.get("type") == kind and predicate(event):
                        event["_index"] = index - 1
                        return event
                if self.eof:
                    raise AssertionError(f"stdout closed before a {kind!r} event; got {self.types()}")
                await self._changed.wait()

    def types(self, start: int = 0, end: int | None = None) -> list[str]:
        return [e["type"] for e in self.events[start:end]]

    async def close(self) -> int:
        """Close stdin; wait for session_end and the exit status."""
        assert self.process.stdin is not None
        await self.process.stdin.aclose()
        await self.wait("session_end")
        with trio.fail_after(TIMEOUT):
            return await self.process.wait()


@asynccontextmanager
async def open_repl(env: dict, cwd: Path, *args: str) -> AsyncIterator[ReplClient]:
    process = await trio.lowlevel.open_process(
        [*roost_argv(), "repl", "--vscode", "--no-banner", *args], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=str(cwd))
    client = ReplClient(process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._reader)
            yield client
            with trio.fail_after(TIMEOUT):
                await process.wait()
            nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.fixture
def env(tmp_path: Path, roost_home: Path) -> dict:
    return script_env(tmp_path, roost_home, SCRIPT)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "marker.txt").write_text("x")
    return work


async def test_ready_tokens_tools_status_and_session_end(env, work):
    async with open_repl(env, work) as repl:
        ready = await repl.wait("ready")
        assert ready["protocolVersion"] == 1 and ready["sessionId"].startswith("thr_")
        assert ready["model"] and ready["title"] is None and ready["autoTitle"] is None
        assert "/status" in ready["midTurnCommands"]
        start = await repl.say("hello there")
        end = await repl.wait("message_end", start=start)
        assert repl.types(start, end["_index"]) == ["turn_start", "token", "token"]
        assert "".join(e["text"] for e in repl.events[start:end["_index"]] if e["type"] == "token") == "hello there"
        assert end["turnIndex"] == 0 and end["toolCalls"] == [] and end["outputTokens"] == 2
        status = await repl.wait("status", start=end["_index"])
        assert status["turn"] == 1 and 0 <= status["context"] <= 1 and status["modes"] == ["standard"]
        title = await repl.wait("title", start=end["_index"])
        assert title["autoTitle"] == "hello there" and title["sessionId"] == ready["sessionId"]
        start = await repl.say("/status")   # an idle command ends with the last turn's index
        command_end = await repl.wait("message_end", start=start)
        assert command_end["turnIndex"] == 0 and command_end["toolCalls"] == []

        start = await repl.say("list it")
        end = await repl.wait("message_end", start=start)
        kinds = repl.types(start, end["_index"])
        assert kinds[0] == "turn_start" and "thinking" in kinds
        call = await repl.wait("tool_call", start=start)
        result = await repl.wait("tool_result", start=start)
        assert call["name"] == "list_dir" and call["args"] == {"path": "."} and call["summary"] == "list_dir: ."
        assert result["id"] == call["id"] and result["ok"] is True and "marker.txt" in result["output"]
        assert call["_index"] < result["_index"] < end["_index"]
        assert end["turnIndex"] == 1 and end["toolCalls"] == ["list_dir"]

        start = await repl.say("flaky provider")  # a provider retry is announced before the text
        assert not repl.types().count("warning")  # the context is nowhere near full
        end = await repl.wait("message_end", start=start)
        retry = await repl.wait("retrying", start=start)
        assert retry["attempt"] == 1 and retry["max"] == 3
        assert retry["_index"] < (await repl.wait("token", start=start))["_index"]
        assert await repl.close() == 0
    assert repl.events[-1]["type"] == "session_end"
    assert repl.types().count("session_end") == 1


async def test_approvals_file_changed_and_denials(env, work):
    async with open_repl(env, work) as repl:
        await repl.wait("ready")
        # approve a write: tool_call before approval_request, then file_changed and file_changes
        start = await repl.say("write it")
        request = await repl.wait("approval_request", start=start)
        assert request["kind"] == "file_write" and request["plugin"] == "files" and request["action"] == "write_file"
        assert request["path"] == str(work / "out.txt") and request["oldContent"] == ""
        assert request["newContent"] == "one\ntwo\n"
        assert not {"thread_id", "turn_id", "item_id"} & set(request)
        call = await repl.wait("tool_call", start=start)
        assert call["_index"] < request["_index"] and call["name"] == "write_file"
        await repl.send({"type": "approval_response", "approved": True})
        end = await repl.wait("message_end", start=start)
        changed = await repl.wait("file_changed", start=start)
        assert changed == {**changed, "path": "out.txt", "sigil": "A", "added": 2, "removed": 0}
        changes = await repl.wait("file_changes", start=start)
        assert changes["changes"] == [{"sigil": "A", "path": "out.txt"}]
        assert changed["_index"] < changes["_index"] < end["_index"]
        assert (work / "out.txt").read_text() == "one\ntwo\n"
        # deny a shell command
        start = await repl.say("shell please")
        request = await repl.wait("approval_request", start=start)
        assert request["kind"] == "shell_command" and request["command"] == "echo hi"
        await repl.send({"type": "approval_response", "approved": False})
        result = await repl.wait("tool_result", start=start)
        assert result["ok"] is False and "Denied" in result["output"]
        await repl.wait("message_end", start=start)
        # a malformed response counts as denied
        start = await repl.say("shell again")
        await repl.wait("approval_request", start=start)
        await repl.send({"type": "approval_response", "approved": "yes"})
        result = await repl.wait("tool_result", start=start)
        assert result["ok"] is False and "Denied" in result["output"]
        await repl.wait("message_end", start=start)
        # a response with nothing pending is an error, and the chat goes on
        start = len(repl.events)
        await repl.send({"type": "approval_response", "approved": True})
        error = await repl.wait("error", start=start)
        assert "no approval_request" in error["text"]
        assert await repl.close() == 0


async def test_question_round_trip_only_with_questions_enabled(env, work):
    async with open_repl({**env, "FUSERAFT_VSCODE_QUESTIONS": "1"}, work) as repl:
        await repl.wait("ready")
        start = await repl.say("ask me")
        question = await repl.wait("question", start=start)
        assert question == {**question, "question": "Which colour?", "options": ["red", "blue"], "allowOther": False}
        # the ask_user call is announced before the question it asks (a client shows the call first)
        calls = [e for e in repl.events[start:question["_index"]] if e["type"] == "tool_call"]
        assert [c["name"] for c in calls] == ["ask_user"], repl.types(start)
        await repl.send({"type": "question_response", "answer": "blue"})
        end = await repl.wait("message_end", start=start)
        tokens = "".join(e["text"] for e in repl.events[start:end["_index"]] if e["type"] == "token")
        assert tokens == "Noted: The user answered: blue"
        assert end["toolCalls"] == ["ask_user"]
        status = await repl.wait("status", start=end["_index"])
        assert "questions" in status["modes"]
        # skipping (answer null)
        start = await repl.say("ask again")
        question = await repl.wait("question", start=start)
        assert "tool_call" in repl.types(start)[: question["_index"] - start]
        await repl.send({"type": "question_response", "answer": None})
        result = await repl.wait("tool_result", start=start)
        # the result of that call, with the id of the call announced before the question
        assert [e["id"] for e in repl.events[start:] if e["type"] == "tool_call"] == [result["id"]]
        assert result["ok"] is True and "skipped" in result["output"]
        await repl.wait("message_end", start=start)
        assert await repl.close() == 0
    # without the variable the model is not offered ask_user: the call fails as an unknown tool
    async with open_repl(env, work) as repl:
        await repl.wait("ready")
        start = await repl.say("ask me")
        result = await repl.wait("tool_result", start=start)
        assert result["ok"] is False and "unknown tool" in result["output"]
        await repl.wait("message_end", start=start)
        assert "question" not in repl.types()
        assert await repl.close() == 0


async def test_interrupts_bad_input_and_sigint(env, work):
    async with open_repl(env, work) as repl:
        await repl.wait("ready")
        # interrupt with no turn running: cancelled, and the process lives on
        start = len(repl.events)
        await repl.send({"type": "interrupt"})
        await repl.wait("cancelled", start=start)
        # bad input lines: an error event each, the chat goes on
        start = len(repl.events)
        await repl.send(b"this is not json\n")
        await repl.send(b"[1, 2]\n")
        await repl.send({"text": "no type"})  # says the type field is missing, not "type None"
        await repl.send({"type": "frobnicate"})
        await repl.wait("error", lambda e: "frobnicate" in e["text"], start=start)
        assert repl.types(start) == ["error", "error", "error", "error"]
        missing = repl.events[start + 2]
        assert missing["text"] == 'the input object has no "type" field' and missing["code"] == "invalid_request"
        # the additive code, as on the serve socket: parse_error, then invalid_request (docs/wire.md:
        # every refused input line has one; the unknown type had none)
        assert [e.get("code") for e in repl.events[start:start + 4]] == ["parse_error", *["invalid_request"] * 3]
        # interrupt mid-turn
        start = await repl.say("slow one")
        await repl.wait("token", start=start)
        await repl.send({"type": "interrupt"})
        await repl.wait("cancelled", start=start)
        assert "message_end" not in repl.types(start)
        # SIGINT mid-turn cancels only the turn
        start = await repl.say("slow two")
        await repl.wait("token", start=start)
        repl.process.send_signal(signal.SIGINT)
        await repl.wait("cancelled", start=start)
        # SIGINT with no turn running: cancelled again, still alive
        start = len(repl.events)
        repl.process.send_signal(signal.SIGINT)
        await repl.wait("cancelled", start=start)
        start = await repl.say("still here")
        end = await repl.wait("message_end", start=start)
        assert end["turnIndex"] == 2  # the two interrupted turns count as turns of the chat
        assert await repl.close() == 0


async def test_mid_turn_input_joins_or_is_carried(env, work):
    async with open_repl(env, work) as repl:
        await repl.wait("ready")
        # joined: sent while the turn waits for an approval, admitted at its next model call
        start = await repl.say("shell now")
        await repl.wait("approval_request", start=start)
        await repl.send({"type": "user_input", "text": "and then this"})
        await repl.send({"type": "user_input", "text": "/title Mid chat"})
        applied = await repl.wait("applied", start=start)
        assert applied["command"] == "/title"
        title = await repl.wait("title", start=start)
        assert title["title"] == "Mid chat"
        info = await repl.wait("info", start=start)
        assert "Mid chat" in info["text"]
        await repl.send({"type": "approval_response", "approved": False})
        joined = await repl.wait("interjection", start=start)
        assert joined["status"] == "joined" and joined["count"] == 1
        end = await repl.wait("message_end", start=start)
        tokens = "".join(e["text"] for e in repl.events[joined["_index"]:end["_index"]] if e["type"] == "token")
        assert tokens == "and then this"
        # carried: the turn is interrupted before it admits the message; the next turn takes it
        start = await repl.say("shell later")
        await repl.wait("approval_request", start=start)
        await repl.send({"type": "user_input", "text": "carry me"})
        await repl.send({"type": "interrupt"})
        cancelled = await repl.wait("cancelled", start=start)
        carried = await repl.wait("interjection", start=cancelled["_index"])
        assert carried["status"] == "carried" and carried["count"] == 1
        turn = await repl.wait("turn_start", start=carried["_index"])
        assert turn["text"] == "carry me"
        end = await repl.wait("message_end", start=turn["_index"])
        assert "".join(e["text"] for e in repl.events[turn["_index"]:end["_index"]] if e["type"] == "token") == "carry me"
        # idle slash commands end with message_end; unknown ones are errors
        start = await repl.say("/status")
        await repl.wait("status", start=start)
        await repl.wait("message_end", lambda e: e["toolCalls"] == [], start=start)
        start = await repl.say("/nope")
        assert "unknown command" in (await repl.wait("error", start=start))["text"]
        assert await repl.close() == 0


async def test_resume_sends_replay_and_continues_the_chat(env, work):
    async with open_repl(env, work) as repl:
        ready = await repl.wait("ready")
        start = await repl.say("first message")
        await repl.wait("message_end", start=start)
        start = await repl.say("list files")
        await repl.wait("message_end", start=start)
        assert await repl.close() == 0
    session_id = ready["sessionId"]
    async with open_repl(env, work, "--resume", session_id) as repl:
        ready = await repl.wait("ready")
        assert ready["sessionId"] == session_id and ready["autoTitle"] == "first message"
        replay = await repl.wait("replay")
        assert replay["_index"] == ready["_index"] + 1
        assert replay["total"] == 2 and replay["compacted"] is False
        assert replay["turns"] == [
            {"user": "first message", "assistant": "first message", "toolCalls": []},
            {"user": "list files", "assistant": "Listed.", "toolCalls": ["list_dir"]},
        ]
        start = await repl.say("again")
        end = await repl.wait("message_end", start=start)
        assert end["turnIndex"] == 2
        assert await repl.close() == 0
    # an unknown id: an error event, then session_end, exit 1
    async with open_repl(env, work, "--resume", "thr_nope") as repl:
        error = await repl.wait("error")
        assert "thr_nope" in error["text"]
        await repl.wait("session_end")
        with trio.fail_after(TIMEOUT):
            assert await repl.process.wait() == 1


async def test_user_input_with_images(env, work):
    import base64

    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()
    async with open_repl(env, work) as repl:
        await repl.wait("ready")
        start = await repl.say("look at this", images=[{"name": "a.png", "data": f"data:image/png;base64,{png}"}])
        end = await repl.wait("message_end", start=start)
        assert "".join(e["text"] for e in repl.events[start:end["_index"]] if e["type"] == "token") == "look at this"
        start = await repl.say("bad image", images=[{"name": "a.png", "data": "not a data url"}])
        error = await repl.wait("error", start=start)
        assert "data URL" in error["text"]
        assert await repl.close() == 0


async def test_end_of_input_mid_approval_cancels_the_turn_then_session_end(env, work):
    async with open_repl(env, work) as repl:
        ready = await repl.wait("ready")
        start = await repl.say("shell maybe")
        await repl.wait("approval_request", start=start)
        assert await repl.close() == 0
        kinds = repl.types(start)
        assert kinds[-2:] == ["status", "session_end"] and "cancelled" in kinds
    # the interrupted turn was persisted: a resumed chat replays it
    async with open_repl(env, work, "--resume", ready["sessionId"]) as repl:
        replay = await repl.wait("replay")
        assert replay["total"] == 1 and replay["turns"][0]["user"] == "shell maybe"
        assert replay["turns"][0]["toolCalls"] == ["shell"]
        start = await repl.say("/exit")
        await repl.wait("session_end", start=start)
        with trio.fail_after(TIMEOUT):
            assert await repl.process.wait() == 0


async def test_without_a_provider_reports_an_error_and_exits_2(tmp_path, roost_home, work):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
    env["ROOST_HOME"] = str(roost_home)
    async with open_repl(env, work) as repl:
        error = await repl.wait("error")
        assert "ROOST_PROVIDER" in error["text"]
        await repl.wait("session_end")
        with trio.fail_after(TIMEOUT):
            assert await repl.process.wait() == 2


async def test_text_mode_without_vscode(env, work):
    typed = b"hello text\nshell it\ny\n/title Named\n"
    with trio.fail_after(TIMEOUT):
        proc = await trio.run_process([*roost_argv(), "repl"], stdin=typed, capture_stdout=True,
                                      capture_stderr=True, env=env, cwd=str(work), check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert lines[0].startswith("roost chat thr_")
    assert lines[1] == "hello text"
    assert "$ shell: echo hi" in lines
    assert "approve shell_command (command: echo hi)? [y/N]" in lines
    assert "Shell: hi" in lines          # approved: the command ran
    assert "(title: Named)" in lines


async def test_subagent_tool_calls_carry_the_agent_name(env, work):
    async with open_repl(env, work) as repl:
        await repl.wait("ready")
        start = await repl.say("team up")
        end = await repl.wait("message_end", start=start)
        calls = [e for e in repl.events[start:end["_index"]] if e["type"] == "tool_call"]
        assert [(c["name"], c.get("agent")) for c in calls] == [
            ("spawn_agent", None), ("list_dir", "helper"), ("wait_agents", None)]
        assert calls[1]["args"] == {"path": "."} and calls[1]["summary"] == "list_dir: ."
        assert end["toolCalls"] == ["spawn_agent", "wait_agents"]  # the chat's own calls only
        results = [e for e in repl.events[start:end["_index"]] if e["type"] == "tool_result"]
        assert [r["name"] for r in results] == ["spawn_agent", "wait_agents"]
        assert await repl.close() == 0


async def test_warning_when_the_context_fills_up(env, work):
    async with open_repl({**env, "ROOST_CONTEXT_WINDOW": "20"}, work) as repl:
        await repl.wait("ready")
        start = await repl.say("hello there, this prompt is long enough to fill a tiny context window")
        status = await repl.wait("status", start=start)
        assert status["level"] in ("warning", "critical")
        warning = await repl.wait("warning", start=start)
        assert "% full" in warning["text"]
        assert await repl.close() == 0
