"""Smaller wire-protocol rows through the real commands: `run --json` carries protocolVersion,
`sessions --prune/--cleanup`, `validate --diagram/--show-paths` (each refused with --json),
ReplSession.modelId never empty."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from _helpers.appserver import roost_argv, script_env
from _helpers.timing import scaled

TEAM = """
Orchestration:
  Name: Team
  Agents:
    - {Name: Planner, Description: plans, Instructions: "You plan."}
    - {Name: Developer, Instructions: "You write code."}
  Selection:
    Type: keyword
    DefaultAgent: Planner
    Routes:
      - {Keyword: SHIP IT, Agent: Developer, SourceAgents: [Planner], RequireHumanApproval: true}
  Termination: {Type: maxiterations, MaxIterations: 1}
"""


def roost(tmp_path: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*roost_argv(), *args], capture_output=True, text=True, timeout=scaled(120), env=env, cwd=tmp_path)


def test_run_json_prune_cleanup_and_model_id(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = script_env(tmp_path, home, "rules: []\ndefault: echo\n")
    config = tmp_path / "team.yaml"
    config.write_text(TEAM)
    done = roost(tmp_path, env, "run", "--json", "-c", str(config), "Build it")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["protocolVersion"] == 1 and result["type"] == "result" and result["succeeded"] is True

    # an incomplete session that never recorded a turn (what a run that died before starting leaves)
    from roost.storage import create_thread, open_store

    store = open_store(home / "roost.db")
    try:
        with store.transaction() as conn:
            empty = create_thread(conn, kind="orchestration", cwd=str(tmp_path)).id
            chat = create_thread(conn, kind="chat", cwd=str(tmp_path), provider="scripted").id
    finally:
        store.close()
    listed = json.loads(roost(tmp_path, env, "sessions", "--all", "--json").stdout)["items"]
    assert {s["sessionId"] for s in listed} == {result["sessionId"], empty}

    for flag in ("--prune", "--cleanup"):
        refused = roost(tmp_path, env, "sessions", flag, "--json")
        assert refused.returncode == 1
        assert json.loads(refused.stdout) == {"protocolVersion": 1, "error": f"--json can't be combined with {flag}"}
    cleaned = roost(tmp_path, env, "sessions", "--cleanup")
    assert cleaned.returncode == 0 and cleaned.stdout == "cleaned up 1 empty session\n"
    listed = json.loads(roost(tmp_path, env, "sessions", "--all", "--json").stdout)["items"]
    assert [s["sessionId"] for s in listed] == [result["sessionId"]]
    pruned = roost(tmp_path, env, "sessions", "--prune")
    assert pruned.returncode == 0 and pruned.stdout == "pruned 1 completed session\n"
    assert json.loads(roost(tmp_path, env, "sessions", "--all", "--json").stdout)["items"] == []

    chats = json.loads(roost(tmp_path, env, "sessions", "--repl", "--json").stdout)["items"]
    assert [(c["sessionId"], c["modelId"]) for c in chats] == [(chat, "scripted")]   # no model: its provider


def test_validate_diagram_and_show_paths(tmp_path: Path) -> None:
    env = script_env(tmp_path, tmp_path / "home", "rules: []\ndefault: echo\n")
    config = tmp_path / "team.yaml"
    config.write_text(TEAM)
    shown = roost(tmp_path, env, "validate", str(config), "--diagram", "--show-paths")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout.splitlines()
    assert f"config: {config.resolve()}" in out and "agent Planner: (inline in the config)" in out
    assert "Team  (selection: keyword)" in out and "  [Planner]  plans" in out
    assert "default agent: [Planner]" in out
    assert '  [Planner] --"SHIP IT"--> [Developer]  [human approval]' in out
    for flag in ("--diagram", "--show-paths"):
        refused = roost(tmp_path, env, "validate", str(config), flag, "--json")
        assert refused.returncode == 1
        assert json.loads(refused.stdout) == {"protocolVersion": 1, "error": f"--json can't be combined with {flag}"}


async def test_serve_token_warn_threshold_applies_to_orchestrated_tasks(tmp_path: Path) -> None:
    from _helpers.serve_client import open_daemon

    config = tmp_path / "team.yaml"
    config.write_text(TEAM.replace("MaxIterations: 1", "MaxIterations: 2").replace("Type: keyword", "Type: sequential"))
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [], "default": "echo"}))
    async with open_daemon(script=script, args=["-c", str(config), "--token-warn-threshold", "1"]) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")
            await client.send({"type": "user_input", "text": "Build it"})
            sid = (await client.wait_for("queued"))["sessionId"]
            await client.wait_for("result", lambda e: e["sessionId"] == sid)
    warnings = [e for e in client.of_type("token_budget_warning") if e["sessionId"] == sid]
    assert len(warnings) == 1   # once per task, though both agents' turns pass the threshold
    assert warnings[0]["warnThreshold"] == 1 and warnings[0]["inputTokens"] >= 1
    assert warnings[0]["agent"] == "Planner"
