"""Issue 14 end to end: the real `roost exec` and `roost app-server` against a local server replaying
what compatible servers stream (parallel calls sharing an index, ids reused across rounds, object
arguments, a 200 that is not an event stream, Anthropic thinking across a restart)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import trio
from _helpers.appserver import open_app_server, roost_argv
from _helpers.sse_server import Reply, json_reply, open_sse_server, sse
from _helpers.timing import scaled


def chat(delta: dict | None = None, finish: str | None = None) -> str:
    return "data: " + json.dumps({"id": "c", "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}) + "\n\n"


def tool(index: int, call_id: str, name: str, arguments) -> dict:
    return {"tool_calls": [{"index": index, "id": call_id, "type": "function",
                            "function": {"name": name, "arguments": arguments}}]}


def ev(kind: str, **data) -> str:
    return f"event: {kind}\ndata: " + json.dumps({"type": kind, **data}) + "\n\n"


def _env(home: Path, provider: str, base_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
    env.update(ROOST_HOME=str(home), ROOST_PROVIDER=provider, ROOST_BASE_URL=base_url, ROOST_MODEL="m",
               OPENAI_API_KEY="sk-test", ANTHROPIC_API_KEY="ak-test")
    return env


async def _exec(env: dict, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    with trio.fail_after(scaled(60)):
        return await trio.run_process([*roost_argv(), "exec", *args], env=env, cwd=str(cwd), capture_stdout=True,
                                      capture_stderr=True, check=False, stdin=subprocess.DEVNULL)


async def test_exec_tool_loop_with_shared_index_and_reused_ids_pairs_every_result(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.txt").write_text(f"contents of {name}\n")
    async with open_sse_server() as server:
        server.add(
            # round 1: two parallel calls, both at index 0, told apart by their ids
            Reply(chunks=sse(chat(tool(0, "call_0", "read_file", "")), chat(tool(0, "", "", '{"path": "a.txt"}')),
                             chat(tool(0, "call_1", "read_file", "")), chat(tool(0, "", "", '{"path": "b.txt"}')),
                             chat(finish="tool_calls"), "data: [DONE]\n\n")),
            # round 2: the server numbers its calls from call_0 again, arguments as an object
            Reply(chunks=sse(chat(tool(0, "call_0", "read_file", {"path": "c.txt"})), chat(finish="tool_calls"),
                             "data: [DONE]\n\n")),
            Reply(chunks=sse(chat({"content": "All read."}), chat(finish="stop"), "data: [DONE]\n\n")),
        )
        done = await _exec(_env(tmp_path / "home", "openai", server.base_url + "/v1"), "--json", "read them",
                           cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()
    lines = [json.loads(line) for line in done.stdout.decode().splitlines()]
    calls = [m["params"]["item"] for m in lines if m["method"] == "item/completed"
             and m["params"]["item"]["type"] == "tool_call"]
    assert [c["arguments"] for c in calls] == [{"path": "a.txt"}, {"path": "b.txt"}, {"path": "c.txt"}]
    assert all(not c.get("is_error") for c in calls)
    ids = [c["call_id"] for c in calls]
    assert ids[:2] == ["call_0", "call_1"] and len(set(ids)) == 3
    assert lines[-1]["method"] == "turn/completed"
    body = json.loads(server.requests[2].body)
    sent = {c["id"]: json.loads(c["function"]["arguments"])["path"]
            for m in body["messages"] if m["role"] == "assistant" for c in m.get("tool_calls", [])}
    results = {m["tool_call_id"]: m["content"] for m in body["messages"] if m["role"] == "tool"}
    assert set(sent) == set(results) == set(ids)
    for call_id, path in sent.items():  # each result is its own call's file
        assert f"contents of {path[0]}" in results[call_id]


async def test_exec_a_200_html_page_fails_once_naming_the_content_type(tmp_path: Path) -> None:
    async with open_sse_server() as server:
        page = b"<html><title>Gateway error</title></html>"
        server.add(*[json_reply(200, page, {"content-type": "text/html"}) for _ in range(4)])
        done = await _exec(_env(tmp_path / "home", "openai", server.base_url + "/v1"), "hello", cwd=tmp_path)
    assert done.returncode == 1
    assert len(server.requests) == 1
    message = done.stderr.decode()
    assert "text/html" in message and "Gateway error" in message and "Traceback" not in message


THINK = [
    ev("message_start", message={"id": "m1", "usage": {"input_tokens": 5, "output_tokens": 1}}),
    ev("content_block_start", index=0, content_block={"type": "thinking", "thinking": "", "signature": ""}),
    ev("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "I should read it."}),
    ev("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "SIG-1"}),
    ev("content_block_stop", index=0),
    ev("content_block_start", index=1, content_block={"type": "redacted_thinking", "data": "REDACTED-1"}),
    ev("content_block_stop", index=1),
    ev("content_block_start", index=2, content_block={"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}),
    ev("content_block_delta", index=2, delta={"type": "input_json_delta", "partial_json": '{"path": "a.txt"}'}),
    ev("content_block_stop", index=2),
    ev("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 30}),
    ev("message_stop"),
]


def _text_reply(text: str) -> Reply:
    return Reply(chunks=sse(
        ev("message_start", message={"id": "m", "usage": {"input_tokens": 1}}),
        ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        ev("content_block_delta", index=0, delta={"type": "text_delta", "text": text}),
        ev("content_block_stop", index=0),
        ev("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 2}),
        ev("message_stop"),
    ))


async def test_app_server_replays_signed_thinking_in_the_tool_loop_and_after_a_restart(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("hello from a\n")
    expected = [
        {"type": "thinking", "thinking": "I should read it.", "signature": "SIG-1"},
        {"type": "redacted_thinking", "data": "REDACTED-1"},
        {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.txt"}},
    ]
    async with open_sse_server() as server:
        env = _env(tmp_path / "home", "anthropic", server.base_url)
        server.add(Reply(chunks=sse(*THINK)), _text_reply("It says hello."), _text_reply("Still hello."))
        async with open_app_server(env=env, cwd=tmp_path) as client:
            await client.initialize()
            thread = (await client.request("thread/start", {"cwd": str(tmp_path), "effort": "low"}))["thread"]
            first = await client.run_turn(thread["id"], "read a.txt")
            assert first["turn"]["status"] == "completed", first
        loop_body = json.loads(server.requests[1].body)
        assert loop_body["thinking"]["type"] == "enabled"
        assert loop_body["messages"][1] == {"role": "assistant", "content": expected}
        # A new process: the history is rebuilt from the store, thinking blocks included.
        async with open_app_server(env=env, cwd=tmp_path) as client:
            await client.initialize()
            await client.request("thread/resume", {"thread_id": thread["id"]})
            second = await client.run_turn(thread["id"], "and again?")
            assert second["turn"]["status"] == "completed", second
    body = json.loads(server.requests[2].body)
    assert body["messages"][1] == {"role": "assistant", "content": expected}
    assert body["messages"][2]["content"][0]["tool_use_id"] == "toolu_1"
    assert "hello from a" in body["messages"][2]["content"][0]["content"]
