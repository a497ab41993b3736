"""MCP servers as plugins, end to end (issue 16): real ``roost`` processes, real MCP servers.

The servers are ``tests/_helpers/mcp_server.py`` (the official SDK's server API), over stdio and
streamable HTTP. The scripted engine calls their tools as ``mcp__<server>__<tool>``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from _helpers.appserver import open_app_server, script_env
from _helpers.cli import roost
from _helpers.timing import scaled

SERVER = Path(__file__).parent / "_helpers" / "mcp_server.py"
APPROVALS = {"reverse_rpc": {"methods": ["approval/request"]}}

SCRIPT = """
rules:
  - match: {prompt: "^echo"}
    steps:
      - - {tool_call: {name: mcp__notes__echo, arguments: {text: "hello"}}}
      - - {text: "got {tool_output}"}
  - match: {prompt: "^note"}
    steps:
      - - {tool_call: {name: mcp__notes__write_note, arguments: {text: "n1"}}}
      - - {text: "then {tool_output}"}
  - match: {prompt: "^crash"}
    steps:
      - - {tool_call: {name: mcp__notes__crash, arguments: {}}}
      - - {text: "after {tool_output}"}
  - match: {prompt: "^whoami"}
    steps:
      - - {tool_call: {name: mcp__notes__whoami, arguments: {}}}
      - - {text: "I am {tool_output}"}
  - match: {prompt: "^hang"}
    steps:
      - - {tool_call: {name: mcp__notes__hang, arguments: {}}}
      - - {text: "after {tool_output}"}
default: echo
"""


def _toml_str(value: str) -> str:
    return json.dumps(value)


def write_config(home: Path, notes: Path, *, extra: str = "", broken: bool = True) -> None:
    """``config.toml`` with the stdio server ``notes`` (and a ``broken`` one that cannot start)."""
    text = (
        "[mcp_servers.notes]\n"
        f"command = {_toml_str(sys.executable)}\n"
        f"args = [{_toml_str(str(SERVER))}, \"stdio\"]\n"
        f"env = {{MCP_NOTES = {_toml_str(str(notes))}}}\n"
        f"{extra}"
    )
    if broken:
        text += '\n[mcp_servers.broken]\ncommand = "/nonexistent/mcp-server"\n'
    (home / "config.toml").write_text(text)


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    return tmp_path / "notes.txt"


@pytest.fixture
def env(tmp_path: Path, roost_home: Path, notes: Path) -> dict:
    write_config(roost_home, notes)
    return script_env(tmp_path, roost_home, SCRIPT, ROOST_MCP_BACKOFF_S="0.2")


def tool_item(turn: dict) -> dict:
    return next(i for i in turn["items"] if i["type"] == "tool_call")


async def test_the_official_mcp_client_runs_under_trio(notes: Path) -> None:
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio"], env={"MCP_NOTES": str(notes)})
    with trio.fail_after(scaled(30)):
        async with Client(params) as client:
            assert trio.lowlevel.current_trio_token() is not None
            names = [t.name for t in (await client.list_tools()).tools]
            assert names == ["echo", "write_note", "whoami", "crash", "hang"]
            result = await client.call_tool("echo", {"text": "under trio"})
    assert result.content[0].text == "echo: under trio" and not result.is_error


async def test_exec_offers_config_toml_servers_and_a_broken_one_does_not_stop_it(env, tmp_path) -> None:
    done = await roost(env, "exec", "--json", "echo please", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    [completed] = [m["params"]["turn"] for m in lines if m.get("method") == "turn/completed"]
    tool = tool_item(completed)
    assert tool["name"] == "mcp__notes__echo" and tool["output"] == "echo: hello" and not tool["is_error"]
    assert completed["items"][-1]["text"] == "got echo: hello"
    assert b"MCP server broken: could not connect" in done.stderr


async def test_plugins_json_lists_mcp_servers_with_their_functions_and_errors(env, tmp_path) -> None:
    listed = await roost(env, "plugins", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr.decode()
    items = {p["name"]: p for p in json.loads(listed.stdout)["items"]}
    assert set(items["files"]) == {"name", "source", "functions"} and items["files"]["source"] == "builtin"
    notes = items["notes"]
    assert notes["source"] == "mcp" and notes["status"] == "connected" and notes["error"] is None
    assert [f["name"] for f in notes["functions"]] == [
        "mcp__notes__echo", "mcp__notes__write_note", "mcp__notes__whoami", "mcp__notes__crash", "mcp__notes__hang",
    ]
    assert notes["functions"][0]["description"] == "Echo the text back."
    broken = items["broken"]
    assert broken["source"] == "mcp" and broken["functions"] == [] and broken["status"] == "failed"
    assert "/nonexistent/mcp-server" in broken["error"]
    one = await roost(env, "plugins", "--json", "--plugin", "notes", cwd=tmp_path)
    assert [p["name"] for p in json.loads(one.stdout)["items"]] == ["notes"]


async def test_non_json_stdout_is_one_log_line_and_a_server_that_cannot_connect_is_failed(tmp_path, roost_home):
    python, server = _toml_str(sys.executable), _toml_str(str(SERVER))
    (roost_home / "config.toml").write_text(
        f"[mcp_servers.notes]\ncommand = {python}\nargs = [{server}, \"noisy\"]\n"
        f"[mcp_servers.garbage]\ncommand = {python}\nargs = [{server}, \"garbage\"]\n"
        f"connect_timeout = {scaled(3):g}\n"
        '[mcp_servers.broken]\ncommand = "/nonexistent/mcp-server"\n'
    )
    env = script_env(tmp_path, roost_home, SCRIPT, ROOST_MCP_BACKOFF_S="0.2")
    listed = await roost(env, "plugins", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr.decode()
    stderr = listed.stderr.decode()
    assert "Traceback" not in stderr and "ValidationError" not in stderr and "Failed to parse" not in stderr
    noise = [line for line in stderr.splitlines() if "not JSON-RPC on stdout (ignored)" in line]
    assert sorted(line.split("MCP server ")[1].split()[0] for line in noise) == ["garbage", "notes"], stderr
    assert all(line.endswith("'starting up, not JSON'") for line in noise)
    items = {p["name"]: p for p in json.loads(listed.stdout)["items"] if p["source"] == "mcp"}
    assert items["notes"]["status"] == "connected" and len(items["notes"]["functions"]) == 5
    garbage = items["garbage"]
    assert garbage["status"] == "failed" and garbage["functions"] == []
    assert "could not connect: it wrote a line that is not JSON-RPC on stdout ('starting up, not JSON')" in (
        garbage["error"]
    )
    assert "did not finish starting" in garbage["error"]
    # the broken server is being retried (backoff 0.2 s) while garbage times out: listed failed, with its error
    assert items["broken"]["status"] == "failed" and "/nonexistent/mcp-server" in items["broken"]["error"]
    assert all((p["error"] is None) == (p["status"] == "connected") for p in items.values()), items


async def test_a_server_that_never_starts_is_killed_at_its_connect_timeout(tmp_path, roost_home) -> None:
    pid_file = tmp_path / "hang.pid"
    python, server = _toml_str(sys.executable), _toml_str(str(SERVER))
    (roost_home / "config.toml").write_text(
        f"[mcp_servers.slow]\ncommand = {python}\nargs = [{server}, \"hang_start\", {_toml_str(str(pid_file))}]\n"
        f"connect_timeout = {scaled(3):g}\n"
    )
    env = script_env(tmp_path, roost_home, SCRIPT)
    listed = await roost(env, "plugins", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr.decode()
    [slow] = [p for p in json.loads(listed.stdout)["items"] if p["name"] == "slow"]
    assert slow["status"] == "failed" and "did not finish starting" in slow["error"]
    # killed at the deadline (SIGKILL), not given the shutdown's grace period and SIGTERM
    assert not Path(f"{pid_file}.term").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


async def test_a_server_that_dies_at_start_names_its_stderr_error(tmp_path, roost_home) -> None:
    python, server = _toml_str(sys.executable), _toml_str(str(SERVER))
    (roost_home / "config.toml").write_text(f"[mcp_servers.dead]\ncommand = {python}\nargs = [{server}, \"die_start\"]\n")
    env = script_env(tmp_path, roost_home, SCRIPT)
    listed = await roost(env, "plugins", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr.decode()
    [dead] = [p for p in json.loads(listed.stdout)["items"] if p["name"] == "dead"]
    assert dead["status"] == "failed"
    assert dead["error"].startswith("could not connect: ")
    assert dead["error"].endswith(
        "; its stderr ended: ModuleNotFoundError: No module named 'roost_test_no_such_module'"
    ), dead["error"]
    stderr = listed.stderr.decode()  # the server's stderr still goes to Roost's
    assert "loading the notes plugin" in stderr and "Traceback (most recent call last)" in stderr


async def test_serve_refuses_a_malformed_mcp_servers_table_as_a_configuration_error(tmp_path, roost_home) -> None:
    from _helpers.serve_client import short_socket_path

    (roost_home / "config.toml").write_text("[mcp_servers.x]\ncommand = 5\n")
    env = script_env(tmp_path, roost_home, SCRIPT)
    served = await roost(env, "serve", "--socket", short_socket_path(), cwd=tmp_path)
    assert served.returncode == 2, served.stderr.decode()
    assert served.stderr.decode().strip().splitlines()[-1] == (
        "roost serve: error: [mcp_servers.x] command in config.toml: expected a string"
    )


async def test_an_invalid_config_toml_is_one_error(tmp_path, roost_home) -> None:
    (roost_home / "config.toml").write_text("[provider\n")
    env = script_env(tmp_path, roost_home, SCRIPT)
    assert env.get("ROOST_PROVIDER")  # the environment chooses the provider; the file is still broken
    done = await roost(env, "exec", "echo please", cwd=tmp_path)
    assert done.returncode == 2
    stderr = done.stderr.decode()
    assert "ignoring" not in stderr and stderr.count("is not valid TOML") == 1, stderr


async def test_a_server_with_both_command_and_url_is_refused(env, tmp_path, roost_home) -> None:
    (roost_home / "config.toml").write_text('[mcp_servers.x]\ncommand = "python3"\nurl = "http://127.0.0.1:1/mcp"\n')
    listed = await roost(env, "plugins", "--json", cwd=tmp_path)
    assert listed.returncode == 1
    assert json.loads(listed.stdout)["error"] == (
        "[mcp_servers.x] url in config.toml: a server has either command (stdio) or url (http), not both"
    )


async def test_a_malformed_mcp_servers_table_is_a_clear_error(env, tmp_path, roost_home) -> None:
    (roost_home / "config.toml").write_text('[mcp_servers.x]\ntransport = "ftp"\n')
    listed = await roost(env, "plugins", "--json", cwd=tmp_path)
    assert listed.returncode == 1
    error = json.loads(listed.stdout)["error"]
    assert "[mcp_servers.x] transport in config.toml" in error and "ftp" in error


async def test_app_server_sends_status_and_asks_approval_for_a_mutating_tool(env, tmp_path, notes) -> None:
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize(capabilities=APPROVALS)
        connected = await client.wait_for("mcp/status/updated", lambda p: p["name"] == "notes" and p["connected"])
        assert connected == {"name": "notes", "state": "connected", "connected": True, "tool_count": 5}
        failed = await client.wait_for("mcp/status/updated", lambda p: p["name"] == "broken" and p["state"] == "failed")
        assert failed["connected"] is False and "/nonexistent/mcp-server" in failed["error"]
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        asked: list[dict] = []
        client.approval_handler = lambda params: asked.append(params) or True
        done = (await client.run_turn(tid, "note it"))["turn"]
        [params] = asked
        assert params["kind"] == "tool_action" and params["plugin"] == "notes" and params["action"] == "write_note"
        assert json.loads(params["detail"]) == {"text": "n1"}
        assert tool_item(done)["output"] == "noted" and notes.read_text() == "n1\n"
        client.approval_handler = lambda params: asked.append(params) or False
        denied = tool_item((await client.run_turn(tid, "note again"))["turn"])
        assert denied["is_error"] and denied["metadata"]["denied"] == "user" and notes.read_text() == "n1\n"
        # a tool the server marks readOnlyHint never asks
        echoed = tool_item((await client.run_turn(tid, "echo it"))["turn"])
        assert echoed["output"] == "echo: hello" and len(asked) == 2
        # read_only mode refuses the mutating tool without asking
        ro = (await client.request("thread/start", {"cwd": str(tmp_path), "permission_mode": "read_only"}))["thread"]
        refused = tool_item((await client.run_turn(ro["id"], "note once more"))["turn"])
        assert refused["metadata"]["denied"] == "read_only" and len(asked) == 2


async def test_a_server_killed_mid_call_fails_the_call_changes_status_and_reconnects(env, tmp_path) -> None:
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        await client.wait_for("mcp/status/updated", lambda p: p["name"] == "notes" and p["connected"])
        tid = (await client.request("thread/start", {"cwd": str(tmp_path), "permission_mode": "unconfined"}))["thread"]
        first = tool_item((await client.run_turn(tid["id"], "whoami"))["turn"])["output"]
        start = len(client.lines)
        crashed = (await client.run_turn(tid["id"], "crash now"))["turn"]
        tool = tool_item(crashed)
        assert crashed["status"] == "completed" and tool["is_error"]
        assert "MCP server 'notes' died during 'crash'" in tool["output"]
        failed = await client.wait_for("mcp/status/updated", lambda p: p["name"] == "notes", start=start)
        assert failed["state"] == "failed" and "closed the connection" in failed["error"]
        await client.wait_for("mcp/status/updated", lambda p: p["name"] == "notes" and p["connected"], start=start)
        again = tool_item((await client.run_turn(tid["id"], "whoami again"))["turn"])
        assert again["output"].startswith("pid ") and not again["is_error"] and again["output"] != first


async def test_a_hanging_server_times_out_and_is_restarted(tmp_path, roost_home, notes) -> None:
    write_config(roost_home, notes, extra="timeout = 2\n", broken=False)
    env = script_env(tmp_path, roost_home, SCRIPT, ROOST_MCP_BACKOFF_S="0.2")
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        await client.wait_for("mcp/status/updated", lambda p: p["name"] == "notes" and p["connected"])
        tid = (await client.request("thread/start", {"cwd": str(tmp_path), "permission_mode": "unconfined"}))["thread"]
        start = len(client.lines)
        hung = (await client.run_turn(tid["id"], "hang"))["turn"]
        tool = tool_item(hung)
        assert hung["status"] == "completed" and tool["is_error"]
        assert "MCP server 'notes' did not answer 'hang' within 2 s" in tool["output"]
        failed = await client.wait_for("mcp/status/updated", lambda p: p["state"] == "failed", start=start)
        assert "stopped answering" in failed["error"]
        await client.wait_for("mcp/status/updated", lambda p: p["connected"], start=start)
        echoed = tool_item((await client.run_turn(tid["id"], "echo again"))["turn"])
        assert echoed["output"] == "echo: hello"


@asynccontextmanager
async def http_server(tmp_path: Path, notes: Path) -> AsyncIterator[str]:
    """The helper server on streamable HTTP; yields its URL."""
    port_file = tmp_path / "port"
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(SERVER), "http", str(port_file)],
        env={**os.environ, "MCP_NOTES": str(notes)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(scaled(30)):
            while not port_file.exists():
                await trio.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text()}/mcp"
    finally:
        proc.kill()
        await proc.wait()


async def test_run_uses_the_orchestration_configs_mcp_servers_over_stdio_and_http(tmp_path, roost_home, notes) -> None:
    script = tmp_path / "run.yaml"
    script.write_text(
        """
rules:
  - match: {agent: Local}
    steps:
      - - {tool_call: {name: mcp__notes__echo, arguments: {text: "from stdio"}}}
      - - {text: "Local: {tool_output}"}
  - match: {agent: Remote}
    steps:
      - - {tool_call: {name: mcp__web__echo, arguments: {text: "over http"}}}
      - - {text: "Remote: {tool_output}"}
default: echo
"""
    )
    async with http_server(tmp_path, notes) as url:
        config = tmp_path / "team.yaml"
        config.write_text(
            json.dumps(
                {
                    "Orchestration": {
                        "Name": "McpTeam",
                        "Agents": [
                            {"Name": "Local", "Instructions": "use notes", "Plugins": ["notes"]},
                            {"Name": "Remote", "Instructions": "use web", "Plugins": ["web"]},
                        ],
                        "Termination": {"Type": "maxiterations", "MaxIterations": 2},
                        "McpServers": [
                            {"Name": "notes", "Type": "stdio", "Command": sys.executable,
                             "Args": [str(SERVER), "stdio"], "Env": {"MCP_NOTES": str(notes)}},
                            {"Name": "web", "Type": "http", "Url": url},
                        ],
                    }
                }
            )
        )
        env = script_env(tmp_path, roost_home, script.read_text())
        done = await roost(env, "run", "--bridge", "-c", str(config), "use the tools", cwd=tmp_path)
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[-1]["type"] == "result" and events[-1]["succeeded"], done.stderr.decode()
    calls = [(e["agent"], e["tool"]) for e in events if e["type"] == "tool_calling"]
    assert calls == [("Local", "mcp__notes__echo"), ("Remote", "mcp__web__echo")]
    texts = [e["message"]["content"] for e in events if e["type"] == "agent_message"]
    assert texts == ["Local: echo: from stdio", "Remote: echo: over http"]


async def test_validate_accepts_mcp_servers_and_reports_bad_ones(tmp_path, roost_home) -> None:
    config = tmp_path / "team.yaml"
    config.write_text(
        json.dumps(
            {
                "Orchestration": {
                    "Name": "T",
                    "Agents": [{"Name": "A", "Instructions": "x", "Plugins": ["notes", "web2", "mcp__web2__find"]}],
                    "McpServers": [
                        {"Name": "notes", "Command": "python3"},
                        {"Name": "bad", "Type": "stdio"},
                        {"Name": "web", "Url": "ftp://x"},
                    ],
                }
            }
        )
    )
    (roost_home / "config.toml").write_text('[mcp_servers.web2]\nurl = "http://127.0.0.1:9/mcp"\n')
    env = script_env(tmp_path, roost_home, SCRIPT)
    checked = await roost(env, "validate", "--json", str(config), cwd=tmp_path)
    item = json.loads(checked.stdout)["item"]
    messages = [i["message"] for i in item["issues"]]
    assert "Orchestration.McpServers[1].Command: required for a stdio server" in messages
    assert any(m.startswith("Orchestration.McpServers[2].Url: an http:// or https:// URL") for m in messages)
    assert not any("Plugins" in m for m in messages)


async def test_serve_offers_the_servers_and_asks_the_dispatching_client(tmp_path, roost_home, notes) -> None:
    from _helpers.serve_client import open_daemon

    write_config(roost_home, notes)
    script = tmp_path / "serve.yaml"
    script.write_text(SCRIPT)
    async with open_daemon(script=script, env={"ROOST_MCP_BACKOFF_S": "0.2"}) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")
            await client.send({"type": "user_input", "text": "note from the daemon"})
            call = await client.wait_for("tool_calling")
            assert call["tool"] == "mcp__notes__write_note"
            request = await client.wait_for("approval_request")
            assert (request["kind"], request["plugin"], request["action"]) == ("tool_action", "notes", "write_note")
            await client.send({"type": "approval_response", "approved": True})
            result = await client.wait_for("result")
    assert result["succeeded"] and result["lastMessage"] == "then noted"
    assert notes.read_text() == "n1\n"


async def test_repl_offers_the_servers_tools(env, tmp_path) -> None:
    from test_repl import open_repl

    async with open_repl(env, tmp_path) as repl:
        await repl.wait("ready")
        start = await repl.say("echo in the repl")
        result = await repl.wait("tool_result", start=start)
        end = await repl.wait("message_end", start=start)
        await repl.close()
    assert "echo: hello" in json.dumps(result)
    assert end["toolCalls"] == ["mcp__notes__echo"]


async def test_the_example_server_of_the_operations_doc_runs(tmp_path, roost_home) -> None:
    import re

    doc = (Path(__file__).parent.parent / "docs" / "operations.md").read_text()
    [code] = re.findall(r"```python\n(# notes_server\.py.*?)```", doc, re.S)
    assert "from mcp.server.mcpserver import MCPServer" in code and len(code.splitlines()) <= 16
    (tmp_path / "notes_server.py").write_text(code)
    (roost_home / "config.toml").write_text(
        f"[mcp_servers.notes]\ncommand = {_toml_str(sys.executable)}\nargs = [{_toml_str(str(tmp_path / 'notes_server.py'))}]\n"
    )
    listed = await roost(script_env(tmp_path, roost_home, SCRIPT), "plugins", "--json", "--plugin", "notes", cwd=tmp_path)
    [notes] = json.loads(listed.stdout)["items"]
    assert (notes["status"], notes["error"]) == ("connected", None)
    assert notes["functions"] == [{"name": "mcp__notes__word_count", "description": "Count the words of a text."}]
