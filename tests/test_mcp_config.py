"""MCP server settings (``[mcp_servers]``, ``McpServers``) and the connection state's rules, in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from roost.actors import Mailbox, Ref
from roost.errors import ConfigError
from roost.plugins import (
    McpServerConfig,
    McpServerState,
    mcp_servers_from_orchestration,
    mcp_servers_from_toml,
    mcp_tool_name,
)
from roost.tools import ToolContext, run_tool


def test_toml_servers_infer_the_transport_and_keep_every_field() -> None:
    [stdio, http] = mcp_servers_from_toml(
        {
            "mcp_servers": {
                "notes": {"command": "python3", "args": ["s.py"], "env": {"K": "v"}, "timeout": 5},
                "web": {"url": "https://example.test/mcp", "headers": {"X": "y"}, "read_only_tools": ["a"]},
            }
        }
    )
    assert (stdio.transport, stdio.command, stdio.args, dict(stdio.env), stdio.timeout_s) == (
        "stdio", "python3", ("s.py",), {"K": "v"}, 5.0,
    )
    assert (http.transport, http.url, dict(http.headers), http.read_only_tools) == (
        "http", "https://example.test/mcp", {"X": "y"}, ("a",),
    )
    assert mcp_servers_from_toml({}) == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"args": ["x"]}, "[mcp_servers.s] command in config.toml: required for a stdio server"),
        ({"command": "x", "timeout": 0}, "[mcp_servers.s] timeout in config.toml: must be a positive finite number"),
        ({"command": "x", "timeout": float("inf")}, "[mcp_servers.s] timeout in config.toml: must be a positive"),
        ({"command": "x", "connect_timeout": float("nan")}, "[mcp_servers.s] connect_timeout in config.toml: must be"),
        ({"command": "x", "args": "s.py"}, "[mcp_servers.s] args in config.toml: expected a list of strings"),
        ({"transport": "http", "url": "ftp://x"}, "[mcp_servers.s] url in config.toml: an http:// or https:// URL"),
        ({"command": "x", "read_only": "yes"}, "[mcp_servers.s] read_only in config.toml: expected true or false"),
        (
            {"command": "x", "url": "http://h/mcp"},
            "[mcp_servers.s] url in config.toml: a server has either command (stdio) or url (http), not both",
        ),
    ],
)
def test_a_bad_toml_field_is_named(body: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        mcp_servers_from_toml({"mcp_servers": {"s": body}})
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize("key", ["conect_timeout", "bogus_key"])
def test_an_unknown_toml_key_is_refused_naming_it_and_the_known_keys(key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        mcp_servers_from_toml({"mcp_servers": {"s": {"command": "x", key: 1}}})
    message = str(caught.value)
    assert message.startswith(f"[mcp_servers.s] in config.toml: unknown key {key!r} (known keys: transport, command,")
    assert "connect_timeout)" in message and "\n" not in message


def test_an_unknown_orchestration_key_is_a_warning_not_an_error() -> None:
    warnings: list[str] = []
    servers, errors = mcp_servers_from_orchestration(
        [{"Name": "a", "Command": "x", "ConectTimeout": 1}], base=None, warnings=warnings
    )
    assert errors == [] and [s.name for s in servers] == ["a"]
    assert len(warnings) == 1
    assert warnings[0].startswith("Orchestration.McpServers[0].ConectTimeout: unknown key, ignored (known keys: Name, Type,")


def test_orchestration_servers_resolve_cwd_and_refuse_duplicates(tmp_path: Path) -> None:
    servers, errors = mcp_servers_from_orchestration(
        [{"Name": "a", "Command": "x", "Cwd": "sub"}, {"Name": "a", "Transport": "http", "Url": "http://h/mcp"}],
        base=tmp_path,
    )
    assert errors == ["Orchestration.McpServers: duplicate server name 'a'"]
    assert servers[0].cwd == str((tmp_path / "sub").resolve()) and servers[1].transport == "http"
    _, errors = mcp_servers_from_orchestration([{"Name": "bad name!", "Command": "x"}], base=None)
    assert errors == ["Orchestration.McpServers[0].Name: the name must be 1-40 of A-Z a-z 0-9 _ -"]
    _, errors = mcp_servers_from_orchestration([{"Name": "a", "Command": "x", "Url": "http://h/mcp"}], base=None)
    assert errors == ["Orchestration.McpServers[0].Url: a server has either Command (stdio) or Url (http), not both"]


def test_tool_names_are_safe_for_every_provider() -> None:
    assert mcp_tool_name("notes", "write note.v2") == "mcp__notes__write_note_v2"
    assert len(mcp_tool_name("s" * 40, "t" * 60)) == 64


def test_backoff_doubles_up_to_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROOST_MCP_BACKOFF_S", "0.5")
    monkeypatch.setenv("ROOST_MCP_BACKOFF_MAX_S", "3")
    state = McpServerState(McpServerConfig(name="s", transport="stdio", command="x"))
    delays = []
    for failures in range(6):
        state.failures = failures
        delays.append(state.next_delay())
    assert delays == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]


async def test_a_down_or_busy_server_is_a_clear_tool_error() -> None:
    from roost.plugins._mcp_host import _mcp_tool

    state = McpServerState(McpServerConfig(name="s", transport="stdio", command="x"), state="failed", error="boom")
    spec = type("Spec", (), {"name": "t", "description": "d", "input_schema": {"type": "object"}, "annotations": None})
    tool = _mcp_tool(state, spec)
    ctx = ToolContext(cwd=Path.cwd(), permission_mode="unconfined")
    down = await run_tool(tool, {}, ctx)
    assert down.is_error and "MCP server 's' is not connected (failed: boom); it is being reconnected" in down.output
    full: Mailbox = Mailbox(1)
    state.ref = Ref("mcp:s", full)
    state.ref.tell("occupied")
    busy = await run_tool(tool, {}, ctx)
    assert busy.is_error and "is busy (too many calls waiting)" in busy.output
    assert tool.mutating and tool.approval_kind == "tool_action"


async def test_a_server_killed_from_outside_fails_every_call_in_flight_and_comes_back(tmp_path: Path) -> None:
    import os
    import signal
    import sys

    import trio
    from _helpers.timing import scaled

    from roost.plugins import open_mcp_host

    server = Path(__file__).parent / "_helpers" / "mcp_server.py"
    config = McpServerConfig(
        name="k", transport="stdio", command=sys.executable, args=(str(server), "stdio"),
        env={"MCP_NOTES": str(tmp_path / "n")},
    )
    ctx = ToolContext(cwd=tmp_path, permission_mode="unconfined")
    statuses: list[str] = []
    with trio.fail_after(scaled(60)):
        async with open_mcp_host([config], on_status=lambda s: statuses.append(s["state"])) as host:
            tools = host.tools()
            pid = int((await run_tool(tools["mcp__k__whoami"], {}, ctx)).output.split()[1])
            results: list = []

            async def call(name: str) -> None:
                results.append(await run_tool(tools[name], {}, ctx))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, "mcp__k__hang")
                await trio.sleep(0.5)  # let the call reach the server (the outcome does not depend on it)
                nursery.start_soon(call, "mcp__k__whoami")
                await trio.sleep(0.2)
                os.kill(pid, signal.SIGKILL)
            assert len(results) == 2 and all(r.is_error for r in results)
            assert all("MCP server 'k'" in r.output for r in results)
            while host.states["k"].state != "connected":
                await trio.sleep(0.05)
            again = await run_tool(tools["mcp__k__whoami"], {}, ctx)
    assert again.output.startswith("pid ") and again.output != f"pid {pid}"
    assert statuses[:2] == ["connecting", "connected"] and "failed" in statuses[2:]


async def test_an_idle_server_that_dies_is_noticed_by_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import signal
    import sys

    import trio
    from _helpers.timing import scaled

    from roost.plugins import open_mcp_host

    monkeypatch.setenv("ROOST_MCP_PING_S", "0.2")
    server = Path(__file__).parent / "_helpers" / "mcp_server.py"
    config = McpServerConfig(
        name="idle", transport="stdio", command=sys.executable, args=(str(server), "stdio"),
        env={"MCP_NOTES": str(tmp_path / "n")},
    )
    ctx = ToolContext(cwd=tmp_path, permission_mode="unconfined")
    changes: list[dict] = []
    with trio.fail_after(scaled(60)):
        async with open_mcp_host([config], on_status=changes.append) as host:
            tools = host.tools()
            pid = int((await run_tool(tools["mcp__idle__whoami"], {}, ctx)).output.split()[1])
            os.kill(pid, signal.SIGKILL)
            while not any(c["state"] == "failed" for c in changes):
                await trio.sleep(0.05)
            while host.states["idle"].state != "connected":
                await trio.sleep(0.05)
            again = await run_tool(tools["mcp__idle__whoami"], {}, ctx)
    [failed] = [c for c in changes if c["state"] == "failed"]
    assert failed["connected"] is False and failed["error"]
    assert again.output != f"pid {pid}" and not again.is_error


def test_a_bad_mcp_tunable_is_refused_when_the_host_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    from roost.plugins import McpHost

    monkeypatch.setenv("ROOST_MCP_BACKOFF_S", "-1")
    with pytest.raises(ConfigError, match="ROOST_MCP_BACKOFF_S"):
        McpHost([McpServerConfig(name="s", transport="stdio", command="x")])
