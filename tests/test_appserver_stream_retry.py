"""A provider stream retried after partial output, end to end (app-server-protocol.md,
"Notifications": ``item/removed`` retracts an attempt-scoped item, ``item/agentMessage/replace`` /
``item/reasoning/replace`` replace accumulated text).

The real ``roost app-server`` talks to a local mock provider that drops (or errors inside) the
first stream after some output and answers the retry in full: the client sees the partial item,
the retry (``turn/event`` ``retrying`` with ``restart: true``), the replacement or retraction, then
the final text; the turn completes, and history (thread/resume, and the next model request) holds
only the final text.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
from _helpers.appserver import open_app_server, roost_argv
from _helpers.sse_server import Reply, open_sse_server, sse
from _helpers.timing import scaled


def chat(delta: dict | None = None, finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return "data: " + json.dumps({"id": "c", "choices": [choice]}) + "\n\n"


def ev(kind: str, **data) -> str:
    return f"event: {kind}\ndata: " + json.dumps({"type": kind, **data}) + "\n\n"


def _env(home: Path, provider: str, base_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
    env.update(ROOST_HOME=str(home), ROOST_PROVIDER=provider, ROOST_BASE_URL=base_url, ROOST_MODEL="m",
               OPENAI_API_KEY="sk-test", ANTHROPIC_API_KEY="ak-test")
    return env


def _check_schema(lines: list[dict]) -> None:
    """Every line the client read matches ``roost app-server --print-schema``."""
    import subprocess

    schema = json.loads(subprocess.run([*roost_argv(), "app-server", "--print-schema"], capture_output=True,
                                       check=True).stdout)
    validator = jsonschema.Draft202012Validator(schema)
    for line in lines:
        errors = [e.message for e in validator.iter_errors(line)]
        assert not errors, (line, errors[:3])


def _turn_lines(client, turn_id: str) -> list[dict]:
    return [m for m in client.notifications() if (m["params"].get("turn_id") == turn_id
                                                   or (m["params"].get("turn") or {}).get("id") == turn_id)]


async def test_a_chat_stream_dropped_mid_text_is_retried_and_its_text_replaced(tmp_path: Path) -> None:
    partial = "Hello wor" + "l" * 5000  # long enough to be checkpointed before the drop
    async with open_sse_server() as server:
        server.add(
            Reply(chunks=sse(chat({"content": partial[:9]}), chat({"content": partial[9:]})), end="abort"),
            Reply(chunks=sse(chat({"content": "Hello "}), chat({"content": "world."}), chat(finish="stop"),
                             "data: [DONE]\n\n")),
            Reply(chunks=sse(chat({"content": "Again."}), chat(finish="stop"), "data: [DONE]\n\n")),
        )
        async with open_app_server(env=_env(tmp_path / "home", "openai", server.base_url + "/v1"),
                                   cwd=tmp_path) as client:
            await client.initialize()
            thread = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]
            end = await client.run_turn(thread["id"], "greet")
            turn_id = end["turn"]["id"]
            assert end["turn"]["status"] == "completed", end
            lines = [(m["method"], m["params"]) for m in _turn_lines(client, turn_id)]
            methods = [m for m, _ in lines]
            started = [p["item"] for m, p in lines if m == "item/started" and p["item"]["type"] == "agent_message"]
            assert len(started) == 1  # one visible assistant item, kept across the retry
            item_id = started[0]["id"]
            deltas = [p["delta"] for m, p in lines if m == "item/agentMessage/delta"]
            retry = [p["event"] for m, p in lines if m == "turn/event" and p["event"]["type"] == "retrying"]
            replace = [p for m, p in lines if m == "item/agentMessage/replace"]
            assert retry and retry[0]["restart"] is True and retry[0]["reason"] == "network"
            assert replace == [{"thread_id": thread["id"], "turn_id": turn_id, "item_id": item_id, "text": ""}]
            # order: the partial text, the retry, the replacement, then the retry's text
            i_partial, i_retry = methods.index("item/agentMessage/delta"), methods.index("turn/event")
            i_replace = methods.index("item/agentMessage/replace")
            assert i_partial < i_retry < i_replace < len(methods) - 1 - methods[::-1].index("item/agentMessage/delta")
            assert "".join(deltas) == partial + "Hello world."
            completed = [p["item"] for m, p in lines if m == "item/completed" and p["item"]["type"] == "agent_message"]
            assert [(c["id"], c["text"], c["status"]) for c in completed] == [(item_id, "Hello world.", "completed")]
            assert "item/removed" not in methods
            snapshot = await client.request("thread/resume", {"session_id": thread["id"], "response_only": True})
            items = [i for t in snapshot["turns"] for i in t["items"]]
            assert [(i["type"], i.get("text")) for i in items] == [("user_message", "greet"),
                                                                   ("agent_message", "Hello world.")]
        async with open_app_server(env=_env(tmp_path / "home", "openai", server.base_url + "/v1"),
                                   cwd=tmp_path) as client:  # a new process: history from the store
            await client.initialize()
            await client.request("thread/resume", {"session_id": thread["id"], "response_only": True})
            again = await client.run_turn(thread["id"], "again")
            assert again["turn"]["status"] == "completed"
    first, retried, nxt = (json.loads(r.body) for r in server.requests)
    assert first == retried  # the same request, sent again
    assistant = [m["content"] for m in nxt["messages"] if m["role"] == "assistant"]
    assert assistant == ["Hello world."]  # the model's next context has only the final text


THINKING = "Let me think. " + "x" * 5000  # checkpointed before the error


async def test_an_anthropic_overloaded_error_mid_stream_retracts_the_attempts_items(tmp_path: Path) -> None:
    first = sse(
        ev("message_start", message={"id": "m1", "usage": {"input_tokens": 5}}),
        ev("content_block_start", index=0, content_block={"type": "thinking", "thinking": "", "signature": ""}),
        ev("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": THINKING}),
        ev("content_block_stop", index=0),
        ev("content_block_start", index=1, content_block={"type": "text", "text": ""}),
        ev("content_block_delta", index=1, delta={"type": "text_delta", "text": "I will list"}),
        ev("content_block_stop", index=1),
        ev("content_block_start", index=2, content_block={"type": "tool_use", "id": "toolu_1", "name": "list_dir",
                                                          "input": {}}),
        ev("error", error={"type": "overloaded_error", "message": "Overloaded"}),
    )
    second = sse(
        ev("message_start", message={"id": "m2", "usage": {"input_tokens": 5}}),
        ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "Nothing to list."}),
        ev("content_block_stop", index=0),
        ev("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 4}),
        ev("message_stop"),
    )
    async with open_sse_server() as server:
        server.add(Reply(chunks=first), Reply(chunks=second))
        async with open_app_server(env=_env(tmp_path / "home", "anthropic", server.base_url), cwd=tmp_path) as client:
            await client.initialize()
            thread = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]
            end = await client.run_turn(thread["id"], "list it")
            turn_id = end["turn"]["id"]
            assert end["turn"]["status"] == "completed", end
            lines = [(m["method"], m["params"]) for m in _turn_lines(client, turn_id)]
            started = {p["item"]["type"]: p["item"]["id"] for m, p in lines if m == "item/started"}
            removed = [p["item_id"] for m, p in lines if m == "item/removed"]
            # the reasoning the retry did not repeat and the tool call that never ran are retracted
            assert sorted(removed) == sorted([started["reasoning"], started["tool_call"]])
            assert [p["text"] for m, p in lines if m == "item/reasoning/replace"] == [""]
            replace = [p for m, p in lines if m == "item/agentMessage/replace"]
            assert [(p["item_id"], p["text"]) for p in replace] == [(started["agent_message"], "")]
            completed = [p["item"] for m, p in lines if m == "item/completed"]
            assert [(c["type"], c.get("text")) for c in completed] == [("user_message", "list it"),
                                                                       ("agent_message", "Nothing to list.")]
            assert all(i["id"] not in removed for i in end["turn"]["items"])
            snapshot = await client.request("thread/resume", {"session_id": thread["id"], "response_only": True})
            items = [i for t in snapshot["turns"] for i in t["items"]]
            assert [(i["type"], i.get("text"), i["status"]) for i in items] == [
                ("user_message", "list it", "completed"), ("agent_message", "Nothing to list.", "completed")]
            _check_schema(client.lines)  # item/removed and the replace notifications included
        # a new process reads the store: the retracted reasoning's checkpoint row is gone too
        async with open_app_server(env=_env(tmp_path / "home", "anthropic", server.base_url), cwd=tmp_path) as client:
            await client.initialize()
            snapshot = await client.request("thread/resume", {"session_id": thread["id"], "response_only": True})
            stored = [(i["type"], i.get("text"), i["status"]) for t in snapshot["turns"] for i in t["items"]]
            assert stored == [("user_message", "list it", "completed"),
                              ("agent_message", "Nothing to list.", "completed")]
    assert len(server.requests) == 2


async def test_a_stream_dropped_on_every_attempt_fails_the_turn_with_the_last_attempts_text(tmp_path: Path) -> None:
    async with open_sse_server() as server:
        server.add(*[Reply(chunks=sse(chat({"content": f"attempt {n}"})), end="abort") for n in range(1, 5)])
        async with open_app_server(env=_env(tmp_path / "home", "openai", server.base_url + "/v1"),
                                   cwd=tmp_path) as client:
            await client.initialize()
            thread = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]
            end = await client.run_turn(thread["id"], "greet")
            turn_id = end["turn"]["id"]
            lines = [(m["method"], m["params"]) for m in _turn_lines(client, turn_id)]
            snapshot = await client.request("thread/resume", {"session_id": thread["id"], "response_only": True})
    assert len(server.requests) == 4  # the default limit: 4 attempts in all
    error = end["turn"]["error"]
    assert end["turn"]["status"] == "failed" and error["category"] == "network"
    assert error["recovery"]["attempt_count"] == 4 and error["recovery"]["retry_count"] == 3
    assert error["recovery"]["stop_reason"] == "retry_limit" and error["partial_text"] == "attempt 4"
    assert [p["text"] for m, p in lines if m == "item/agentMessage/replace"] == ["", "", ""]
    (message,) = [i for i in end["turn"]["items"] if i["type"] == "agent_message"]
    assert message["status"] == "failed" and message["text"] == "attempt 4"
    stored = [i for t in snapshot["turns"] for i in t["items"] if i["type"] == "agent_message"]
    assert [(i["text"], i["status"]) for i in stored] == [("attempt 4", "failed")]


async def test_exec_text_mode_says_the_reply_starts_again(tmp_path: Path) -> None:
    import subprocess

    import trio

    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(chat({"content": "Hello wor"})), end="abort"),
                   Reply(chunks=sse(chat({"content": "Hello world."}), chat(finish="stop"), "data: [DONE]\n\n")))
        env = _env(tmp_path / "home", "openai", server.base_url + "/v1")
        with trio.fail_after(scaled(60)):
            done = await trio.run_process([*roost_argv(), "exec", "greet"], env=env, cwd=str(tmp_path),
                                          capture_stdout=True, capture_stderr=True, check=False,
                                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == "Hello wor\nHello world.\n"
    assert "the model stream was retried after partial output" in done.stderr.decode()
