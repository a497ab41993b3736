"""``roost run --bridge``: the run bridge end to end (the real process over stdio, scripted engine).

wire-protocol.md, "Run events (run bridge)": ready first, result last with the process's exit code;
approval_request answered by approval_response (also route_approval); interrupt / SIGINT end the
session with succeeded false, and --resume continues it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import trio

from _helpers.appserver import roost_argv
from _helpers.timing import scaled

DEADLINE = scaled(20)

TEAM = """
Orchestration:
  Name: Team
  Agents:
    - {Name: Planner, Instructions: "You plan."}
    - {Name: Developer, Instructions: "You write code."}
    - {Name: Reviewer, Instructions: "You review."}
  Selection: %(selection)s
  Termination: %(termination)s
"""

SCRIPT = """
rules:
  - match: {agent: selector, prompt: "Last message from Planner"}
    steps: [[{text: "Developer"}]]
  - match: {agent: selector, prompt: "Last message from Developer"}
    steps: [[{text: "Reviewer"}]]
  - match: {agent: selector}
    steps: [[{text: "Planner"}]]
  - match: {agent: Planner}
    steps:
      - - {text: "Plan ready. HANDOFF TO DEVELOPER"}
  - match: {agent: Developer, prompt: "not approved"}
    steps:
      - - {text: "Understood, I keep working. HANDOFF TO REVIEWER"}
  - match: {agent: Developer}
    steps:
      - - {tool_call: {name: list_dir, arguments: {path: "."}}}
      - - {text: "Code written after seeing {tool_output}. HANDOFF TO REVIEWER"}
  - match: {agent: Reviewer}
    steps:
      - - {text: "Looks good. APPROVED"}
default: echo
"""

SHELL_SCRIPT = """
rules:
  - match: {agent: Planner}
    steps: [[{text: "Plan: run a command."}]]
  - match: {agent: Developer}
    steps:
      - - {tool_call: {name: shell, arguments: {command: "echo built > out.txt"}}}
      - - {text: "Shell said: {tool_output}"}
  - match: {agent: Reviewer}
    steps: [[{text: "APPROVED"}]]
default: echo
"""

ROUNDROBIN = "{Type: roundrobin}"
UNTIL_APPROVED = "{Type: composite, Strategies: [{Type: regex, Pattern: APPROVED, AgentNames: [Reviewer]}, {Type: maxiterations, MaxIterations: 9}]}"


def _setup(tmp_path: Path, *, selection: str = ROUNDROBIN, termination: str = UNTIL_APPROVED,
           script: str = SCRIPT) -> tuple[Path, Path]:
    config = tmp_path / "team.yaml"
    config.write_text(TEAM % {"selection": selection, "termination": termination})
    script_path = tmp_path / "script.yaml"
    script_path.write_text(script)
    return config, script_path


class Bridge:
    """A `roost run --bridge` process with line-oriented stdin/stdout."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.buffer = b""
        self.events: list[dict] = []

    async def next(self) -> dict:
        while b"\n" not in self.buffer:
            data = await self.proc.stdout.receive_some(65536)
            assert data, f"bridge closed stdout; events so far: {self.events}"
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        event = json.loads(line)
        self.events.append(event)
        return event

    async def until(self, kind: str) -> dict:
        while True:
            event = await self.next()
            if event["type"] == kind:
                return event

    async def send(self, obj: dict) -> None:
        await self.proc.stdin.send_all(json.dumps(obj).encode() + b"\n")

    async def finish(self) -> tuple[dict, int]:
        """Read up to result; check it is the last line; return it and the exit code."""
        result = await self.until("result")
        rest = b""
        while True:
            data = await self.proc.stdout.receive_some(65536)
            if not data:
                break
            rest += data
        assert (self.buffer + rest).strip() == b"", "result must be the last event"
        await self.proc.stdin.aclose()
        code = await self.proc.wait()
        return result, code


async def open_bridge(tmp_path: Path, script: Path, *args: str) -> Bridge:
    env = dict(os.environ, ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script))
    proc = await trio.lowlevel.open_process([*roost_argv(), "run", "--bridge", *args], cwd=str(tmp_path), env=env,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return Bridge(proc)


def _messages(events: list[dict]) -> list[tuple[str, str]]:
    return [(e["message"]["agentName"], e["message"]["content"]) for e in events if e["type"] == "agent_message"]


async def test_roundrobin_three_agents_until_regex(tmp_path: Path) -> None:
    config, script = _setup(tmp_path)
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(config), "Build a hello world")
        ready = await bridge.next()
        assert ready["type"] == "ready"
        assert ready["protocolVersion"] == 1 and ready["resumed"] is False
        assert ready["task"] == "Build a hello world" and ready["config"] == str(config.resolve())
        assert ready["agents"] == ["Planner", "Developer", "Reviewer"]
        result, code = await bridge.finish()
    kinds = [e["type"] for e in bridge.events]
    assert kinds == ["ready", "agent_starting", "agent_message", "agent_starting", "tool_calling", "agent_message",
                     "agent_starting", "agent_message", "result"]
    assert [e["agent"] for e in bridge.events if e["type"] == "agent_starting"] == ["Planner", "Developer", "Reviewer"]
    tool = next(e for e in bridge.events if e["type"] == "tool_calling")
    assert tool == {"type": "tool_calling", "agent": "Developer", "tool": "list_dir", "argsSummary": "."}
    dev = [e for e in bridge.events if e["type"] == "agent_message"][1]
    assert set(dev) == {"type", "message", "elapsedMs"} and isinstance(dev["elapsedMs"], int)
    msg = dev["message"]
    assert set(msg) == {"agentName", "role", "content", "turnIndex", "timestamp", "inputTokens", "outputTokens",
                        "isCompactionSummary", "toolCalls"}
    assert msg["agentName"] == "Developer" and msg["role"] == "assistant" and msg["turnIndex"] == 1
    assert msg["content"].startswith("Code written after seeing") and "team.yaml" in msg["content"]
    assert msg["toolCalls"] == [{"name": "list_dir", "argsSummary": ".", "succeeded": True}]
    assert result["succeeded"] is True and result["exitCode"] == 0 == code
    assert result["sessionId"] == ready["sessionId"] and result["turns"] == 3
    assert set(result) == {"type", "sessionId", "task", "config", "succeeded", "errorMessage", "exitCode", "turns",
                           "elapsedSeconds", "inputTokens", "outputTokens", "approvedActions", "deniedActions"}
    assert result["approvedActions"] == result["deniedActions"] == 0
    assert result["inputTokens"] > 0 and result["outputTokens"] > 0


async def test_sequential_each_agent_once(tmp_path: Path) -> None:
    config, script = _setup(tmp_path, selection="{Type: sequential}",
                            termination="{Type: maxiterations, MaxIterations: 10}")
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(config), "Task")
        result, code = await bridge.finish()
    assert [a for a, _ in _messages(bridge.events)] == ["Planner", "Developer", "Reviewer"]
    assert result["succeeded"] is True and code == 0 and result["turns"] == 3


async def test_max_iterations_and_token_budget_warning(tmp_path: Path) -> None:
    config, script = _setup(tmp_path, termination=(
        "{Type: composite, Strategies: [{Type: maxiterations, MaxIterations: 2}, {Type: token_budget, MaxTokens: 1000}]}"))
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(config), "Task")
        result, code = await bridge.finish()
    assert [a for a, _ in _messages(bridge.events)] == ["Planner", "Developer"]
    assert result["turns"] == 2 and code == 0
    config2, _ = _setup(tmp_path, termination="{Type: token_budget, MaxTokens: 30}")
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(config2), "Task")
        result, code = await bridge.finish()
    warnings = [e for e in bridge.events if e["type"] == "token_budget_warning"]
    assert len(warnings) == 1
    assert warnings[0]["warnThreshold"] == 24 and warnings[0]["inputTokens"] >= 24
    assert set(warnings[0]) == {"type", "agent", "inputTokens", "warnThreshold"}
    assert result["inputTokens"] + result["outputTokens"] >= 30 and code == 0
    # the warning comes right after the agent message that crossed the threshold, before the result
    index = bridge.events.index(warnings[0])
    assert bridge.events[index - 1]["type"] == "agent_message"


KEYWORD = """{Type: keyword, Routes: [
  {Keyword: HANDOFF TO DEVELOPER, Agent: Developer, SourceAgents: [Planner], RequireHumanApproval: true},
  {Keyword: HANDOFF TO REVIEWER, Agent: Reviewer}]}"""


async def test_keyword_route_approval_denied_then_approved(tmp_path: Path) -> None:
    config, script = _setup(tmp_path, selection=KEYWORD)
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(config), "Task")
        ask = await bridge.until("approval_request")
        assert ask == {"type": "approval_request", "kind": "route_approval", "keyword": "HANDOFF TO DEVELOPER",
                       "sourceAgent": "Planner", "targetAgent": "Developer"}
        await bridge.send({"type": "approval_response", "approved": False})
        ask = await bridge.until("approval_request")  # the Planner speaks again, and hands off again
        assert ask["kind"] == "route_approval"
        await bridge.send({"type": "approval_response", "approved": True})
        result, code = await bridge.finish()
    assert _messages(bridge.events)[:3] == [
        ("Planner", "Plan ready. HANDOFF TO DEVELOPER"),
        ("Orchestrator", "The handoff from Planner to Developer was not approved by a human. Planner, continue "
                         "without handing off to Developer."),
        ("Planner", "Plan ready. HANDOFF TO DEVELOPER"),
    ]
    orchestrator = [e["message"] for e in bridge.events if e["type"] == "agent_message"][1]
    assert orchestrator["role"] == "user"
    assert [a for a, _ in _messages(bridge.events)][3:] == ["Developer", "Reviewer"]
    assert result["succeeded"] is True and code == 0 and result["turns"] == 4
    assert result["deniedActions"] == 1 and result["approvedActions"] == 1   # additive, as in run --json


async def test_llm_selection(tmp_path: Path) -> None:
    config, script = _setup(tmp_path, selection="{Type: llm}")
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(config), "Task")
        result, code = await bridge.finish()
    assert [a for a, _ in _messages(bridge.events)] == ["Planner", "Developer", "Reviewer"]
    assert result["succeeded"] is True and code == 0


async def test_shell_approval_interrupt_then_resume(tmp_path: Path) -> None:
    config, script = _setup(tmp_path, script=SHELL_SCRIPT)
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(config), "Task")
        ready = await bridge.next()
        ask = await bridge.until("approval_request")
        assert ask == {"type": "approval_request", "kind": "shell_command", "command": "echo built > out.txt"}
        prior = bridge.events[-2]
        assert prior == {"type": "tool_calling", "agent": "Developer", "tool": "shell",
                         "argsSummary": "echo built > out.txt"}
        await bridge.send({"type": "interrupt"})
        result, code = await bridge.finish()
    assert result["succeeded"] is False and result["exitCode"] == 130 == code
    assert result["sessionId"] == ready["sessionId"] and result["errorMessage"]
    assert not (tmp_path / "out.txt").exists()
    session = ready["sessionId"]
    listed = subprocess.run([*roost_argv(), "sessions", "--json"], capture_output=True, check=True, cwd=tmp_path)
    items = json.loads(listed.stdout)["items"]
    assert [(i["sessionId"], i["isComplete"], i["task"]) for i in items] == [(session, False, "Task")]

    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "--resume", session)
        ready2 = await bridge.next()
        assert ready2["resumed"] is True and ready2["sessionId"] == session and ready2["task"] == "Task"
        assert await bridge.next() == {"type": "agent_starting", "agent": "Developer"}
        result, code = await bridge.finish()
    # The interrupted agent continues its turn: it sees its interrupted tool call's result.
    assert _messages(bridge.events) == [
        ("Developer", "Shell said: error: the tool call was interrupted before it produced a result"),
        ("Reviewer", "APPROVED")]
    assert result["succeeded"] is True and code == 0 and result["turns"] == 3
    assert not (tmp_path / "out.txt").exists()
    done = subprocess.run([*roost_argv(), "sessions", "--all", "--json"], capture_output=True, check=True, cwd=tmp_path)
    assert [i["isComplete"] for i in json.loads(done.stdout)["items"]] == [True]
    shown = subprocess.run([*roost_argv(), "sessions", "--show", session, "--json"], capture_output=True, check=True,
                           cwd=tmp_path)
    agents = [m["agentName"] for m in json.loads(shown.stdout)["item"]["messages"]]
    assert agents == ["Human", "Planner", "Developer", "Reviewer"]


async def test_shell_approval_approved_runs_the_command(tmp_path: Path) -> None:
    config, script = _setup(tmp_path, script=SHELL_SCRIPT)
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(config), "Task")
        ask = await bridge.until("approval_request")
        assert ask["kind"] == "shell_command"
        await bridge.send({"type": "approval_response", "approved": True})
        result, code = await bridge.finish()
    assert result["succeeded"] is True and code == 0
    assert (tmp_path / "out.txt").read_text().strip() == "built"
    dev = [e["message"] for e in bridge.events if e["type"] == "agent_message"][1]
    assert dev["toolCalls"] == [{"name": "shell", "argsSummary": "echo built > out.txt", "succeeded": True}]


async def test_denied_file_write_and_malformed_response(tmp_path: Path) -> None:
    script = tmp_path / "w.yaml"
    script.write_text("""
rules:
  - match: {agent: Planner}
    steps:
      - - {tool_call: {name: write_file, arguments: {path: notes.txt, content: "hi"}}}
      - - {text: "Write said: {tool_output}"}
  - match: {agent: Reviewer}
    steps: [[{text: "APPROVED"}]]
default: [[{text: "ok"}]]
""")
    config, _ = _setup(tmp_path)
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(config), "Task")
        ask = await bridge.until("approval_request")
        await bridge.send({"type": "approval_response", "approved": "yes"})  # malformed: denied
        result, code = await bridge.finish()
    assert ask["kind"] == "file_write" and ask["path"].endswith("notes.txt")
    assert {"plugin", "action", "path", "oldContent", "newContent"} <= set(ask)
    assert not (tmp_path / "notes.txt").exists()
    assert code == 0 and result["succeeded"] is True
    assert result["deniedActions"] == 1 and result["approvedActions"] == 0


async def test_sigint_ends_with_result_not_succeeded(tmp_path: Path) -> None:
    config, script = _setup(tmp_path, script=SHELL_SCRIPT)
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(config), "Task")
        await bridge.until("approval_request")
        bridge.proc.send_signal(signal.SIGINT)
        result, code = await bridge.finish()
    assert result["succeeded"] is False and code == 130


async def test_fails_before_start_sends_only_result(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("Orchestration:\n  Agents:\n    - {Description: no name}\n")
    _, script = _setup(tmp_path)
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(bad), "Task")
        result, code = await bridge.finish()
    assert [e["type"] for e in bridge.events] == ["result"]
    assert result["sessionId"] is None and result["succeeded"] is False and code == 1 == result["exitCode"]
    assert "Orchestration.Agents[0].Name" in result["errorMessage"]
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "--resume", "thr_nope")
        result, code = await bridge.finish()
    assert [e["type"] for e in bridge.events] == ["result"] and result["sessionId"] is None and code == 1


async def test_hitl_with_bridge_is_refused(tmp_path: Path) -> None:
    config, script = _setup(tmp_path)
    with trio.fail_after(DEADLINE):
        done = await trio.run_process([*roost_argv(), "run", "--bridge", "--hitl", "-c", str(config), "Task"],
                                      capture_stdout=True, capture_stderr=True, check=False, cwd=str(tmp_path),
                                      stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stdout == b""
    assert b"--hitl" in done.stderr


async def test_interrupt_during_route_approval_then_resume_asks_again(tmp_path: Path) -> None:
    config, script = _setup(tmp_path, selection=KEYWORD)
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(config), "Task")
        ready = await bridge.next()
        await bridge.until("approval_request")
        await bridge.send({"type": "interrupt"})
        result, code = await bridge.finish()
    assert result["succeeded"] is False and code == 130 and result["turns"] == 1
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "--resume", ready["sessionId"])
        assert (await bridge.next())["resumed"] is True
        ask = await bridge.next()  # the route is asked again before anyone speaks
        assert ask == {"type": "approval_request", "kind": "route_approval", "keyword": "HANDOFF TO DEVELOPER",
                       "sourceAgent": "Planner", "targetAgent": "Developer"}
        await bridge.send({"type": "approval_response", "approved": True})
        result, code = await bridge.finish()
    assert [a for a, _ in _messages(bridge.events)] == ["Developer", "Reviewer"]
    assert result["succeeded"] is True and code == 0 and result["turns"] == 3


async def test_agent_plugins_limit_its_tools(tmp_path: Path) -> None:
    config, script = _setup(tmp_path, script=SHELL_SCRIPT)
    config.write_text(config.read_text().replace('Instructions: "You write code."}',
                                                 'Instructions: "You write code.", Plugins: [files]}'))
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(config), "Task")
        result, code = await bridge.finish()  # no approval_request: the Developer has no shell tool
    assert "approval_request" not in [e["type"] for e in bridge.events]
    dev = [e["message"] for e in bridge.events if e["type"] == "agent_message"][1]
    assert dev["content"] == "Shell said: error: unknown tool 'shell'"
    assert dev["toolCalls"] == [{"name": "shell", "argsSummary": "echo built > out.txt", "succeeded": False}]
    assert code == 0 and not (tmp_path / "out.txt").exists()


async def test_bad_input_lines_get_error_events_and_a_malformed_answer_denies(tmp_path: Path) -> None:
    config, script = _setup(tmp_path, script=SHELL_SCRIPT)
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(config), "Task")
        await bridge.until("ready")
        await bridge.send({"type": "approval_response", "approved": True})  # nothing pending yet
        early = await bridge.until("error")
        await bridge.send({"type": "frobnicate"})
        unknown = await bridge.until("error")
        await bridge.send({"approved": True})  # no type: says so (not "type None"), and approves nothing
        missing = await bridge.until("error")
        await bridge.until("approval_request")
        await bridge.proc.stdin.send_all(b"{not json\n")  # the pending approval is denied
        malformed = await bridge.until("error")
        result, code = await bridge.finish()
    assert "no approval is pending" in early["text"]
    assert "unknown input type 'frobnicate'" in unknown["text"]
    assert 'no "type" field' in missing["text"] and "None" not in missing["text"]
    assert missing["code"] == "invalid_request"
    assert "the pending approval is denied" in malformed["text"]
    # the additive code, as on the serve socket
    assert (early["code"], unknown["code"], malformed["code"]) == ("invalid_request", "invalid_request", "parse_error")
    assert not (tmp_path / "out.txt").exists()  # the shell command was denied, not run
    assert code == 0 and result["succeeded"] is True


async def test_a_closed_stdout_interrupts_quietly_and_the_run_resumes(tmp_path: Path) -> None:
    config, script = _setup(tmp_path, script=SHELL_SCRIPT)
    env = dict(os.environ, ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script))
    with trio.fail_after(DEADLINE):
        proc = await trio.lowlevel.open_process(
            [*roost_argv(), "run", "--bridge", "-c", str(config), "Task"], cwd=str(tmp_path), env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = b""
        while b"\n" not in first:
            first += await proc.stdout.receive_some(65536)
        await proc.stdout.aclose()  # like `| head -1`
        errors = b""
        while chunk := await proc.stderr.receive_some(65536):
            errors += chunk
        code = await proc.wait()
    ready = json.loads(first.split(b"\n")[0])
    assert ready["type"] == "ready" and code in (1, 130)
    assert b"Traceback" not in errors, errors.decode()
    with trio.fail_after(DEADLINE):
        resumed = await open_bridge(tmp_path, script, "--resume", ready["sessionId"])
        await resumed.until("approval_request")
        await resumed.send({"type": "approval_response", "approved": True})
        result, code = await resumed.finish()
    assert result["succeeded"] is True and code == 0


async def test_sigterm_interrupts_resumably(tmp_path: Path) -> None:
    config, script = _setup(tmp_path, script=SHELL_SCRIPT)
    with trio.fail_after(DEADLINE):
        bridge = await open_bridge(tmp_path, script, "-c", str(config), "Task")
        await bridge.until("approval_request")
        bridge.proc.send_signal(signal.SIGTERM)
        result, code = await bridge.finish()
    assert result["succeeded"] is False and code == 130 and result["sessionId"]
