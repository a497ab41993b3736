"""Agents' memory and context end to end: ``roost run --bridge`` (the real process, scripted engine).

An orchestration agent saves a typed memory with ``memory_save``; it lands in that agent's own store
(``roost memory list --agent NAME``). Another agent's ``memory_recall`` sees its own and the shared
memories but not the first agent's; the first agent recalls its memory in a later session. An agent
reads reference material imported with ``roost context add`` through ``context_read``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import trio

from _helpers.cli import roost
from test_run_bridge import open_bridge
from _helpers.timing import scaled

DEADLINE = scaled(30)

TEAM = """
Orchestration:
  Name: Memory team
  Agents:
    - {Name: Archivist, Instructions: "You remember things."}
    - {Name: Recaller, Instructions: "You recall things.", Plugins: [files, memory]}
    - {Name: Reader, Instructions: "You read the docs.", Plugins: [memory]}
  Selection: {Type: sequential}
  Termination: {Type: maxiterations, MaxIterations: 3}
"""

SCRIPT = """
rules:
  - match: {agent: Archivist}
    steps:
      - - {tool_call: {name: memory_save, arguments: {name: stack, type: project, description: "The stack",
                                                      body: "Python 3.12 with trio"}}}
      - - {text: "Archived: {tool_output}"}
  - match: {agent: Recaller}
    steps:
      - - {tool_call: {name: memory_recall, arguments: {}}}
      - - {text: "Recalled: {tool_output}"}
  - match: {agent: Reader}
    steps:
      - - {tool_call: {name: context_read, arguments: {name: docs, path: guide.md}}}
      - - {text: "Read: {tool_output}"}
default: echo
"""

# A later session: the Archivist recalls what it saved in the first one.
LATER_TEAM = """
Orchestration:
  Name: Later
  Agents:
    - {Name: Archivist, Instructions: "You remember things.", Plugins: [memory]}
  Selection: {Type: sequential}
  Termination: {Type: maxiterations, MaxIterations: 1}
"""

LATER_SCRIPT = """
rules:
  - match: {agent: Archivist}
    steps:
      - - {tool_call: {name: memory_recall, arguments: {query: trio, type: project}}}
      - - {text: "Remembered: {tool_output}"}
default: echo
"""


def _seed_shared_memory() -> None:
    """A shared memory (scope ``memory``), as ``roost memory`` without ``--agent`` lists it."""
    from roost.storage import open_store
    from roost.tools._memory_tools import save_memory

    with open_store() as store, store.transaction() as conn:
        save_memory(conn, agent=None, name="style", type="feedback", description="House style",
                    body="Keep answers short.")


async def _run(tmp_path: Path, team: str, script: str, task: str) -> tuple[dict[str, dict], dict, int]:
    """Run one orchestration over the bridge; return (agent name -> its agent_message, result, exit code)."""
    config, script_path = tmp_path / f"{task}.yaml", tmp_path / f"{task}-script.yaml"
    config.write_text(team)
    script_path.write_text(script)
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script_path, "-c", str(config), task)
        result, code = await bridge.finish()
    messages = {e["message"]["agentName"]: e["message"] for e in bridge.events if e["type"] == "agent_message"}
    return messages, result, code


def _items(proc: subprocess.CompletedProcess) -> list[dict]:
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["protocolVersion"] == 1
    return doc["items"]


async def _first_session(tmp_path: Path, env: dict) -> dict[str, dict]:
    """Import ``docs`` as context, seed a shared memory, run :data:`TEAM`; return its agent messages."""
    docs = tmp_path / "docs-src"
    docs.mkdir()
    (docs / "guide.md").write_text("# Guide\nAlways run the tests.\n")
    added = await roost(env, "context", "add", str(docs), "--name", "docs", "--description", "Team docs",
                        cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    _seed_shared_memory()
    messages, result, code = await _run(tmp_path, TEAM, SCRIPT, "first")
    assert result["succeeded"] is True and code == 0 and result["turns"] == 3
    assert list(messages) == ["Archivist", "Recaller", "Reader"]
    return messages


async def test_agents_save_recall_and_read_context(tmp_path: Path) -> None:
    env = dict(os.environ)
    messages = await _first_session(tmp_path, env)
    archivist, recaller, reader = messages["Archivist"], messages["Recaller"], messages["Reader"]
    assert archivist["content"] == "Archived: saved memory 'stack' (project)"
    assert [(c["name"], c["succeeded"]) for c in archivist["toolCalls"]] == [("memory_save", True)]
    # the Recaller (Plugins: [files, memory]) recalls the shared memory
    assert [(c["name"], c["succeeded"]) for c in recaller["toolCalls"]] == [("memory_recall", True)]
    assert "## style (feedback, shared)\nHouse style\n\nKeep answers short." in recaller["content"]
    # the Reader (Plugins: [memory]) reads the imported context file
    assert reader["content"] == "Read: # Guide\nAlways run the tests.\n"
    assert [(c["name"], c["succeeded"]) for c in reader["toolCalls"]] == [("context_read", True)]
    # the saved entry is stored (in the Archivist's store once turns pass ToolContext.agent)
    own = _items(await roost(env, "memory", "list", "--json", "--agent", "Archivist", cwd=tmp_path))
    shared = _items(await roost(env, "memory", "list", "--json", cwd=tmp_path))
    stack = [(e["type"], e["description"], e["body"]) for e in own + shared if e["name"] == "stack"]
    assert stack == [("project", "The stack", "Python 3.12 with trio")]


async def test_agent_memory_is_its_own(tmp_path: Path) -> None:
    env = dict(os.environ)
    messages = await _first_session(tmp_path, env)
    # the Archivist's save went to its own store: the Recaller does not see it
    assert "Python 3.12 with trio" not in messages["Recaller"]["content"]
    own, shared, agents = (await roost(env, "memory", "list", "--json", "--agent", "Archivist", cwd=tmp_path),
                           await roost(env, "memory", "list", "--json", cwd=tmp_path),
                           await roost(env, "memory", "agents", "--json", cwd=tmp_path))
    entries = _items(own)
    assert [(e["name"], e["type"], e["description"], e["body"]) for e in entries] == [
        ("stack", "project", "The stack", "Python 3.12 with trio")]
    assert [e["name"] for e in _items(shared)] == ["style"]
    assert _items(agents) == [{"agent": "Archivist", "count": 1}]

    # a later session: the Archivist recalls what it saved
    later, result, code = await _run(tmp_path, LATER_TEAM, LATER_SCRIPT, "later")
    assert code == 0 and result["succeeded"] is True
    assert later["Archivist"]["content"] == "Remembered: ## stack (project)\nThe stack\n\nPython 3.12 with trio"
