"""Issue 14, "Also": `roost exec --script` with a missing or broken file fails like run/repl/app-server,
and `roost run --resume ID` keeps the model settings the run started with (flags may override)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import trio
from _helpers.appserver import roost_argv
from _helpers.timing import scaled

TEAM = """
Orchestration:
  Name: Team
  Agents:
    - {Name: Planner, Instructions: "You plan."}
    - {Name: Developer, Instructions: "You write code."}
    - {Name: Reviewer, Instructions: "You review."}
  Selection: {Type: roundrobin}
  Termination: {Type: composite, Strategies: [{Type: regex, Pattern: APPROVED, AgentNames: [Reviewer]}, {Type: maxiterations, MaxIterations: 9}]}
"""

SCRIPT = """
rules:
  - match: {agent: Planner}
    steps: [[{text: "Plan: run a command."}]]
  - match: {agent: Developer}
    steps:
      - - {tool_call: {name: shell, arguments: {command: "echo built > out.txt"}}}
      - - {text: "%s"}
  - match: {agent: Reviewer}
    steps: [[{text: "APPROVED"}]]
default: echo
"""


def _env() -> dict[str, str]:
    """The environment with no model settings at all (ROOST_HOME kept)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ROOST_") or k == "ROOST_HOME"}


@pytest.mark.parametrize("content", [None, "rules: [\n", "rules: 5\n"])
async def test_exec_with_a_missing_or_broken_script_fails_like_the_other_commands(tmp_path: Path, content) -> None:
    script = tmp_path / "script.yaml"
    if content is not None:
        script.write_text(content)
    argv = [*roost_argv(), "exec", "--provider", "scripted", "--script", str(script), "hello"]
    with trio.fail_after(scaled(30)):
        done = await trio.run_process(argv, env=_env(), cwd=str(tmp_path), capture_stdout=True, capture_stderr=True,
                                      check=False, stdin=subprocess.DEVNULL)
        repl = await trio.run_process([*roost_argv(), "repl", "--provider", "scripted", "--script", str(script)],
                                      env=_env(), cwd=str(tmp_path), capture_stdout=True, capture_stderr=True,
                                      check=False, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stdout == b""  # the demo script never plays
    message = done.stderr.decode()
    assert "the scripted engine's script is unusable" in message and str(script) in message
    assert "Traceback" not in message
    # the same reason as roost repl gives
    assert message.split("error: ", 1)[1].strip() in (repl.stdout + repl.stderr).decode()


class Bridge:
    """A `roost run --bridge` process, one JSON event per stdout line."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.buffer = b""
        self.events: list[dict] = []

    async def until(self, kind: str) -> dict:
        while True:
            while b"\n" not in self.buffer:
                data = await self.proc.stdout.receive_some(65536)
                assert data, f"bridge closed stdout; events so far: {self.events}"
                self.buffer += data
            line, self.buffer = self.buffer.split(b"\n", 1)
            event = json.loads(line)
            self.events.append(event)
            if event["type"] == kind:
                return event

    async def send(self, obj: dict) -> None:
        await self.proc.stdin.send_all(json.dumps(obj).encode() + b"\n")

    async def finish(self) -> dict:
        result = await self.until("result")
        await self.proc.stdin.aclose()
        await self.proc.wait()
        return result


async def _bridge(tmp_path: Path, *args: str) -> Bridge:
    proc = await trio.lowlevel.open_process([*roost_argv(), "run", "--bridge", *args], cwd=str(tmp_path), env=_env(),
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return Bridge(proc)


async def _interrupted_session(tmp_path: Path, script: Path, config: Path) -> str:
    bridge = await _bridge(tmp_path, "--provider", "scripted", "--script", str(script), "-c", str(config), "Task")
    ready = await bridge.until("ready")
    await bridge.until("approval_request")
    await bridge.send({"type": "interrupt"})
    result = await bridge.finish()
    assert result["succeeded"] is False
    return ready["sessionId"]


def _said(events: list[dict]) -> list[tuple[str, str]]:
    return [(e["message"]["agentName"], e["message"]["content"]) for e in events if e["type"] == "agent_message"]


async def test_run_resume_keeps_the_model_settings_it_started_with_and_flags_override(tmp_path: Path) -> None:
    config = tmp_path / "team.yaml"
    config.write_text(TEAM)
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(SCRIPT % "from the first script")
    second.write_text(SCRIPT % "from the second script")
    with trio.fail_after(scaled(60)):
        # Started with flags; resumed with no flag and no environment: the session's own settings.
        session = await _interrupted_session(tmp_path, first, config)
        resumed = await _bridge(tmp_path, "--resume", session)
        result = await resumed.finish()
        assert result["succeeded"] is True, result
        assert ("Developer", "from the first script") in _said(resumed.events)
        # A flag given at resume overrides the stored setting.
        session = await _interrupted_session(tmp_path, first, config)
        resumed = await _bridge(tmp_path, "--resume", session, "--script", str(second))
        result = await resumed.finish()
        assert result["succeeded"] is True, result
        assert ("Developer", "from the second script") in _said(resumed.events)
