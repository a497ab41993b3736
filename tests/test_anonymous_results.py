"""The result of an anonymous client's task (a serve-socket client without a client id) when its
node dies (issue 13): the ``hello`` of a reconnecting anonymous client cannot name it (the spec's
``pendingResults`` are a client id's), so the result is had by its ``sessionId`` from the MCP tool
``get_result`` of any node (wire-protocol.md "Daemon events": "The daemon also exposes
dispatch_task, get_status and get_result as MCP tools over HTTP"; docs/operations.md). And a
restarted daemon's anonymous clients are new clients: none inherits a task of the anonymous
client of the same number of the process before (its approvals, its result)."""

from __future__ import annotations

import json
import os
import signal
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import psycopg
import trio
from _helpers.serve_client import short_socket_path, start_daemon, write_resume_script
from _helpers.timing import scaled


async def _mcp(port: int, tool: str, args: dict) -> dict:
    """Call one MCP tool of the daemon on ``port`` (a session of its own); its structured result."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient() as http, \
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        result = await session.call_tool(tool, args)
        assert not result.is_error, result
        return json.loads(result.content[0].text)


async def _result_by_mcp(port: int, sid: str) -> dict:
    with trio.fail_after(scaled(60)):
        while True:
            result = await _mcp(port, "get_result", {"sessionId": sid})
            if result.get("type") == "result":
                return result
            assert result["status"] in ("queued", "running"), result
            await trio.sleep(0.2)


async def _stop_all(daemons: list[Any]) -> None:
    for daemon in daemons:
        if daemon.process.returncode is None:
            daemon.process.send_signal(signal.SIGTERM)
    for daemon in daemons:
        with trio.move_on_after(scaled(15)):
            await daemon.process.wait()
        if daemon.process.returncode is None:
            daemon.kill9()
            await daemon.process.wait()


async def test_an_anonymous_clients_result_after_its_node_dies(tmp_path: Path, pg_url: str) -> None:
    script = write_resume_script(tmp_path / "script.json")
    started: list[Any] = []

    def env(name: str) -> dict[str, Any]:
        (tmp_path / f"home-{name}").mkdir()
        return {"ROOST_HOME": str(tmp_path / f"home-{name}"), "ROOST_DATABASE_URL": pg_url,
                "ROOST_LEASE_TTL": "3", "ROOST_TASK_POLL_S": "0.3"}

    async with AsyncExitStack() as stack:
        args = ["--work-dir", str(tmp_path)]
        nursery = await stack.enter_async_context(trio.open_nursery())
        stack.push_async_callback(_stop_all, started)
        node_a = await start_daemon(nursery, script=script, env=env("a"), args=args)
        started.append(node_a)
        async with node_a.unix() as anonymous:
            assert (await anonymous.wait_for("hello"))["clientId"] is None
            await anonymous.send({"type": "user_input", "text": "slow job"})
            sid = (await anonymous.wait_for("queued"))["sessionId"]
            await anonymous.wait_for("agent_starting", lambda e: e["sessionId"] == sid)  # A runs it
            node_b = await start_daemon(nursery, script=script, env=env("b"), args=args)
            started.append(node_b)
            os.kill(node_a.process.pid, signal.SIGKILL)  # its node dies, and its connection with it
            await anonymous.wait_closed()
        # B resumes the task; the client, back on B, gets nothing in its hello (it has no id) ...
        async with node_b.unix() as back:
            hello = await back.wait_for("hello")
            assert hello["pendingResults"] == [] and hello["inFlight"] is None
        # ... and asks any node for the result by the task's sessionId
        result = await _result_by_mcp(node_b.port, sid)
        assert result["sessionId"] == sid and result["succeeded"] is True
        assert result["lastMessage"] == "resumed and done" and result["task"] == "slow job"
        assert (await _mcp(node_b.port, "get_status", {"sessionId": sid}))["status"] == "finished"
        # a node that never knew the task answers the same, from the database
        node_c = await start_daemon(nursery, script=script, env=env("c"), args=args)
        started.append(node_c)
        assert (await _mcp(node_c.port, "get_result", {"sessionId": sid}))["lastMessage"] == "resumed and done"
    with psycopg.connect(pg_url) as conn:
        (token,), = conn.execute("SELECT token FROM leases WHERE key = %s", (f"task:{sid}",)).fetchall()
    assert token == 2  # A's claim, then B's


async def test_a_restarted_daemons_anonymous_client_is_a_new_client(tmp_path: Path) -> None:
    script = write_resume_script(tmp_path / "script.json")
    socket_path = short_socket_path()
    async with trio.open_nursery() as nursery:
        first = await start_daemon(nursery, script=script, socket=socket_path)
        try:
            async with first.unix() as anonymous:
                await anonymous.wait_for("hello")
                await anonymous.send({"type": "user_input", "text": "slow job"})
                sid = (await anonymous.wait_for("queued"))["sessionId"]
                await anonymous.wait_for("agent_starting", lambda e: e["sessionId"] == sid)
                first.kill9()
                await first.process.wait()
            restarted = await start_daemon(nursery, script=script, socket=socket_path)
            try:
                # the new process's first anonymous client is not the old one's first
                async with restarted.unix() as newcomer:
                    hello = await newcomer.wait_for("hello")
                    assert hello["inFlight"] is None and hello["pendingResults"] == []
                    result = await _result_by_mcp(restarted.port, sid)
                    assert result["lastMessage"] == "resumed and done"
                    # one runner: a task it queues now ends after the old task was told to its client
                    mark = len(newcomer.events)
                    await newcomer.send({"type": "user_input", "text": "echo after"})
                    later = (await newcomer.wait_for("queued", start=mark))["sessionId"]
                    await newcomer.wait_for("result", lambda e: e["sessionId"] == later, start=mark)
                    assert [e["type"] for e in newcomer.events if e.get("sessionId") == sid
                            and e["type"] in ("result", "approval_request")] == []
            finally:
                restarted.process.send_signal(signal.SIGTERM)
                await restarted.process.wait()
        finally:
            if first.process.returncode is None:
                first.kill9()
                await first.process.wait()
