"""A2A tasks of `roost serve --a2a` (docs/wire.md, "A2A"): ``tasks/cancel`` of a task another node
of the PostgreSQL cluster runs, tasks scoped to the token that sent them, and the request checks
(a missing ``id``, params that are not an object, non-boolean ``blocking``, a repeated
``messageId``, ``historyLength: 0``, JSON-RPC bodies of the 401/403 refusals)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _helpers.serve_client import open_daemon
from _helpers.timing import scaled
from a2a.client.errors import A2AClientJSONRPCError
from a2a.types import TaskIdParams, TaskQueryParams, TaskState
from test_a2a import SCRIPT, _message, _rpc, a2a_client, send, until_state
from test_pg_cluster import _rows, _runner_pid, _wait_rows

FULL, OTHER, READ = "tasks-full", "tasks-other", "tasks-read"


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    return script


async def test_cancel_on_a_stops_an_a2a_task_running_on_b(tmp_path: Path, pg_url: str) -> None:
    """A (``--a2a``) and B (no A2A) on one database, one runner each: A runs the first slow task,
    B claims the second; ``tasks/cancel`` on A interrupts it on B (the node bus) and answers
    ``canceled`` once it ended."""
    script = _script(tmp_path)
    async with contextlib.AsyncExitStack() as stack:
        daemons = []
        for name, extra in (("a", ["--a2a"]), ("b", [])):
            home = tmp_path / f"home-{name}"
            home.mkdir()
            env = {"ROOST_HOME": str(home), "ROOST_DATABASE_URL": pg_url, "ROOST_TASK_POLL_S": "0.3"}
            args = [*extra, "--max-concurrent", "1", "--work-dir", str(tmp_path)]
            daemons.append(await stack.enter_async_context(open_daemon(script=script, env=env, args=args)))
        a, b = daemons
        async with a2a_client(a.port, None, polling=True) as client:
            ((first, _),) = await send(client, "slow first")
            await _wait_rows(
                pg_url, "SELECT 1 FROM turns WHERE thread_id = %s AND status = 'running'", (first.id,), bool
            )
            ((second, _),) = await send(client, "slow second")
            await _wait_rows(
                pg_url, "SELECT 1 FROM turns WHERE thread_id = %s AND status = 'running'", (second.id,), bool
            )
            runners = {_runner_pid(pg_url, t.id): t for t in (first, second)}
            assert set(runners) == {a.process.pid, b.process.pid}
            on_a, on_b = runners[a.process.pid], runners[b.process.pid]
            with trio.fail_after(scaled(20)):
                answer = await client.cancel_task(TaskIdParams(id=on_b.id))
            assert answer.status.state == TaskState.canceled, answer
            assert _rows(pg_url, "SELECT status FROM turns WHERE thread_id = %s", (on_b.id,)) == [("interrupted",)]
            assert (await client.get_task(TaskQueryParams(id=on_a.id))).status.state == TaskState.working
            assert (await client.cancel_task(TaskIdParams(id=on_a.id))).status.state == TaskState.canceled


def _tokens(tmp_path: Path) -> list[str]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"full {FULL}\nfull {OTHER}\nread {READ}\n")
    return ["--a2a", "--tokens-file", str(tokens), "--max-concurrent", "2", "--work-dir", str(tmp_path)]


async def _not_found(call: Any) -> None:
    with pytest.raises(A2AClientJSONRPCError) as refused:
        await call
    assert refused.value.error.code == -32001, refused.value.error  # as for an unknown id


async def test_a_task_belongs_to_the_token_that_sent_it(tmp_path: Path) -> None:
    async with open_daemon(script=_script(tmp_path), args=_tokens(tmp_path), token=FULL) as daemon:
        async with a2a_client(daemon.port, FULL, polling=True) as mine:
            ((slow, _),) = await send(mine, "slow work of the full token")
            await until_state(mine, slow.id, {TaskState.working})
        async with a2a_client(daemon.port, OTHER, streaming=True) as other:
            await _not_found(other.get_task(TaskQueryParams(id=slow.id, history_length=5)))
            await _not_found(other.cancel_task(TaskIdParams(id=slow.id)))

            async def resubscribe() -> None:
                async for _ in other.resubscribe(TaskIdParams(id=slow.id)):
                    raise AssertionError("another token's task was streamed")

            await _not_found(resubscribe())
            ((own, _),) = [e async for e in other.send_message(_message("its own"))][-1:]
            assert (await other.get_task(TaskQueryParams(id=own.id))).status.state == TaskState.completed
        async with a2a_client(daemon.port, READ) as reader:  # a read token reads every task
            assert (await reader.get_task(TaskQueryParams(id=slow.id))).status.state == TaskState.working
            assert (await reader.get_task(TaskQueryParams(id=own.id))).status.state == TaskState.completed
        async with a2a_client(daemon.port, FULL) as mine:  # its own token still may
            assert (await mine.cancel_task(TaskIdParams(id=slow.id))).status.state == TaskState.canceled


def _send_params(message_id: str = "m-1", **configuration: Any) -> dict:
    message = {"role": "user", "messageId": message_id, "parts": [{"kind": "text", "text": "hi"}]}
    return {"message": message, **({"configuration": configuration} if configuration else {})}


async def test_request_checks_idempotent_sends_history_length_and_refusal_bodies(tmp_path: Path) -> None:
    async with open_daemon(script=_script(tmp_path), args=_tokens(tmp_path), token=FULL) as daemon:
        url = f"http://127.0.0.1:{daemon.port}/a2a/assistant/"
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {FULL}"}, timeout=scaled(60)) as http:

            async def post(body: Any, **headers: str) -> httpx.Response:
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                return await http.post(url, content=content, headers={"content-type": "application/json", **headers})

            no_id = {"jsonrpc": "2.0", "method": "message/send", "params": _send_params("m-no-id")}
            cases = [
                (no_id, -32600, "message/send has no id", None),
                (_rpc("message/send", [1, 2], 2), -32602, "params must be an object", 2),
                (_rpc("message/send", _send_params("m-yes", blocking="yes"), 3), -32602, "blocking", 3),
                (_rpc("tasks/get", {"id": "x", "historyLength": "5"}, 4), -32602, "historyLength", 4),
                (_rpc("tasks/get", {"id": "x", "historyLength": -1}, 5), -32602, "historyLength", 5),
            ]
            for body, code, words, request_id in cases:
                answer = await post(body)
                assert answer.status_code == 200, (body, answer.text)
                reply = answer.json()
                assert reply["error"]["code"] == code and words in reply["error"]["message"], (body, reply)
                assert reply["id"] == request_id, reply

            # a repeated messageId of the same token answers the task it started: one task
            first = (await post(_rpc("message/send", _send_params("m-same"), 6))).json()["result"]
            again = (await post(_rpc("message/send", _send_params("m-same"), 7))).json()["result"]
            assert again["id"] == first["id"] and first["status"]["state"] == "completed"
            async with trio.open_nursery() as nursery:  # two sends of one new id at once: one task
                ids: list[str] = []

                async def racer(n: int) -> None:
                    ids.append((await post(_rpc("message/send", _send_params("m-race"), n))).json()["result"]["id"])

                for n in (8, 9):
                    nursery.start_soon(racer, n)
            assert len(ids) == 2 and ids[0] == ids[1]
            other = (
                await post(_rpc("message/send", _send_params("m-same"), 10), authorization=f"Bearer {OTHER}")
            ).json()
            assert other["result"]["id"] != first["id"]  # another caller's message of that id

            got = (await post(_rpc("tasks/get", {"id": first["id"], "historyLength": 0}, 11))).json()["result"]
            assert got["history"] == []
            got = (await post(_rpc("tasks/get", {"id": first["id"], "historyLength": 1}, 12))).json()["result"]
            assert [_text_of(m) for m in got["history"]] == ["hi"]

            # refusals: JSON-RPC error bodies, their HTTP status kept
            refusals = [
                ({"authorization": "Bearer nope"}, 401, "Authorization: Bearer", None),
                ({"origin": "http://evil"}, 403, "Origin", None),
                ({"authorization": f"Bearer {READ}"}, 403, "not tasks/cancel", 13),
            ]
            for headers, status, words, request_id in refusals:
                answer = await post(_rpc("tasks/cancel", {"id": first["id"]}, 13), **headers)
                assert answer.status_code == status and answer.headers["content-type"] == "application/json"
                reply = answer.json()
                assert reply["jsonrpc"] == "2.0" and reply["id"] == request_id, reply
                assert reply["error"]["code"] == -32600 and words in reply["error"]["message"], reply
            card = await http.get(
                f"http://127.0.0.1:{daemon.port}/.well-known/agent-card.json", headers={"authorization": ""}
            )
            assert card.status_code == 401 and card.json()["error"]["code"] == -32600
            # three tasks: m-same, m-race, and m-same of the other token (no bad request became one)
            metrics = (await http.get(f"http://127.0.0.1:{daemon.port}/metrics")).text  # same keep-alive pool
            assert 'roost_tasks_accepted_total{source="a2a"} 3.0' in metrics, metrics


def _text_of(message: dict) -> str:
    return "".join(p["text"] for p in message["parts"])
