"""``roost serve`` running orchestration configs: ``serve -c`` and ``schedule add --config``.

The real daemon on the scripted engine (rules with ``match: {agent: NAME}`` give each agent its
reply), driven over its serve socket / WebSocket: a task dispatched by a client runs the daemon's
``-c`` team of agents (``agent_starting`` per agent, ``token`` events with the agent's name, the
result naming the last agent), a keyword route that needs a human asks the dispatching client with
``route_approval``, an interrupt stops the run, a restarted daemon continues the run, and schedules
run their own config (or the daemon's default). Unusable configs are refused up front.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import trio

from _helpers.appserver import roost_argv
from _helpers.serve_client import open_daemon, short_socket_path, start_daemon
from _helpers.timing import scaled

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

SOLO = """
Orchestration:
  Name: Solo
  Agents:
    - {Name: Soloist, Instructions: "You work alone."}
  Selection: {Type: sequential}
  Termination: {Type: maxiterations, MaxIterations: 1}
"""

SCRIPT = """
rules:
  - match: {agent: Planner}
    steps: [[{text: "Plan ready. HANDOFF TO DEVELOPER"}]]
  - match: {agent: Developer}
    steps:
      - - {tool_call: {name: list_dir, arguments: {path: "."}}}
      - - {text: "Code written. HANDOFF TO REVIEWER"}
  - match: {agent: Reviewer}
    steps: [[{text: "Looks good. APPROVED"}]]
  - match: {agent: Soloist}
    steps: [[{text: "Solo work done."}]]
default: echo
"""

#: the Developer never finishes (the daemon is interrupted or killed meanwhile)
SLOW_SCRIPT = SCRIPT.replace('''  - match: {agent: Developer}
    steps:''', '''  - match: {agent: Developer}
    steps:
      - - {text: "Working..."}
        - {delay: 120}''')

ROUNDROBIN = "{Type: roundrobin}"
UNTIL_APPROVED = ("{Type: composite, Strategies: [{Type: regex, Pattern: APPROVED, AgentNames: [Reviewer]}, "
                  "{Type: maxiterations, MaxIterations: 9}]}")
KEYWORD = """{Type: keyword, Routes: [
  {Keyword: HANDOFF TO DEVELOPER, Agent: Developer, SourceAgents: [Planner], RequireHumanApproval: true},
  {Keyword: HANDOFF TO REVIEWER, Agent: Reviewer}]}"""
AGENTS = ["Planner", "Developer", "Reviewer"]


def _write(tmp_path: Path, *, selection: str = ROUNDROBIN, termination: str = UNTIL_APPROVED,
           script: str = SCRIPT, name: str = "team.yaml") -> tuple[Path, Path]:
    config = tmp_path / name
    config.write_text(TEAM % {"selection": selection, "termination": termination})
    script_path = tmp_path / f"script-{name}"
    script_path.write_text(script)
    return config, script_path


def roost(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*roost_argv(), *args], capture_output=True, text=True, timeout=scaled(60), cwd=cwd)


async def _dispatch(client, text: str) -> str:
    start = len(client.events)
    await client.send({"type": "user_input", "text": text})
    return (await client.wait_for("queued", start=start))["sessionId"]


def _of(client, kind: str, sid: str) -> list[dict]:
    return [e for e in client.of_type(kind) if e.get("sessionId") == sid]


def _starting(client, sid: str) -> list[str]:
    return [e["agent"] for e in _of(client, "agent_starting", sid)]


async def test_serve_c_runs_three_agents_for_a_client(tmp_path: Path) -> None:
    config, script = _write(tmp_path)
    async with open_daemon(script=script, args=["-c", str(config), "--work-dir", str(tmp_path)]) as daemon:
        async with daemon.unix() as owner, daemon.unix() as bystander:
            await owner.wait_for("hello")
            await bystander.wait_for("hello")
            sid = await _dispatch(owner, "Build a hello world")
            result = await owner.wait_for("result", lambda e: e["sessionId"] == sid)
            await bystander.wait_for("agent_starting", lambda e: e["sessionId"] == sid and e["agent"] == "Reviewer")
    assert result == {"type": "result", "sessionId": sid, "task": "Build a hello world", "succeeded": True,
                      "errorMessage": None, "lastAgent": "Reviewer", "lastMessage": "Looks good. APPROVED"}
    for client in (owner, bystander):   # progress is broadcast, each event exactly once
        assert _starting(client, sid) == AGENTS
        assert _of(client, "agent_starting", sid)[0] == {"type": "agent_starting", "agent": "Planner",
                                                         "sessionId": sid}
    assert [e["agent"] for e in _of(owner, "tool_calling", sid)] == ["Developer"]
    assert _of(owner, "tool_calling", sid)[0]["tool"] == "list_dir"
    tokens = _of(owner, "token", sid)
    said = {agent: "".join(e["text"] for e in tokens if e["agent"] == agent) for agent in AGENTS}
    assert said == {"Planner": "Plan ready. HANDOFF TO DEVELOPER", "Developer": "Code written. HANDOFF TO REVIEWER",
                    "Reviewer": "Looks good. APPROVED"}
    kinds = [t for t in owner.types() if t in ("queued", "agent_starting", "tool_calling", "result")]
    assert kinds == ["queued", "agent_starting", "agent_starting", "tool_calling", "agent_starting", "result"]
    assert not owner.of_type("agent_message") and not owner.of_type("token_budget_warning")
    assert not bystander.of_type("result")
    sessions = json.loads(roost("sessions", "--json", "--all").stdout)["items"]
    assert [(s["sessionId"], s["task"], s["isComplete"]) for s in sessions] == [(sid, "Build a hello world", True)]


async def test_route_approval_goes_to_the_dispatching_client(tmp_path: Path) -> None:
    config, script = _write(tmp_path, selection=KEYWORD)
    async with open_daemon(script=script, args=["-c", str(config)]) as daemon:
        async with daemon.ws(client_id="owner") as owner, daemon.ws(client_id="other") as other:
            await owner.wait_for("hello")
            await other.wait_for("hello")
            sid = await _dispatch(owner, "Ship it")
            ask = await owner.wait_for("approval_request")
            assert ask == {"type": "approval_request", "kind": "route_approval", "keyword": "HANDOFF TO DEVELOPER",
                           "sourceAgent": "Planner", "targetAgent": "Developer", "sessionId": sid}
            await owner.send({"type": "approval_response", "approved": False})   # the Planner goes on
            start = owner.events.index(ask) + 1
            again = await owner.wait_for("approval_request", start=start)
            assert again["kind"] == "route_approval" and again["sourceAgent"] == "Planner"
            await owner.send({"type": "approval_response", "approved": True})    # now hand off
            result = await owner.wait_for("result", lambda e: e["sessionId"] == sid)
    assert _starting(owner, sid) == ["Planner", "Planner", "Developer", "Reviewer"]
    assert result["succeeded"] is True and result["lastAgent"] == "Reviewer"
    assert result["lastMessage"] == "Looks good. APPROVED"
    assert not other.of_type("approval_request")
    # a route approval has no tool call: the only tool_calling is the Developer's real one
    # (never an empty one before the route_approval)
    for client in (owner, other):
        assert [(e["agent"], e["tool"]) for e in _of(client, "tool_calling", sid)] == [("Developer", "list_dir")]
    planner = "".join(e["text"] for e in _of(owner, "token", sid) if e["agent"] == "Planner")
    assert planner == "Plan ready. HANDOFF TO DEVELOPER" * 2      # it spoke again after the denial


async def test_piped_attach_answers_a_route_approval(tmp_path: Path) -> None:
    # the new-user trial: `printf 'Ship it\ny\n' | roost attach` with a keyword route that needs a
    # human: "y" answers the route approval (it is not queued as a task) and no empty
    # "Planner calls : " line is shown before the approval
    config, script = _write(tmp_path, selection=KEYWORD)
    async with open_daemon(script=script, args=["-c", str(config)]) as daemon:
        done = await trio.run_process([*roost_argv(), "attach", daemon.socket], stdin=b"Ship it\ny\n",
                                      capture_stdout=True, capture_stderr=True, check=False)
    out = done.stdout.decode()
    assert done.returncode == 0, (out, done.stderr.decode())
    assert "approval needed: route_approval\n  Planner -> Developer (keyword 'HANDOFF TO DEVELOPER')" in out
    assert "approve? [y/N] approved\n" in out
    assert "calls : " not in out and "Planner calls" not in out
    assert "Developer calls list_dir" in out
    assert out.count("queued, position") == 1                 # "y" was an answer, not a task
    assert "result: succeeded ('Ship it')" in out and "  Reviewer: Looks good. APPROVED" in out


async def test_unattended_route_is_denied_and_token_budget_warns_once(tmp_path: Path) -> None:
    # no client can be asked (an anonymous client that left): the route is denied, the Planner
    # keeps the floor until MaxIterations; the config's token budget warns once (the daemon's
    # own --token-warn-threshold is not used for orchestrated tasks)
    config, script = _write(tmp_path, selection=KEYWORD, termination=(
        "{Type: composite, Strategies: [{Type: maxiterations, MaxIterations: 2}, {Type: token_budget, MaxTokens: 30}]}"))
    async with open_daemon(script=script, args=["-c", str(config), "--token-warn-threshold", "1",
                                                "--reconnect-grace", "0"]) as daemon:
        async with daemon.unix() as watcher:
            await watcher.wait_for("hello")
            async with daemon.unix() as owner:
                await owner.wait_for("hello")
                sid = await _dispatch(owner, "Plan alone")
            await watcher.wait_for("token_budget_warning", lambda e: e["sessionId"] == sid)
            with trio.fail_after(scaled(30)):   # the session completes (MaxIterations or the token budget)
                while not json.loads(roost("sessions", "--json", "--all").stdout)["items"][0]["isComplete"]:
                    await trio.sleep(0.2)
    assert set(_starting(watcher, sid)) == {"Planner"}        # the handoff was never approved
    [warning] = _of(watcher, "token_budget_warning", sid)
    assert warning["warnThreshold"] == 24 and warning["agent"] == "Planner" and warning["inputTokens"] >= 24
    assert not watcher.of_type("approval_request")


async def test_interrupt_stops_the_run(tmp_path: Path) -> None:
    config, script = _write(tmp_path, script=SLOW_SCRIPT)
    async with open_daemon(script=script, args=["-c", str(config)]) as daemon:
        async with daemon.ws(client_id="owner") as owner:
            await owner.wait_for("hello")
            sid = await _dispatch(owner, "Take your time")
            await owner.wait_for("token", lambda e: e["sessionId"] == sid and e["agent"] == "Developer")
            await owner.send({"type": "interrupt"})
            result = await owner.wait_for("result", lambda e: e["sessionId"] == sid)
    assert result["succeeded"] is False and "interrupt" in result["errorMessage"]
    assert result["lastAgent"] in ("Planner", "Developer")
    assert _starting(owner, sid) == ["Planner", "Developer"]


async def test_restarted_daemon_continues_the_run(tmp_path: Path) -> None:
    config, slow = _write(tmp_path, script=SLOW_SCRIPT)
    _, fast = _write(tmp_path, name="fast.yaml")
    socket_path = short_socket_path()
    async with trio.open_nursery() as nursery:
        first = await start_daemon(nursery, script=slow, socket=socket_path, args=["-c", str(config)])
        try:
            async with first.ws(client_id="owner") as owner:
                await owner.wait_for("hello")
                sid = await _dispatch(owner, "Survive a restart")
                await owner.wait_for("token", lambda e: e["sessionId"] == sid and e["agent"] == "Developer")
                first.kill9()
                await first.process.wait()
        finally:
            if first.process.returncode is None:
                first.kill9()
                await first.process.wait()
        second = await start_daemon(nursery, script=fast, socket=socket_path, args=["-c", str(config)])
        try:
            async with second.ws(client_id="owner") as owner:
                await owner.wait_for("hello")
                assert (await owner.wait_for("task_resumed"))["sessionId"] == sid
                result = await owner.wait_for("result", lambda e: e["sessionId"] == sid)
        finally:
            second.process.send_signal(15)
            await second.process.wait()
    # The run continues where it was: the Planner already spoke and does not speak again. (The
    # Developer's agent_starting can go out before this client's hello under load: the daemon
    # resumes the task as it starts, and events are not replayed to a client attached later.)
    assert _starting(owner, sid) in (["Developer", "Reviewer"], ["Reviewer"])
    assert result["succeeded"] is True and result["lastAgent"] == "Reviewer"


def test_serve_refuses_an_unusable_config(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    bad = tmp_path / "bad.yaml"
    bad.write_text("Orchestration:\n  Name: Broken\n  Agents: []\n")
    for path, hint in ((tmp_path / "missing.yaml", "missing.yaml"), (bad, "bad.yaml")):
        done = subprocess.run([*roost_argv(), "serve", "--provider", "scripted", "--script", str(script),
                               "--socket", short_socket_path(), "-c", str(path)],
                              capture_output=True, text=True, timeout=scaled(60))
        assert done.returncode == 2, done.stderr
        assert done.stdout == ""                              # it never listened
        assert done.stderr.startswith("roost serve: ") and hint in done.stderr
    helped = subprocess.run([*roost_argv(), "serve", "--help"], capture_output=True, text=True, timeout=scaled(60))
    assert "-c, --config" in helped.stdout


def test_serve_refuses_a_config_whose_agent_model_cannot_be_used(tmp_path: Path) -> None:
    # the Developer's model alias names a key variable that is unset: like `roost run`, the daemon
    # refuses the config at start (exit 2, naming the agent and the variable) instead of failing
    # every task later
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    config = tmp_path / "keyless.yaml"
    config.write_text(TEAM.replace("  Agents:\n", "  Models:\n"
                                   "    claude: {Provider: anthropic, ModelId: x, ApiKeyEnv: ROOST_TEST_UNSET_KEY}\n"
                                   "  Agents:\n").replace(
        'Instructions: "You write code."}', 'Instructions: "You write code.", Model: claude}') % {
        "selection": ROUNDROBIN, "termination": UNTIL_APPROVED})
    env = {k: v for k, v in os.environ.items() if k != "ROOST_TEST_UNSET_KEY"}
    socket_path = short_socket_path()
    done = subprocess.run([*roost_argv(), "serve", "--provider", "scripted", "--script", str(script),
                           "--socket", socket_path, "-c", str(config)],
                          capture_output=True, text=True, timeout=scaled(60), env=env)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""                                  # it never listened
    assert done.stderr.startswith("roost serve: ") and "keyless.yaml" in done.stderr
    assert "agent Developer" in done.stderr and "ROOST_TEST_UNSET_KEY" in done.stderr
    assert not os.path.exists(socket_path)


@pytest.mark.parametrize("as_json", [False, True])
def test_schedule_add_refuses_an_unusable_config(tmp_path: Path, as_json: bool) -> None:
    (tmp_path / "bad.yaml").write_text("Orchestration: [not, a, mapping]\n")
    for config in ("bad.yaml", "missing.yaml"):
        added = roost("schedule", "add", "nightly", "--cron", "0 3 * * *", "--task", "t", "--config", config,
                      *(["--json"] if as_json else []), cwd=tmp_path)
        assert added.returncode == 1
        if as_json:
            assert "invalid --config" in json.loads(added.stdout)["error"] and config in added.stdout
        else:
            assert added.stderr.startswith("roost schedule add: invalid --config") and config in added.stderr
    assert json.loads(roost("schedule", "list", "--json").stdout)["items"] == []


async def test_schedules_run_their_config_or_the_daemon_default(tmp_path: Path) -> None:
    config, script = _write(tmp_path)
    (tmp_path / "solo.yaml").write_text(SOLO)
    added = roost("schedule", "add", "team", "--cron", "0 3 * * *", "--task", "scheduled team work",
                  "--config", "team.yaml", cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    plain = roost("schedule", "add", "plain", "--cron", "0 4 * * *", "--task", "scheduled default work",
                  cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    listed = {j["name"]: j for j in json.loads(roost("schedule", "list", "--json").stdout)["items"]}
    assert Path(listed["team"]["config"]) == config.resolve() and listed["plain"]["config"] is None
    async with open_daemon(script=script, args=["-c", str(tmp_path / "solo.yaml"),
                                                "--work-dir", str(tmp_path)]) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")
            assert roost("schedule", "run", "team").returncode == 0
            first = await client.wait_for("agent_starting")
            sid = first["sessionId"]
            await client.wait_for("agent_starting", lambda e: e["sessionId"] == sid and e["agent"] == "Reviewer")
            assert roost("schedule", "run", "plain").returncode == 0
            solo = await client.wait_for("agent_starting", lambda e: e["sessionId"] != sid)
            await client.wait_for("token", lambda e: e["sessionId"] == solo["sessionId"] and "done" in e["text"])
            with trio.fail_after(scaled(30)):   # both sessions complete
                while True:
                    sessions = json.loads(roost("sessions", "--json", "--all").stdout)["items"]
                    if len(sessions) == 2 and all(s["isComplete"] for s in sessions):
                        break
                    await trio.sleep(0.2)
    assert _starting(client, sid) == AGENTS
    assert _starting(client, solo["sessionId"]) == ["Soloist"]
    solo_text = "".join(e["text"] for e in _of(client, "token", solo["sessionId"]))
    assert solo_text == "Solo work done."
    assert {s["task"] for s in sessions} == {"scheduled team work", "scheduled default work"}


async def test_a_config_gone_by_the_time_the_task_starts_fails_the_task(tmp_path: Path) -> None:
    config, script = _write(tmp_path)
    async with open_daemon(script=script, args=["-c", str(config)]) as daemon:
        config.unlink()                                       # valid at start, unreadable at run time
        async with daemon.unix() as owner:
            await owner.wait_for("hello")
            sid = await _dispatch(owner, "Doomed")
            result = await owner.wait_for("result", lambda e: e["sessionId"] == sid)
    assert result["succeeded"] is False and result["lastAgent"] is None and result["lastMessage"] is None
    assert "team.yaml" in result["errorMessage"] and "cannot read" in result["errorMessage"]
    assert not owner.of_type("agent_starting")


def test_translator_of_an_orchestrated_task() -> None:
    from roost.protocol._serve_events import TaskEventTranslator

    t = TaskEventTranslator("s1", "assistant", warn_threshold=1, orchestrated=True)
    assert t.run_event({"type": "agent_starting", "agent": "Planner"}) == [
        {"type": "agent_starting", "agent": "Planner", "sessionId": "s1"}]
    assert t.translate("turn/started", {"turn": {"id": "t"}}) == []          # announced by the run already
    assert t.translate("item/agentMessage/delta", {"delta": "hi"}) == [
        {"type": "token", "sessionId": "s1", "agent": "Planner", "text": "hi"}]
    assert t.translate("turn/usage", {"usage": {"input_tokens": 500}}) == []  # the config's budget warns instead
    assert t.run_event({"type": "token_budget_warning", "agent": "Planner", "inputTokens": 30,
                        "warnThreshold": 24}) == [
        {"type": "token_budget_warning", "agent": "Planner", "inputTokens": 30, "warnThreshold": 24, "sessionId": "s1"}]
    assert t.run_event({"type": "tool_calling", "agent": "Planner", "tool": "shell", "argsSummary": "ls"}) == []
    assert t.run_event({"type": "agent_message", "message": {}, "elapsedMs": 1}) == []
