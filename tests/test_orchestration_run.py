"""Orchestration runs: selection and termination policies, and ``roost run`` without ``--bridge``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import trio

from _helpers.appserver import roost_argv
from roost.orchestration import load_config_file
from roost.orchestration._policy import (
    Progress, first_agent, keyword_handoff, next_sequential, terminated, token_budget,
)
from _helpers.timing import scaled

CONFIG = """
Orchestration:
  Name: Team
  Agents:
    - {Name: Planner, Instructions: "You plan."}
    - {Name: Developer, Instructions: "You write code."}
    - {Name: Reviewer, Instructions: "You review."}
  Selection:
    Type: keyword
    Routes:
      - {Keyword: handoff to developer, Agent: Developer, SourceAgents: [Planner], RequireHumanApproval: true}
      - {Keyword: HANDOFF TO REVIEWER, Agent: Reviewer}
  Termination:
    Type: composite
    Mode: %(mode)s
    Strategies:
      - {Type: regex, Pattern: APPROVED, AgentNames: [Reviewer]}
      - {Type: maxiterations, MaxIterations: 4}
      - {Type: token_budget, MaxTokens: 500}
"""

SCRIPT = """
rules:
  - match: {agent: Planner}
    steps: [[{text: "Plan ready."}]]
  - match: {agent: Developer}
    steps:
      - - {tool_call: {name: list_dir, arguments: {path: "."}}}
      - - {text: "Code written."}
  - match: {agent: Reviewer}
    steps: [[{text: "APPROVED"}]]
default: echo
"""


def _config(tmp_path: Path, mode: str = "any"):
    path = tmp_path / "team.yaml"
    path.write_text(CONFIG % {"mode": mode})
    return load_config_file(path)


def test_route_flag_and_keyword_handoff(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert config.selection.routes[0].require_human_approval is True
    assert config.selection.routes[1].require_human_approval is False
    handoff = keyword_handoff(config, "Planner", "Done. HANDOFF TO DEVELOPER please")  # case-insensitive
    assert handoff.agent == "Developer" and handoff.route is config.selection.routes[0]
    # a route restricted to other source agents does not apply
    assert keyword_handoff(config, "Reviewer", "handoff to developer").route is None
    # no route, no default agent: the same agent again, with a correction naming the keywords
    missed = keyword_handoff(config, "Planner", "nothing here")
    assert missed.agent == "Planner" and missed.route is None
    assert "'handoff to developer'" in missed.correction and "'HANDOFF TO REVIEWER'" in missed.correction


def test_bad_route_flag_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text((CONFIG % {"mode": "any"}).replace("RequireHumanApproval: true", "RequireHumanApproval: maybe"))
    try:
        load_config_file(path)
    except Exception as exc:  # ConfigInvalid
        assert "Orchestration.Selection.Routes[0].RequireHumanApproval" in str(exc)
    else:
        raise AssertionError("a non-boolean RequireHumanApproval must be refused")


def test_sequential_and_roundrobin_order(tmp_path: Path) -> None:
    config = _config(tmp_path)
    assert first_agent(config) == "Planner"
    assert next_sequential(config, "Planner", cycle=False) == "Developer"
    assert next_sequential(config, "Reviewer", cycle=False) is None
    assert next_sequential(config, "Reviewer", cycle=True) == "Planner"


def test_termination_strategies(tmp_path: Path) -> None:
    config = _config(tmp_path)
    term = config.termination
    assert token_budget(term) == 500
    p = Progress(iterations=1, tokens=10)
    assert terminated(term, p, "Planner", "APPROVED") is None  # regex only for the Reviewer
    assert terminated(term, p, "Reviewer", "APPROVED") == "Reviewer matched 'APPROVED'"
    assert terminated(term, Progress(iterations=4), "Planner", "x") == "reached 4 iterations"
    assert terminated(term, Progress(iterations=1, tokens=500), "Planner", "x") == "token budget of 500 used"
    every = _config(tmp_path, mode="all").termination
    assert terminated(every, Progress(iterations=4, tokens=500), "Reviewer", "x") is None
    assert terminated(every, Progress(iterations=4, tokens=500), "Reviewer", "APPROVED") is not None


async def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    config = tmp_path / "rr.yaml"
    config.write_text((CONFIG % {"mode": "any"}).replace("Type: keyword", "Type: roundrobin"))
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    env = dict(os.environ, ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script))
    with trio.fail_after(scaled(20)):
        return await trio.run_process([*roost_argv(), "run", "-c", str(config), *args], env=env, cwd=str(tmp_path),
                                      capture_stdout=True, capture_stderr=True, check=False,
                                      stdin=subprocess.DEVNULL)


async def test_run_json_prints_one_summary(tmp_path: Path) -> None:
    done = await _run(tmp_path, "--json", "Build it")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 1
    summary = json.loads(lines[0])
    assert summary["type"] == "result" and summary["succeeded"] is True and summary["turns"] == 3
    assert summary["task"] == "Build it" and summary["sessionId"].startswith("thr_")


async def test_run_transcript_with_progress_lines(tmp_path: Path) -> None:
    done = await _run(tmp_path, "Build it")
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode()
    assert "agents: Planner, Developer, Reviewer" in out
    assert "[turn 1 · Planner · 0 tokens so far ·" in out and "[turn 3 · Reviewer ·" in out
    assert "  $ list_dir .\n" in out
    assert "Planner: Plan ready.\n" in out and "Developer: Code written.\n" in out and "Reviewer: APPROVED\n" in out
    assert " completed: " in out and " (3 turns," in out


async def test_run_usage_errors(tmp_path: Path) -> None:
    done = await _run(tmp_path)  # no task
    assert done.returncode == 2 and b"TASK" in done.stderr


async def test_keyword_without_a_route_injects_orchestrator_corrections(tmp_path: Path) -> None:
    config = tmp_path / "kw.yaml"
    config.write_text(CONFIG % {"mode": "any"})
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    env = dict(os.environ, ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script))
    with trio.fail_after(scaled(20)):
        done = await trio.run_process([*roost_argv(), "run", "-c", str(config), "Build it"], env=env,
                                      cwd=str(tmp_path), capture_stdout=True, capture_stderr=True, check=False,
                                      stdin=subprocess.DEVNULL)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr
    # The Planner never says a handoff keyword: corrected each time, until MaxIterations (4).
    assert out.count("Planner: Plan ready.\n") == 4
    assert out.count("Orchestrator: Planner: no handoff found in your message.") == 3
    assert "Developer" not in out.split("agents:")[1].split("\n", 1)[1]
    with trio.fail_after(scaled(20)):
        listed = await trio.run_process([*roost_argv(), "sessions", "--all", "--json"], env=env, cwd=str(tmp_path),
                                        capture_stdout=True, check=True)
    session = json.loads(listed.stdout)["items"][0]["sessionId"]
    with trio.fail_after(scaled(20)):
        shown = await trio.run_process([*roost_argv(), "sessions", "--show", session, "--json"], env=env,
                                       cwd=str(tmp_path), capture_stdout=True, check=True)
    messages = json.loads(shown.stdout)["item"]["messages"]
    assert [(m["agentName"], m["role"]) for m in messages[:4]] == [
        ("Human", "user"), ("Planner", "assistant"), ("Orchestrator", "user"), ("Planner", "assistant")]


def test_agent_message_events_have_the_wire_types_shape() -> None:
    """The Orchestrator builds ``agent_message`` events without importing the protocol room; the
    message must be exactly what the wire's AgentMessage/ToolCallSummary render to."""
    from types import SimpleNamespace

    from roost.orchestration import Orchestrator
    from roost.protocol import AgentMessage, ToolCallSummary, to_wire

    events: list[dict] = []
    host = SimpleNamespace(actor=SimpleNamespace(turns=[{}, {}]), emit=events.append)
    host._emit_message = lambda *args: Orchestrator._emit_message(host, *args)  # type: ignore[arg-type]
    turn = {"completed_at": "2026-01-01T00:00:00Z", "usage": {"input_tokens": 7, "output_tokens": 3},
            "items": [{"type": "agent_message", "text": "done"},
                      {"type": "tool_call", "name": "shell", "arguments": {"command": "ls"}, "status": "completed"}]}
    assert Orchestrator._emit_turn(host, "Planner", turn, 1.5) == "done"  # type: ignore[arg-type]
    (event,) = events
    call = event["message"]["toolCalls"][0]
    expected = AgentMessage(agent_name="Planner", role="assistant", content="done", turn_index=1,
                            timestamp="2026-01-01T00:00:00Z", input_tokens=7, output_tokens=3,
                            is_compaction_summary=False,
                            tool_calls=[ToolCallSummary(name="shell", args_summary=call["argsSummary"], succeeded=True)])
    assert event == {"type": "agent_message", "message": to_wire(expected), "elapsedMs": 1500}
