"""Every field of every event a real wire session sends is documented in docs/wire.md.

Drives ``roost repl --vscode``, ``roost run --bridge`` and ``roost serve`` (WebSocket) through the
real command with the scripted engine, and checks each received event's fields against the fields
its row in docs/wire.md names. A field added to an event in the code without the docs fails here.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from _helpers.appserver import roost_argv, script_env, scripted_env
from _helpers.serve_client import open_daemon
from test_docs_protocol import DOCS, ROW, sections
from test_repl import open_repl
from _helpers.timing import scaled

#: The kind-specific fields of approval_request (docs/wire.md, "Prompts").
KIND_FIELDS = {"command", "plugin", "action", "detail", "path", "oldContent", "newContent", "keyword",
               "sourceAgent", "targetAgent"}

CHAT = """
rules:
  - match: {prompt: "^write"}
    steps:
      - - {text: "Writing."}
        - {tool_call: {name: write_file, arguments: {path: "out.txt", content: "one\\ntwo\\n"}}}
      - - {text: "Result: {tool_output}"}
  - match: {prompt: "^list"}
    steps:
      - - {reasoning: "Let me look."}
        - {tool_call: {name: list_dir, arguments: {path: "."}}}
      - - {text: "Listed."}
default: echo
"""

TEAM = """
Orchestration:
  Name: Team
  Agents:
    - {Name: Planner, Instructions: "You plan."}
    - {Name: Developer, Instructions: "You write code."}
  Selection: {Type: sequential}
  Termination: {Type: maxiterations, MaxIterations: 2}
"""

TEAM_SCRIPT = """
rules:
  - match: {agent: Planner}
    steps: [[{text: "Plan ready."}]]
  - match: {agent: Developer}
    steps:
      - - {tool_call: {name: list_dir, arguments: {path: "."}}}
      - - {text: "Done after {tool_output}"}
default: echo
"""


def documented_fields(heading: str) -> dict[str, set[str]]:
    """Event type -> the backticked names in its row (fields, and harmless extras such as values)."""
    out: dict[str, set[str]] = {}
    for line in sections(DOCS / "wire.md", "### ")[heading].splitlines():
        match = ROW.match(line)
        if match:
            cells = line.split("|")
            names = set(re.findall(r"`([A-Za-z_]+)\??`", cells[2] if len(cells) > 2 else ""))
            out.setdefault(match.group(1), set()).update(names)
    return out


def check(events: list[dict], heading: str) -> set[str]:
    """Assert each event's fields are documented for its type; return the types seen."""
    docs = documented_fields(heading)
    seen: set[str] = set()
    for event in events:
        kind = event["type"]
        assert kind in docs, f"{kind} is not in the {heading!r} table"
        fields = set(event) - {"type", "_index"}
        if kind == "approval_request":
            fields -= KIND_FIELDS
        undocumented = fields - docs[kind]
        assert not undocumented, f"{kind}: fields {sorted(undocumented)} are not documented"
        seen.add(kind)
    return seen


async def test_repl_events_fields_are_documented(tmp_path: Path, roost_home: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    env = script_env(tmp_path, roost_home, CHAT)
    async with open_repl(env, work) as repl:
        await repl.wait("ready")
        start = await repl.say("write it")
        await repl.wait("approval_request", start=start)
        await repl.send({"type": "approval_response", "approved": True})
        await repl.wait("message_end", start=start)
        for line in ("list it", "/help", "/title Docs", "!echo hi", "/copy"):
            start = await repl.say(line)
            await repl.wait({"list it": "message_end", "/help": "text", "/title Docs": "info",
                             "!echo hi": "shell_end", "/copy": "copy"}[line], start=start)
        start = len(repl.events)
        await repl.send({"type": "bogus"})
        await repl.wait("error", start=start)
        assert await repl.close() == 0
    seen = check(repl.events, "Stdio chat events (`roost repl --vscode`)")
    assert {"ready", "token", "thinking", "tool_call", "tool_result", "file_changed", "file_changes",
            "message_end", "status", "approval_request", "shell_start", "shell_end", "copy", "text",
            "info", "title", "error", "session_end"} <= seen


def test_run_bridge_event_fields_are_documented(tmp_path: Path, roost_home: Path) -> None:
    config = tmp_path / "team.yaml"
    config.write_text(TEAM)
    script = tmp_path / "script.yaml"
    script.write_text(TEAM_SCRIPT)
    out = subprocess.run([*roost_argv(), "run", "--bridge", "-c", str(config), "build it"], input=b"",
                         capture_output=True, env=scripted_env(roost_home, script), cwd=tmp_path,
                         timeout=scaled(120), check=False)
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    seen = check(events, "Run bridge events (`roost run --bridge`)")
    assert {"ready", "agent_starting", "tool_calling", "agent_message", "result"} <= seen


async def test_daemon_event_fields_are_documented(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text(CHAT)
    async with open_daemon(script=script, args=["--work-dir", str(tmp_path), "--a2a"]) as daemon, \
            daemon.ws(client_id="docs") as client:
        await client.wait_for("hello")
        await client.send({"type": "user_input", "text": "write it"})
        await client.wait_for("approval_request")
        await client.send({"type": "approval_response", "approved": True})
        await client.wait_for("result")
        await client.send({"type": "question_response", "answer": "x"})
        await client.wait_for("error")
        await _a2a_send(daemon.port, "hello over a2a")  # an A2A caller: a2a_call
        await client.wait_for("a2a_call")
        events = list(client.events)
    seen = check(events, "Daemon events (`roost serve`)")
    assert {"hello", "queued", "agent_starting", "token", "tool_calling", "approval_request", "result",
            "error", "a2a_call"} <= seen


async def _a2a_send(port: int, text: str) -> None:
    import httpx

    rpc = {"jsonrpc": "2.0", "id": 1, "method": "message/send",
           "params": {"message": {"role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": text}]}}}
    async with httpx.AsyncClient(timeout=scaled(60)) as http:
        reply = (await http.post(f"http://127.0.0.1:{port}/a2a/assistant/", json=rpc)).json()
    assert reply["result"]["status"]["state"] == "completed", reply
