"""Anthropic Messages adapter against a local server sending documented SSE bytes."""

from __future__ import annotations

import json

from _helpers.sse_server import Reply, collect, json_reply, no_sleep, open_sse_server, sse
from roost._json import loads
from roost.engines import (
    AgentMessage,
    AnthropicEngine,
    EngineRequest,
    Finish,
    Image,
    ProviderSettings,
    ReasoningDelta,
    ReasoningItems,
    Retrying,
    RetryPolicy,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolResult,
    Usage,
    UserMessage,
)

REQ = EngineRequest(system="sys", history=[UserMessage("hi")])


def ev(kind: str, **data) -> str:
    return f"event: {kind}\ndata: " + json.dumps({"type": kind, **data}) + "\n\n"


START = ev("message_start", message={"id": "m", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": 20, "cache_read_input_tokens": 7, "output_tokens": 1}})
STOP = ev("message_stop")


def engine(server) -> AnthropicEngine:
    return AnthropicEngine(ProviderSettings(provider="anthropic", base_url=server.base_url, model="claude-test", api_key="ak"))


async def test_text_thinking_ping_usage_and_stop():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            START,
            ev("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""}),
            ev("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "hmm"}),
            ev("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "sig"}),
            ev("content_block_stop", index=0),
            ev("ping"),
            ev("content_block_start", index=1, content_block={"type": "text", "text": ""}),
            ev("content_block_delta", index=1, delta={"type": "text_delta", "text": "Hello"}),
            ev("content_block_stop", index=1),
            ev("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None}, usage={"output_tokens": 15}),
            STOP,
        )))
        async with engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None
    assert events == [ReasoningDelta("hmm"), TextDelta("Hello"),
                      ReasoningItems("anthropic", [{"type": "thinking", "thinking": "hmm", "signature": "sig"}]),
                      Usage(20, 15, 7), Finish("stop")]
    req = server.requests[0]
    assert req.path == "/v1/messages" and req.headers["x-api-key"] == "ak"
    assert req.headers["anthropic-version"] == "2023-06-01"
    body = loads(req.body)
    assert body["system"] == "sys" and body["max_tokens"] > 0


async def test_parallel_tool_use_input_json_delta_by_block_index():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            START,
            ev("content_block_start", index=0, content_block={"type": "tool_use", "id": "tu_1", "name": "list_dir", "input": {}}),
            ev("content_block_start", index=1, content_block={"type": "tool_use", "id": "tu_2", "name": "ping_host", "input": {}}),
            ev("content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": ""}),
            ev("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": '{"path": '}),
            ev("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": '"src"}'}),
            ev("content_block_stop", index=0),
            ev("content_block_stop", index=1),
            ev("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 30}),
            STOP,
        )))
        async with engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None
    assert events[:2] == [ToolCallStart("tu_1", "list_dir", 0), ToolCallStart("tu_2", "ping_host", 1)]
    assert ToolCallDelta("tu_1", '{"path": ') in events
    assert ToolCallEnd("tu_1", "list_dir", {"path": "src"}) in events
    assert ToolCallEnd("tu_2", "ping_host", {}) in events
    assert events[-1] == Finish("tool_calls")


async def test_mid_stream_overloaded_error_after_200_is_retried_restarting_the_stream():
    half = (START, ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "Half an ans"}))
    async with open_sse_server() as server:
        server.add(
            Reply(chunks=sse(*half, ev("error", error={"type": "overloaded_error", "message": "Overloaded"}))),
            Reply(chunks=sse(START, ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
                             ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "Whole."}),
                             ev("content_block_stop", index=0), ev("message_stop"))),
        )
        async with engine(server) as eng:
            eng.retry = RetryPolicy(max_attempts=2, sleep=no_sleep)
            events, failure = await collect(eng, REQ)
    # Anthropic documents overloaded_error in a stream as its HTTP 529: sent again, from the start
    assert failure is None and len(server.requests) == 2
    retry = [e for e in events if isinstance(e, Retrying)]
    assert len(retry) == 1 and retry[0].restart and retry[0].reason == "provider"
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Half an ans", "Whole."]


async def test_mid_stream_invalid_request_error_is_not_retried_and_keeps_partial_text():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            START,
            ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "Half an ans"}),
            ev("error", error={"type": "invalid_request_error", "message": "Bad"}),
        )))
        async with engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert events == [TextDelta("Half an ans")]
    assert failure.category == "invalid_request" and not failure.retryable
    assert failure.partial_text == "Half an ans" and failure.stop_reason == "non_retryable"
    assert len(server.requests) == 1


async def test_missing_message_stop_is_failure():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            START,
            ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "cut"}),
            ev("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 1}),
        )))
        async with engine(server) as eng:
            eng.retry = RetryPolicy(max_attempts=1)
            events, failure = await collect(eng, REQ)
    assert failure is not None and "message_stop" in str(failure) and failure.partial_text == "cut"
    assert failure.retryable and failure.stop_reason == "retry_limit"  # a dropped stream


async def test_models_list_uses_v1_models():
    async with open_sse_server() as server:
        server.add(json_reply(200, json.dumps({"data": [{"id": "claude-test", "type": "model"}, {"id": "claude-b", "type": "model"}], "has_more": False}).encode()))
        async with engine(server) as eng:
            models = await eng.list_models()
    assert server.requests[0].path.startswith("/v1/models")
    assert [(m.id, m.current) for m in models] == [("claude-b", False), ("claude-test", True)]


def test_history_alternation_tool_results_and_images():
    eng = AnthropicEngine(ProviderSettings(provider="anthropic", base_url="http://x", model="m", api_key="k"))
    body = eng._body(EngineRequest(history=[
        AgentMessage("I start"),  # a history may not start with the user
        UserMessage("see", [Image("image/jpeg", "QUJD")]),
        UserMessage("and this"),
        AgentMessage("calling"),
        ToolCall("t1", "shell", {"command": "ls"}),
        ToolCall("t2", "shell", {"command": "pwd"}),
        ToolResult("t2", "/", is_error=False),
        UserMessage("thanks"),
    ]))
    msgs = body["messages"]
    roles = [m["role"] for m in msgs]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[2]["content"][0] == {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "QUJD"}}
    assert [b["type"] for b in msgs[3]["content"]] == ["text", "tool_use", "tool_use"]
    last = msgs[4]["content"]
    assert [b["type"] for b in last] == ["tool_result", "tool_result", "text"]
    assert last[0]["tool_use_id"] == "t1" and last[0]["is_error"] is True
    assert last[1] == {"type": "tool_result", "tool_use_id": "t2", "content": "/", "is_error": False}
