"""The engines room's public surface and import rules."""

from __future__ import annotations

import ast
import pathlib

import roost.engines as engines
from roost.engines import INTERRUPTED_OUTPUT, AgentMessage, ToolCall, ToolResult, UserMessage, pair_tool_results, parse_arguments
from roost.errors import EngineFailure

ROOM = pathlib.Path(engines.__file__).parent


def test_all_is_exact_and_public():
    public = {n for n in dir(engines) if not n.startswith("_")} - {"annotations", "TYPE_CHECKING"}
    assert set(engines.__all__) == public
    for name in engines.__all__:
        obj = getattr(engines, name)
        if isinstance(obj, type) and obj.__module__.startswith("roost.engines"):
            assert obj.__module__ == "roost.engines", name


def test_room_never_imports_actors_protocol_storage():
    for path in ROOM.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                assert not name.startswith(("roost.actors", "roost.protocol", "roost.storage")), (path, name)


def test_pair_tool_results_orders_and_fills_and_drops_orphans():
    history = [UserMessage("u"), ToolCall("a", "t"), AgentMessage("x"), ToolResult("a", "late"), ToolResult("zz", "orphan")]
    assert pair_tool_results(history) == [UserMessage("u"), ToolCall("a", "t"), ToolResult("a", "late"), AgentMessage("x")]
    assert pair_tool_results([ToolCall("b", "t")]) == [ToolCall("b", "t"), ToolResult("b", INTERRUPTED_OUTPUT, True)]


def test_parse_arguments():
    assert parse_arguments("t", "") == {} and parse_arguments("t", "  ") == {}
    assert parse_arguments("t", '{"a": [1]}') == {"a": [1]}
    for bad in ("{", "[1]", "null"):
        try:
            parse_arguments("my_tool", bad)
        except EngineFailure as failure:
            assert "my_tool" in str(failure) and failure.category == "provider"
        else:
            raise AssertionError(bad)
