"""``ask_user`` on ``roost serve``: the question goes to the task's dispatching client, with the
approvals' reconnect grace and unattended rules (wire-protocol.md "Prompts", "Daemon events"),
end to end over the daemon's Unix socket and WebSocket."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio
from _helpers.appserver import roost_argv
from _helpers.serve_client import open_daemon
from _helpers.timing import scaled

ASK = {
    "tool_call": {
        "name": "ask_user",
        "arguments": {"question": "Which colour?", "options": ["red", "blue"], "allowOther": False},
    }
}
SCRIPT = {
    "rules": [
        {"match": {"prompt": "^ask"}, "steps": [[ASK], [{"text": "model saw: {tool_output}"}]]},
    ],
    "default": "echo",
}


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(SCRIPT))
    return path


async def _dispatch(client, text: str) -> str:
    start = len(client.events)
    await client.send({"type": "user_input", "text": text})
    return (await client.wait_for("queued", start=start))["sessionId"]


async def test_question_goes_to_the_dispatcher_and_the_answer_reaches_the_model(script: Path) -> None:
    async with open_daemon(script=script) as daemon:
        async with daemon.unix() as a, daemon.unix() as bystander:
            await a.wait_for("hello")
            await bystander.wait_for("hello")
            start = len(a.events)
            await a.send({"type": "question_response", "answer": "blue"})  # nothing pending yet
            assert (await a.wait_for("error", start=start))["code"] == "invalid_request"
            sid = await _dispatch(a, "ask me a colour")
            question = await a.wait_for("question")
            assert question == {
                "type": "question",
                "question": "Which colour?",
                "options": ["red", "blue"],
                "allowOther": False,
                "sessionId": sid,
            }
            call = await bystander.wait_for("tool_calling", lambda e: e["sessionId"] == sid)
            assert call["tool"] == "ask_user"  # progress is broadcast, the prompt is not
            start = len(a.events)
            await a.send({"type": "approval_response", "approved": True})  # the wrong response kind
            error = await a.wait_for("error", start=start)
            assert error["code"] == "invalid_request" and "approval" in error["text"]
            await a.send({"type": "question_response", "answer": "blue"})
            result = await a.wait_for("result", lambda e: e["sessionId"] == sid)
            assert result["succeeded"] is True and result["lastMessage"] == "model saw: The user answered: blue"
            # null skips
            sid2 = await _dispatch(a, "ask again")
            await a.wait_for("question", lambda e: e["sessionId"] == sid2)
            await a.send({"type": "question_response", "answer": None})
            result = await a.wait_for("result", lambda e: e["sessionId"] == sid2)
            assert "skipped the question" in result["lastMessage"]
            assert not bystander.of_type("question")


async def test_question_is_asked_again_after_a_reconnect_within_the_grace(script: Path) -> None:
    async with open_daemon(script=script, token="t", args=["--reconnect-grace", "60"]) as daemon:
        async with daemon.ws(client_id="alice") as a:
            await a.wait_for("hello")
            sid = await _dispatch(a, "ask across a reconnect")
            await a.wait_for("question")
        async with daemon.ws(client_id="alice") as a2:
            hello = await a2.wait_for("hello")
            assert hello["inFlight"]["sessionId"] == sid
            question = await a2.wait_for("question")
            assert question["sessionId"] == sid and question["question"] == "Which colour?"
            await a2.send({"type": "question_response", "answer": "red"})
            result = await a2.wait_for("result", lambda e: e["sessionId"] == sid)
            assert result["lastMessage"] == "model saw: The user answered: red"


async def test_a_vanished_dispatcher_falls_back_to_the_unattended_rules(script: Path) -> None:
    async with open_daemon(script=script, token="t", args=["--reconnect-grace", "0.2"]) as daemon:
        async with daemon.ws(client_id="watcher") as w:
            await w.wait_for("hello")
            async with daemon.ws(client_id="gone") as g:
                await g.wait_for("hello")
                sid = await _dispatch(g, "ask nobody")
                await g.wait_for("question")
            # the grace passes: the question is skipped and the task finishes without an answer
            async with daemon.unix() as anonymous:
                await anonymous.wait_for("hello")
                sid_anon = await _dispatch(anonymous, "ask then leave")
                await anonymous.wait_for("question")
            marker = await _dispatch(w, "marker")
            await w.wait_for("result", lambda e: e["sessionId"] == marker)
            async with daemon.ws(client_id="gone") as g2:
                hello = await g2.wait_for("hello")
                assert hello["pendingResults"] == [sid]
                result = await g2.wait_for("result")
                assert result["succeeded"] is True and "skipped the question" in result["lastMessage"]
                assert not g2.of_type("question")
            assert not w.of_type("question")
            assert sid_anon not in {r["sessionId"] for r in w.of_type("result")}


async def _attach_piped(socket: str, lines: str) -> tuple[int, str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("FUSERAFT_SERVE_TOKEN", "ROOST_SERVE_TOKEN")}
    with trio.fail_after(scaled(60)):
        done = await trio.run_process(
            [*roost_argv(), "attach", socket],
            stdin=lines.encode(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=environ,
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def test_roost_attach_answers_a_question_with_the_next_line_and_skips_at_end_of_stdin(script: Path) -> None:
    async with open_daemon(script=script) as daemon:
        code, out, err = await _attach_piped(daemon.socket, "ask from attach\nblue\n")
        assert code == 0, (out, err)
        assert "question: Which colour? (options: red, blue)\nanswer (an empty line skips): answered: blue\n" in out
        assert "assistant: model saw: The user answered: blue" in out
        code, out, err = await _attach_piped(daemon.socket, "ask with nothing left\n")
        assert code == 0, (out, err)
        assert "answer (an empty line skips): (stdin is closed: skipped)\n" in out
        assert "skipped the question" in out


SOLO = """
Orchestration:
  Name: Solo
  Agents:
    - {Name: Soloist, Instructions: "You work alone."}
  Selection: {Type: sequential}
  Termination: {Type: maxiterations, MaxIterations: 1}
"""


async def test_an_orchestrated_tasks_agent_asks_the_dispatching_client(tmp_path: Path) -> None:
    config = tmp_path / "solo.yaml"
    config.write_text(SOLO)
    script = tmp_path / "solo-script.json"
    script.write_text(
        json.dumps(
            {
                "rules": [{"match": {"agent": "Soloist"}, "steps": [[ASK], [{"text": "Soloist got: {tool_output}"}]]}],
                "default": "echo",
            }
        )
    )
    async with open_daemon(script=script, args=["-c", str(config), "--work-dir", str(tmp_path)]) as daemon:
        async with daemon.unix() as owner, daemon.unix() as bystander:
            await owner.wait_for("hello")
            await bystander.wait_for("hello")
            sid = await _dispatch(owner, "pick a colour")
            question = await owner.wait_for("question")
            assert question["sessionId"] == sid and question["options"] == ["red", "blue"]
            await owner.send({"type": "question_response", "answer": "red"})
            result = await owner.wait_for("result", lambda e: e["sessionId"] == sid)
            assert result["lastAgent"] == "Soloist" and result["lastMessage"] == "Soloist got: The user answered: red"
            assert not bystander.of_type("question")
