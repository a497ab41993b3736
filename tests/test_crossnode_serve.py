"""Cross-node ``interrupt`` on the serve socket (issue 13; wire-protocol.md, "Input": ``interrupt``
cancels the client's running task): two real ``roost serve`` daemons on one PostgreSQL database
share the task queue, so a client's tasks dispatched on node A may run on node B. An
``interrupt`` line on A stops them on both nodes (B's over the node bus, ``task.interrupt``); the
results reach the client on A; checked in the database. The approvals of a task B runs for a
client on A are asked of that client on A (``task.approval``)."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from test_pg_cluster import SCRIPT, _rows, _runner_pid, _wait_rows, cluster


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    approve = {
        "match": {"prompt": "^approve"},
        "steps": [
            [{"tool_call": {"name": "shell", "arguments": {"command": "echo approved-run"}}}],
            [{"text": "tool said: {tool_output}"}],
        ],
    }
    path.write_text(json.dumps({**SCRIPT, "rules": [approve, *SCRIPT["rules"]]}))
    return path


async def _dispatch(client, text: str) -> str:
    start = len(client.events)
    await client.send({"type": "user_input", "text": text})
    return (await client.wait_for("queued", start=start))["sessionId"]


async def test_interrupt_on_node_a_stops_the_clients_task_running_on_node_b(
    tmp_path: Path, pg_url: str, script: Path
) -> None:
    async with cluster(tmp_path, pg_url, script, n=2) as (a, b):
        async with AsyncExitStack() as stack:
            client = await stack.enter_async_context(a.unix())
            await client.wait_for("hello")
            # one runner per node (--max-concurrent 1): A runs the first slow task, B claims the second
            first, second = await _dispatch(client, "slow one"), await _dispatch(client, "slow two")
            for sid in (first, second):
                await _wait_rows(
                    pg_url, "SELECT 1 FROM turns WHERE thread_id = %s AND status = 'running'", (sid,), bool
                )
            runners = {_runner_pid(pg_url, first), _runner_pid(pg_url, second)}
            assert runners == {a.process.pid, b.process.pid}
            on_b = first if _runner_pid(pg_url, first) == b.process.pid else second
            start = len(client.events)
            await client.send({"type": "interrupt"})
            results = {}
            for sid in (first, second):
                results[sid] = await client.wait_for("result", lambda e, s=sid: e["sessionId"] == s, start=start)
            assert all(r["succeeded"] is False for r in results.values())
            assert not [e for e in client.events[start:] if e.get("type") == "error"]
        # in the database: B's task was interrupted on B (claimed once, never resumed or run twice)
        assert _rows(pg_url, "SELECT status FROM turns WHERE thread_id = %s", (on_b,)) == [("interrupted",)]
        assert _rows(pg_url, "SELECT token FROM leases WHERE key = %s", (f"task:{on_b}",)) == [(1,)]
        assert {s for (s,) in _rows(pg_url, "SELECT status FROM daemon_tasks")} <= {"finished", "collected"}
        assert {s for (s,) in _rows(pg_url, "SELECT status FROM bus_messages")} <= {"done"}


async def test_interrupt_with_no_task_running_anywhere_is_an_error(tmp_path: Path, pg_url: str, script: Path) -> None:
    async with cluster(tmp_path, pg_url, script, n=2) as (a, _b):
        async with a.unix() as client:
            await client.wait_for("hello")
            start = len(client.events)
            await client.send({"type": "interrupt"})
            error = await client.wait_for("error", start=start)
            assert error["code"] == "invalid_request"


async def test_a_task_running_on_another_node_asks_its_approval_of_the_client_that_dispatched_it(
    tmp_path: Path, pg_url: str, script: Path
) -> None:
    async with cluster(tmp_path, pg_url, script, n=2) as daemons, AsyncExitStack() as stack:
        clients = {d.process.pid: await stack.enter_async_context(d.unix()) for d in daemons}
        for client in clients.values():
            await client.wait_for("hello")
        first = clients[daemons[0].process.pid]
        busy = await _dispatch(first, "slow one")  # one node's only runner takes it
        await _wait_rows(pg_url, "SELECT 1 FROM turns WHERE thread_id = %s AND status = 'running'", (busy,), bool)
        here = _runner_pid(pg_url, busy)
        (other,) = [pid for pid in clients if pid != here]
        asker = clients[here]
        sid = await _dispatch(asker, "approve this please")  # so the other node runs this one
        request = await asker.wait_for("approval_request", lambda e: e["sessionId"] == sid)
        assert request["kind"] == "shell_command" and request["command"] == "echo approved-run"
        assert _runner_pid(pg_url, sid) == other
        await asker.send({"type": "approval_response", "approved": True})
        result = await asker.wait_for("result", lambda e: e["sessionId"] == sid)
        assert result["succeeded"] is True and "approved-run" in result["lastMessage"]
        assert not clients[other].of_type("approval_request")
        start = len(first.events)
        await first.send({"type": "interrupt"})
        await first.wait_for("result", lambda e: e["sessionId"] == busy, start=start)
    # in the database: the tool ran once, on the other node, approved (not by the unattended deny)
    outputs = _rows(
        pg_url, "SELECT payload FROM items WHERE thread_id = %s AND type = 'tool_call' ORDER BY seq", (sid,)
    )
    assert len(outputs) == 1 and "approved-run" in str(outputs[0][0])


async def test_an_anonymous_client_of_another_node_cannot_interrupt_a_task_it_did_not_send(
    tmp_path: Path, pg_url: str, script: Path
) -> None:
    # anonymous clients are numbered per process, so the first one of each node has the same key
    async with cluster(tmp_path, pg_url, script, n=2) as (a, b):
        async with a.unix() as sender, b.unix() as stranger:
            await sender.wait_for("hello")
            await stranger.wait_for("hello")
            first, second = await _dispatch(sender, "slow one"), await _dispatch(sender, "slow two")
            for sid in (first, second):
                await _wait_rows(
                    pg_url, "SELECT 1 FROM turns WHERE thread_id = %s AND status = 'running'", (sid,), bool
                )
            start = len(stranger.events)
            await stranger.send({"type": "interrupt"})
            error = await stranger.wait_for("error", start=start)
            assert error["code"] == "invalid_request"
            assert {s for (s,) in _rows(pg_url, "SELECT status FROM daemon_tasks")} == {"running"}
            start = len(sender.events)
            await sender.send({"type": "interrupt"})
            for sid in (first, second):
                result = await sender.wait_for("result", lambda e, s=sid: e["sessionId"] == s, start=start)
                assert result["succeeded"] is False
