"""MCP servers of a daemon task's own orchestration config (docs/operations.md, "MCP servers";
docs/wire.md, ``mcp_status``): started for that task through the plugin host and the official
``mcp`` client, their tools offered to its agents and gated by approvals, stopped when it ends;
a server that cannot start is a status, not a failed task; one that dies mid-call is a tool error
and a status change. Also ``roost serve -c CONFIG``'s own
servers, which the daemon runs once for every task.

The servers are ``tests/_helpers/mcp_server.py``; tasks are dispatched with the daemon's MCP
``dispatch_task`` (with a ``config``) and over the Unix socket.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import trio
from _helpers.serve_client import open_daemon
from _helpers.timing import scaled
from test_serve_mcp_tools import TOKEN, call, finished, mcp_client

SERVER = Path(__file__).parent / "_helpers" / "mcp_server.py"
SCRIPT = {
    "rules": [
        {
            "match": {"prompt": "^crash"},
            "steps": [[{"tool_call": {"name": "mcp__notes__crash", "arguments": {}}}], [{"text": "after {tool_output}"}]],
        },
        {
            "match": {"agent": "Noter"},
            "steps": [
                [{"tool_call": {"name": "mcp__notes__write_note", "arguments": {"text": "n1"}}}],
                [{"tool_call": {"name": "mcp__notes__whoami", "arguments": {}}}],
                [{"text": "done: {tool_output}"}],
            ],
        }
    ],
    "default": "echo",
}


def _team(path: Path, notes: Path, *, broken: bool = True) -> Path:
    servers = [
        {
            "Name": "notes",
            "Type": "stdio",
            "Command": sys.executable,
            "Args": [str(SERVER), "stdio"],
            "Env": {"MCP_NOTES": str(notes)},
        }
    ]
    if broken:
        servers.append({"Name": "broken", "Command": "/nonexistent/mcp-server"})
    path.write_text(
        json.dumps(
            {
                "Orchestration": {
                    "Name": "Notes",
                    "Agents": [{"Name": "Noter", "Instructions": "take notes", "Plugins": ["notes", "broken"]}],
                    "Termination": {"Type": "maxiterations", "MaxIterations": 1},
                    "McpServers": servers,
                }
            }
        )
    )
    return path


def _pid(text: str) -> int:
    return int(text.rsplit("pid ", 1)[1])


async def _gone(pid: int) -> None:
    with trio.fail_after(scaled(30)):
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            await trio.sleep(0.05)


async def test_a_dispatched_tasks_config_starts_its_servers_for_that_task(tmp_path: Path, roost_home: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    notes = tmp_path / "notes.txt"
    config = _team(tmp_path / "notes.yaml", notes)
    env = {"ROOST_MCP_BACKOFF_S": "0.2"}
    args = ["--work-dir", str(tmp_path)]
    async with open_daemon(script=script, token=TOKEN, args=args, env=env) as daemon:
        async with daemon.ws(client_id="desk") as desk, mcp_client(daemon.port, client_id="desk") as session:
            await desk.wait_for("hello")
            sid = (await call(session, "dispatch_task", {"task": "take a note", "config": str(config)}))["sessionId"]
            asked = await desk.wait_for("approval_request")
            # the task's own server's mutating tool is gated like a built-in one, asked of its client
            assert (asked["kind"], asked["plugin"], asked["action"], asked["sessionId"]) == (
                "tool_action",
                "notes",
                "write_note",
                sid,
            )
            await desk.send({"type": "approval_response", "approved": True})
            result = await finished(session, sid)
            assert result["succeeded"], result
            statuses = [(e["server"], e["state"]) for e in desk.of_type("mcp_status") if e["sessionId"] == sid]
            assert ("notes", "connected") in statuses and ("broken", "failed") in statuses
            failed = next(e for e in desk.of_type("mcp_status") if e["state"] == "failed")
            assert "/nonexistent/mcp-server" in failed["error"]
            calls = [e["tool"] for e in desk.of_type("tool_calling") if e["sessionId"] == sid]
            assert calls == ["mcp__notes__write_note", "mcp__notes__whoami"]
        assert notes.read_text() == "n1\n"
        # the server ran for that task only: stopped once it ended
        await _gone(_pid(result["lastMessage"]))
        # a second task with the config starts a fresh server process
        async with mcp_client(daemon.port, client_id="away") as session:
            again = (await call(session, "dispatch_task", {"task": "note again", "config": str(config)}))["sessionId"]
            second = await finished(session, again)
        # nobody attached as "away": the unattended policy (deny) answered the approval
        assert second["approvals"] == [{"kind": "tool_action", "approved": False, "answeredBy": "unattended"}]
        assert _pid(second["lastMessage"]) != _pid(result["lastMessage"])
        await _gone(_pid(second["lastMessage"]))
        assert notes.read_text() == "n1\n"


async def test_the_daemons_default_config_runs_its_servers_for_every_task(tmp_path: Path, roost_home: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    notes = tmp_path / "notes.txt"
    config = _team(tmp_path / "notes.yaml", notes, broken=False)
    args = ["--work-dir", str(tmp_path), "-c", str(config), "--unattended-policy", "allow"]
    async with open_daemon(script=script, args=args) as daemon, daemon.unix() as client:
        await client.wait_for("hello")
        await client.send({"type": "user_input", "text": "first"})
        request = await client.wait_for("approval_request")
        assert (request["plugin"], request["action"]) == ("notes", "write_note")
        await client.send({"type": "approval_response", "approved": True})
        first = await client.wait_for("result")
        await client.send({"type": "user_input", "text": "second"})
        await client.wait_for("approval_request", start=len(client.events) - 1)
        await client.send({"type": "approval_response", "approved": True})
        second = await client.wait_for("result", lambda e: e["sessionId"] != first["sessionId"])
        assert first["succeeded"] and second["succeeded"]
        # one server for the daemon: the same process answered both tasks, and no per-task status
        assert _pid(first["lastMessage"]) == _pid(second["lastMessage"])
        assert not client.of_type("mcp_status")
    assert notes.read_text() == "n1\nn1\n"


async def test_a_tasks_server_dying_mid_call_is_a_tool_error_and_a_status(tmp_path: Path, roost_home: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    config = _team(tmp_path / "notes.yaml", tmp_path / "notes.txt", broken=False)
    async with open_daemon(script=script, token=TOKEN, args=["--work-dir", str(tmp_path)]) as daemon:
        async with daemon.ws() as watcher, mcp_client(daemon.port) as session:
            await watcher.wait_for("hello")
            sid = (await call(session, "dispatch_task", {"task": "crash it", "config": str(config)}))["sessionId"]
            result = await finished(session, sid)
            # the run goes on: the agent's message carries the clear tool error
            assert result["succeeded"] and "MCP server 'notes' died during 'crash'" in result["lastMessage"], result
            states = [e["state"] for e in watcher.of_type("mcp_status") if e["sessionId"] == sid]
            # and a status change said it went down (it is being reconnected)
            assert states[:2] == ["connecting", "connected"] and any(s != "connected" for s in states[2:]), states
