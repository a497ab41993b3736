"""The daemon's MCP tools through the real `roost serve` and the official `mcp` client.

Structured output, `sessionId` arguments, refused bad input, `objectiveId`, and approvals of an
MCP-dispatched task answered by the attached client with the same client id or by the unattended
policy, with `get_result` saying which (docs/wire.md, "MCP tools").
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from _helpers.appserver import roost_argv
from _helpers.serve_client import open_daemon

SCRIPT = {
    "rules": [
        {"match": {"prompt": "^write"},
         "steps": [[{"tool_call": {"name": "write_file", "arguments": {"path": "out.txt", "content": "hi\n"}}}],
                   [{"text": "Result: {tool_output}"}]]},
    ],
    "default": "echo",
}
TOKEN = "mcptok"


def roost(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*roost_argv(), *args], capture_output=True, text=True, timeout=60)


@asynccontextmanager
async def mcp_client(port: int, client_id: str | None = None) -> AsyncIterator[Any]:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {TOKEN}"}
    if client_id:
        headers["Fuseraft-Client-Id"] = client_id
    async with httpx2.AsyncClient(headers=headers) as http, \
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        yield session


async def call(session: Any, tool: str, args: dict) -> dict:
    result = await session.call_tool(tool, args)
    assert not result.is_error, result
    assert isinstance(result.structured_content, dict), result   # structured, not JSON in text
    return result.structured_content


async def finished(session: Any, sid: str) -> dict:
    with trio.fail_after(60):
        while True:
            result = await call(session, "get_result", {"sessionId": sid})
            if result.get("type") == "result":
                return result
            await trio.sleep(0.1)


async def test_mcp_tools_structured_session_ids_and_refusals(tmp_path: Path, roost_home: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    created = roost("objective", "create", "--title", "Via MCP", "--tasks", "first", "--status", "paused")
    assert created.stdout == "OBJ-0001\n", created.stderr
    async with open_daemon(script=script, token=TOKEN, args=["--work-dir", str(tmp_path)]) as daemon, \
            mcp_client(daemon.port) as session:
        queued = await call(session, "dispatch_task", {"task": "hello mcp"})
        sid = queued["sessionId"]
        assert queued["position"] == 0 and queued["objectiveId"] is None
        result = await finished(session, sid)
        assert result["succeeded"] is True and result["lastMessage"] == "hello mcp" and result["approvals"] == []
        status = await call(session, "get_status", {"sessionId": sid})
        assert status["status"] == "finished" and status["task"] == "hello mcp"
        assert (await call(session, "get_status", {"session_id": sid}))["status"] == "finished"

        missing = await session.call_tool("dispatch_task", {"task": "x", "work_dir": str(tmp_path / "nope")})
        assert missing.is_error and "is not an existing directory" in missing.content[0].text
        no_id = await session.call_tool("get_result", {})
        assert no_id.is_error and "sessionId" in no_id.content[0].text
        typed = await session.call_tool("dispatch_task", {"task": 5, "work_dir": ["a"]})
        assert typed.is_error and typed.content[0].text == (
            "invalid arguments for dispatch_task: task must be a valid string (got a number); "
            "work_dir must be a valid string (got an array)")
        absent = await session.call_tool("dispatch_task", {})
        assert absent.is_error and absent.content[0].text == "invalid arguments for dispatch_task: task is required"
        wrong_id = await session.call_tool("get_status", {"sessionId": 7})
        assert wrong_id.is_error and "sessionId must be a valid string (got a number)" in wrong_id.content[0].text
        assert "pydantic" not in typed.content[0].text + absent.content[0].text + wrong_id.content[0].text
        unknown = await session.call_tool("dispatch_task", {"task": "x", "objectiveId": "OBJ-0404"})
        assert unknown.is_error and "no objective 'OBJ-0404'" in unknown.content[0].text

        on_obj = await call(session, "dispatch_task", {"task": "for the objective", "objectiveId": "OBJ-0001"})
        assert on_obj["objectiveId"] == "OBJ-0001"
        await finished(session, on_obj["sessionId"])
        with trio.fail_after(60):
            while True:
                tasks = json.loads(roost("objective", "status", "OBJ-0001", "--json").stdout)["item"]["tasks"]
                if tasks[-1]["outcome"] == "succeeded":
                    break
                await trio.sleep(0.2)
        assert [(t["task"], t["outcome"]) for t in tasks] == [("first", "pending"), ("for the objective", "succeeded")]
        assert tasks[-1]["sessionId"] == on_obj["sessionId"]


async def test_mcp_task_approvals_go_to_the_same_client_id_or_the_unattended_policy(
        tmp_path: Path, roost_home: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    async with open_daemon(script=script, token=TOKEN,
                           args=["--work-dir", str(tmp_path), "--reconnect-grace", "0"]) as daemon:
        async with daemon.ws(client_id="desk") as desk, mcp_client(daemon.port, client_id="desk") as session:
            await desk.wait_for("hello")
            sid = (await call(session, "dispatch_task", {"task": "write the file"}))["sessionId"]
            asked = await desk.wait_for("approval_request")
            assert asked["sessionId"] == sid and asked["kind"] == "file_write"
            await desk.send({"type": "approval_response", "approved": True})
            result = await finished(session, sid)
            assert result["approvals"] == [{"kind": "file_write", "approved": True, "answeredBy": "client"}]
            assert (tmp_path / "out.txt").read_text() == "hi\n"
        (tmp_path / "out.txt").unlink()
        async with mcp_client(daemon.port, client_id="away") as session:   # nobody attached as "away"
            sid = (await call(session, "dispatch_task", {"task": "write again"}))["sessionId"]
            result = await finished(session, sid)
            assert result["approvals"] == [{"kind": "file_write", "approved": False, "answeredBy": "unattended"}]
            assert not (tmp_path / "out.txt").exists()
