"""A2A ``contextId`` on `roost serve --a2a` (docs/wire.md, "A2A"), through the official `a2a-sdk` client.

A message with the ``contextId`` an answer carried continues that conversation (the model sees the
earlier messages: the scripted engine's ``{history}``); a message without one starts a new
context; an unknown id starts a context of that id (as the SDK's own request handler does);
another caller's context, a malformed id, and a context whose previous task still runs are
refused with -32602.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
import trio
from _helpers.serve_client import open_daemon
from _helpers.timing import scaled
from a2a.client.errors import A2AClientJSONRPCError
from a2a.types import Message, Part, Role, TaskIdParams, TaskState, TextPart
from test_a2a import _text, a2a_client, until_state

SCRIPT = {
    "rules": [
        {"match": {"prompt": "^slow"}, "steps": [[{"delay": 600}, {"text": "too late"}]]},
        {"match": {"agent": "Echo"}, "steps": [[{"text": "team saw: {history}"}]]},
    ],
    "default": [[{"text": "saw: {history}"}]],
}
ONE, OTHER = "ctx-token-one", "ctx-token-other"


def _message(text: str, context_id: str | None = None) -> Message:
    return Message(
        role=Role.user, parts=[Part(root=TextPart(text=text))], message_id=os.urandom(8).hex(), context_id=context_id
    )


async def _send(client, text: str, context_id: str | None = None):
    events = [event async for event in client.send_message(_message(text, context_id))]
    task, _ = events[-1]
    return task


def _reply(task) -> str:
    return _text(task.artifacts[0].parts) if task.artifacts else _text(task.status.message.parts)


async def test_a_context_id_continues_the_conversation(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    tokens = tmp_path / "tokens"
    tokens.write_text(f"full {ONE}\nfull {OTHER}\n")
    args = ["--a2a", "--tokens-file", str(tokens), "--work-dir", str(tmp_path)]
    async with open_daemon(script=script, args=args, token=ONE) as daemon:
        async with a2a_client(daemon.port, ONE) as client:
            first = await _send(client, "my name is Ada")
            assert first.status.state == TaskState.completed and _reply(first) == "saw: none"
            assert first.context_id == first.id  # a new context: its id is its first task's
            second = await _send(client, "what is my name?", first.context_id)
            assert second.id != first.id and second.context_id == first.id
            # the model saw the first exchange before the new message
            assert _reply(second) == "saw: user: my name is Ada / agent: saw: none"
            third = await _send(client, "and now?", first.context_id)
            assert _reply(third).startswith("saw: user: my name is Ada / agent: saw: none / user: what is my name?")
            # no contextId: a fresh context
            fresh = await _send(client, "who am I?")
            assert fresh.context_id not in (first.id, None) and _reply(fresh) == "saw: none"
            # an unknown contextId starts a context of that id (the SDK's handler does the same)
            mine = await _send(client, "remember 42", "caller-chosen-ctx")
            assert (mine.id, mine.context_id, _reply(mine)) == ("caller-chosen-ctx", "caller-chosen-ctx", "saw: none")
            again = await _send(client, "what number?", "caller-chosen-ctx")
            assert again.context_id == "caller-chosen-ctx"
            assert _reply(again) == "saw: user: remember 42 / agent: saw: none"
            with pytest.raises(A2AClientJSONRPCError) as malformed:
                await _send(client, "hi", "not a valid id!")
            assert malformed.value.error.code == -32602 and "contextId" in malformed.value.error.message
        async with a2a_client(daemon.port, OTHER) as other:  # another token's caller
            with pytest.raises(A2AClientJSONRPCError) as foreign:
                await _send(other, "what is my name?", first.context_id)
            assert foreign.value.error.code == -32602 and "not a context of this caller" in foreign.value.error.message
        async with a2a_client(daemon.port, ONE, polling=True) as client:
            slow = await _send(client, "slow one", first.context_id)
            await until_state(client, slow.id, {TaskState.working})
            with pytest.raises(A2AClientJSONRPCError) as busy:
                await _send(client, "are you there?", first.context_id)
            assert busy.value.error.code == -32602 and slow.id in busy.value.error.message
            assert (await client.cancel_task(TaskIdParams(id=slow.id))).status.state == TaskState.canceled


TEAM = """
Orchestration:
  Name: Solo
  Agents:
    - {Name: Echo, Instructions: You echo.}
  Selection: {Type: sequential}
  Termination: {Type: maxiterations, MaxIterations: 1}
"""


async def test_a_team_task_continues_its_context(tmp_path: Path) -> None:
    config = tmp_path / "solo.yaml"
    config.write_text(TEAM)
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    async with (
        open_daemon(script=script, args=["--a2a", "-c", str(config), "--work-dir", str(tmp_path)]) as daemon,
        a2a_client(daemon.port, None, path="/a2a/Echo") as client,
    ):
        first = await _send(client, "the plan is A")
        assert first.status.state == TaskState.completed and _reply(first) == "team saw: none"
        second = await _send(client, "which plan?", first.context_id)
        assert second.status.state == TaskState.completed and second.context_id == first.id
        # (an agent of a team is shown the earlier agents' messages as user input)
        assert _reply(second) == "team saw: user: the plan is A / user: team saw: none"


async def test_a_queued_task_is_withdrawn_through_another_node(tmp_path: Path, pg_url: str) -> None:
    """Two front doors on one PostgreSQL database, neither running tasks (``--no-claim``): a task
    queued through one is cancelled at once through the other (the store decides), and the node
    that dispatched it tells its own listener."""
    from test_a2a import _metrics

    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    daemons = []
    async with contextlib.AsyncExitStack() as stack:
        for name in ("a", "b"):
            home = tmp_path / f"home-{name}"
            home.mkdir()
            env = {"ROOST_HOME": str(home), "ROOST_DATABASE_URL": pg_url, "ROOST_TASK_POLL_S": "0.3"}
            args = ["--a2a", "--no-claim", "--work-dir", str(tmp_path)]
            daemons.append(await stack.enter_async_context(open_daemon(script=script, env=env, args=args)))
        a, b = daemons
        async with a2a_client(a.port, None, polling=True) as on_a, a2a_client(b.port, None) as on_b:
            queued = await _send(on_a, "nobody runs this")
            assert queued.status.state == TaskState.submitted
            with trio.fail_after(scaled(20)):
                answer = await on_b.cancel_task(TaskIdParams(id=queued.id))
            assert answer.status.state == TaskState.canceled
            seen = await until_state(on_a, queued.id, {TaskState.canceled, TaskState.failed})
            assert "before it started" in _text(seen.status.message.parts)
        # the dispatching node followed the row and told its listener (a task that ended
        # elsewhere is counted by its outcome there: not succeeded)
        with trio.fail_after(scaled(20)):
            while 'roost_tasks_finished_total{outcome="failed"} 1.0' not in await _metrics(a.port):
                await trio.sleep(0.1)
