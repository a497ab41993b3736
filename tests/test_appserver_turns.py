"""End-to-end: app-server turns over the real ``roost app-server`` subprocess: starting (inputs,
attachments, content parts, continuation), pending input (queue, hold, update, dequeue, steer,
unsteer), interruption, notifications, failures, framing limits and end of input.

A turn is held open deterministically by a mutating tool in ``standard`` mode whose
``approval/request`` the test answers only when it is ready (no sleeps).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import trio

from _helpers.appserver import RemoteError, open_app_server, scripted_env, expect_error, script_env
from _helpers.timing import scaled

SCRIPT = """
rules:
  - match: {prompt: "^slow"}
    steps:
      - - {text: "one two three four five six seven eight nine ten", tokens_per_second: 4}
  - match: {prompt: "^drawl"}
    steps:
      - - {text: "one two three four five six", tokens_per_second: 5}
  - match: {prompt: "^gated"}
    steps:
      - - {text: "Writing."}
        - {tool_call: {name: write_file, arguments: {path: "gated.txt", content: "hello"}}}
      - - {text: "Wrote it."}
  - match: {prompt: "^think"}
    steps:
      - - {reasoning: "pondering deeply"}
        - {text: "Running it."}
        - {tool_call: {name: shell, arguments: {command: "echo out-one; echo out-two"}}}
      - - {text: "All done."}
  - match: {prompt: "^fail"}
    steps:
      - - {text: "Let me try"}
        - {error: {category: rate_limit, message: "slow down", retryable: true, http_status: 429}}
default: echo
"""

APPROVALS = {"reverse_rpc": {"methods": ["approval/request"]}}
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n fake image bytes").decode()


@pytest.fixture
def env(tmp_path: Path, roost_home: Path) -> dict:
    return script_env(tmp_path, roost_home, SCRIPT)




async def start_gated(client, tid: str, prompt: str = "gated write") -> tuple[dict, dict]:
    """Start a turn that waits on its approval/request; return (turn, approval request line)."""
    client.approval_handler = lambda params: None  # answer later, by hand
    start = len(client.lines)
    turn = (await client.request("turn/start", {"thread_id": tid, "prompt": prompt}))["turn"]
    request = await client.wait_line(lambda m: m.get("method") == "approval/request"
                                     and m["params"]["turn_id"] == turn["id"], start=start)
    return turn, request


async def answer(client, request: dict, approved: bool) -> None:
    await client.send({"id": request["id"], "result": {"approved": approved}})


def item_types(turn: dict) -> list[str]:
    return [i["type"] for i in turn["items"]]


# -- turn/start: inputs -------------------------------------------------------------------------


async def test_turn_start_inputs_attachments_and_content_parts(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        # client_id -> source_id, in the response, the notifications and stored history
        start = len(client.lines)
        reply = await client.request("turn/start", {"thread_id": tid, "prompt": "look at this", "client_id": "local-7",
                                                    "images": [{"media_type": "image/png", "data": PNG,
                                                                "original": "shot.png"}]})
        turn = reply["turn"]
        assert turn["status"] == "running" and turn["thread_id"] == tid
        assert turn["items"][0]["source_id"] == "local-7"
        done = await client.wait_terminal(turn["id"], start=start)
        user = done["turn"]["items"][0]
        assert user["source_id"] == "local-7" and user["images"][0]["original"] == "shot.png"
        note = await client.wait_for("item/completed", lambda p: p["item"]["type"] == "user_message", start=start)
        assert note["item"]["source_id"] == "local-7"
        # content_parts kept when their texts concatenate to the prompt (outer whitespace trimmed)
        parts = [
            {"type": "text", "text": "Please fix "},
            {"type": "file_selection", "text": "[main.py:1-2 edit] def f(): pass",
             "source": {"workspace": str(tmp_path), "path": "main.py", "quote": "def f(): pass", "revision": "r1",
                        "start_line": 1, "start_column": 1, "end_line": 2, "end_column": 1},
             "intent": "edit", "id": "sel-1"},
            {"type": "pasted_text", "text": " now", "title": "clip"},
            {"type": "mystery", "text": ""},
        ]
        prompt = "Please fix [main.py:1-2 edit] def f(): pass now"
        kept = (await client.run_turn(tid, "  " + prompt + "\n", content_parts=parts))["turn"]["items"][0]
        assert [p["type"] for p in kept["content_parts"]] == ["text", "file_selection", "pasted_text"]
        # an invalid part is dropped alone (end before start); a mismatch drops all metadata
        bad_range = dict(parts[1], source=dict(parts[1]["source"], start_line=3))
        dropped = (await client.run_turn(tid, prompt, content_parts=[parts[0], bad_range, parts[2]]))["turn"]
        assert [p["type"] for p in dropped["items"][0]["content_parts"]] == ["text", "pasted_text"]
        mismatch = (await client.run_turn(tid, "something else", content_parts=parts))["turn"]["items"][0]
        assert "content_parts" not in mismatch and mismatch["text"] == "something else"
        # a response selection whose quoted JSON matches its selection
        quote = {"text": "the answer", "comment": "why?"}
        selection = {"id": "q1", "text": "the answer", "comment": "why?",
                     "source": {"thread_id": tid, "turn_id": turn["id"], "item_id": "x", "start_offset": 0,
                                "end_offset": 10}}
        qtext = "Quoted assistant response (JSON):\n" + json.dumps(quote) + "\n"
        quoted = (await client.run_turn(tid, qtext + "Explain.", content_parts=[
            {"type": "response_selection", "text": qtext, "selection": selection},
            {"type": "text", "text": "Explain."}]))["turn"]["items"][0]
        assert [p["type"] for p in quoted["content_parts"]] == ["response_selection", "text"]
        # text files are inlined into the model-visible message
        data = base64.b64encode(b"line one\nline two\n").decode()
        with_file = (await client.run_turn(tid, "summarise", files=[
            {"media_type": "text/plain", "data": data, "filename": "notes.txt"}]))["turn"]
        text = with_file["items"][0]["text"]
        assert text.startswith("summarise") and "notes.txt" in text and "line two" in text
        assert with_file["items"][1]["text"] == text  # the scripted engine echoes what it was sent
        # stored history keeps all of it
        snap = await client.request("thread/resume", {"session_id": tid, "response_only": True})
        users = [t["items"][0] for t in snap["turns"]]
        assert users[0]["source_id"] == "local-7" and users[0]["images"][0]["media_type"] == "image/png"
        assert [p["type"] for p in users[1]["content_parts"]] == ["text", "file_selection", "pasted_text"]
        # failure paths
        await expect_error(client, "turn/start", {"thread_id": tid}, "invalid_params", contains="prompt")
        await expect_error(client, "turn/start", {"thread_id": tid, "prompt": "x", "images": [
            {"media_type": "image/png", "data": "%%%not base64"}]}, "invalid_params", contains="base64")
        await expect_error(client, "turn/start", {"thread_id": tid, "prompt": "x", "images": [
            {"media_type": "text/plain", "data": PNG}]}, "invalid_params")
        await expect_error(client, "turn/start", {"thread_id": tid, "prompt": "x", "files": [
            {"media_type": "application/pdf", "data": PNG, "filename": "a.pdf"}]}, "invalid_params",
            contains="not a PDF")
        pdf = base64.b64encode(b"%PDF-1.4\n%%EOF\n").decode()  # the scripted engine reads no files
        await expect_error(client, "turn/start", {"thread_id": tid, "prompt": "x", "files": [
            {"media_type": "application/pdf", "data": pdf, "filename": "a.pdf"}]}, "unsupported",
            contains="cannot send application/pdf")
        await expect_error(client, "turn/start", {"thread_id": tid, "prompt": "x", "files": [
            {"media_type": "video/mp4", "data": PNG}]}, "unsupported")
        await expect_error(client, "turn/start", {"thread_id": tid, "prompt": "x", "files": [
            {"media_type": "text/plain", "data": base64.b64encode(b"\xff\xfe").decode()}]}, "invalid_params")
        await expect_error(client, "turn/start", {"thread_id": tid, "prompt": "x",
                                                  "permission_mode": "unconfined"}, "invalid_params")
        await expect_error(client, "turn/start", {"thread_id": tid, "prompt": "x", "colour": "red"},
                           "invalid_params", contains="colour")
        assert (await client.run_turn(tid, "x", permission_mode="standard"))["turn"]["status"] == "completed"


# -- explicit continuation ----------------------------------------------------------------------


async def test_explicit_continuation(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize(capabilities=APPROVALS)
        tid = (await client.request("thread/start", {}))["thread"]["id"]
        await expect_error(client, "turn/start", {"thread_id": tid, "resume_after_turn_id": "turn_nope"},
                           "turn_not_found")
        t1 = (await client.run_turn(tid, "hello"))["turn"]
        start = len(client.lines)
        cont = (await client.request("turn/start", {"thread_id": tid, "resume_after_turn_id": t1["id"]}))["turn"]
        assert cont["items"] == []
        done = await client.wait_terminal(cont["id"], start=start)
        assert done["turn"]["status"] == "completed"
        assert "user_message" not in item_types(done["turn"])
        # repeating the source id, or a stale one, is rejected; so is input with it
        await expect_error(client, "turn/start", {"thread_id": tid, "resume_after_turn_id": t1["id"]}, "stale_turn")
        await expect_error(client, "turn/start", {"thread_id": tid, "resume_after_turn_id": cont["id"],
                                                  "prompt": "more"}, "invalid_params")
        # a busy thread is rejected
        gated, request = await start_gated(client, tid)
        await expect_error(client, "turn/start", {"thread_id": tid, "resume_after_turn_id": cont["id"]},
                           "thread_busy")
        await expect_error(client, "turn/start", {"thread_id": tid, "prompt": "again"}, "thread_busy")
        await answer(client, request, False)
        await client.wait_terminal(gated["id"])
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        # after a restart the consumed and stale ids stay rejected
        await expect_error(client, "turn/start", {"thread_id": tid, "resume_after_turn_id": t1["id"]}, "stale_turn")
        await expect_error(client, "turn/start", {"thread_id": tid, "resume_after_turn_id": cont["id"]},
                           "stale_turn")
        start = len(client.lines)
        again = (await client.request("turn/start", {"thread_id": tid, "resume_after_turn_id": gated["id"]}))["turn"]
        assert (await client.wait_terminal(again["id"], start=start))["turn"]["status"] == "completed"
        await expect_error(client, "turn/start", {"thread_id": tid, "resume_after_turn_id": gated["id"]},
                           "stale_turn")


async def test_busy_across_processes(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as first:
        await first.initialize(capabilities=APPROVALS)
        tid = (await first.request("thread/start", {}))["thread"]["id"]
        turn, request = await start_gated(first, tid)
        async with open_app_server(env=env, cwd=tmp_path) as second:
            await second.initialize()
            await expect_error(second, "turn/start", {"thread_id": tid, "prompt": "me too"}, "thread_busy",
                               contains="another process")
            await expect_error(second, "turn/start", {"thread_id": tid, "resume_after_turn_id": turn["id"]},
                               "thread_busy")
            await expect_error(second, "config/model/update", {"thread_id": tid, "permission_mode": "read_only"},
                               "thread_busy")
            await expect_error(second, "thread/delete", {"thread_id": tid}, "thread_busy")
        await answer(first, request, True)
        done = await first.wait_terminal(turn["id"])
        assert done["turn"]["status"] == "completed"


# -- pending input --------------------------------------------------------------------------------


async def test_queue_hold_update_dequeue_and_client_id_retries(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize(capabilities=APPROVALS)
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        turn, request = await start_gated(client, tid)
        start = len(client.lines)
        queued = (await client.request("turn/queue", {"thread_id": tid, "prompt": "queued one",
                                                      "client_id": "q-1"}))["input"]
        note = await client.wait_for("turn/queued", start=start)
        assert note["input"]["id"] == queued["id"] and queued["kind"] == "queue"
        retry = (await client.request("turn/queue", {"thread_id": tid, "prompt": "queued one",
                                                     "client_id": "q-1"}))["input"]
        assert retry["id"] == queued["id"]
        held = (await client.request("turn/queue", {"thread_id": tid, "prompt": "held one", "hold": True}))["input"]
        await client.wait_for("turn/held", lambda p: p["input"]["id"] == held["id"])
        drop = (await client.request("turn/queue", {"thread_id": tid, "prompt": "to drop"}))["input"]
        updated = (await client.request("turn/update-queued", {"thread_id": tid, "input_id": queued["id"],
                                                               "prompt": "queued one, edited"}))["input"]
        assert updated["prompt"] == "queued one, edited"
        removed = (await client.request("turn/dequeue", {"thread_id": tid, "input_id": drop["id"]}))["input"]
        assert removed["id"] == drop["id"]
        await client.wait_for("turn/dequeued", lambda p: p["input"]["id"] == drop["id"])
        await expect_error(client, "turn/dequeue", {"thread_id": tid, "input_id": drop["id"]}, "invalid_params")
        # turn/unsteer withdraws steers only: a pending queued input is named as such, and stays
        await expect_error(client, "turn/unsteer", {"thread_id": tid, "input_id": queued["id"]}, "invalid_params",
                           contains=f"input {queued['id']} is queued input, not a steer: withdraw it with turn/dequeue")
        await expect_error(client, "turn/update-queued", {"thread_id": tid, "input_id": "input_nope",
                                                          "prompt": "x"}, "invalid_params")
        snap = await client.request("thread/resume", {"session_id": tid, "response_only": True})
        assert [p["prompt"] for p in snap["pending_user_messages"]] == ["queued one, edited"]
        assert [p["prompt"] for p in snap["held_user_messages"]] == ["held one"]
        # the turn ends naturally: the queued input is dispatched as the next turn
        start = len(client.lines)
        await answer(client, request, False)
        assert (await client.wait_terminal(turn["id"]))["turn"]["status"] == "completed"
        started = await client.wait_for("turn/started", lambda p: p["turn"]["id"] != turn["id"], start=start)
        nxt = await client.wait_terminal(started["turn"]["id"], start=start)
        user = nxt["turn"]["items"][0]
        assert user["text"] == "queued one, edited" and user["source_id"] == "q-1"
        # a consumed client_id is refused, never queued twice
        await expect_error(client, "turn/queue", {"thread_id": tid, "prompt": "queued one", "client_id": "q-1"},
                           "invalid_params", contains="consumed")
        snap = await client.request("thread/resume", {"session_id": tid, "response_only": True})
        assert snap["pending_user_messages"] == []
        assert [p["prompt"] for p in snap["held_user_messages"]] == ["held one"]
        texts = [t["items"][0]["text"] for t in snap["turns"]]
        assert texts.count("queued one, edited") == 1
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        # held input survives a restart and is sent explicitly with turn/steer
        snap = await client.request("thread/resume", {"session_id": tid})
        assert [p["prompt"] for p in snap["held_user_messages"]] == ["held one"]
        start = len(client.lines)
        sent = await client.request("turn/steer", {"thread_id": tid, "input_id": held["id"]})
        assert sent["delivery"] == "queued"
        done = await client.wait_terminal(sent["turn"]["id"], start=start)
        assert done["turn"]["items"][0]["text"] == "held one"
        snap = await client.request("thread/resume", {"session_id": tid, "response_only": True})
        assert snap["held_user_messages"] == [] and snap["pending_user_messages"] == []
        await expect_error(client, "turn/queue", {"thread_id": tid, "prompt": "   "}, "invalid_params")
        # consumed ids are refused across input methods, also after a restart
        await expect_error(client, "turn/steer", {"thread_id": tid, "prompt": "queued one", "client_id": "q-1"},
                           "invalid_params", contains="consumed")
        await expect_error(client, "turn/queue", {"thread_id": tid, "prompt": "queued one", "client_id": "q-1",
                                                  "hold": True}, "invalid_params", contains="consumed")


async def test_steer_is_admitted_at_the_next_model_step(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize(capabilities=APPROVALS)
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        await expect_error(client, "turn/steer", {"thread_id": tid, "prompt": "x", "expected_turn_id": "turn_x"},
                           "stale_turn")
        turn, request = await start_gated(client, tid)
        # the first model step ended in a tool call that waits for approval: steer now
        await expect_error(client, "turn/steer", {"thread_id": tid, "prompt": "x", "expected_turn_id": "turn_x"},
                           "stale_turn")
        withdrawn = await client.request("turn/steer", {"thread_id": tid, "prompt": "never mind",
                                                        "expected_turn_id": turn["id"]})
        assert withdrawn["delivery"] == "active_turn" and withdrawn["turn_id"] == turn["id"]
        gone = (await client.request("turn/unsteer", {"thread_id": tid, "input_id": withdrawn["input"]["id"]}))["input"]
        assert gone["prompt"] == "never mind"
        await client.wait_for("turn/unsteered", lambda p: p["input"]["id"] == gone["id"])
        await expect_error(client, "turn/unsteer", {"thread_id": tid, "input_id": gone["id"]}, "invalid_params")
        steer = await client.request("turn/steer", {"thread_id": tid, "prompt": "also add a test",
                                                    "expected_turn_id": turn["id"], "client_id": "s-1"})
        assert steer["delivery"] == "active_turn"
        await answer(client, request, True)
        steered = await client.wait_for("turn/steered", lambda p: p["state"] == "admitted")
        assert steered["turn_id"] == turn["id"] and steered["input"]["prompt"] == "also add a test"
        done = (await client.wait_terminal(turn["id"]))["turn"]
        assert done["status"] == "completed"
        assert item_types(done) == ["user_message", "agent_message", "tool_call", "user_message", "agent_message"]
        assert done["items"][3]["text"] == "also add a test" and done["items"][3]["source_id"] == "s-1"
        assert done["items"][2]["status"] == "completed" and (tmp_path / "gated.txt").read_text() == "hello"
        assert "never mind" not in json.dumps(done)
        # exactly one terminal event, and one turn: the steer did not start another
        assert len([n for n in client.notifications("turn/completed") if n["params"]["turn"]["id"] == turn["id"]]) == 1
        snap = await client.request("thread/resume", {"session_id": tid, "response_only": True})
        assert len(snap["turns"]) == 1 and snap["pending_user_messages"] == []
        assert [i["type"] for i in snap["turns"][0]["items"]] == item_types(done)


async def test_steer_during_the_last_model_response_continues_the_same_turn(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {}))["thread"]["id"]
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "drawl on"}))["turn"]
        await client.wait_for("item/agentMessage/delta", lambda p: p["turn_id"] == turn["id"])
        steer = await client.request("turn/steer", {"thread_id": tid, "prompt": "and then?",
                                                    "expected_turn_id": turn["id"]})
        assert steer["delivery"] == "active_turn"
        done = (await client.wait_terminal(turn["id"]))["turn"]
        assert done["status"] == "completed"
        assert item_types(done) == ["user_message", "agent_message", "user_message", "agent_message"]
        # the streaming reply was cut at the steer: its prefix is kept as a steered fragment
        fragment = done["items"][1]
        assert fragment["steered"] is True and fragment["status"] == "completed"
        assert "one two three four five six".startswith(fragment["text"])
        assert fragment["text"] != "one two three four five six"
        assert done["items"][2]["text"] == "and then?" and done["items"][3]["text"] == "and then?"
        assert "steered" not in done["items"][3]
        assert (await client.wait_for("turn/steered"))["turn_id"] == turn["id"]
        snap = await client.request("thread/resume", {"session_id": tid, "response_only": True})
        assert len(snap["turns"]) == 1 and snap["pending_user_messages"] == []
        assert snap["turns"][0]["items"][1]["steered"] is True
        assert not client.notifications("turn/dequeued")


# -- interruption, notifications, failures ------------------------------------------------------


async def test_interrupt_paths(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize(capabilities=APPROVALS)
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        idle = await client.request("turn/interrupt", {"thread_id": tid})
        assert idle == {"thread_id": tid, "turn": None, "interrupted": False}
        await expect_error(client, "turn/interrupt", {"thread_id": tid, "turn_id": "turn_nope"}, "turn_not_found")
        await expect_error(client, "turn/interrupt", {"thread_id": "thr_nope"}, "thread_not_found")
        # interrupting while a tool waits for approval: the tool call settles as interrupted
        turn, request = await start_gated(client, tid)
        reply = await client.request("turn/interrupt", {"thread_id": tid, "turn_id": turn["id"]})
        assert reply["interrupted"] is True
        done = (await client.wait_terminal(turn["id"]))["turn"]
        assert done["status"] == "interrupted"
        tool = next(i for i in done["items"] if i["type"] == "tool_call")
        assert tool["status"] == "interrupted" and not (tmp_path / "gated.txt").exists()
        await answer(client, request, True)  # too late: ignored
        # the thread takes the next turn, whose history gives the interrupted call a result
        assert (await client.run_turn(tid, "after"))["turn"]["status"] == "completed"


async def test_notification_stream(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        thread = (await client.request("thread/start", {"cwd": str(tmp_path), "permission_mode": "unconfined"}))
        tid = thread["thread"]["id"]
        start = len(client.lines)
        done = await client.run_turn(tid, "think and run")
        turn = done["turn"]
        tail = client.lines[start:]
        methods = [m.get("method") for m in tail if "id" not in m]
        for name in ("turn/started", "item/started", "item/completed", "item/reasoning/delta",
                     "item/agentMessage/delta", "item/toolCall/delta", "item/toolCall/outputDelta", "turn/usage",
                     "turn/completed"):
            assert name in methods, name
        assert methods.index("turn/started") < methods.index("item/started") < methods.index("turn/completed")
        assert methods[-1] == "turn/completed" and methods.count("turn/completed") == 1
        params = [m["params"] for m in tail if "id" not in m]
        reasoning = "".join(p["delta"] for m, p in zip(methods, params) if m == "item/reasoning/delta")
        assert reasoning == "pondering deeply"
        args = "".join(p["delta"] for m, p in zip(methods, params) if m == "item/toolCall/delta")
        assert json.loads(args) == {"command": "echo out-one; echo out-two"}
        output = "".join(p["delta"] for m, p in zip(methods, params) if m == "item/toolCall/outputDelta")
        assert "out-one" in output and "out-two" in output
        assert item_types(turn) == ["user_message", "reasoning", "agent_message", "tool_call", "agent_message"]
        tool = turn["items"][3]
        assert tool["name"] == "shell" and "out-two" in tool["output"] and tool["status"] == "completed"
        # every item that started also completed, in one turn
        started = [p["item"]["id"] for m, p in zip(methods, params) if m == "item/started"]
        completed = [p["item"]["id"] for m, p in zip(methods, params) if m == "item/completed"]
        assert sorted(started) == sorted(completed) == sorted(i["id"] for i in turn["items"])
        # turn/usage is cumulative: non-decreasing, and the last one is the turn's usage
        usages = [p["usage"] for m, p in zip(methods, params) if m == "turn/usage"]
        assert len(usages) == 2
        for key in ("input_tokens", "output_tokens"):
            assert usages[0][key] > 0 and usages[1][key] > usages[0][key]
        assert usages[-1] == turn["usage"]


async def test_turn_error_carries_recovery_facts(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {}))["thread"]["id"]
        start = len(client.lines)
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "fail please"}))["turn"]
        failed = await client.wait_for("turn/error", start=start)
        error = failed["turn"]["error"]
        assert failed["turn"]["id"] == turn["id"] and failed["turn"]["status"] == "failed"
        assert error["category"] == "rate_limit" and error["retryable"] is True
        assert error["message"] == "slow down" and error["http_status"] == 429
        recovery = error["recovery"]
        for key in ("attempt_count", "retry_count", "submission_count", "max_attempts", "stop_reason",
                    "failure_category"):
            assert key in recovery, key
        assert recovery["failure_category"] == "rate_limit"
        assert recovery["operation_id"].startswith("op_")  # identifies the stream in diagnostics
        partial = failed["turn"]["items"][1]
        assert partial["type"] == "agent_message" and partial["text"] == "Let me try" and partial["status"] == "failed"
        assert not [n for n in client.notifications("turn/completed") if n["params"]["turn"]["id"] == turn["id"]]
        # the thread lives on
        assert (await client.run_turn(tid, "fine now"))["turn"]["status"] == "completed"
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": tid})
        stored = snap["turns"][0]
        assert stored["status"] == "failed" and stored["error"]["recovery"]["failure_category"] == "rate_limit"
        assert stored["error"]["recovery"]["operation_id"] == recovery["operation_id"]  # persisted


# -- framing and end of input -------------------------------------------------------------------


async def test_malformed_and_oversized_lines_then_reading_goes_on(env, tmp_path):
    small = dict(env, ROOST_MAX_LINE_BYTES="1000")
    async with open_app_server(env=small, cwd=tmp_path) as client:
        await client.initialize()
        big = json.dumps({"id": "big", "method": "thread/start", "params": {"title": "x" * 5000}}).encode() + b"\n"
        await client.send(big)
        error = await client.wait_line(lambda m: "error" in m)
        assert error["id"] is None and error["error"]["code"] == "parse_error"
        assert "1000" in error["error"]["message"]
        await client.send(b"{not json}\n")
        await client.wait_line(lambda m: "error" in m and m["error"]["code"] == "parse_error",
                               start=client.lines.index(error) + 1)
        await client.send({"id": "e1", "method": "thread/list", "params": {}, "extra": True})
        bad = await client.wait_line(lambda m: m.get("id") == "e1")
        assert bad["error"]["code"] == "invalid_request"
        await client.send({"id": True, "method": "thread/list"})
        await client.wait_line(lambda m: m.get("error", {}).get("code") == "invalid_request"
                               and "id must be" in m["error"]["message"])
        with pytest.raises(RemoteError) as exc:
            await client.request("run/interrupt", {"run_id": "run_nope"})
        assert exc.value.code == "run_not_found"
        # the connection keeps serving, and a line just under the limit is fine
        ok = await client.request("thread/start", {"title": "y" * 800})
        assert ok["thread"]["title"] == "y" * 800
        assert not any(m.get("id") == "big" for m in client.lines)


async def test_end_of_input_interrupts_and_persists_running_turns(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {}))["thread"]["id"]
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "slow reply"}))["turn"]
        await client.wait_for("item/agentMessage/delta", lambda p: p["turn_id"] == turn["id"])
        await client.close_stdin()
        done = await client.wait_terminal(turn["id"])
        assert done["turn"]["status"] == "interrupted"
        with trio.fail_after(scaled(20)):
            assert await client.process.wait() == 0
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": tid})
        stored = snap["turns"][0]
        assert stored["status"] == "interrupted"
        partial = stored["items"][1]
        assert partial["type"] == "agent_message" and partial["status"] == "interrupted" and partial["text"]


async def test_withdrawal_fences_retries_in_its_delivery_mode(env, tmp_path):
    """app-server-protocol.md: cancellation fences retries in that delivery mode; switching
    between queue and steering supersedes the previous mode's cancellation. Durable."""
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize(capabilities=APPROVALS)
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        turn, request = await start_gated(client, tid)  # a turn waits on an approval: input stays pending
        queued = (await client.request("turn/queue", {"thread_id": tid, "prompt": "q", "client_id": "c-1"}))["input"]
        await client.request("turn/dequeue", {"thread_id": tid, "input_id": queued["id"]})
        await expect_error(client, "turn/queue", {"thread_id": tid, "prompt": "q", "client_id": "c-1"},
                           "invalid_params")
        # steering with the same client_id switches mode: accepted, and it lifts the queue fence
        steer = await client.request("turn/steer", {"thread_id": tid, "prompt": "s", "client_id": "c-1",
                                                    "expected_turn_id": turn["id"]})
        await client.request("turn/unsteer", {"thread_id": tid, "input_id": steer["input"]["id"]})
        await expect_error(client, "turn/steer", {"thread_id": tid, "prompt": "s", "client_id": "c-1",
                                                  "expected_turn_id": turn["id"]}, "invalid_params")
        await answer(client, request, False)
        await client.wait_terminal(turn["id"])
    async with open_app_server(env=env, cwd=tmp_path) as client:  # the fence survives a restart
        await client.initialize()
        await client.request("thread/resume", {"session_id": tid})
        await expect_error(client, "turn/steer", {"thread_id": tid, "prompt": "s", "client_id": "c-1"},
                           "invalid_params")
        again = (await client.request("turn/queue", {"thread_id": tid, "prompt": "q again", "client_id": "c-1",
                                                     "hold": True}))["input"]
        assert again["client_id"] == "c-1" and again["prompt"] == "q again"


async def test_a_huge_integer_param_keeps_the_request_id(tmp_path, roost_home):
    """A 400-digit `limit` was `{"id":null,"error":{"code":"parse_error",...}}` (the client waited
    forever); the line is valid JSON: its id is answered with invalid_params. An id of that size
    is echoed exactly (ids are any JSON value the client chooses)."""
    big = "9" * 400
    async with open_app_server(env=scripted_env(roost_home), cwd=tmp_path) as client:
        await client.initialize()
        await client.send(b'{"id":"big-limit","method":"thread/list","params":{"limit":%s}}\n' % big.encode())
        reply = await client.wait_line(lambda m: m.get("id") == "big-limit")
        assert reply["error"]["code"] == "invalid_params" and "limit" in reply["error"]["message"]
        await client.send(b'{"id":%s,"method":"thread/list","params":{}}\n' % big.encode())
        reply = await client.wait_line(lambda m: m.get("id") == int(big))
        assert "result" in reply
        assert not [m for m in client.lines if "error" in m and m.get("id") is None]
