"""What compatible servers actually stream (issue 14): byte-exact replays against the three adapters.

Each case is a stream a server really sends (OpenAI-compatible proxies and local servers, Anthropic
gateways, extended thinking), written as bytes by the local SSE server; the next request's body
shows what Roost sends back.
"""

from __future__ import annotations

import json

import pytest
from _helpers.sse_server import Reply, collect, json_reply, no_sleep, open_sse_server, sse

from roost._json import loads
from roost.engines import (
    AgentMessage,
    AnthropicEngine,
    ChatCompletionsParser,
    EngineRequest,
    Finish,
    OpenAIChatEngine,
    OpenAIResponsesEngine,
    ProviderSettings,
    Reasoning,
    ReasoningDelta,
    ReasoningItems,
    RetryPolicy,
    TextDelta,
    ToolCall,
    ToolCallEnd,
    ToolCallStart,
    ToolResult,
    Usage,
    UserMessage,
    new_call_id,
    pair_tool_results,
)

REQ = EngineRequest(history=[UserMessage("hi")])


def chat(delta: dict | None = None, finish: str | None = None, **extra) -> str:
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "choices": [choice], **extra}) + "\n\n"


def call(index, name=None, args=None, id=None) -> dict:
    frag: dict = {"function": {}}
    if index is not None:
        frag["index"] = index
    if id is not None:
        frag["id"] = id
        frag["type"] = "function"
    if name is not None:
        frag["function"]["name"] = name
    if args is not None:
        frag["function"]["arguments"] = args
    return frag


def ev(kind: str, **data) -> str:
    return f"event: {kind}\ndata: " + json.dumps({"type": kind, **data}) + "\n\n"


def chat_engine(server) -> OpenAIChatEngine:
    return OpenAIChatEngine(ProviderSettings(provider="openai", base_url=server.base_url + "/v1", model="m", api_key="k"))


def anthropic_engine(server) -> AnthropicEngine:
    return AnthropicEngine(ProviderSettings(provider="anthropic", base_url=server.base_url, model="c", api_key="k"))


def responses_engine(server) -> OpenAIResponsesEngine:
    return OpenAIResponsesEngine(ProviderSettings(provider="openai-responses", base_url=server.base_url + "/v1",
                                                  model="m", api_key="k"))


def ends(events) -> list[ToolCallEnd]:
    return [e for e in events if isinstance(e, ToolCallEnd)]


# -- case 1: parallel calls sharing one index --------------------------------------------------


async def test_parallel_calls_sharing_an_index_with_different_ids_are_kept_apart():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            chat({"role": "assistant", "tool_calls": [call(0, "read_file", "", id="call_A")]}),
            chat({"tool_calls": [call(0, args='{"path": "a.txt"}')]}),
            chat({"tool_calls": [call(0, "list_dir", "", id="call_B")]}),  # same index, new id
            chat({"tool_calls": [call(0, args='{"path": "."}')]}),
            chat(finish="tool_calls"),
            "data: [DONE]\n\n",
        )))
        async with chat_engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None
    assert [e for e in events if isinstance(e, ToolCallStart)] == [
        ToolCallStart("call_A", "read_file", 0), ToolCallStart("call_B", "list_dir", 1)]
    assert ends(events) == [ToolCallEnd("call_A", "read_file", {"path": "a.txt"}),
                            ToolCallEnd("call_B", "list_dir", {"path": "."})]
    assert events[-1] == Finish("tool_calls")


async def test_whole_calls_without_index_or_id_in_one_chunk_are_separate_calls():
    # Servers that send each parallel call whole, with neither index nor id (Ollama-style).
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            chat({"tool_calls": [call(None, "read_file", '{"path": "a"}'), call(None, "read_file", '{"path": "b"}')]}),
            chat(finish="tool_calls"),
        )))
        async with chat_engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None
    (a, b) = ends(events)
    assert (a.arguments, b.arguments) == ({"path": "a"}, {"path": "b"})
    assert a.call_id != b.call_id and a.call_id.startswith("call_roost_")


async def test_an_id_repeated_on_every_fragment_continues_its_call():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            chat({"tool_calls": [call(0, "read_file", '{"pa', id="x1")]}),
            chat({"tool_calls": [call(0, None, 'th": "z"}', id="x1")]}),
            chat(finish="tool_calls"), "data: [DONE]\n\n",
        )))
        async with chat_engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None and ends(events) == [ToolCallEnd("x1", "read_file", {"path": "z"})]


# -- case 2: ids missing or reused in a later round --------------------------------------------


async def test_ids_reused_in_a_later_round_are_replaced_and_each_result_pairs_with_its_call():
    round_stream = sse(
        chat({"tool_calls": [call(0, "read_file", '{"path": "a"}', id="call_0")]}),
        chat({"tool_calls": [call(1, "read_file", '{"path": "b"}', id="call_1")]}),
        chat(finish="tool_calls"), "data: [DONE]\n\n",
    )
    async with open_sse_server() as server:
        server.add(Reply(chunks=round_stream), Reply(chunks=round_stream),
                   Reply(chunks=sse(chat({"content": "done"}, "stop"), "data: [DONE]\n\n")))
        history: list = [UserMessage("go")]
        async with chat_engine(server) as eng:
            for _ in range(2):
                events, failure = await collect(eng, EngineRequest(history=history))
                assert failure is None
                calls = ends(events)
                history += [ToolCall(c.call_id, c.name, c.arguments) for c in calls]
                history += [ToolResult(c.call_id, f"content of {c.arguments['path']} #{len(history)}") for c in calls]
            await collect(eng, EngineRequest(history=history))
    ids = [h.call_id for h in history if isinstance(h, ToolCall)]
    assert ids[:2] == ["call_0", "call_1"]  # the server's ids, new in the thread, are kept
    assert len(set(ids)) == 4 and all(i.startswith("call_roost_") for i in ids[2:])
    body = loads(server.requests[2].body)
    sent_calls = {c["id"]: c for m in body["messages"] if m["role"] == "assistant" for c in m.get("tool_calls", [])}
    results = [m for m in body["messages"] if m["role"] == "tool"]
    assert len(sent_calls) == 4 and len(results) == 4
    for want, got in zip([h for h in history if isinstance(h, ToolResult)], results):
        assert got == {"role": "tool", "tool_call_id": want.call_id, "content": want.output}


def test_history_stored_with_repeated_ids_pairs_each_result_with_its_own_call():
    # A thread stored before ids were unique: round 2 reused "call_0".
    history = [UserMessage("go"), ToolCall("call_0", "t", {"n": 1}), ToolResult("call_0", "first"),
               ToolCall("call_0", "t", {"n": 2}), ToolResult("call_0", "second")]
    paired = pair_tool_results(history)
    assert paired == [UserMessage("go"), ToolCall("call_0", "t", {"n": 1}), ToolResult("call_0", "first"),
                      ToolCall("call_0_dup2", "t", {"n": 2}), ToolResult("call_0_dup2", "second")]


def test_roost_fallback_ids_never_repeat():
    parser = ChatCompletionsParser()
    ids = set()
    for _ in range(3):
        out = parser.feed("", json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": [call(None, "t", "{}")]}}]}))
        ids |= {e.call_id for e in out if isinstance(e, ToolCallStart)}
    assert len(ids) == 3
    assert len({new_call_id() for _ in range(1000)}) == 1000


# -- case 3: arguments as an object ------------------------------------------------------------


async def test_object_valued_arguments_are_accepted():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            chat({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "read_file", "arguments": {"path": "x"}}}]}),
            chat(finish="tool_calls"), "data: [DONE]\n\n",
        )))
        server.add(Reply(chunks=sse(
            ev("response.output_item.done", output_index=0,
               item={"type": "function_call", "id": "fc1", "call_id": "r1", "name": "list_dir", "arguments": {"path": "."}}),
            ev("response.completed", response={"status": "completed"}),
        )))
        async with chat_engine(server) as eng:
            chat_events, chat_failure = await collect(eng, REQ)
        async with responses_engine(server) as eng:
            resp_events, resp_failure = await collect(eng, REQ)
    assert chat_failure is None and ends(chat_events) == [ToolCallEnd("c1", "read_file", {"path": "x"})]
    # a function_call first seen in output_item.done still starts and ends
    assert resp_failure is None and ends(resp_events) == [ToolCallEnd("r1", "list_dir", {"path": "."})]
    assert ToolCallStart("r1", "list_dir", 0) in resp_events


# -- cases 4 and 5: Anthropic thinking, redacted thinking, input in content_block_start ---------

THINKING_STREAM = sse(
    ev("message_start", message={"id": "m1", "role": "assistant", "content": [], "usage": {"input_tokens": 5, "output_tokens": 1}}),
    ev("content_block_start", index=0, content_block={"type": "thinking", "thinking": "", "signature": ""}),
    ev("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "Let me "}),
    ev("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "look."}),
    ev("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "EqQBCgIYAhIM"}),
    ev("content_block_stop", index=0),
    ev("content_block_start", index=1, content_block={"type": "redacted_thinking", "data": "EmwKAhgBEgy3va"}),
    ev("content_block_stop", index=1),
    ev("content_block_start", index=2, content_block={"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {}}),
    ev("content_block_delta", index=2, delta={"type": "input_json_delta", "partial_json": '{"path": "a.txt"}'}),
    ev("content_block_stop", index=2),
    "event: ping\ndata: {\"type\": \"ping\"}\n\n",
    ev("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 40}),
    ev("message_stop"),
)


async def test_thinking_and_redacted_thinking_are_kept_and_replayed_unchanged_in_the_tool_loop():
    async with open_sse_server() as server:
        server.add(Reply(chunks=THINKING_STREAM))
        server.add(Reply(chunks=sse(
            ev("message_start", message={"id": "m2", "usage": {"input_tokens": 9}}),
            ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "It says hi."}),
            ev("content_block_stop", index=0),
            ev("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 3}),
            ev("message_stop"),
        )))
        request = EngineRequest(history=[UserMessage("read a.txt")], effort="low")
        async with anthropic_engine(server) as eng:
            events, failure = await collect(eng, request)
            assert failure is None
            (items,) = [e for e in events if isinstance(e, ReasoningItems)]
            thinking = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
            (end,) = ends(events)
            history = [*request.history, Reasoning(thinking, items.provider, items.items),
                       ToolCall(end.call_id, end.name, end.arguments), ToolResult(end.call_id, "hi")]
            _, failure = await collect(eng, EngineRequest(history=history, effort="low"))
    assert failure is None
    assert items == ReasoningItems("anthropic", [
        {"type": "thinking", "thinking": "Let me look.", "signature": "EqQBCgIYAhIM"},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va"}])
    assert events[-1] == Finish("tool_calls")
    body = loads(server.requests[1].body)
    assert body["thinking"]["type"] == "enabled"
    assistant = body["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == [
        {"type": "thinking", "thinking": "Let me look.", "signature": "EqQBCgIYAhIM"},
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va"},
        {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a.txt"}},
    ]
    assert body["messages"][2]["content"][0]["tool_use_id"] == "toolu_1"


def test_reasoning_of_another_provider_or_without_items_is_not_sent_to_anthropic():
    eng = AnthropicEngine(ProviderSettings(provider="anthropic", base_url="http://x", model="c"))
    body = eng._body(EngineRequest(history=[UserMessage("q"), Reasoning("plain"), Reasoning("r", "openai-responses", [{"type": "reasoning"}]),
                                            AgentMessage("a")]))
    assert body["messages"][1] == {"role": "assistant", "content": [{"type": "text", "text": "a"}]}


async def test_a_gateway_sending_the_whole_input_in_content_block_start_runs_with_it():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            ev("message_start", message={"id": "m", "usage": {"input_tokens": 1}}),
            ev("content_block_start", index=0, content_block={"type": "text", "text": "Reading."}),
            ev("content_block_stop", index=0),
            ev("content_block_start", index=1, content_block={"type": "tool_use", "id": "t1", "name": "read_file",
                                                              "input": {"path": "notes.md"}}),
            ev("content_block_stop", index=1),
            ev("message_delta", delta={"stop_reason": "tool_use"}),
            ev("message_stop"),
        )))
        async with anthropic_engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None
    assert TextDelta("Reading.") in events
    assert ends(events) == [ToolCallEnd("t1", "read_file", {"path": "notes.md"})]


# -- Responses: reasoning items replayed statelessly --------------------------------------------


async def test_responses_reasoning_items_are_replayed_with_their_encrypted_content():
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}],
                 "encrypted_content": "gAAAAB..."}
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            ev("response.output_item.added", output_index=0, item={"type": "reasoning", "id": "rs_1", "summary": []}),
            ev("response.reasoning_summary_text.delta", item_id="rs_1", output_index=0, delta="plan"),
            ev("response.output_item.done", output_index=0, item=reasoning),
            ev("response.output_item.added", output_index=1, item={"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "list_dir", "arguments": ""}),
            ev("response.function_call_arguments.delta", item_id="fc_1", output_index=1, delta='{"path": "."}'),
            ev("response.output_item.done", output_index=1, item={"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "list_dir", "arguments": '{"path": "."}'}),
            ev("response.completed", response={"status": "completed", "usage": {"input_tokens": 3, "output_tokens": 4}}),
        )))
        server.add(Reply(chunks=sse(ev("response.completed", response={"status": "completed"}))))
        request = EngineRequest(history=[UserMessage("ls")], effort="medium")
        async with responses_engine(server) as eng:
            events, failure = await collect(eng, request)
            (items,) = [e for e in events if isinstance(e, ReasoningItems)]
            (end,) = ends(events)
            history = [*request.history, Reasoning("plan", items.provider, items.items),
                       ToolCall(end.call_id, end.name, end.arguments), ToolResult(end.call_id, "a b")]
            await collect(eng, EngineRequest(history=history))
    assert failure is None
    first, second = (loads(r.body) for r in server.requests)
    assert first["include"] == ["reasoning.encrypted_content"] and first["store"] is False
    assert second["input"][1] == {"type": "reasoning", "summary": reasoning["summary"], "encrypted_content": "gAAAAB..."}
    assert second["input"][2]["type"] == "function_call" and second["input"][2]["call_id"] == "call_1"
    assert second["input"][3] == {"type": "function_call_output", "call_id": "call_1", "output": "a b"}
    assert second["include"] == ["reasoning.encrypted_content"]


# -- case 6 and its kin: replies that are not what they claim ------------------------------------


@pytest.mark.parametrize("make", ["chat", "anthropic", "responses"])
@pytest.mark.parametrize(("content_type", "body", "named"), [
    ("text/html; charset=utf-8", b"<html><body><h1>502 Bad Gateway</h1></body></html>", "502 Bad Gateway"),
    ("application/json", b'{"error": {"message": "model overloaded, try later", "code": "overloaded"}}', "model overloaded"),
])
async def test_a_200_reply_that_is_not_an_event_stream_fails_once_naming_it(make, content_type, body, named):
    async with open_sse_server() as server:
        server.add(*[json_reply(200, body, {"content-type": content_type}) for _ in range(4)])
        factory = {"chat": chat_engine, "anthropic": anthropic_engine, "responses": responses_engine}[make]
        async with factory(server) as eng:
            events, failure = await collect(eng, REQ)
    assert events == [] and len(server.requests) == 1  # the paid request is sent once
    assert failure is not None and not failure.retryable and failure.stop_reason == "non_retryable"
    assert failure.http_status == 200 and content_type.split(";")[0] in failure.message and named in failure.message


@pytest.mark.parametrize("stream", [
    'data: {"error": {"message": "upstream timed out", "code": 504}}\n\n',                   # OpenAI / OpenRouter
    'data: {"object": "error", "message": "upstream timed out", "type": "BadRequestError", "code": 400}\n\n',  # vLLM
])
async def test_an_error_object_inside_a_200_chat_stream_fails_without_a_retry(stream):
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(stream)), Reply(chunks=sse(chat({"content": "x"}, "stop"))))
        async with chat_engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert events == [] and len(server.requests) == 1
    assert not failure.retryable and "upstream timed out" in failure.message


@pytest.mark.parametrize(("factory", "stream", "marker"), [
    (anthropic_engine, [ev("message_start", message={"usage": {}}), ev("content_block_start", index=0, content_block={"type": "text", "text": ""})], "message_stop"),
    (responses_engine, [ev("response.created", response={"status": "in_progress"})], "response.completed"),
])
async def test_streams_ending_without_their_terminal_marker_are_retried_then_fail(factory, stream, marker):
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(*stream)), Reply(chunks=sse(*stream)))
        async with factory(server) as eng:
            eng.retry = RetryPolicy(max_attempts=2, sleep=no_sleep)
            _, failure = await collect(eng, REQ)
    # a truncated stream is a dropped one: sent again, until the attempts run out
    assert len(server.requests) == 2 and failure.retryable and failure.stop_reason == "retry_limit"
    assert marker in failure.message and "received" in failure.message


# -- what the well-kept clients also handle -------------------------------------------------------


async def test_chat_stream_variants_of_compatible_servers():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            ": OPENROUTER PROCESSING\r\n\r\n",                                   # comment line, CRLF
            chat({"role": "assistant", "content": None, "reasoning_content": "think"}),  # DeepSeek / vLLM
            chat({"reasoning": " more"}),                                        # OpenRouter / Ollama
            chat({"content": "", "refusal": None}),
            'data: {"choices":[{"index":0,\ndata: "delta":{"content":"Hi"}}]}\n\n',  # multi-line data
            chat({"refusal": " (cannot do that)"}),
            'data: {"choices":[{"index":1,"delta":{"content":"other choice"}}]}\n\n',  # n>1: only choice 0
            chat(finish="eos"),
            'data: {"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}\n\n',  # empty choices
            "data: [DONE]\n\n",
        )))
        async with chat_engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None
    assert events == [ReasoningDelta("think"), ReasoningDelta(" more"), TextDelta("Hi"), TextDelta(" (cannot do that)"),
                      Usage(3, 5, None), Finish("stop")]


@pytest.mark.parametrize(("reason", "finish"), [("max_tokens", "length"), ("tool_use", "tool_calls"),
                                                ("content_filter", "content_filter"), ("something_new", "stop")])
async def test_chat_finish_reason_variants(reason, finish):
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(chat({"content": "x"}), chat(finish=reason), "data: [DONE]\n\n")))
        async with chat_engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None and events[-1] == Finish(finish)


async def test_legacy_function_call_delta_is_a_tool_call():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            chat({"function_call": {"name": "list_dir", "arguments": '{"path"'}}),
            chat({"function_call": {"arguments": ': "."}'}}),
            chat(finish="function_call"), "data: [DONE]\n\n",
        )))
        async with chat_engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None
    (end,) = ends(events)
    assert (end.name, end.arguments) == ("list_dir", {"path": "."}) and events[-1] == Finish("tool_calls")


async def test_anthropic_usage_in_message_delta_and_error_event_mapping():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            ev("message_start", message={"usage": {"input_tokens": 10, "output_tokens": 1}}),
            ev("message_delta", delta={"stop_reason": "max_tokens"}, usage={"output_tokens": 99, "cache_read_input_tokens": 4}),
            ev("message_stop"),
        )))
        server.add(Reply(chunks=sse(ev("error", error={"type": "invalid_request_error", "message": "prompt is too long: 300000 tokens"}))))
        async with anthropic_engine(server) as eng:
            events, failure = await collect(eng, REQ)
            _, too_long = await collect(eng, REQ)
    assert failure is None and events == [Usage(10, 99, 4), Finish("length")]
    assert too_long.category == "context_length" and not too_long.retryable


async def test_chat_error_null_content_parts_and_done_with_trailing_text():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(
            chat({"content": "a"}, error=None),                     # "error": null is not an error
            chat({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "hmm"}]},
                              {"type": "text", "text": "b"}]}),       # Mistral content parts
            chat(finish="stop"),
            "data: [DONE] \n\n",
        )))
        async with chat_engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None
    assert events == [TextDelta("a"), ReasoningDelta("hmm"), TextDelta("b"), Finish("stop")]


async def test_a_json_error_body_sent_as_an_event_stream_is_named():
    # A proxy that labels its JSON error body text/event-stream: no events, the body is quoted.
    async with open_sse_server() as server:
        server.add(Reply(chunks=[b'{"error": {"message": "budget exceeded for key"}}']))
        async with chat_engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert events == [] and len(server.requests) == 1 and not failure.retryable
    assert "carried no events" in failure.message and "budget exceeded for key" in failure.message


@pytest.mark.parametrize("reason", ["error", "abort"])
async def test_a_failed_finish_reason_is_a_failure_not_a_silent_success(reason):
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse(chat({"content": "half"}), chat(finish=reason), "data: [DONE]\n\n")))
        async with chat_engine(server) as eng:
            events, failure = await collect(eng, REQ)
    assert events == [TextDelta("half")] and len(server.requests) == 1
    assert failure.partial_text == "half" and not failure.retryable and repr(reason) in failure.message
