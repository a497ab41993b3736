"""The memory tools per orchestration agent (``ToolContext.agent``), their registration in a runtime,
and the plugin groups that pick them (``roost.tools._plugins``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from roost.storage import open_store
from roost.tools import PLUGIN_GROUPS, Tool, ToolContext, ToolResult, builtin_tools, memory_tools, plugin_tool_names
from roost.tools._memory_tools import memory_entries, recall_entries, save_memory
from roost.tools._plugins import unknown_plugins


@pytest.fixture
async def store():
    """An open store with its writer running (closed after the test)."""
    s = open_store()
    async with trio.open_nursery() as nursery:
        await nursery.start(s.writer.run)
        yield s
        nursery.cancel_scope.cancel()
    s.close()


def _entries(store, agent):
    with store.read() as conn:
        return [(e["name"], e["body"]) for e in memory_entries(conn, agent)]


def test_tool_context_agent_defaults_to_none(tmp_path: Path) -> None:
    assert ToolContext(cwd=tmp_path).agent is None
    assert ToolContext(cwd=tmp_path, agent="Planner").agent == "Planner"
    with pytest.raises(TypeError):
        ToolContext(cwd=tmp_path, agent=object())   # the agent's name, not its settings


async def test_save_uses_the_calls_agent(store, tmp_path: Path) -> None:
    tools = memory_tools(store)
    save = tools["memory_save"]
    planner = await save.run({"name": "plan", "type": "project", "body": "three steps"},
                             ToolContext(cwd=tmp_path, agent="Planner"))
    await save.run({"name": "plan", "type": "project", "body": "review first"},
                   ToolContext(cwd=tmp_path, agent="Reviewer"))
    await save.run({"name": "style", "type": "feedback", "body": "short answers"}, ToolContext(cwd=tmp_path))
    assert planner.metadata["agent"] == "Planner"
    assert _entries(store, "Planner") == [("plan", "three steps")]
    assert _entries(store, "Reviewer") == [("plan", "review first")]
    assert _entries(store, None) == [("style", "short answers")]


async def test_ctx_agent_wins_over_the_construction_agent(store, tmp_path: Path) -> None:
    tools = memory_tools(store, agent="Default")
    await tools["memory_save"].run({"name": "a", "type": "user", "body": "from ctx"},
                                   ToolContext(cwd=tmp_path, agent="Dev"))
    await tools["memory_save"].run({"name": "b", "type": "user", "body": "fallback"}, ToolContext(cwd=tmp_path))
    assert _entries(store, "Dev") == [("a", "from ctx")]
    assert _entries(store, "Default") == [("b", "fallback")]
    assert _entries(store, None) == []


async def test_recall_sees_own_and_shared_but_not_other_agents(store, tmp_path: Path) -> None:
    def seed(conn):
        save_memory(conn, agent=None, name="style", type="feedback", description="", body="shared style")
        save_memory(conn, agent=None, name="stack", type="project", description="", body="shared stack")
        save_memory(conn, agent="Dev", name="stack", type="project", description="mine", body="dev stack")
        save_memory(conn, agent="Ops", name="secret", type="reference", description="", body="ops only")

    await store.writer.submit(seed)
    recall = memory_tools(store)["memory_recall"]
    dev = await recall.run({}, ToolContext(cwd=tmp_path, agent="Dev"))
    assert "## stack (project)\nmine\n\ndev stack" in dev.output        # own first, shadowing the shared one
    assert "## style (feedback, shared)" in dev.output and "shared stack" not in dev.output
    assert "ops only" not in dev.output
    assert dev.output.index("dev stack") < dev.output.index("shared style")
    nobody = await recall.run({}, ToolContext(cwd=tmp_path))
    assert "shared stack" in nobody.output and "dev stack" not in nobody.output and "ops only" not in nobody.output
    typed = await recall.run({"type": "feedback"}, ToolContext(cwd=tmp_path, agent="Ops"))
    assert "shared style" in typed.output and "ops only" not in typed.output
    none = await recall.run({"query": "nothing-like-this"}, ToolContext(cwd=tmp_path, agent="Dev"))
    assert none.output == "no matching memories" and not none.is_error

    with store.read() as conn:
        rows = recall_entries(conn, "Dev")
    assert [(r["name"], r["shared"]) for r in rows] == [("stack", False), ("style", True)]


async def test_open_runtime_offers_the_memory_tools(tmp_path: Path) -> None:
    from roost.supervisor._root import open_runtime, with_memory_tools

    def engine_for(thread):  # never called: no turn runs
        raise AssertionError("no engine needed")

    async with open_runtime(engine_for=engine_for, tools=builtin_tools()) as runtime:
        tools = runtime.services.tools
        assert set(tools) == set(builtin_tools()) | set(PLUGIN_GROUPS["memory"])
        saved = await tools["memory_save"].run({"name": "n", "type": "user", "body": "b"},
                                               ToolContext(cwd=tmp_path, agent="A"))
        assert not saved.is_error
        assert _entries(runtime.store, "A") == [("n", "b")]
    async with open_runtime(engine_for=engine_for, tools=builtin_tools(), memory=False) as runtime:
        assert set(runtime.services.tools) == set(builtin_tools())

    async def mine(args, ctx):
        return ToolResult(output="mine")

    own = Tool(name="memory_save", description="d", parameters={"type": "object"}, mutating=False, run=mine)
    given = {"memory_save": own}
    merged = with_memory_tools(given, store=None)
    assert merged["memory_save"] is own and set(merged) == {"memory_save", "memory_recall", "context_read"}
    assert given == {"memory_save": own}                                   # not changed


def test_plugin_tool_names() -> None:
    assert plugin_tool_names([]) is None
    assert plugin_tool_names(["files", "shell"]) == ("read_file", "write_file", "list_dir", "search_files", "shell")
    assert plugin_tool_names(["memory"]) == ("memory_save", "memory_recall", "context_read")
    assert plugin_tool_names(["memory_recall", "custom", "memory"]) == (
        "memory_recall", "custom", "memory_save", "context_read")
    assert set(PLUGIN_GROUPS["files"]) | set(PLUGIN_GROUPS["shell"]) == set(builtin_tools())
    assert unknown_plugins(["files", "memory_save", "nope", "memory"], {"memory_save"}) == ["nope"]
