"""End to end: the `--json` resource queries (wire-protocol.md "Resource queries") through the real
`roost` command: sessions, memory, context, plugins, models; envelopes and every item's fields."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import trio

from _helpers.appserver import roost_argv, scripted_env
from _helpers.timing import scaled

# The documented fields of each item type, exactly (wire-protocol.md).
SESSION = {"sessionId", "task", "workingDirectory", "configPath", "startedAt", "lastUpdatedAt", "isComplete",
           "turnCount"}
SESSION_DETAIL = SESSION - {"turnCount"} | {"messages"}
AGENT_MESSAGE = {"agentName", "role", "content", "turnIndex", "timestamp", "inputTokens", "outputTokens",
                 "isCompactionSummary", "toolCalls"}
REPL_SESSION = {"sessionId", "modelId", "cwd", "title", "autoTitle", "startedAt", "lastUpdatedAt", "turnIndex",
                "firstUserMessage"}
MEMORY = {"guid", "name", "type", "description", "body"}
MEMORY_AGENT = {"agent", "count"}
CONTEXT_ITEM = {"name", "description", "sourcePath", "importedAt", "sizeBytes", "files"}
PLUGIN = {"name", "source", "functions"}
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|\+00:00)$")


from _helpers.cli import cli, roost, roost_all  # noqa: E402



def envelope(proc: subprocess.CompletedProcess, key: str = "items"):
    """The one stdout line, parsed; asserts exit 0 and the envelope's shape."""
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 1, proc.stdout
    doc = json.loads(lines[0])
    assert set(doc) == {"protocolVersion", key} and doc["protocolVersion"] == 1
    return doc[key]


def error_of(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 1, proc.stdout
    doc = json.loads(lines[0])
    assert set(doc) == {"protocolVersion", "error"} and doc["protocolVersion"] == 1
    assert isinstance(doc["error"], str) and doc["error"]
    return doc["error"]


@pytest.fixture
def env(roost_home: Path) -> dict:
    return scripted_env(roost_home)


def _seed_sessions(cwd: Path) -> tuple[str, str]:
    """Two orchestration sessions: one complete (with messages, tool calls, usage), one not."""
    from roost.storage import (append_item, create_run, create_thread, create_turn, open_store, update_run,
                               update_turn)

    with open_store() as store, store.transaction() as conn:
        done = create_thread(conn, kind="orchestration", cwd=str(cwd),
                             metadata={"task": "Build the parser\nwith tests", "config_path": "/cfg/team.yaml"})
        run = create_run(conn, thread_id=done.id, kind="orchestration")
        t1 = create_turn(conn, done.id, run_id=run.id)
        append_item(conn, done.id, type="user_message", payload={"text": "Build the parser"},
                    text="Build the parser", turn_id=t1.id)
        append_item(conn, done.id, type="tool_call", turn_id=t1.id,
                    payload={"name": "shell", "arguments": {"command": "ls -la"}, "output": "x", "is_error": False})
        append_item(conn, done.id, type="tool_call", turn_id=t1.id,
                    payload={"name": "read_file", "arguments": {"path": "nope"}, "output": "no", "is_error": True})
        append_item(conn, done.id, type="agent_message", payload={"text": "Planned.", "agent": "Planner"},
                    text="Planned.", turn_id=t1.id)
        update_turn(conn, t1.id, status="completed", usage={"input_tokens": 120, "output_tokens": 7})
        t2 = create_turn(conn, done.id, run_id=run.id)
        append_item(conn, done.id, type="agent_message", payload={"text": "Done. APPROVED", "agent": "Reviewer"},
                    text="Done. APPROVED", turn_id=t2.id)
        update_turn(conn, t2.id, status="completed")
        update_run(conn, run.id, status="completed")
        open_ = create_thread(conn, kind="orchestration", cwd=str(cwd / "elsewhere"))
        create_run(conn, thread_id=open_.id, kind="orchestration", status="interrupted")
        t3 = create_turn(conn, open_.id)
        append_item(conn, open_.id, type="user_message", payload={"text": "x" * 300}, text="x" * 300, turn_id=t3.id)
        update_turn(conn, t3.id, status="interrupted")
    return done.id, open_.id


async def test_sessions_list_show_and_delete(env, tmp_path):
    done, open_ = _seed_sessions(tmp_path)
    (q_show, q_incomplete, q_all, q_project, q_missing, q_malformed, q_delete_json) = await roost_all(
        env, ("sessions", "--show", done, "--json"), ("sessions", "--json"), ("sessions", "--all", "--json"),
        ("sessions", "--all", "--project", str(tmp_path / "elsewhere"), "--json"), ("sessions", "--show", "thr_missing", "--json"),
        ("sessions", "--show", "a b", "--json"), ("sessions", "--delete", done, "--json"), cwd=tmp_path)
    incomplete = envelope(q_incomplete)
    assert [s["sessionId"] for s in incomplete] == [open_]
    row = incomplete[0]
    assert set(row) == SESSION
    assert row["task"] == "x" * 120 and row["configPath"] is None and row["isComplete"] is False
    assert row["turnCount"] == 1 and row["workingDirectory"] == str(tmp_path / "elsewhere")
    assert ISO_UTC.match(row["startedAt"]) and ISO_UTC.match(row["lastUpdatedAt"])

    everything = envelope(q_all)
    assert {s["sessionId"] for s in everything} == {done, open_}
    complete = next(s for s in everything if s["sessionId"] == done)
    assert complete["task"] == "Build the parser" and complete["isComplete"] is True
    assert complete["configPath"] == "/cfg/team.yaml" and complete["turnCount"] == 2
    assert [s["sessionId"] for s in envelope(q_project)] == [open_]

    detail = envelope(q_show, "item")
    assert set(detail) == SESSION_DETAIL and detail["sessionId"] == done
    messages = detail["messages"]
    for m in messages:
        assert set(m) == AGENT_MESSAGE and ISO_UTC.match(m["timestamp"])
    assert [(m["agentName"], m["role"], m["turnIndex"]) for m in messages] == [
        ("Human", "user", 0), ("Planner", "assistant", 0), ("Reviewer", "assistant", 1)]
    assert messages[1]["toolCalls"] == [{"name": "shell", "argsSummary": "ls -la", "succeeded": True},
                                        {"name": "read_file", "argsSummary": "nope", "succeeded": False}]
    assert (messages[1]["inputTokens"], messages[1]["outputTokens"]) == (120, 7)
    assert (messages[2]["inputTokens"], messages[2]["outputTokens"]) == (None, None)
    assert messages[0]["toolCalls"] == [] and messages[2]["isCompactionSummary"] is False

    assert "no session" in error_of(q_missing)
    assert "malformed" in error_of(q_malformed)
    assert "--delete" in error_of(q_delete_json)

    deleted = await roost(env, "sessions", "--delete", done, cwd=tmp_path)
    assert deleted.returncode == 0 and deleted.stdout == b"", deleted.stderr
    again = await cli("sessions", "--delete", done, cwd=tmp_path)
    assert again.returncode == 1 and b"no session" in again.stderr
    left = envelope(await cli("sessions", "--all", "--json", cwd=tmp_path))
    assert [s["sessionId"] for s in left] == [open_]


async def test_repl_sessions_lists_chats_made_by_a_real_turn(env, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    ran = await roost(env, "exec", "hello there", cwd=work)
    assert ran.returncode == 0, ran.stderr
    q_chats, q_sessions, q_other = await roost_all(
        env, ("sessions", "--repl", "--json"), ("sessions", "--all", "--json"),
        ("sessions", "--repl", "--project", str(tmp_path / "other"), "--json"), cwd=tmp_path)
    chats = envelope(q_chats)
    assert len(chats) == 1
    chat = chats[0]
    assert set(chat) == REPL_SESSION
    assert chat["cwd"] == str(work) and chat["firstUserMessage"] == "hello there" and chat["turnIndex"] == 1
    assert chat["title"] is None and chat["autoTitle"] is None and isinstance(chat["modelId"], str)
    assert ISO_UTC.match(chat["startedAt"]) and ISO_UTC.match(chat["lastUpdatedAt"])
    # a chat is not an orchestration session, and --project filters on the chat's directory
    assert envelope(q_sessions) == [] and envelope(q_other) == []


async def test_memory_saved_by_the_tool_is_listed_and_deleted(env, tmp_path):
    from roost.storage import open_store
    from roost.tools import ToolContext, run_tool
    from roost.tools._memory_tools import memory_tools

    async with trio.open_nursery() as nursery:
        store = open_store()
        await nursery.start(store.writer.run)
        ctx = ToolContext(cwd=tmp_path)
        shared, planner = memory_tools(store), memory_tools(store, agent="Planner")
        first = await shared["memory_save"].run({"name": "tabs", "type": "feedback", "body": "Use tabs."}, ctx)
        again = await shared["memory_save"].run({"name": "tabs", "type": "feedback", "description": "Indentation",
                                                 "body": "Use four spaces."}, ctx)
        assert first.metadata["guid"] == again.metadata["guid"]          # replaced in place
        bad = await run_tool(shared["memory_save"], {"name": "x", "type": "secret", "body": "b"}, ctx)
        assert bad.is_error
        for name, kind in (("stack", "project"), ("docs", "reference")):
            await planner["memory_save"].run({"name": name, "type": kind, "body": f"{name} body"}, ctx)
        recalled = await planner["memory_recall"].run({"query": "stack"}, ctx)
        assert "stack body" in recalled.output and "docs body" not in recalled.output
        nursery.cancel_scope.cancel()
    store.close()

    q_planner, q_list, q_agents, q_nobody = await roost_all(
        env, ("memory", "list", "--agent", "Planner", "--json"), ("memory", "list", "--json"),
        ("memory", "agents", "--json"), ("memory", "list", "--agent", "Nobody", "--json"), cwd=tmp_path)
    entries = envelope(q_list)
    assert entries and all(set(e) == MEMORY for e in entries)
    assert [(e["name"], e["type"], e["description"], e["body"]) for e in entries] == [
        ("tabs", "feedback", "Indentation", "Use four spaces.")]
    planner_entries = envelope(q_planner)
    assert [(e["name"], e["type"], e["description"]) for e in planner_entries] == [
        ("docs", "reference", ""), ("stack", "project", "")]
    assert all(re.fullmatch(r"[0-9a-f-]{36}", e["guid"]) for e in planner_entries)
    agents = envelope(q_agents)
    assert agents == [{"agent": "Planner", "count": 2}] and all(set(a) == MEMORY_AGENT for a in agents)
    assert envelope(q_nobody) == []

    deleted = await roost(env, "memory", "delete", "stack", "--agent", "Planner", cwd=tmp_path)
    assert deleted.returncode == 0 and deleted.stdout == b""
    missing = await cli("memory", "delete", "stack", "--agent", "Planner", cwd=tmp_path)
    assert missing.returncode == 1 and b"no memory named 'stack'" in missing.stderr
    assert envelope(await roost(env, "memory", "agents", "--json", cwd=tmp_path)) == [{"agent": "Planner", "count": 1}]


async def test_context_add_list_read_by_tool_and_remove(env, tmp_path):
    project, source = tmp_path / "proj", tmp_path / "ref"
    (source / "sub").mkdir(parents=True)
    project.mkdir()
    (source / "guide.md").write_text("# Guide\nUse the force.\n")
    (source / "sub" / "data.bin").write_bytes(b"\0\1\2\3")
    (source / ".git").mkdir()
    (source / ".git" / "HEAD").write_text("ignored")
    assert envelope(await cli("context", "list", "--json", cwd=project)) == []

    added = await roost(env, "context", "add", str(source), "--name", "ref", "--description", "Reference",
                        cwd=project)
    assert added.returncode == 0 and added.stdout == b"", added.stderr
    q_items, dup, q_dir, q_none = await roost_all(
        env, ("context", "list", "--json"), ("context", "add", str(source), "--name", "ref"),
        ("context", "list", "--dir", str(project), "--json"), ("context", "list", "--dir", str(tmp_path), "--json"),
        cwd=project)
    assert dup.returncode == 1 and b"exists" in dup.stderr
    items = envelope(q_items)
    assert len(items) == 1 and set(items[0]) == CONTEXT_ITEM
    item = items[0]
    assert item["name"] == "ref" and item["description"] == "Reference" and item["sourcePath"] == str(source)
    assert item["files"] == [{"relativePath": "guide.md", "sizeBytes": 23}, {"relativePath": "sub/data.bin", "sizeBytes": 4}]
    assert item["sizeBytes"] == 27 and ISO_UTC.match(item["importedAt"])
    # --dir picks the project; another project has none
    assert envelope(q_dir) == items and envelope(q_none) == []

    from roost.storage import open_store
    from roost.tools import ToolContext, run_tool
    from roost.tools._memory_tools import memory_tools

    with open_store() as store:
        tool = memory_tools(store)["context_read"]
        ctx = ToolContext(cwd=project / "deeper")  # the nearest parent with context
        listing = await run_tool(tool, {}, ctx)
        assert "ref: Reference (2 files)" in listing.output
        files = await run_tool(tool, {"name": "ref"}, ctx)
        assert "guide.md (23 bytes)" in files.output
        text = await run_tool(tool, {"name": "ref", "path": "guide.md"}, ctx)
        assert text.output == "# Guide\nUse the force.\n" and not text.is_error
        binary = await run_tool(tool, {"name": "ref", "path": "sub/data.bin"}, ctx)
        assert binary.is_error and "binary" in binary.output

    removed = await roost(env, "context", "remove", "ref", cwd=project)
    assert removed.returncode == 0 and removed.stdout == b""
    gone = await cli("context", "remove", "ref", cwd=project)
    assert gone.returncode == 1 and b"no context item" in gone.stderr
    assert envelope(await cli("context", "list", "--json", cwd=project)) == []


async def test_plugins_json_and_filter(env, tmp_path):
    q_all, q_files, q_missing, q_memory = await roost_all(
        env, ("plugins", "--json"), ("plugins", "--plugin", "files", "--json"),
        ("plugins", "--plugin", "mcp-x", "--json"), ("plugins", "--plugin", "MEMORY", "--json"), cwd=tmp_path)
    plugins = envelope(q_all)
    assert [p["name"] for p in plugins] == ["shell", "files", "memory", "agents"]
    for p in plugins:
        assert set(p) == PLUGIN and p["source"] == "builtin" and p["functions"]
        assert all(set(f) == {"name", "description"} and f["description"] for f in p["functions"])
    files = envelope(q_files)
    assert [f["name"] for f in files[0]["functions"]] == ["read_file", "write_file", "list_dir", "search_files"]
    assert "no plugin named 'mcp-x'" in error_of(q_missing)
    memory = envelope(q_memory)
    assert len(memory) == 1 and set(memory[0]) == PLUGIN and memory[0]["name"] == "memory"
    assert memory[0]["source"] == "builtin"
    assert [f["name"] for f in memory[0]["functions"]] == ["memory_save", "memory_recall", "context_read"]
    assert all(set(f) == {"name", "description"} and f["description"] for f in memory[0]["functions"])


def test_plugin_groups_match_roost_plugins():
    from roost.cli._res_config import builtin_plugins
    from roost.tools import PLUGIN_GROUPS

    listed = {p.name: tuple(f.name for f in p.functions) for p in builtin_plugins()}
    assert {name: listed[name] for name in PLUGIN_GROUPS} == PLUGIN_GROUPS


async def test_validate_warns_about_unknown_plugins(env, tmp_path):
    config = tmp_path / "team.yaml"
    config.write_text("Orchestration:\n  Agents:\n"
                      "    - {Name: A, Instructions: a, Plugins: [files, memory, shell, memory_recall, agents]}\n"
                      "    - {Name: B, Instructions: b, Plugins: [memroy, files]}\n")
    proc = await cli("validate", str(config), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr                 # a warning does not make it invalid
    item = envelope(proc, "item")
    assert item["valid"] is True
    assert [i for i in item["issues"] if "Plugins" in i["message"]] == [{
        "level": "warning",
        "message": "Orchestration.Agents[1].Plugins: 'memroy' is neither a plugin nor a known tool "
                   "(see roost plugins); it gives the agent no tool"}]


async def test_models_json_envelopes(env, tmp_path, roost_home):
    unconfigured = {k: v for k, v in env.items() if k not in ("ROOST_PROVIDER", "ROOST_SCRIPT")}
    async with trio.open_nursery() as nursery:
        results: dict = {}

        async def run(key: str, e: dict) -> None:
            results[key] = await roost(e, "models", "--json", cwd=tmp_path)

        nursery.start_soon(run, "configured", env)
        nursery.start_soon(run, "unconfigured", unconfigured)
    models = envelope(results["configured"])
    assert models and all(set(m) == {"id", "current"} and isinstance(m["current"], bool) for m in models)
    assert "provider" in error_of(results["unconfigured"])


def test_empty_sessions_after_exec_point_at_repl(env, tmp_path):
    """``roost sessions`` lists orchestration sessions (wire-protocol.md, Session); after a
    ``roost exec`` the text output says where its thread is, and --json keeps its shape."""
    def roost(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*roost_argv(), *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=scaled(60), check=False)

    fresh = roost("sessions")
    assert fresh.returncode == 0 and fresh.stdout.startswith("no sessions (") and "--repl" in fresh.stdout
    assert roost("exec", "hello").returncode == 0
    after = roost("sessions")
    assert after.returncode == 0
    assert after.stdout == ("no sessions (orchestration runs and daemon tasks); "
                            "1 chat (roost exec, app-server, repl): roost sessions --repl\n")
    assert json.loads(roost("sessions", "--json").stdout) == {"protocolVersion": 1, "items": []}
    (chat,) = json.loads(roost("sessions", "--repl", "--json").stdout)["items"]
    assert chat["firstUserMessage"] == "hello"
