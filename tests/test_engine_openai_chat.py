"""OpenAI Chat Completions adapter against a local server sending documented SSE bytes."""

from __future__ import annotations

import pytest
import trio

from _helpers.sse_server import Reply, collect, open_sse_server, sse
from roost._json import loads
from roost.engines import (
    AgentMessage,
    EngineRequest,
    Finish,
    Image,
    OpenAIChatEngine,
    ProviderSettings,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolResult,
    ToolSchema,
    Usage,
    UserMessage,
    INTERRUPTED_OUTPUT,
)

REQ = EngineRequest(system="be brief", history=[UserMessage("hi")])


def chunk(delta: dict, finish: str | None = None) -> str:
    import json

    return "data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}) + "\n\n"


def engine(server, **kw) -> OpenAIChatEngine:
    return OpenAIChatEngine(ProviderSettings(provider="openai", base_url=server.base_url + "/v1", model="gpt-test", api_key="sk-test", **kw))


async def test_text_usage_done_and_request_shape():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            chunk({"role": "assistant", "content": ""}),
            chunk({"content": "Hello"}),
            chunk({"content": " world"}),
            chunk({}, "stop"),
            'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}\n\n',
            "data: [DONE]\n\n",
        )))
        async with engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None
    assert events == [TextDelta("Hello"), TextDelta(" world"), Usage(9, 2, 4), Finish("stop")]
    req = server.requests[0]
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-test"
    body = loads(req.body)
    assert body["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


async def test_keepalive_comments_retry_blocks_and_multiline_data_and_crlf_splits():
    # A comment-only block and a retry:-only block carry no data and are ignored. The JSON of one
    # event is spread over two data: lines (joined with "\n", still valid JSON). CRLF framing is
    # split between network chunks, including between the CR and the LF of a blank line.
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            ": keep-alive\r\n\r\n",
            "retry: 3000\r\n\r\n",
            'data: {"choices":[{"index":0,\r\ndata: "delta":{"content":"multi"}}]}\r\n\r',
            "\n",
            'data: {"choices":[{"index":0,"delta":{"content":"-line"},"finish_reason":"stop"}]}\r',
            "\n\r\n",
            "data: [DO", "NE]\r\n\r\n",
        )))
        async with engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None
    assert events == [TextDelta("multi"), TextDelta("-line"), Finish("stop")]


async def test_parallel_tool_calls_interleaved_by_index():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {"name": "list_dir", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": '{"pa'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path"'}}]}),
            chunk({"tool_calls": [{"index": 1, "function": {"arguments": 'th": "a.txt"}'}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "."}'}}]}),
            chunk({}, "tool_calls"),
            "data: [DONE]\n\n",
        )))
        async with engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None
    assert events[0] == ToolCallStart("call_a", "list_dir", 0)
    assert events[1] == ToolCallStart("call_b", "read_file", 1)
    assert ToolCallDelta("call_a", '{"path"') in events
    assert events[-3:] == [
        ToolCallEnd("call_a", "list_dir", {"path": "."}),
        ToolCallEnd("call_b", "read_file", {"path": "a.txt"}),
        Finish("tool_calls"),
    ]


async def test_empty_arguments_mean_empty_object():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "now", "arguments": ""}}]}),
            chunk({}, "tool_calls"),
            "data: [DONE]\n\n",
        )))
        async with engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None
    assert ToolCallEnd("c", "now", {}) in events


async def test_invalid_arguments_fail_naming_the_tool():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            chunk({"content": "calling"}),
            chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "shell", "arguments": '{"command": "ls'}}]}),
            chunk({}, "tool_calls"),
            "data: [DONE]\n\n",
        )))
        async with engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is not None and "shell" in str(failure)
    assert failure.category == "provider" and not any(isinstance(e, ToolCallEnd) for e in events)
    assert failure.partial_text == "calling"


async def test_finish_reason_without_done_is_accepted():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(chunk({"content": "ok"}), chunk({}, "length"))))
        async with engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None and events == [TextDelta("ok"), Finish("length")]


@pytest.mark.parametrize("end", ["complete", "abort"])
async def test_stream_without_terminal_marker_is_a_failure_keeping_partial_text(end):
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(chunk({"content": "partial "}), chunk({"content": "text"})), end=end))
        async with engine(server, max_attempts=1) as eng:
            events, failure = await collect(eng, REQ)
    assert events == [TextDelta("partial "), TextDelta("text")]
    assert failure is not None and failure.category == "network"
    assert failure.partial_text == "partial text"
    assert len(server.requests) == 1
    # a dropped stream is retryable (sent again while attempts remain); here the limit is one
    assert failure.retryable and failure.stop_reason == "retry_limit"
    if end == "complete":  # a clean end without [DONE] names what was received
        assert "without [DONE]" in failure.message and "received 2 events" in failure.message
        assert '"text"' in failure.message


async def test_a_dropped_stream_is_sent_again_and_restarts():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(chunk({"content": "partial "})), end="abort"),
                   Reply(chunks=sse(chunk({"content": "whole"}, "stop"), "data: [DONE]\n\n")))
        async with engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None and len(server.requests) == 2
    assert [type(e).__name__ for e in events] == ["TextDelta", "Retrying", "TextDelta", "Finish"]
    assert events[1].restart and events[2] == TextDelta("whole")


async def test_error_chunk_after_200():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(chunk({"content": "a"}), 'data: {"error":{"message":"boom","code":"server_error"}}\n\n')))
        async with engine(server, max_attempts=1) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is not None and failure.provider_code == "server_error" and "boom" in str(failure)
    assert failure.retryable  # a server_error inside the stream is transient: retried while attempts remain


def test_history_mapping_pairs_tool_results_and_images():
    eng = OpenAIChatEngine(ProviderSettings(provider="openai", base_url="http://x/v1", model="m"))
    req = EngineRequest(
        history=[
            UserMessage("look", [Image("image/png", "QUJD")]),
            AgentMessage("let me check"),
            ToolCall("c1", "list_dir", {"path": "."}),
            ToolCall("c2", "shell", {"command": "ls"}),
            UserMessage("stop that"),  # the turn was interrupted: c1/c2 never got results here
            ToolResult("c1", "a b"),  # a late result is moved next to its call
        ],
        tools=[ToolSchema("list_dir", "list", {"type": "object"})],
        max_tokens=100,
        temperature=0.5,
    )
    body = eng._body(req)
    msgs = body["messages"]
    assert msgs[0]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}
    assert msgs[1]["role"] == "assistant" and msgs[1]["content"] == "let me check"
    assert [c["id"] for c in msgs[1]["tool_calls"]] == ["c1", "c2"]
    assert msgs[2] == {"role": "tool", "tool_call_id": "c1", "content": "a b"}
    assert msgs[3] == {"role": "tool", "tool_call_id": "c2", "content": INTERRUPTED_OUTPUT}
    assert msgs[4] == {"role": "user", "content": "stop that"}
    assert len(msgs) == 5
    assert body["tools"][0]["function"]["name"] == "list_dir"
    assert body["max_tokens"] == 100 and body["temperature"] == 0.5
