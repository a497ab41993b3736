"""`roost serve --a2a` through the real daemon and the official `a2a-sdk` client (docs/wire.md, "A2A").

Agent cards at the well-known paths, message/send, message/stream, tasks/get and tasks/cancel,
the daemon's bearer and read tokens on every request, `a2a_call` on attached clients, a daemon
killed mid-task resuming the A2A task, and an orchestration agent with `RemoteAgent` proxying a
second `roost serve --a2a` daemon (with a remote failure and a timeout that do not stop the run).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _helpers.appserver import roost_argv
from _helpers.serve_client import open_daemon, short_socket_path, start_daemon
from _helpers.timing import scaled
from a2a.client import A2ACardResolver, A2AClientHTTPError, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientJSONRPCError
from a2a.types import Message, Part, Role, Task, TaskIdParams, TaskQueryParams, TaskState, TextPart

SCRIPT = {
    "rules": [
        {"match": {"prompt": "while you were working on"}, "steps": [[{"text": "resumed fine"}]]},
        {"match": {"prompt": "^slow"}, "steps": [[{"delay": 600}, {"text": "too late"}]]},
    ],
    "default": [[{"text": "reply to: {prompt}"}]],
}
FULL, READ = "a2a-full", "a2a-read"


def _message(text: str) -> Message:
    return Message(role=Role.user, parts=[Part(root=TextPart(text=text))], message_id=os.urandom(8).hex())


@asynccontextmanager
async def a2a_client(
    port: int, token: str | None, *, streaming: bool = False, polling: bool = False, path: str = ""
) -> AsyncIterator[Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(headers=headers, timeout=scaled(60)) as http:
        card = await A2ACardResolver(http, f"http://127.0.0.1:{port}{path}").get_agent_card()
        yield ClientFactory(ClientConfig(httpx_client=http, streaming=streaming, polling=polling)).create(card)


async def send(client: Any, text: str) -> list[Any]:
    return [event async for event in client.send_message(_message(text))]


def _text(parts: Any) -> str:
    return "".join(p.root.text for p in parts)


def _artifact(task: Task, name: str) -> str:
    return next(_text(a.parts) for a in task.artifacts if a.name == name)


async def until_state(client: Any, task_id: str, states: set[TaskState]) -> Task:
    with trio.fail_after(scaled(60)):
        while True:
            task = await client.get_task(TaskQueryParams(id=task_id))
            if task.status.state in states:
                return task
            await trio.sleep(0.05)


def _daemon_args(tmp_path: Path) -> list[str]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"full {FULL}\nread {READ}\n")
    return ["--a2a", "--tokens-file", str(tokens), "--work-dir", str(tmp_path)]


async def test_cards_send_stream_get_cancel_and_a2a_call(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    async with open_daemon(script=script, args=_daemon_args(tmp_path), token=FULL) as daemon, daemon.ws() as watcher:
        port = daemon.port
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {FULL}"}) as http:
            for path in (
                "/.well-known/agent-card.json",
                "/.well-known/agent.json",
                "/a2a/assistant/.well-known/agent-card.json",
                "/a2a/assistant/.well-known/agent.json",
            ):
                card = (await http.get(f"http://127.0.0.1:{port}{path}")).json()
                assert card["name"] == "assistant", path
                assert card["url"] == f"http://127.0.0.1:{port}/a2a/assistant/"
                assert card["capabilities"]["streaming"] is True and card["security"] == [{"bearer": []}]

        async with a2a_client(port, FULL) as client:
            events = await send(client, "hello over a2a")
            task, update = events[-1]
            assert update is None and task.status.state == TaskState.completed
            assert _text(task.artifacts[0].parts) == "reply to: hello over a2a"
            assert task.metadata == {"agent": "assistant", "lastAgent": "assistant"}
            call = await watcher.wait_for("a2a_call")
            assert call == {"type": "a2a_call", "agent": "assistant", "sessionId": task.id}
            got = await client.get_task(TaskQueryParams(id=task.id))
            assert got.id == task.id and got.status.state == TaskState.completed
            assert _text(got.history[0].parts) == "hello over a2a"
            with pytest.raises(A2AClientJSONRPCError) as missing:
                await client.get_task(TaskQueryParams(id="thr_nosuchtask"))
            assert missing.value.error.code == -32001  # TaskNotFoundError

        async with a2a_client(port, FULL, streaming=True) as client:
            events = await send(client, "stream me")
            states = [update.status.state for _, update in events if update is not None and hasattr(update, "status")]
            assert states[-1] == TaskState.completed, events
            final_task, final_update = events[-1]
            assert final_update.final is True and _artifact(final_task, "result") == "reply to: stream me"
            chunks = [
                u
                for _, u in events
                if u is not None and getattr(u, "artifact", None) is not None and u.artifact.name == "stream"
            ]
            assert chunks and _artifact(final_task, "stream") == "reply to: stream me"  # streamed as it came
            await watcher.wait_for("a2a_call", lambda e: e["sessionId"] == final_task.id)

        async with a2a_client(port, FULL, polling=True) as client:  # blocking: false
            ((started, _),) = await send(client, "slow job")
            assert started.status.state in (TaskState.submitted, TaskState.working)
            await until_state(client, started.id, {TaskState.working})
            cancelled = await client.cancel_task(TaskIdParams(id=started.id))
            assert cancelled.status.state == TaskState.canceled
            assert (await client.get_task(TaskQueryParams(id=started.id))).status.state == TaskState.canceled
            with pytest.raises(A2AClientJSONRPCError) as again:
                await client.cancel_task(TaskIdParams(id=started.id))
            assert again.value.error.code == -32002  # TaskNotCancelableError
            with pytest.raises(A2AClientJSONRPCError) as empty:
                await send(client, "   ")
            assert empty.value.error.code == -32602


async def test_tokens_apply_to_every_request(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    async with open_daemon(script=script, args=_daemon_args(tmp_path), token=FULL) as daemon:
        port = daemon.port
        async with httpx.AsyncClient() as http:
            card = await http.get(f"http://127.0.0.1:{port}/.well-known/agent-card.json")
            assert card.status_code == 401
            rpc = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "message/send",
                "params": {"message": {"role": "user", "messageId": "m", "parts": [{"kind": "text", "text": "x"}]}},
            }
            assert (await http.post(f"http://127.0.0.1:{port}/a2a/assistant/", json=rpc)).status_code == 401
            wrong = await http.post(
                f"http://127.0.0.1:{port}/a2a/assistant/", json=rpc, headers={"Authorization": "Bearer nope"}
            )
            assert wrong.status_code == 401
            browser = await http.post(
                f"http://127.0.0.1:{port}/a2a/assistant/",
                json=rpc,
                headers={"Authorization": f"Bearer {FULL}", "Origin": "http://evil"},
            )
            assert browser.status_code == 403
        async with a2a_client(port, FULL) as client:
            ((done, _),) = await send(client, "by the full token")
        async with a2a_client(port, READ) as reader:  # a read token reads cards and tasks ...
            assert (await reader.get_task(TaskQueryParams(id=done.id))).status.state == TaskState.completed
            with pytest.raises(A2AClientHTTPError) as refused:  # ... and may not send
                await send(reader, "by the read token")
            assert refused.value.status_code == 403
            with pytest.raises(A2AClientHTTPError) as no_cancel:
                await reader.cancel_task(TaskIdParams(id=done.id))
            assert no_cancel.value.status_code == 403
        # one keep-alive connection, many requests: each one is checked on its own
        async with httpx.AsyncClient() as http:
            url = f"http://127.0.0.1:{port}/a2a/assistant/.well-known/agent-card.json"
            assert (await http.get(url, headers={"Authorization": f"Bearer {FULL}"})).status_code == 200
            assert (await http.get(url)).status_code == 401


async def test_a_daemon_killed_mid_task_resumes_the_a2a_task(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    socket = short_socket_path()
    args = ["--a2a", "--work-dir", str(tmp_path)]
    async with trio.open_nursery() as nursery:
        first = await start_daemon(nursery, script=script, socket=socket, args=args)
        async with a2a_client(first.port, None, polling=True) as client:
            ((queued, _),) = await send(client, "slow work that outlives the daemon")
            await until_state(client, queued.id, {TaskState.working})
        first.kill9()
        await first.process.wait()
        second = await start_daemon(nursery, script=script, socket=socket, args=args)
        try:
            async with second.ws() as watcher, a2a_client(second.port, None) as client:
                done = await until_state(client, queued.id, {TaskState.completed, TaskState.failed})
                assert done.status.state == TaskState.completed
                assert _text(done.artifacts[0].parts) == "resumed fine"
                assert _text(done.history[0].parts) == "slow work that outlives the daemon"
                del watcher
        finally:
            second.process.terminate()
            await second.process.wait()


TEAM = """
Orchestration:
  Name: Relay
  Agents:
    - Name: Writer
      Instructions: Write the question.
    - Name: Oracle
      RemoteAgent: {Url: "%(url)s", TimeoutSeconds: %(timeout)s}
  Selection: {Type: sequential}
  Termination: {Type: maxiterations, MaxIterations: 2}
"""


async def _run_team(tmp_path: Path, url: str, timeout: float, task: str) -> dict:
    config = tmp_path / f"team-{abs(hash((url, task)))}.yaml"
    config.write_text(TEAM % {"url": url, "timeout": timeout})
    local = tmp_path / "local.json"
    local.write_text(json.dumps({"rules": [], "default": [[{"text": "Question: {prompt}"}]]}))
    env = dict(os.environ, ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(local))
    with trio.fail_after(scaled(90)):
        done = await trio.run_process(
            [*roost_argv(), "run", "-c", str(config), "--json", task],
            env=env,
            cwd=str(tmp_path),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.decode().splitlines()[-1])


async def _messages(tmp_path: Path, session_id: str) -> list[dict]:
    with trio.fail_after(scaled(30)):
        shown = await trio.run_process(
            [*roost_argv(), "sessions", "--show", session_id, "--json"],
            cwd=str(tmp_path),
            capture_stdout=True,
            check=True,
        )
    return json.loads(shown.stdout)["item"]["messages"]


async def test_remote_agent_proxies_a_second_daemon(tmp_path: Path) -> None:
    remote = tmp_path / "remote.json"
    remote.write_text(
        json.dumps(
            {
                "rules": [{"match": {"prompt": "stall"}, "steps": [[{"delay": 600}]]}],
                "default": [[{"text": "Oracle says: {prompt}"}]],
            }
        )
    )
    remote_dir = tmp_path / "remote"
    remote_dir.mkdir()
    async with (
        open_daemon(script=remote, args=["--a2a", "--work-dir", str(remote_dir)]) as other,
        other.ws() as watcher,
    ):
        url = f"http://127.0.0.1:{other.port}/a2a/assistant"
        result = await _run_team(tmp_path, url, 60, "what is 6 x 7")
        assert result["succeeded"] is True and result["turns"] == 2
        messages = await _messages(tmp_path, result["sessionId"])
        said = [(m["agentName"], m["content"]) for m in messages if m["role"] == "assistant"]
        assert said == [("Writer", "Question: what is 6 x 7"), ("Oracle", "Oracle says: Question: what is 6 x 7")]
        call = await watcher.wait_for("a2a_call")
        assert call["agent"] == "assistant"

        # the daemon's root URL works too (its card at /.well-known/agent.json names the default agent)
        root = await _run_team(tmp_path, f"http://127.0.0.1:{other.port}", 60, "via the root")
        assert (await _messages(tmp_path, root["sessionId"]))[-1]["content"] == "Oracle says: Question: via the root"

        # a timeout is the agent's message, not the run's failure
        slow = await _run_team(tmp_path, url, 1, "stall please")
        assert slow["succeeded"] is True
        last = (await _messages(tmp_path, slow["sessionId"]))[-1]
        assert last["agentName"] == "Oracle"
        assert last["content"] == f"[remote agent {url} failed: no answer within 1 s (TimeoutSeconds)]"

    # nobody listens there any more: a clear error message, and the run still completes
    gone = await _run_team(tmp_path, url, 30, "anyone there")
    assert gone["succeeded"] is True and gone["turns"] == 2
    last = (await _messages(tmp_path, gone["sessionId"]))[-1]
    assert last["content"].startswith(f"[remote agent {url} failed: ") and "connect" in last["content"].lower()


def test_remote_agent_config_is_checked(tmp_path: Path) -> None:
    from roost.orchestration import validate_config_file

    config = tmp_path / "bad.yaml"
    config.write_text(TEAM % {"url": "ftp://x", "timeout": 0})
    _, issues = validate_config_file(config)
    errors = [i.message for i in issues if i.level == "error"]
    assert "Orchestration.Agents[1].RemoteAgent.Url: must be an http:// or https:// URL" in errors
    assert "Orchestration.Agents[1].RemoteAgent.TimeoutSeconds: must be more than 0" in errors
    config.write_text(TEAM.replace("TimeoutSeconds", "Extra: 1, TimeoutSeconds") % {"url": "http://h", "timeout": 5})
    loaded, issues = validate_config_file(config)
    assert loaded is not None and loaded.agents[1].remote_agent.url == "http://h"
    assert loaded.agents[1].remote_agent.timeout_seconds == 5.0
    assert [i.message for i in issues] == ["Orchestration.Agents[1].RemoteAgent.Extra: unknown key, ignored"]


def test_a2a_needs_the_http_port(tmp_path: Path) -> None:
    done = subprocess.run(
        [*roost_argv(), "serve", "--provider", "scripted", "--a2a", "--socket", short_socket_path()],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        cwd=str(tmp_path),
    )
    assert done.returncode == 2 and "--a2a serves on the HTTP port: give --http-port" in done.stderr


LOCAL_TEAM = """
Orchestration:
  Name: Pair
  Agents:
    - {Name: Planner, Description: Plans the work., Instructions: You plan.}
    - {Name: Lead Developer, Instructions: You build.}
  Selection: {Type: sequential}
  Termination: {Type: maxiterations, MaxIterations: 2}
"""


async def test_a_team_daemon_hosts_each_agent(tmp_path: Path) -> None:
    config = tmp_path / "pair.yaml"
    config.write_text(LOCAL_TEAM)
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "rules": [
                    {"match": {"agent": "Planner"}, "steps": [[{"text": "Plan ready."}]]},
                    {"match": {"agent": "Lead Developer"}, "steps": [[{"text": "Built."}]]},
                ],
                "default": "echo",
            }
        )
    )
    async with (
        open_daemon(script=script, args=["--a2a", "-c", str(config), "--work-dir", str(tmp_path)]) as daemon,
        daemon.ws() as watcher,
    ):
        async with httpx.AsyncClient() as http:
            base = f"http://127.0.0.1:{daemon.port}"
            planner = (await http.get(f"{base}/a2a/Planner/.well-known/agent-card.json")).json()
            assert planner["description"] == "Plans the work." and planner["url"] == f"{base}/a2a/Planner/"
            developer = (await http.get(f"{base}/a2a/Lead%20Developer/.well-known/agent.json")).json()
            assert developer["name"] == "Lead Developer" and "security" not in developer  # no tokens: open
            assert developer["url"] == f"{base}/a2a/Lead%20Developer/"  # a name is one URL segment
            assert (await http.get(f"{base}/.well-known/agent-card.json")).json()["name"] == "Planner"
            assert (await http.get(f"{base}/a2a/Nobody/.well-known/agent-card.json")).status_code == 404
        async with a2a_client(daemon.port, None, path="/a2a/Lead%20Developer") as client:
            ((task, _),) = await send(client, "build the thing")
        assert task.status.state == TaskState.completed and _text(task.artifacts[0].parts) == "Built."
        assert task.metadata == {"agent": "Lead Developer", "lastAgent": "Lead Developer"}
        call = await watcher.wait_for("a2a_call")
        assert call == {"type": "a2a_call", "agent": "Lead Developer", "sessionId": task.id}
        await watcher.wait_for("agent_starting", lambda e: e["agent"] == "Lead Developer")
        starting = [e["agent"] for e in watcher.of_type("agent_starting") if e.get("sessionId") == task.id]
        assert starting == ["Planner", "Lead Developer"]


async def test_approvals_of_an_a2a_task_follow_the_unattended_policy(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "rules": [
                    {
                        "match": {"prompt": "^write"},
                        "steps": [
                            [
                                {
                                    "tool_call": {
                                        "name": "write_file",
                                        "arguments": {"path": "out.txt", "content": "by a2a\n"},
                                    }
                                }
                            ],
                            [{"text": "Result: {tool_output}"}],
                        ],
                    }
                ],
                "default": "echo",
            }
        )
    )
    for policy in ("deny", "allow"):
        work = tmp_path / policy
        work.mkdir()
        args = ["--a2a", "--work-dir", str(work), "--unattended-policy", policy, "--reconnect-grace", "600"]
        async with open_daemon(script=script, args=args) as daemon, daemon.ws(client_id="bystander") as bystander:
            async with a2a_client(daemon.port, None) as client:
                ((task, _),) = await send(client, "write the file")
            assert task.status.state == TaskState.completed
            assert (work / "out.txt").exists() is (policy == "allow"), _text(task.artifacts[0].parts)
            assert not bystander.of_type("approval_request")  # nobody attached is asked


async def test_a_daemon_team_with_a_remote_agent_called_over_a2a(tmp_path: Path) -> None:
    """A2A caller -> daemon A (`serve -c` team, --a2a) -> its RemoteAgent -> daemon B (--a2a)."""
    remote = tmp_path / "remote.json"
    remote.write_text(json.dumps({"rules": [], "default": [[{"text": "B answers: {prompt}"}]]}))
    local = tmp_path / "local.json"
    local.write_text(json.dumps({"rules": [], "default": [[{"text": "Question: {prompt}"}]]}))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with open_daemon(script=remote, args=["--a2a", "--work-dir", str(tmp_path / "b")]) as b, b.ws() as b_watcher:
        config = tmp_path / "a" / "team.yaml"
        config.write_text(TEAM % {"url": f"http://127.0.0.1:{b.port}/a2a/assistant", "timeout": 60})
        async with (
            open_daemon(script=local, args=["--a2a", "-c", str(config), "--work-dir", str(tmp_path / "a")]) as a,
            a.ws() as a_watcher,
        ):
            async with a2a_client(a.port, None, streaming=True, path="/a2a/Writer") as client:
                events = await send(client, "ping")
            task, update = events[-1]
            assert update.final is True and task.status.state == TaskState.completed
            assert _artifact(task, "result") == "B answers: Question: ping"
            assert _artifact(task, "stream") == "Question: pingB answers: Question: ping"  # both agents' text
            assert task.metadata == {"agent": "Writer", "lastAgent": "Oracle"}
            assert (await a_watcher.wait_for("a2a_call"))["agent"] == "Writer"
            assert (await b_watcher.wait_for("a2a_call"))["agent"] == "assistant"


async def _metrics(port: int) -> str:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"http://127.0.0.1:{port}/metrics")).text


async def test_cancelling_a_queued_task_answers_canceled_at_once(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    log = tmp_path / "serve.err"
    async with (
        open_daemon(script=script, args=["--a2a", "--work-dir", str(tmp_path)], stderr=log.open("wb")) as daemon,
        daemon.unix() as watcher,
        a2a_client(daemon.port, None, polling=True) as client,
    ):
        await watcher.wait_for("hello")
        ((first, _),) = await send(client, "slow first")
        await until_state(client, first.id, {TaskState.working})
        ((second, _),) = await send(client, "slow second")  # queued behind the first (one runner)
        assert second.status.state == TaskState.submitted
        # answered while the first still runs (it sleeps 600 s): the queued task is withdrawn,
        # not left to be interrupted once it starts
        with trio.fail_after(scaled(20)):
            answer = await client.cancel_task(TaskIdParams(id=second.id))
        assert answer.status.state == TaskState.canceled
        assert "before it started" in _text(answer.status.message.parts)
        assert (await client.get_task(TaskQueryParams(id=second.id))).status.state == TaskState.canceled
        assert (await client.get_task(TaskQueryParams(id=first.id))).status.state == TaskState.working
        assert f"A2A cancel of task {second.id} (withdrawn before it started)" in log.read_text()
        # it ended as a cancelled task does (the daemon's metrics count it interrupted) and never ran
        assert 'roost_tasks_finished_total{outcome="interrupted"} 1.0' in await _metrics(daemon.port)
        with pytest.raises(A2AClientJSONRPCError):  # an ended task is not cancelable twice
            await client.cancel_task(TaskIdParams(id=second.id))
        # the running one is interrupted and answered once it ended
        assert (await client.cancel_task(TaskIdParams(id=first.id))).status.state == TaskState.canceled
        assert 'roost_tasks_finished_total{outcome="interrupted"} 2.0' in await _metrics(daemon.port)
    started = [e.get("sessionId") for e in watcher.events if e["type"] == "agent_starting"]
    assert first.id in started and second.id not in started
    assert [e["sessionId"] for e in watcher.events if e["type"] == "a2a_call"] == [first.id, second.id]


ASK_SCRIPT = {
    "rules": [
        {
            "match": {"prompt": "^ask"},
            "steps": [
                [{"tool_call": {"name": "ask_user", "arguments": {"question": "Which colour?", "options": ["red"]}}}],
                [{"text": "model saw: {tool_output}"}],
            ],
        }
    ],
    "default": "echo",
}


async def test_ask_user_reaches_the_attached_client_of_an_a2a_daemon(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(ASK_SCRIPT))
    async with open_daemon(script=script, args=["--a2a", "--work-dir", str(tmp_path)]) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")
            start = len(client.events)
            await client.send({"type": "user_input", "text": "ask me a colour"})
            sid = (await client.wait_for("queued", start=start))["sessionId"]
            question = await client.wait_for("question")
            assert question["sessionId"] == sid and question["question"] == "Which colour?"
            await client.send({"type": "question_response", "answer": "red"})
            result = await client.wait_for("result", lambda e: e["sessionId"] == sid)
            assert result["lastMessage"] == "model saw: The user answered: red"


def _rpc(method: str, params: Any, request_id: Any = 1) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}).encode()


async def test_malformed_requests_push_notifications_and_the_body_limit(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    log_path = tmp_path / "stderr.log"
    limit = 100_000
    with log_path.open("wb") as stderr:
        async with (
            open_daemon(
                script=script,
                args=_daemon_args(tmp_path),
                token=FULL,
                env={"ROOST_MAX_LINE_BYTES": str(limit)},
                stderr=stderr,
            ) as daemon,
            daemon.ws() as watcher,
        ):
            url = f"http://127.0.0.1:{daemon.port}/a2a/assistant/"
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {FULL}"}, timeout=scaled(60)) as http:
                task_config = {"taskId": "t1", "pushNotificationConfig": {"url": "https://example.com/hook"}}
                cases = [
                    (b"{not json", -32700, "not JSON"),
                    (b"", -32700, "empty"),
                    (b"[]", -32600, "batches are not supported"),
                    (b'{"jsonrpc": "2.0", "id": 2}', -32600, "method"),
                    (_rpc("message/send", None, 3), -32602, "params"),
                    (_rpc("message/send", {"message": {"role": "user"}}, 4), -32602, "parts"),
                    (_rpc("tasks/pushNotificationConfig/set", task_config, 5), -32003, "not supported"),
                    (_rpc("tasks/pushNotificationConfig/get", {"id": "t1"}, 6), -32003, "not supported"),
                    (_rpc("tasks/pushNotificationConfig/list", {"id": "t1"}, 7), -32003, "not supported"),
                    (_rpc("tasks/pushNotificationConfig/set", {"taskId": 1}, 8), -32602, "pushNotificationConfig"),
                ]
                for body, code, words in cases:
                    response = await http.post(url, content=body, headers={"content-type": "application/json"})
                    assert response.status_code == 200, (body, response.text)
                    error = response.json()["error"]
                    assert error["code"] == code and words in error["message"], (body, error)
                    assert "pydantic" not in response.text and "data" not in error, (body, error)
                huge = _message("x" * (limit + 1)).model_dump(mode="json", by_alias=True, exclude_none=True)
                response = await http.post(url, content=_rpc("message/send", {"message": huge}, 9))
                assert response.status_code == 413, response.text
                error = response.json()["error"]
                assert error["code"] == -32600 and str(limit) in error["message"], error
                assert "ROOST_MAX_LINE_BYTES" in error["message"]
                async with a2a_client(daemon.port, FULL) as client:  # still serving others
                    task, _ = (await send(client, "after the bad ones"))[-1]
                    assert _text(task.artifacts[0].parts) == "reply to: after the bad ones"
                    await watcher.wait_for("a2a_call", lambda e: e["sessionId"] == task.id)
                    assert len(watcher.of_type("a2a_call")) == 1  # no bad request became a task
    log = log_path.read_text()
    assert "Traceback" not in log and "pydantic" not in log and "Unhandled exception" not in log, log


async def test_validate_warns_about_an_agent_name_a2a_cannot_host(tmp_path: Path, roost_home: Path) -> None:
    from _helpers.appserver import scripted_env
    from _helpers.cli import roost

    config = tmp_path / "team.yaml"
    config.write_text(LOCAL_TEAM.replace("Name: Planner", "Name: ünï/x").replace("Lead Developer", "'Lead {Dev}'"))
    checked = await roost(scripted_env(roost_home), "validate", "--json", str(config), cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr.decode()  # it runs; only serve --a2a leaves them out
    item = json.loads(checked.stdout)["item"]
    assert item["valid"] is True
    rule = "its name cannot be one URL segment of /a2a/<name>/ (it holds '/' or '{')"
    assert [(i["level"], i["message"]) for i in item["issues"]] == [
        ("warning", f"Orchestration.Agents[{i}].Name: {name!r} cannot be hosted over A2A (roost serve --a2a leaves "
         f"it out): {rule}")
        for i, name in enumerate(["ünï/x", "Lead {Dev}"])
    ]
    plain = tmp_path / "plain.yaml"
    plain.write_text(LOCAL_TEAM.replace("Name: Planner", "Name: Plänner ünï"))
    checked = await roost(scripted_env(roost_home), "validate", "--json", str(plain), cwd=tmp_path)
    assert json.loads(checked.stdout)["item"]["issues"] == []
