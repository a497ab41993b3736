"""OpenAI Responses adapter against a local server sending documented SSE bytes."""

from __future__ import annotations

import json

from _helpers.sse_server import Reply, collect, open_sse_server, sse
from roost._json import loads
from roost.engines import (
    EngineRequest,
    Finish,
    OpenAIResponsesEngine,
    ProviderSettings,
    ReasoningDelta,
    RetryPolicy,
    TextDelta,
    ToolCall,
    ToolCallEnd,
    ToolCallStart,
    ToolResult,
    Usage,
    UserMessage,
)

REQ = EngineRequest(system="sys", history=[UserMessage("hi")], effort="low")


def ev(kind: str, **data) -> str:
    return f"event: {kind}\ndata: " + json.dumps({"type": kind, **data}) + "\n\n"


COMPLETED = ev(
    "response.completed",
    response={"id": "r1", "status": "completed", "usage": {"input_tokens": 11, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 5}}},
)


def engine(server) -> OpenAIResponsesEngine:
    return OpenAIResponsesEngine(ProviderSettings(provider="openai-responses", base_url=server.base_url + "/v1", model="o-test", api_key="k"))


async def test_text_reasoning_and_completed():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            ev("response.created", response={"id": "r1", "status": "in_progress"}),
            ev("response.reasoning_summary_text.delta", item_id="rs1", output_index=0, delta="think"),
            ev("response.output_item.added", output_index=1, item={"id": "m1", "type": "message"}),
            ev("response.output_text.delta", item_id="m1", output_index=1, content_index=0, delta="Hi"),
            ev("response.output_text.delta", item_id="m1", output_index=1, content_index=0, delta=" there"),
            ev("response.output_text.done", item_id="m1", output_index=1, content_index=0, text="Hi there"),
            COMPLETED,
        )))
        async with engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None
    assert events == [ReasoningDelta("think"), TextDelta("Hi"), TextDelta(" there"), Usage(11, 3, 5), Finish("stop")]
    body = loads(server.requests[0].body)
    assert server.requests[0].path == "/v1/responses"
    assert body["instructions"] == "sys" and body["reasoning"]["effort"] == "low"
    assert body["input"] == [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]


async def test_parallel_function_calls_interleaved_by_item_id():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            ev("response.output_item.added", output_index=0, item={"id": "fc1", "type": "function_call", "call_id": "call_1", "name": "list_dir", "arguments": ""}),
            ev("response.output_item.added", output_index=1, item={"id": "fc2", "type": "function_call", "call_id": "call_2", "name": "read_file", "arguments": ""}),
            ev("response.function_call_arguments.delta", item_id="fc2", output_index=1, delta='{"path":'),
            ev("response.function_call_arguments.delta", item_id="fc1", output_index=0, delta='{"path":"."}'),
            ev("response.function_call_arguments.delta", item_id="fc2", output_index=1, delta='"b"}'),
            ev("response.function_call_arguments.done", item_id="fc1", output_index=0, arguments='{"path":"."}'),
            ev("response.output_item.done", output_index=0, item={"id": "fc1", "type": "function_call", "call_id": "call_1", "name": "list_dir", "arguments": '{"path":"."}'}),
            ev("response.function_call_arguments.done", item_id="fc2", output_index=1, arguments='{"path":"b"}'),
            ev("response.output_item.done", output_index=1, item={"id": "fc2", "type": "function_call", "call_id": "call_2", "name": "read_file", "arguments": '{"path":"b"}'}),
            COMPLETED,
        )))
        async with engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None
    assert events[:2] == [ToolCallStart("call_1", "list_dir", 0), ToolCallStart("call_2", "read_file", 1)]
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert ends == [ToolCallEnd("call_1", "list_dir", {"path": "."}), ToolCallEnd("call_2", "read_file", {"path": "b"})]
    assert events[-1] == Finish("tool_calls")


async def test_invalid_arguments_name_the_tool():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            ev("response.output_item.added", output_index=0, item={"id": "fc1", "type": "function_call", "call_id": "c", "name": "shell", "arguments": ""}),
            ev("response.function_call_arguments.delta", item_id="fc1", output_index=0, delta="{oops"),
            ev("response.output_item.done", output_index=0, item={"id": "fc1", "type": "function_call", "call_id": "c", "name": "shell", "arguments": "{oops"}),
            COMPLETED,
        )))
        async with engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is not None and "'shell'" in str(failure)


async def test_incomplete_is_length_and_missing_completed_is_failure():
    async with open_sse_server() as server:
        server.add(
            Reply(chunks=sse(
                ev("response.output_text.delta", item_id="m", output_index=0, delta="x"),
                ev("response.incomplete", response={"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}),
            )),
            Reply(chunks=sse(ev("response.output_text.delta", item_id="m", output_index=0, delta="half"))),
        )
        async with engine(server) as eng:
            events, failure = await collect(eng, REQ)
            assert failure is None and events[-1] == Finish("length")
            eng.retry = RetryPolicy(max_attempts=1)
            events, failure = await collect(eng, REQ)
    assert failure is not None and failure.partial_text == "half" and "response.completed" in str(failure)


async def test_failed_and_error_events():
    async with open_sse_server() as server:
        server.add(
            Reply(chunks=sse(ev("response.failed", response={"status": "failed", "error": {"code": "context_length_exceeded", "message": "too long"}}))),
            Reply(chunks=sse(ev("response.output_text.delta", item_id="m", output_index=0, delta="a"), ev("error", code="invalid_prompt", message="bad"))),
        )
        async with engine(server) as eng:
            _, failure = await collect(eng, REQ)
            assert failure.category == "context_length" and failure.provider_code == "context_length_exceeded"
            _, failure = await collect(eng, REQ)
            assert failure.category == "invalid_request" and failure.partial_text == "a"


def test_history_mapping():
    eng = OpenAIResponsesEngine(ProviderSettings(provider="openai-responses", base_url="http://x/v1", model="m"))
    body = eng._body(EngineRequest(history=[UserMessage("q"), ToolCall("c1", "f", {"a": 1}), ToolResult("c1", "out")]))
    assert body["input"][1] == {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":1}'}
    assert body["input"][2] == {"type": "function_call_output", "call_id": "c1", "output": "out"}


def test_wire_body_is_the_mapped_body_with_messages_encoded_once(monkeypatch):
    from roost.engines import AgentMessage, Image, Reasoning
    from roost.engines._openai_responses import MessageJSON

    eng = OpenAIResponsesEngine(ProviderSettings(provider="openai-responses", base_url="http://x/v1", model="m"))
    history = [
        UserMessage("q"), AgentMessage("a"), UserMessage("look", images=[Image("image/png", "aGk=")]),
        Reasoning("r", "openai-responses", [{"type": "reasoning", "encrypted_content": "x"}]),
        ToolCall("c1", "f", {"a": 1}), ToolResult("c1", "out"), AgentMessage("a"), UserMessage('q \u2603 "quoted"\n'),
        UserMessage("a"),  # the same text in another role
    ]
    request = EngineRequest(system="s", history=history, effort="low")
    for _ in range(2):  # the second time from the encoded messages
        assert loads(eng._encode_body(request)) == eng._body(request)
    monkeypatch.setattr(MessageJSON, "LIMIT", 100)  # full: it starts over, the body stays the same
    for n in range(5):
        request = EngineRequest(history=[*history, AgentMessage("x" * 60 + str(n))])
        assert loads(eng._encode_body(request)) == eng._body(request)
