"""The scripted engine: matching, steps by call count, pacing, errors, determinism, demo script."""

from __future__ import annotations

import pytest
import trio
from hypothesis import given, strategies as st

from _helpers.sse_server import collect
from roost.engines import (
    AgentMessage,
    EngineRequest,
    Finish,
    ReasoningDelta,
    ScriptedEngine,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolResult,
    Usage,
    UserMessage,
    builtin_scripts,
    load_script,
    parse_script,
    split_deltas,
)
from roost.errors import ConfigError
from _helpers.timing import scaled

ISSUE_SCRIPT = """
rules:
  - match: {prompt: "regex", agent: "worker-name"}
    steps:
      - - {text: "Hello", tokens_per_second: 50}
        - {tool_call: {name: list_dir, arguments: {path: "."}}}
      - - {reasoning: "thinking..."}
        - {delay: 0.5}
        - {text: "Done."}
      - - {error: {category: rate_limit, message: "slow down", retryable: true}}
  - match: {prompt: "^count"}
    steps:
      - - {text: "abcdefghij", deltas: 4}
default: echo
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(ISSUE_SCRIPT)
    return load_script(str(path))


def texts(events):
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_issue_script_steps_follow_model_calls(script, autojump_clock):
    engine = ScriptedEngine(script)
    first = EngineRequest(history=[UserMessage("a regex b")], agent="worker-name")
    events, failure = await collect(engine, first)
    assert failure is None
    call = next(e for e in events if isinstance(e, ToolCallEnd))
    assert events[0] == TextDelta("Hello")
    assert events[1:4] == [
        ToolCallStart(call.call_id, "list_dir", 0),
        ToolCallDelta(call.call_id, '{"path":"."}'),
        ToolCallEnd(call.call_id, "list_dir", {"path": "."}),
    ]
    assert events[-1] == Finish("tool_calls") and isinstance(events[-2], Usage)

    history = [*first.history, AgentMessage("Hello"), ToolCall(call.call_id, "list_dir", {"path": "."}), ToolResult(call.call_id, "a b")]
    second = EngineRequest(history=history, agent="worker-name")
    start = trio.current_time()
    events, failure = await collect(engine, second)
    assert trio.current_time() - start == pytest.approx(0.5)  # the delay, on the autojump clock
    assert events[0] == ReasoningDelta("thinking...")
    assert texts(events) == "Done." and events[-1] == Finish("stop")

    third = EngineRequest(history=[*history, AgentMessage("Done."), ToolCall("x", "f"), ToolResult("x", "")], agent="worker-name")
    events, failure = await collect(engine, third)
    assert failure is not None and failure.category == "rate_limit" and failure.retryable and str(failure) == "slow down"

    # Steps exhausted: the turn ends with the last step's text (the error step has none: empty reply).
    fourth = EngineRequest(history=[*third.history, ToolCall("y", "f"), ToolResult("y", "")], agent="worker-name")
    events, failure = await collect(engine, fourth)
    assert failure is None and texts(events) == "" and events[-1] == Finish("stop")


async def test_exhausted_steps_repeat_last_text():
    script = parse_script({"rules": [{"steps": [[{"text": "one"}, {"tool_call": {"name": "t"}}], [{"text": "two "}, {"tool_call": {"name": "t"}}]]}]})
    engine = ScriptedEngine(script)
    history = [UserMessage("go"), ToolCall("a", "t"), ToolResult("a", ""), ToolCall("b", "t"), ToolResult("b", "")]
    events, _ = await collect(engine, EngineRequest(history=history))
    assert texts(events) == "two " and not any(isinstance(e, ToolCallStart) for e in events)
    assert events[-1] == Finish("stop")


async def test_agent_must_match_and_default_echo(script):
    engine = ScriptedEngine(script)
    events, _ = await collect(engine, EngineRequest(history=[UserMessage("a regex b")], agent="other"))
    assert texts(events) == "a regex b" and events[-1] == Finish("stop")
    events, _ = await collect(engine, EngineRequest(history=[UserMessage("count please")]))
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["ab", "cde", "fg", "hij"]


async def test_pacing_tokens_per_second_and_zero_latency(autojump_clock):
    script = parse_script({"rules": [{"steps": [[{"text": "a b c d e", "tokens_per_second": 2}]]}]})
    start = trio.current_time()
    await collect(ScriptedEngine(script), EngineRequest(history=[UserMessage("x")]))
    assert trio.current_time() - start == pytest.approx(2.0)  # 5 deltas, 4 gaps of 0.5 s
    start = trio.current_time()
    await collect(ScriptedEngine(script, pacing=False), EngineRequest(history=[UserMessage("x")]))
    assert trio.current_time() == start


async def test_byte_identical_events_for_same_input(script):
    from roost._json import converter, dumps

    request = EngineRequest(history=[UserMessage("a regex b")], agent="worker-name")
    runs = []
    for _ in range(3):
        events, _ = await collect(ScriptedEngine(script, pacing=False), request)
        runs.append(b"".join(dumps([type(e).__name__, converter.unstructure(e)]) for e in events))
    assert runs[0] == runs[1] == runs[2]


async def test_substitution_and_usage_override():
    script = parse_script({"rules": [{"steps": [[{"tool_call": {"name": "t", "id": "fixed"}}], [{"text": "got {tool_output} for {prompt} as {agent}"}, {"usage": {"input": 1, "output": 2, "cached": 3}}, {"finish": "length"}]]}]})
    engine = ScriptedEngine(script)
    events, _ = await collect(engine, EngineRequest(history=[UserMessage("q")]))
    assert events[0] == ToolCallStart("fixed", "t", 0)
    events, _ = await collect(engine, EngineRequest(history=[UserMessage("q"), ToolCall("fixed", "t"), ToolResult("fixed", "42")], agent="w"))
    assert texts(events) == "got 42 for q as w"
    assert events[-2:] == [Usage(1, 2, 3), Finish("length")]


async def test_cancelling_a_paced_stream():
    script = parse_script({"rules": [{"steps": [[{"delay": 3600}, {"text": "never"}]]}]})
    got = []
    with trio.fail_after(scaled(5)):
        with trio.move_on_after(0.01):  # not a deadline
            async with ScriptedEngine(script).stream(EngineRequest(history=[UserMessage("x")])) as events:
                async for event in events:
                    got.append(event)
    assert got == []


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ({"rules": "x"}, "'rules' must be a list"),
        ({"rules": [{"steps": [[{"bogus": 1}]]}]}, "rules[0].steps[0][0]"),
        ({"rules": [{"steps": [[{"error": {"category": "nope"}}]]}]}, "error.category"),
        ({"rules": [{"match": {"prompt": "("}, "steps": []}]}, "invalid regex"),
        ({"rules": [{"steps": [[{"tool_call": {"arguments": {}}}]]}]}, "needs a 'name'"),
        ({"rules": [], "defualt": "echo"}, "unknown top-level key 'defualt' (a script has only rules and default)"),
    ],
)
def test_invalid_scripts_name_the_place(doc, where):
    with pytest.raises(ConfigError, match=__import__("re").escape(where)):
        parse_script(doc)


def test_load_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_script(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigError, match="not valid"):
        load_script(str(bad))
    good = tmp_path / "good.json"
    good.write_text('{"rules": [{"steps": [[{"text": "hi"}]]}]}')
    assert load_script(str(good)).name == "good"


def test_each_builtin_script_ships_its_parsed_twin():
    """scripts/NAME.json is scripts/NAME.yaml decoded (load_script reads the twin, so PyYAML does
    not load for a built-in script): regenerate it whenever the YAML changes."""
    import importlib.resources
    import json

    import yaml

    root = importlib.resources.files("roost.engines") / "scripts"
    for name in builtin_scripts():
        doc = yaml.safe_load((root / f"{name}.yaml").read_text("utf-8"))
        assert json.loads((root / f"{name}.json").read_text("utf-8")) == doc, f"regenerate scripts/{name}.json"


async def test_demo_script_exercises_tools_and_subagents():
    assert "demo" in builtin_scripts()
    engine = ScriptedEngine(load_script("demo"), pacing=False)
    names = set()
    for prompt in ("list the files", "read the readme", "run a shell command", "use a team of workers"):
        history: list = [UserMessage(prompt)]
        for _ in range(5):
            events, failure = await collect(engine, EngineRequest(history=history))
            assert failure is None
            calls = [e for e in events if isinstance(e, ToolCallEnd)]
            history += [AgentMessage(texts(events))] if texts(events) else []
            if not calls:
                break
            names |= {c.name for c in calls}
            history += [ToolCall(c.call_id, c.name, c.arguments) for c in calls]
            history += [ToolResult(c.call_id, f"result of {c.name}") for c in calls]
        assert events[-1] == Finish("stop")
    assert {"list_dir", "read_file", "shell", "spawn_agent", "wait_agents"} <= names
    events, _ = await collect(engine, EngineRequest(history=[UserMessage("Survey the working directory.")], agent="scout"))
    assert ToolCallEnd in {type(e) for e in events}
    events, _ = await collect(engine, EngineRequest(history=[UserMessage("hello")]))
    assert "scripted demo" in texts(events)


@given(st.text(max_size=200), st.integers(min_value=1, max_value=50))
def test_split_deltas_properties(text, n):
    assert "".join(split_deltas(text)) == text
    pieces = split_deltas(text, n)
    if text:
        assert len(pieces) == n and all(pieces)
        assert "".join(pieces).startswith(text)
