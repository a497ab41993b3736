"""End-to-end: ``agent/mailbox`` carries worker messages (a ``send_message`` to a worker and each
worker's result) over the real ``roost app-server``."""

from __future__ import annotations

from pathlib import Path

from _helpers.appserver import open_app_server, script_env

SCRIPT = r"""
rules:
  - match: {agent: "helper.*"}
    steps:
      - - {text: "helper {prompt} done"}
      - - {text: "helper saw the note"}
  - match: {prompt: "^mailbox"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: helper, prompt: "H"}}}
      - - {tool_call: {name: send_message, arguments: {target: helper, message: "here is a note"}}}
      - - {tool_call: {name: wait_agents, arguments: {}}}
      - - {text: "mailbox done"}
default: echo
"""


async def test_send_message_and_results_travel_as_agent_mailbox(tmp_path: Path, roost_home: Path) -> None:
    async with open_app_server(env=script_env(tmp_path, roost_home, SCRIPT), cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        done = await client.run_turn(tid, "mailbox please")
        assert done["turn"]["status"] == "completed"
        messages = [n["params"] for n in client.notifications("agent/mailbox")]
        assert all(m["thread_id"] == tid for m in messages)
        kinds = [(m["message"]["kind"], m["message"].get("from_name")) for m in messages]
        # a foreground spawn returns its result as the tool's output; the message travels the mailbox
        assert kinds == [("agent_message", "root")]
        note = messages[0]["message"]
        assert note["text"] == "here is a note" and note["from_agent_id"] is None and note["to_name"] == "helper"
        helper = {n["params"]["agent"]["id"] for n in client.notifications("agent/updated")
                  if n["params"]["agent"]["name"] == "helper"}
        assert helper == {note["to_agent_id"]}
