"""Orchestration configs: the loader (cattrs, error paths) and, end to end through the real `roost`
command, `init`, `config --list` and `validate` with their wire-protocol envelopes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import trio

from roost.errors import ConfigError
from roost.orchestration import ModelSpec, load_config_file, validate_config_file

from _helpers.appserver import roost_argv, scripted_env

CONFIG_SUMMARY = {"path", "name", "description", "agents", "selectionType", "error"}
VALIDATION = {"path", "valid", "issues", "config"}
TEMPLATE = {"key", "label", "description"}
INIT_RESULT = {"template", "model", "endpoint", "configPath", "agentFiles"}

GOOD = """\
Orchestration:
  Name: Team
  Description: A small team.
  Models:
    fast: {ModelId: small-model, Endpoint: "http://localhost:1/v1"}
  Agents:
    - Name: Planner
      Instructions: Plan. Say GO.
      Model: fast
    - File: agents/coder.yaml
  Selection:
    Type: Round_Robin
  Termination:
    Type: composite
    Mode: all
    Strategies:
      - {Type: regex, Pattern: "DONE$", AgentNames: [Coder]}
      - {Type: token_budget, MaxTokens: 5000}
"""
CODER = "Name: Coder\nInstructions: Code.\nModel: {ModelId: big-model}\nPlugins: [files, shell]\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_loader_reads_agents_files_aliases_and_strategies(tmp_path):
    write(tmp_path / "agents" / "coder.yaml", CODER)
    config = load_config_file(write(tmp_path / "team.yaml", GOOD))
    assert config.path == str(tmp_path / "team.yaml") and config.name == "Team"
    assert [a.name for a in config.agents] == ["Planner", "Coder"]
    assert config.agents[1].file == str(tmp_path / "agents" / "coder.yaml")
    assert config.agents[1].plugins == ["files", "shell"]
    assert config.resolve_model(config.agents[0]) == ModelSpec(model_id="small-model", endpoint="http://localhost:1/v1")
    assert config.resolve_model(config.agents[1]) == ModelSpec(model_id="big-model")
    assert config.selection.type == "roundrobin"
    term = config.termination
    assert term.type == "composite" and term.mode == "all"
    assert [(s.type, s.pattern, s.max_tokens) for s in term.strategies] == [("regex", "DONE$", None),
                                                                             ("token_budget", None, 5000)]


def test_defaults_and_json_format(tmp_path):
    path = write(tmp_path / "one.json", json.dumps({"Orchestration": {"Agents": [{"Name": "A", "Instructions": "x"}]}}))
    config = load_config_file(path)
    assert config.selection.type == "sequential"
    assert (config.termination.type, config.termination.max_iterations) == ("maxiterations", 10)


@pytest.mark.parametrize("body, expected", [
    ("Name: 3\nAgents: [{Name: A, Instructions: x}]", "Orchestration.Name: expected a string, got int"),
    ("Agents: [{Name: A, Instructions: x}, {Instructions: y}]", "Orchestration.Agents[1].Name: required"),
    ("Agents: []", "Orchestration.Agents: at least one agent is required"),
    ("Agents: [{Name: A}, {Name: A}]", "Orchestration.Agents[1].Name: duplicate agent name 'A'"),
    ("Agents: [{Name: A}]\nSelection: {Type: magic}", "Orchestration.Selection.Type: unknown selection 'magic'"),
    ("Agents: [{Name: A}]\nSelection: {Type: keyword, Routes: [{Keyword: GO, Agent: B}]}",
     "Orchestration.Selection.Routes[0].Agent: no agent named 'B'"),
    ("Agents: [{Name: A}]\nSelection: {Type: keyword}", "Orchestration.Selection.Routes: keyword selection needs"),
    ("Agents: [{Name: A}]\nTermination: {Type: regex, Pattern: '('}",
     "Orchestration.Termination.Pattern: not a valid regular expression"),
    ("Agents: [{Name: A}]\nTermination: {Type: composite, Strategies: [{Type: maxiterations}]}",
     "Orchestration.Termination.Strategies[0].MaxIterations: required"),
    ("Agents: [{Name: A}]\nTermination: {Type: max_iterations, MaxIterations: many}",
     "Orchestration.Termination.MaxIterations: expected an integer, got str"),
    ("Agents: [{Name: A}]\nTermination: {Type: token_budget}", "Orchestration.Termination.MaxTokens: required"),
    ("Agents: [{File: agents/missing.yaml}]", "Orchestration.Agents[0].File: cannot read"),
])
def test_errors_name_the_field(tmp_path, body, expected):
    path = write(tmp_path / "bad.yaml", "Orchestration:\n" + "".join(f"  {line}\n" for line in body.splitlines()))
    _, issues = validate_config_file(path)
    errors = [i.message for i in issues if i.level == "error"]
    assert any(e.startswith(expected) for e in errors), errors
    with pytest.raises(ConfigError):
        load_config_file(path)


def test_unknown_keys_are_warnings_and_bad_files_are_errors(tmp_path):
    path = write(tmp_path / "c.yaml", "Orchestration:\n  MaxCostUsd: 1\n  Agents: [{Name: A, Instructions: x, Temp: 1}]\n")
    config, issues = validate_config_file(path)
    assert config is not None
    assert [(i.level, i.message) for i in issues] == [
        ("warning", "Orchestration.MaxCostUsd: unknown key, ignored"),
        ("warning", "Orchestration.Agents[0].Temp: unknown key, ignored")]
    for text, needle in (("a: [", "not valid YAML"), ("- 1\n", "Orchestration key")):
        config, issues = validate_config_file(write(tmp_path / "x.yaml", text))
        assert config is None and needle in issues[0].message
    config, issues = validate_config_file(tmp_path / "absent.yaml")
    assert config is None and "cannot read" in issues[0].message


# -- end to end -------------------------------------------------------------------------------


from _helpers.cli import cli, roost, roost_all  # noqa: E402



def one_line(proc: subprocess.CompletedProcess) -> dict:
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 1, (proc.stdout, proc.stderr)
    doc = json.loads(lines[0])
    assert doc["protocolVersion"] == 1 and len(doc) == 2
    return doc


@pytest.fixture
def env(roost_home: Path) -> dict:
    return {k: v for k, v in scripted_env(roost_home).items() if k not in ("ROOST_MODEL", "ROOST_BASE_URL")}


async def test_init_templates_and_written_files(env, tmp_path):
    listed = await roost(env, "init", "--list-templates", "--json", cwd=tmp_path)
    made = await roost(env, "init", "--template", "dev-team", "--model", "m-1", "--json", cwd=tmp_path)
    assert listed.returncode == 0
    templates = one_line(listed)["items"]
    assert len(templates) >= 2 and all(set(t) == TEMPLATE for t in templates)
    keys = [t["key"] for t in templates]
    assert keys[:2] == ["assistant", "dev-team"]

    assert made.returncode == 0, made.stderr
    result = one_line(made)["item"]
    assert set(result) == INIT_RESULT
    config_path = tmp_path / ".roost" / "config" / "orchestration.yaml"
    assert result == {"template": "dev-team", "model": "m-1", "endpoint": None, "configPath": str(config_path),
                      "agentFiles": [str(config_path.parent / "agents" / f) for f in
                                     ("planner.yaml", "developer.yaml", "reviewer.yaml")]}
    assert all(Path(p).is_file() for p in result["agentFiles"])
    gitignore = (tmp_path / ".gitignore").read_text().splitlines()
    assert ".roost/*" in gitignore and "!.roost/config/" in gitignore
    config = load_config_file(config_path)
    assert [a.name for a in config.agents] == ["Planner", "Developer", "Reviewer"]
    assert config.resolve_model(config.agents[0]).model_id == "m-1"

    # existing files without --force: an error envelope, nothing changed
    config_path.write_text("# edited\n")
    again = await cli("init", "--template", "dev-team", "--json", cwd=tmp_path)
    assert again.returncode == 1 and "--force" in one_line(again)["error"]
    assert config_path.read_text() == "# edited\n"
    forced = await cli("init", "--template", "dev-team", "--model", "m-2", "--endpoint", "http://h:1/v1",
                       "--force", "--json", cwd=tmp_path)
    assert forced.returncode == 0 and one_line(forced)["item"]["endpoint"] == "http://h:1/v1"
    assert (tmp_path / ".gitignore").read_text().count(".roost/*") == 1

    # a path of its own, and an unknown template
    other = await cli("init", "elsewhere/solo.yaml", "--json", cwd=tmp_path)
    unknown = await cli("init", "--template", "nope", "--json", cwd=tmp_path)
    item = one_line(other)["item"]
    assert item["template"] == "assistant" and item["configPath"] == str(tmp_path / "elsewhere" / "solo.yaml")
    assert item["agentFiles"] == [str(tmp_path / "elsewhere" / "agents" / "assistant.yaml")]
    assert unknown.returncode == 1 and "unknown template 'nope'" in one_line(unknown)["error"]


async def test_config_list_and_validate(env, tmp_path):
    made = await cli("init", "--json", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    config_dir = tmp_path / ".roost" / "config"
    write(config_dir / "broken.yml", "Orchestration:\n  Agents: [{Instructions: x}]\n")
    write(config_dir / "nested" / "two.json", json.dumps({"Orchestration": {"Name": "Two", "Agents": [{"Name": "B"}]}}))
    write(tmp_path / "semantic.yaml", "Orchestration:\n  Agents: [{Name: A}]\n  Selection: {Type: keyword, Routes: [{Keyword: K, Agent: Z}]}\n")
    listed, other, empty, ok, sem = await roost_all(
        env, ("config", "--list", "--json"), ("config", "--list", "--dir", str(config_dir / "nested"), "--json"),
        ("config", "--list", "--dir", str(tmp_path / "nowhere"), "--json"),
        ("validate", str(config_dir / "orchestration.yaml"), "--json"),
        ("validate", "semantic.yaml", "--json"), cwd=tmp_path)
    bad = await roost(env, "validate", str(config_dir / "broken.yml"), "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = one_line(listed)["items"]
    assert all(set(r) == CONFIG_SUMMARY for r in rows)
    by_name = {Path(r["path"]).name: r for r in rows}
    assert set(by_name) == {"broken.yml", "orchestration.yaml", "two.json"}   # agents/ is skipped
    assert by_name["orchestration.yaml"] == {
        "path": str(config_dir / "orchestration.yaml"), "name": "Assistant", "description": by_name["orchestration.yaml"]["description"],
        "agents": ["Assistant"], "selectionType": "roundrobin", "error": None}
    broken = by_name["broken.yml"]
    assert broken["name"] is None and broken["description"] is None and broken["selectionType"] is None
    assert "Orchestration.Agents[0].Name: required" in broken["error"]
    assert by_name["two.json"]["description"] is None and by_name["two.json"]["agents"] == ["B"]
    assert [Path(r["path"]).name for r in one_line(other)["items"]] == ["two.json"]
    assert empty.returncode == 1 and "no config folder" in one_line(empty)["error"]

    assert ok.returncode == 0
    valid = one_line(ok)["item"]
    assert set(valid) == VALIDATION and valid["valid"] is True and valid["issues"] == []
    assert set(valid["config"]) == CONFIG_SUMMARY and valid["config"]["name"] == "Assistant"

    assert bad.returncode == 1
    invalid = one_line(bad)["item"]              # exits 1 but prints the item, not an error envelope
    assert invalid["valid"] is False and invalid["config"] is None
    assert {"level": "error", "message": "Orchestration.Agents[0].Name: required"} in invalid["issues"]

    item = one_line(sem)["item"]
    assert sem.returncode == 1 and item["valid"] is False and item["path"] == str(tmp_path / "semantic.yaml")
    assert item["config"]["selectionType"] == "keyword" and "no agent named 'Z'" in item["config"]["error"]
    levels = {i["level"] for i in item["issues"]}
    assert levels == {"error", "warning"}
