"""Agents of a run: each its own actor and model, tool-round limits, and ``roost run --hitl``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import trio

from _helpers.appserver import roost_argv
from _helpers.sse_server import Reply, open_sse_server
from roost.orchestration import validate_config_file
from _helpers.timing import scaled

TEAM = """
Orchestration:
  Name: Team
  Models:
    remote: {Provider: openai, ModelId: remote-model, Endpoint: "%(endpoint)s", ApiKeyEnv: TEAM_KEY,
             MaxTokens: 77, Temperature: 0.3}
  Agents:
    - {Name: Planner, Instructions: "You plan.", Model: %(planner_model)s}
    - {Name: Developer, Instructions: "You write code.", Plugins: [files], MaxToolRounds: %(rounds)s}
    - {Name: Reviewer, Instructions: "You review."}
  Selection: {Type: roundrobin}
  Termination:
    Type: composite
    Strategies:
      - {Type: regex, Pattern: APPROVED, AgentNames: [Reviewer]}
      - {Type: maxiterations, MaxIterations: 6}
"""

SCRIPT = """
rules:
  - match: {agent: Planner}
    steps: [[{text: "Plan ready."}]]
  - match: {agent: Developer}
    steps:
      - - {tool_call: {name: list_dir, arguments: {path: "."}}}
      - - {tool_call: {name: list_dir, arguments: {path: "."}}}
      - - {text: "Code written."}
  - match: {agent: Reviewer, prompt: "add tests"}
    steps: [[{text: "APPROVED with tests"}]]
  - match: {agent: Reviewer}
    steps: [[{text: "APPROVED"}]]
default: echo
"""


def _team(tmp_path: Path, *, endpoint: str = "http://127.0.0.1:9/v1", planner_model: str = "null",
          rounds: str = "null") -> tuple[Path, dict[str, str]]:
    config = tmp_path / "team.yaml"
    config.write_text(TEAM % {"endpoint": endpoint, "planner_model": planner_model, "rounds": rounds})
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    env = dict(os.environ, ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script), TEAM_KEY="sk-team")
    return config, env


async def _roost(tmp_path: Path, env: dict, *args: str, stdin: bytes | None = None,
                 deadline: float = 30) -> subprocess.CompletedProcess:
    with trio.fail_after(deadline):
        return await trio.run_process(
            [*roost_argv(), *args], env=env, cwd=str(tmp_path), capture_stdout=True, capture_stderr=True,
            check=False, stdin=stdin if stdin is not None else subprocess.DEVNULL)


def _bridge_events(done: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def _chat_stream(text: str) -> list[bytes]:
    chunk = {"id": "c1", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]}
    usage = {"id": "c1", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3}}
    return [f"data: {json.dumps(chunk)}\n\n".encode(), f"data: {json.dumps(usage)}\n\n".encode(),
            b"data: [DONE]\n\n"]


async def test_an_agent_uses_its_own_model_alias(tmp_path: Path) -> None:
    """Planner's alias sends its turns to another provider with its model id, max tokens,
    temperature and key; the other agents stay on the run's (scripted) engine."""
    async with open_sse_server() as server:
        server.add(Reply(chunks=_chat_stream("Plan from the remote model.")))
        config, env = _team(tmp_path, endpoint=server.base_url + "/v1", planner_model="remote")
        done = await _roost(tmp_path, env, "run", "--bridge", "-c", str(config), "Build it")
        assert done.returncode == 0, done.stderr.decode()
        events = _bridge_events(done)
        messages = [(e["message"]["agentName"], e["message"]["content"]) for e in events
                    if e["type"] == "agent_message"]
        assert messages[0] == ("Planner", "Plan from the remote model.")
        assert messages[-1] == ("Reviewer", "APPROVED")
        assert len(server.requests) == 1
        request = server.requests[0]
        body = json.loads(request.body)
        assert body["model"] == "remote-model" and body["max_tokens"] == 77 and body["temperature"] == 0.3
        assert body["messages"][0] == {"role": "system", "content": "You plan."}
        assert request.headers["authorization"] == "Bearer sk-team"
        assert events[-1]["inputTokens"] >= 11


async def test_an_agent_model_without_its_key_fails_before_the_run_starts(tmp_path: Path) -> None:
    config, env = _team(tmp_path, planner_model="{Provider: anthropic, ModelId: claude-x, ApiKeyEnv: NO_SUCH_KEY}")
    env.pop("NO_SUCH_KEY", None)
    done = await _roost(tmp_path, env, "run", "--bridge", "-c", str(config), "Build it")
    assert done.returncode == 1
    (result,) = _bridge_events(done)
    assert result["type"] == "result" and result["sessionId"] is None
    assert "agent Planner" in result["errorMessage"] and "NO_SUCH_KEY" in result["errorMessage"]


async def test_max_tool_rounds_withholds_tools_after_the_last_round(tmp_path: Path) -> None:
    config, env = _team(tmp_path, rounds="1")
    done = await _roost(tmp_path, env, "run", "--bridge", "-c", str(config), "Build it")
    assert done.returncode == 0, done.stderr.decode()
    events = _bridge_events(done)
    developer = next(e["message"] for e in events
                     if e["type"] == "agent_message" and e["message"]["agentName"] == "Developer")
    # the first round ran; the second call was offered no tools, so its call was refused
    assert [c["succeeded"] for c in developer["toolCalls"]] == [True, False]


async def test_past_max_tool_rounds_the_model_is_offered_no_tools(tmp_path: Path) -> None:
    call = {"index": 0, "id": "call1", "type": "function",
            "function": {"name": "list_dir", "arguments": json.dumps({"path": "."})}}
    first = {"id": "c1", "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": "tool_calls"}]}
    async with open_sse_server() as server:
        server.add(Reply(chunks=[f"data: {json.dumps(first)}\n\n".encode(), b"data: [DONE]\n\n"]),
                   Reply(chunks=_chat_stream("Code written.")))
        config, env = _team(tmp_path, endpoint=server.base_url + "/v1", rounds="1")
        config.write_text(config.read_text().replace("MaxToolRounds: 1}", "MaxToolRounds: 1, Model: remote}"))
        done = await _roost(tmp_path, env, "run", "--bridge", "-c", str(config), "Build it")
        assert done.returncode == 0, done.stderr.decode()
        first_body, second_body = (json.loads(r.body) for r in server.requests)
        assert [t["function"]["name"] for t in first_body["tools"]] == [
            "read_file", "write_file", "list_dir", "search_files"]  # Plugins: [files]
        assert "tools" not in second_body
        assert "used all 1 tool rounds" in second_body["messages"][-1]["content"]


async def test_each_agent_is_an_actor_under_the_run_supervisor(tmp_path: Path, roost_home: Path) -> None:
    from roost.config import resolve_provider
    from roost.protocol._bridge import run_session

    config, env = _team(tmp_path)
    settings = resolve_provider(provider="scripted", script=env["ROOST_SCRIPT"])
    trees: list[str] = []
    holder: dict = {}

    def emit(event: dict) -> None:
        if event["type"] == "agent_starting":
            trees.append(holder["orch"].supervisor.render_tree())

    async def deny(params: dict) -> bool:
        return False

    result = await run_session(config_path=str(config), task="Build it", resume_id=None, settings=settings,
                               cwd=tmp_path, emit=emit, request_approval=deny,
                               on_orchestrator=lambda orch: holder.setdefault("orch", orch))
    assert result["succeeded"] is True and len(trees) == 3
    tree = trees[0].splitlines()
    assert tree[0].startswith(f"run:{result['sessionId']} (one_for_one")
    assert [line.split()[1] for line in tree[1:]] == ["agent:Planner", "agent:Developer", "agent:Reviewer"]
    assert all("transient" in line and "running" in line for line in tree[1:])


async def test_hitl_continue_message_then_the_next_agent_gets_it(tmp_path: Path) -> None:
    config, env = _team(tmp_path)
    done = await _roost(tmp_path, env, "run", "--hitl", "-c", str(config), "Build it",
                        stdin=b"\nPlease add tests\n")
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err
    assert "[Planner is done]" in err and "[Developer is done]" in err
    assert "Human: Please add tests\n" in out
    assert "Reviewer: APPROVED with tests\n" in out


async def test_hitl_stop_then_resume_continues_with_the_next_agent(tmp_path: Path) -> None:
    config, env = _team(tmp_path)
    stopped = await _roost(tmp_path, env, "run", "--hitl", "--json", "-c", str(config), "Build it",
                           stdin=b"/stop\n")
    assert stopped.returncode == 130, stopped.stderr.decode()
    result = json.loads(stopped.stdout)
    assert result["succeeded"] is False and result["turns"] == 1 and "--hitl" in result["errorMessage"]
    resumed = await _roost(tmp_path, env, "run", "--resume", result["sessionId"])
    out = resumed.stdout.decode()
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert "Planner:" not in out  # the stopped run chose again: the next agent, not Planner
    assert "Developer: Code written.\n" in out and "Reviewer: APPROVED\n" in out


async def test_hitl_asks_approvals_on_the_terminal(tmp_path: Path) -> None:
    config, env = _team(tmp_path)
    script = Path(env["ROOST_SCRIPT"])
    script.write_text(SCRIPT.replace('{tool_call: {name: list_dir, arguments: {path: "."}}}',
                                     '{tool_call: {name: write_file, arguments: {path: "a.txt", content: "hi"}}}', 1))
    # Planner done -> Enter; Developer's first write -> y; its second write -> n; Developer done -> Enter
    done = await _roost(tmp_path, env, "run", "--hitl", "-c", str(config), "Build it", stdin=b"\ny\nn\n\n")
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert err.count("approve file_write") == 1
    assert (tmp_path / "a.txt").read_text() == "hi"


async def test_hitl_with_end_of_input_stops_resumably(tmp_path: Path) -> None:
    config, env = _team(tmp_path)
    done = await _roost(tmp_path, env, "run", "--hitl", "-c", str(config), "Build it")  # stdin: /dev/null
    assert done.returncode == 130
    assert "resume with: roost run --resume" in done.stdout.decode()


@pytest.mark.parametrize(("model", "rounds", "expected"), [
    ("{ModelId: m, Temperature: hot}", "null", "Orchestration.Agents[0].Model.Temperature"),
    ("{ModelId: m, Provider: nope}", "null", "Orchestration.Agents[0].Model.Provider: unknown provider 'nope'"),
    ("{ModelId: m, MaxTokens: 0}", "null", "Orchestration.Agents[0].Model.MaxTokens"),
    ("{ModelId: m, Endpoint: localhost}", "null", "Orchestration.Agents[0].Model.Endpoint"),
    ("null", "-1", "Orchestration.Agents[1].MaxToolRounds"),
    ("null", "many", "Orchestration.Agents[1].MaxToolRounds"),
])
def test_model_and_round_fields_are_validated(tmp_path: Path, model: str, rounds: str, expected: str) -> None:
    config, _ = _team(tmp_path, planner_model=model, rounds=rounds)
    _, issues = validate_config_file(config)
    errors = [i.message for i in issues if i.level == "error"]
    assert any(m.startswith(expected) for m in errors), errors


async def test_an_agent_with_the_agents_plugin_spawns_workers(tmp_path: Path) -> None:
    config, env = _team(tmp_path)
    config.write_text(config.read_text().replace("Plugins: [files]", "Plugins: [agents]"))
    Path(env["ROOST_SCRIPT"]).write_text(SCRIPT.replace(
        "  - match: {agent: Developer}\n    steps:\n      - - {tool_call: {name: list_dir, arguments: {path: \".\"}}}",
        "  - match: {agent: \"helper.*\"}\n    steps: [[{text: \"helped\"}]]\n"
        "  - match: {agent: Developer}\n    steps:\n"
        "      - - {tool_call: {name: spawn_agent, arguments: {name: helper, prompt: \"H\"}}}"))
    done = await _roost(tmp_path, env, "run", "--bridge", "-c", str(config), "Build it")
    assert done.returncode == 0, done.stderr.decode()
    developer = next(e["message"] for e in _bridge_events(done)
                     if e["type"] == "agent_message" and e["message"]["agentName"] == "Developer")
    assert [(c["name"], c["succeeded"]) for c in developer["toolCalls"]] == [("spawn_agent", True), ("list_dir", False)]


async def test_plain_run_reports_a_failure_to_start_on_stderr(tmp_path: Path) -> None:
    _, env = _team(tmp_path)
    done = await _roost(tmp_path, env, "run", "-c", str(tmp_path / "missing.yaml"), "Build it")
    assert done.returncode == 1
    assert done.stdout == b""
    assert done.stderr.decode().startswith("roost run: error: ") and "missing.yaml" in done.stderr.decode()
    usage = await _roost(tmp_path, env, "run", "--bridge", "--json", "-c", "x.yaml", "Build it")
    assert usage.returncode == 2 and b"--json" in usage.stderr


async def test_plain_run_marks_failed_tool_calls(tmp_path: Path) -> None:
    config, env = _team(tmp_path, rounds="1")
    done = await _roost(tmp_path, env, "run", "-c", str(config), "Build it")
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert "  (1 tool call failed: list_dir)\nDeveloper:" in out
    assert "[turn 1 · Planner · 0 tokens so far ·" in out and "(3 turns," in out


@pytest.mark.parametrize(("fragment", "expected"), [
    ("Plugins: [files]", "Orchestration.Agents[1].Plugins: expected a list, got str"),
    ("Model: %(planner_model)s", "Orchestration.Agents[0].Model"),
])
def test_strings_are_not_read_as_lists(tmp_path: Path, fragment: str, expected: str) -> None:
    config, _ = _team(tmp_path)
    text = config.read_text().replace("Plugins: [files]", "Plugins: files")
    config.write_text(text)
    _, issues = validate_config_file(config)
    errors = [i.message for i in issues if i.level == "error"]
    if fragment.startswith("Plugins"):
        assert expected in errors, errors
    else:  # an unknown alias is a warning, not an error
        config.write_text(TEAM % {"endpoint": "http://127.0.0.1:9/v1", "planner_model": "nosuch", "rounds": "null"})
        _, issues = validate_config_file(config)
        assert [i.message for i in issues if i.level == "warning" and "nosuch" in i.message] == [
            "Orchestration.Agents[0].Model: 'nosuch' is not an alias of Models (remote); it is used as a model id"]


async def test_hitl_sigint_at_the_pause_prompt_with_stdin_open_exits_130_cleanly(tmp_path: Path) -> None:
    # SIGINT while `roost run --hitl` waits at its pause prompt, stdin kept open: the thread reading
    # stdin is abandoned still blocked; the process must exit 130 without "Fatal Python error"
    import signal

    config, env = _team(tmp_path)
    process = await trio.lowlevel.open_process(
        [*roost_argv(), "run", "--hitl", "-c", str(config), "Build it"], env=env, cwd=str(tmp_path),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = bytearray(), bytearray()

    async def pump(stream: trio.abc.ReceiveStream, into: bytearray) -> None:
        while data := await stream.receive_some(1 << 16):
            into.extend(data)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, process.stdout, out)
            nursery.start_soon(pump, process.stderr, err)
            with trio.fail_after(scaled(30)):
                while b"[Planner is done]" not in err:
                    assert process.poll() is None, err.decode()
                    await trio.sleep(0.05)
                process.send_signal(signal.SIGINT)
                code = await process.wait()
    finally:
        await process.stdin.aclose()
        if process.poll() is None:
            process.kill()
            await process.wait()
    print(err.decode()); assert code == 130, err.decode()
    assert "Fatal Python error" not in err.decode() and "Traceback" not in err.decode(), err.decode()
    assert "resume with: roost run --resume" in out.decode()
