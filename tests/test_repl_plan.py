"""`plan` and `step_status` from the `update_plan` tool on `roost repl --vscode` (scripted model)."""

from __future__ import annotations

from pathlib import Path

from _helpers.appserver import script_env
from test_docs_wire_fields import documented_fields
from test_repl import open_repl
from _helpers.timing import scaled

SCRIPT = """
rules:
  - match: {prompt: "^plan"}
    steps:
      - - {tool_call: {name: update_plan, arguments: {steps: ["Read the code", "Fix the bug", "Run the tests"]}}}
      - - {tool_call: {name: update_plan, arguments: {step: 1, status: completed}}}
      - - {tool_call: {name: update_plan, arguments: {step: 9, status: completed}}}
      - - {text: "Planned."}
default: echo
"""


async def test_plan_tool_sends_plan_and_step_status(tmp_path: Path, roost_home: Path) -> None:
    env = script_env(tmp_path, roost_home, SCRIPT)
    async with open_repl(env, tmp_path) as repl:
        await repl.wait("ready")
        start = await repl.say("plan the fix")
        end = await repl.wait("message_end", start=start)
        plan = await repl.wait("plan", start=start)
        assert plan["steps"] == ["Read the code", "Fix the bug", "Run the tests"]
        status = await repl.wait("step_status", start=start)
        assert {k: status[k] for k in ("step", "total", "status", "stepsLeft")} == {
            "step": 1, "total": 3, "status": "completed", "stepsLeft": 2}
        assert plan["_index"] < status["_index"] < end["_index"]
        # the out-of-range step is an error result, and no event
        results = [e for e in repl.events[start:end["_index"]] if e["type"] == "tool_result"]
        assert [r["ok"] for r in results] == [True, True, False]
        assert "between 1 and 3" in results[2]["output"]
        assert len([e for e in repl.events[start:] if e["type"] == "step_status"]) == 1
        await repl.close()
    docs = documented_fields("Stdio chat events (`roost repl --vscode`)")
    assert set(plan) - {"type", "_index"} <= docs["plan"]
    assert set(status) - {"type", "_index"} <= docs["step_status"]


async def test_switch_runs_another_chat_and_names_it_in_title(tmp_path: Path, roost_home: Path) -> None:
    import json
    import subprocess

    from _helpers.appserver import roost_argv

    env = script_env(tmp_path, roost_home, "rules: []\ndefault: echo\n")
    async with open_repl(env, tmp_path) as first:
        old = (await first.wait("ready"))["sessionId"]
        start = await first.say("first chat words")
        await first.wait("message_end", start=start)
        await first.close()
    async with open_repl(env, tmp_path) as repl:
        new = (await repl.wait("ready"))["sessionId"]
        bad = await repl.say("/switch thr_nope")
        assert "no chat with id 'thr_nope'" in (await repl.wait("error", start=bad))["text"]
        start = await repl.say(f"/switch {old}")
        title = await repl.wait("title", start=start)
        assert title["sessionId"] == old and title["sessionId"] != new
        replay = await repl.wait("replay", start=start)
        assert replay["total"] == 1 and replay["turns"][0]["user"] == "first chat words"
        await repl.wait("message_end", start=start)
        start = await repl.say("more words")
        end = await repl.wait("message_end", start=start)
        assert end["turnIndex"] == 1   # the switched-to chat's second turn
        await repl.close()
    chats = json.loads(subprocess.run([*roost_argv(), "sessions", "--repl", "--json"], capture_output=True,
                                      text=True, env=env, timeout=scaled(60)).stdout)["items"]
    by_id = {c["sessionId"]: c for c in chats}
    assert by_id[old]["turnIndex"] == 2 and by_id[new]["turnIndex"] == 0


async def test_fork_copies_the_chat_and_fork_switch_runs_the_copy(tmp_path: Path, roost_home: Path) -> None:
    env = script_env(tmp_path, roost_home, "rules: []\ndefault: echo\n")
    async with open_repl(env, tmp_path) as repl:
        original = (await repl.wait("ready"))["sessionId"]
        start = await repl.say("words to keep")
        await repl.wait("message_end", start=start)
        start = await repl.say("/fork")
        info = await repl.wait("info", lambda e: e["text"].startswith("Forked"), start=start)
        copy = info["text"].removeprefix("Forked this chat as ").rstrip(".")
        assert copy.startswith("thr_") and copy != original
        await repl.wait("message_end", start=start)
        # still the original (an auto-title of the first turn may come, naming it)
        assert {e["sessionId"] for e in repl.events[start:] if e["type"] == "title"} <= {original}
        start = await repl.say("/fork switch")
        title = await repl.wait("title", lambda e: e["sessionId"] != original, start=start)
        assert title["sessionId"] not in (original, copy)
        replay = await repl.wait("replay", start=start)
        assert [t["user"] for t in replay["turns"]] == ["words to keep"]
        bad = await repl.say("/fork sideways")
        assert (await repl.wait("error", start=bad))["text"] == "usage: /fork [switch]"
        await repl.close()
