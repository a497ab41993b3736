"""``roost app-server --print-schema``: the printed JSON Schema describes the real messages.

An end-to-end session through the real command (scripted engine) drives initialize, thread/start,
turns with a tool call and an approval, a worker tree, the pending-input methods, lists, fork,
runs and errors; every line the server writes is validated against the printed schema, and every
response's ``result`` against the definition of the method it answers.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jsonschema
import pytest
from _helpers.appserver import open_app_server, roost_argv, script_env
from _helpers.timing import scaled

SCRIPT = """
rules:
  - match: {prompt: "^tool"}
    steps:
      - - {text: "Listing."}
        - {tool_call: {name: list_dir, arguments: {path: "."}}}
      - - {text: "Writing."}
        - {tool_call: {name: write_file, arguments: {path: "x.txt", content: "hi"}}}
      - - {text: "Done."}
  - match: {prompt: "^spawn"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: w1, task: "hello"}}}
      - - {tool_call: {name: wait_agents, arguments: {}}}
      - - {text: "ok"}
  - match: {prompt: "^fail"}
    steps:
      - - {error: {category: rate_limit, message: "slow down"}}
  - match: {prompt: "^slow"}
    steps:
      - - {text: "one two three four five six seven eight nine ten", tokens_per_second: 4}
  - match: {prompt: "^busy"}
    steps:
      - - {tool_call: {name: shell, arguments: {command: "echo started; sleep 60"}}}
      - - {text: "never"}
  - match: {prompt: "^background"}
    steps:
      - - {tool_call: {name: shell, arguments: {command: "sleep 60", background: true}}}
      - - {text: "started"}
default: echo
"""


@pytest.fixture(scope="module")
def schema() -> dict:
    out = subprocess.run([*roost_argv(), "app-server", "--print-schema"], capture_output=True, check=True)
    value = json.loads(out.stdout)
    jsonschema.Draft202012Validator.check_schema(value)
    return value


def _validator(schema: dict, pointer: str | None = None) -> jsonschema.Draft202012Validator:
    target = schema if pointer is None else {"$ref": pointer, "$defs": schema["$defs"]}
    return jsonschema.Draft202012Validator(target)


def test_schema_covers_every_method_and_rejects_what_the_server_rejects(schema):
    from roost.protocol._as_schema import (  # importing it registers every handler
        METHODS,
        UNSUPPORTED_METHODS,
    )

    assert set(schema["x-methods"]) == set(METHODS) | set(UNSUPPORTED_METHODS)
    start = _validator(schema, schema["x-methods"]["turn/start"]["params"])
    assert start.is_valid({"thread_id": "thr_1", "prompt": "hi"})
    assert not start.is_valid({"prompt": "hi"})                       # thread_id is required
    assert not start.is_valid({"thread_id": "thr_1", "bogus": 1})     # unknown params are refused
    assert not start.is_valid({"thread_id": 5})                       # wrong type
    assert start.is_valid({"thread_id": "thr_1", "client_id": None})  # null = absent
    init = _validator(schema, schema["x-methods"]["initialize"]["params"])  # nested members the server checks
    assert init.is_valid({"client": {"name": "ide", "version": "1"}, "capabilities": {"deferred_notification_content": True}})
    assert not init.is_valid({"client": {"name": 5}})
    assert not init.is_valid({"capabilities": {"deferred_notification_content": 1}})
    assert not init.is_valid({"capabilities": {"reverse_rpc": {"methods": [1]}}})


async def test_every_line_of_a_real_session_matches_the_schema(schema, tmp_path: Path, roost_home: Path):
    project = tmp_path / "project"
    project.mkdir()
    env = script_env(tmp_path, roost_home, SCRIPT)
    answered: list[tuple[str, dict]] = []  # (method, response envelope)
    async with open_app_server(env=env, cwd=project) as client:
        client.approval_handler = lambda params: True

        async def call(method: str, params: dict) -> dict:
            reply = await client.request_raw(method, params)
            answered.append((method, reply))
            return reply.get("result") or {}

        await call("initialize", {"protocol_version": "wuu-app-server/v0.1",
                                  "capabilities": {"reverse_rpc": {"methods": ["approval/request"]}}})
        tid = (await call("thread/start", {}))["thread"]["id"]
        for prompt in ("hello", "tool please", "spawn one", "fail now"):
            start = len(client.lines)
            turn = (await call("turn/start", {"thread_id": tid, "prompt": prompt}))["turn"]
            await client.wait_terminal(turn["id"], start=start)
        # a streaming turn: steer it, then interrupt it
        start = len(client.lines)
        slow = (await call("turn/start", {"thread_id": tid, "prompt": "slow please"}))["turn"]
        await client.wait_for("item/agentMessage/delta", lambda p: p["turn_id"] == slow["id"], start=start)
        await call("turn/steer", {"thread_id": tid, "prompt": "also this", "expected_turn_id": slow["id"]})
        await call("turn/interrupt", {"thread_id": tid, "turn_id": slow["id"]})
        await client.wait_terminal(slow["id"], start=start)
        # a steer while a tool runs waits for the next model request, so it can be withdrawn
        start = len(client.lines)
        busy = (await call("turn/start", {"thread_id": tid, "prompt": "busy please"}))["turn"]
        await client.wait_for("item/toolCall/outputDelta", lambda p: "started" in p["delta"], start=start)
        pending = await call("turn/steer", {"thread_id": tid, "prompt": "wait", "expected_turn_id": busy["id"]})
        await call("turn/unsteer", {"thread_id": tid, "input_id": pending["input"]["id"]})
        await call("turn/interrupt", {"thread_id": tid})
        await client.wait_terminal(busy["id"], start=start)
        # an idle thread: a steer starts a turn
        start = len(client.lines)
        steered = await call("turn/steer", {"thread_id": tid, "prompt": "hello again"})
        await client.wait_terminal(steered.get("turn", {}).get("id") or steered["turn_id"], start=start)
        first_turn = (await call("thread/history/read", {"thread_id": tid}))["turns"][0]
        # an image attachment, read back by identity (chunk and preview)
        start = len(client.lines)
        pixel = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
        pictured = (await call("turn/start", {"thread_id": tid, "prompt": "picture",
                                              "images": [{"media_type": "image/png", "data": pixel}]}))["turn"]
        done = (await client.wait_terminal(pictured["id"], start=start))["turn"]
        user = done["items"][0]
        ref = {"kind": "artifact", "thread_id": tid, "turn_id": pictured["id"], "item_id": user["id"],
               "content_index": 0, "sha256": user["images"][0]["sha256"]}
        await call("thread/attachment/read", ref)
        await call("config/model/update", {"thread_id": tid, "permission_mode": "unconfined"})
        start = len(client.lines)
        bg = (await call("turn/start", {"thread_id": tid, "prompt": "background please"}))["turn"]
        bg_done = (await client.wait_terminal(bg["id"], start=start))["turn"]
        proc = {"thread_id": tid, "process_id": bg_done["items"][1]["metadata"]["process_id"]}
        await call("process/list", {"thread_id": tid})
        await call("process/read", proc)
        await call("process/cancel-notifications", proc)
        await call("process/stop", proc)
        await call("config/model/update", {"thread_id": tid, "permission_mode": "standard"})
        conversation = await call("thread/resume", {"session_id": tid, "response_only": True,
                                                    "conversation_history": True})
        summary = next(i for t in conversation["turns"] for i in t["items"] if i["type"] == "process_summary")
        await call("thread/activity/read", {"thread_id": tid, "turn_id": summary["turn_id"], "item_id": summary["id"],
                                            "last_item_id": summary["activity"]["last_item_id"]})
        await call("thread/attachment/read", {**ref, "preview": True})
        for method, params in [
            ("thread/list", {}), ("thread/listAll", {}), ("thread/listArchived", {}),
            ("thread/search", {"query": "hello"}), ("thread/rename", {"thread_id": tid, "title": "T"}),
            ("thread/pin", {"thread_id": tid}), ("thread/resume", {"session_id": tid}),
            ("thread/history/read", {"thread_id": tid}), ("engine/list", {}),
            ("turn/interrupt", {"thread_id": tid}),
        ]:
            await call(method, params)
        held = (await call("turn/queue", {"thread_id": tid, "prompt": "later", "hold": True}))["input"]
        await call("turn/update-queued", {"thread_id": tid, "input_id": held["id"], "prompt": "later 2"})
        await call("turn/dequeue", {"thread_id": tid, "input_id": held["id"]})
        fork = (await call("thread/fork", {"thread_id": tid}))["thread"]["id"]
        await call("thread/edit-message", {"thread_id": tid, "turn_id": first_turn["id"],
                                           "item_id": first_turn["items"][0]["id"]})
        await call("config/model/update", {"thread_id": fork, "model": "other"})
        run = (await call("run/start", {"thread_id": fork, "prompt": "run it"}))["run"]
        await client.wait_for("run/updated", lambda p: p["run"]["id"] == run["id"]
                              and p["run"]["status"] not in ("queued", "running"))
        await call("run/interrupt", {"run_id": run["id"]})
        await call("thread/archive", {"thread_id": fork})
        await call("thread/delete", {"thread_id": fork, "only_if_archived": True})
        for method, params in [("turn/start", {"thread_id": "thr_missing", "prompt": "x"}),
                               ("usage/overview", {}), ("settings/usage", {"timezone": "Europe/Paris"}),
                               ("config/model-catalog/providers", {}), ("config/model-catalog/refresh", {}),
                               ("config/model-catalog/providers", {"provider": "groq"}),
                               ("thread/content/read", {"thread_id": tid, "turn_id": pictured["id"],
                                                        "item_id": user["id"], "field": "text"}),
                               ("engine/update", {}), ("no/such", {}), ("thread/start", {"bogus": 1})]:
            await call(method, params)
        await call("shutdown", {})

    whole = _validator(schema)
    for line in client.lines:
        errors = sorted(whole.iter_errors(line), key=str)
        assert not errors, (line, [e.message for e in errors][:3])
    notified = {m["method"] for m in client.lines if "method" in m}
    for expected in ("thread/started", "turn/started", "item/started", "item/completed", "turn/completed",
                     "turn/error", "item/agentMessage/delta", "item/toolCall/delta", "approval/request",
                     "agent/updated", "turn/held", "run/started", "run/updated", "thread/updated"):
        assert expected in notified, expected
    results_checked = 0
    for method, reply in answered:
        if "result" in reply:
            _validator(schema, schema["x-methods"][method]["result"]).validate(reply["result"])
            results_checked += 1
        elif method == "engine/update":
            assert reply["error"]["code"] == "unsupported"
    assert results_checked >= 25
    answered_ok = {m for m, r in answered if "result" in r}
    from roost.protocol._as_schema import (
        METHODS,  # importing it registers every handler
    )

    assert answered_ok == set(METHODS), set(METHODS) - answered_ok  # every method's result was checked
    _check_object_fields_documented(client.lines + [r for _, r in answered])


def _check_object_fields_documented(messages: list[dict]) -> None:
    """Every key of every thread, turn, item, input, run and agent object seen is named in the
    "Objects" section of docs/app-server.md (so a field added in the code is documented)."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "app-server.md").read_text()
    objects = text.split("## Objects", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`([a-z_]+)`", objects))
    seen: dict[str, set[str]] = {}

    plural = {"threads": "thread", "turns": "turn", "items": "item", "agents": "agent",
              "held_user_messages": "input", "pending_user_messages": "input"}

    def visit(value: object, name: str | None) -> None:
        if isinstance(value, dict):
            if name in ("thread", "turn", "item", "input", "run", "agent"):
                seen.setdefault(name, set()).update(value)
            for key, child in value.items():
                if key in ("metadata", "arguments", "request", "runtime", "workspace", "error", "usage"):
                    continue  # free-form or documented inline with their object
                if name == "run" and key == "turns":
                    continue  # a run's turns are {id, status, purpose}, documented with the run
                visit(child, plural.get(key, key))
        elif isinstance(value, list):
            for child in value:
                visit(child, name)

    for message in messages:
        visit(message, None)
    assert {"thread", "turn", "item", "input", "run", "agent"} <= set(seen)
    missing = {name: sorted(keys - documented) for name, keys in seen.items() if keys - documented}
    assert not missing, missing


def test_schema_is_not_vacuous(schema):
    """A thread missing the fields the server always sends, an unknown notification and an unknown
    error code all fail validation."""
    assert not _validator(schema, "#/$defs/Thread").is_valid({"id": "thr_1"})
    whole = _validator(schema)
    assert not whole.is_valid({"method": "turn/finished", "params": {"thread_id": "t"}})
    assert not whole.is_valid({"id": 1, "error": {"code": "oops", "message": "m"}})
    assert whole.is_valid({"id": 1, "error": {"code": "thread_busy", "message": "m"}})


def test_exec_json_lines_match_the_schema(schema, tmp_path: Path, roost_home: Path) -> None:
    """``roost exec --json`` prints app-server notifications: each line is one the schema allows."""
    env = script_env(tmp_path, roost_home, SCRIPT)
    out = subprocess.run([*roost_argv(), "exec", "--json", "hello"], capture_output=True, env=env,
                         cwd=tmp_path, timeout=scaled(120), check=False)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [m["method"] for m in lines][-1] == "turn/completed"
    notification = _validator(schema, "#/$defs/Notification")
    for line in lines:
        errors = [e.message for e in notification.iter_errors(line)]
        assert not errors, (line, errors[:3])
