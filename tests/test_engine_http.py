"""Shared HTTP behaviour: retries (before the first chunk and restarts after it), error mapping, cancellation, models."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
import trio
from _helpers.sse_server import Reply, collect, json_reply, open_sse_server, sse
from _helpers.timing import scaled

from roost.engines import (
    EngineRequest,
    Finish,
    OpenAIChatEngine,
    ProviderSettings,
    Retrying,
    RetryPolicy,
    TextDelta,
    UserMessage,
)
from roost.engines._http import failure_from_response, failure_from_transport

REQ = EngineRequest(history=[UserMessage("hi")])
OK = sse('data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n', "data: [DONE]\n\n")


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await trio.lowlevel.checkpoint()


def engine(base_url: str, sleeps: Sleeps, attempts: int = 3) -> OpenAIChatEngine:
    settings = ProviderSettings(provider="openai", base_url=base_url + "/v1", model="m", api_key="k")
    return OpenAIChatEngine(settings, retry=RetryPolicy(max_attempts=attempts, sleep=sleeps, random=lambda: 0.0))


async def test_retries_429_and_5xx_honouring_retry_after_then_succeeds():
    sleeps = Sleeps()
    async with open_sse_server() as server:
        server.add(
            json_reply(429, b'{"error":{"message":"slow","type":"requests","code":"rate_limit_exceeded"}}', {"retry-after": "7"}),
            json_reply(503, b'{"error":{"message":"busy"}}'),
            Reply(chunks=OK),
        )
        async with engine(server.base_url, sleeps) as eng:
            events, failure = await collect(eng, REQ)
    # each retry is announced (a progress event, before any content), then the content streams
    assert failure is None and events == [Retrying(1, 3, 7.0, "rate_limit"), Retrying(2, 3, 0.5, "provider"),
                                          TextDelta("ok"), Finish("stop")]
    assert len(server.requests) == 3
    # retry-after: 7 honoured; then backoff base 0.5 * 2**1 scaled by jitter factor 0.5.
    assert sleeps.delays == [7.0, 0.5]


async def test_bounded_attempts_and_recovery_facts():
    sleeps = Sleeps()
    async with open_sse_server() as server:
        server.add(*(json_reply(500, b'{"error":{"message":"down","type":"server_error"}}') for _ in range(3)))
        async with engine(server.base_url, sleeps, attempts=3) as eng:
            events, failure = await collect(eng, REQ)
    assert [type(e).__name__ for e in events] == ["Retrying", "Retrying"]
    assert failure.category == "provider" and failure.http_status == 500 and failure.retryable
    recovery = failure.recovery()
    assert recovery.pop("operation_id").startswith("op_")  # one id for the whole retried stream
    assert recovery == {
        "attempt_count": 3,
        "retry_count": 2,
        "submission_count": 3,
        "max_attempts": 3,
        "stop_reason": "retry_limit",
        "failure_category": "provider",
    }
    assert len(sleeps.delays) == 2


async def test_auth_and_invalid_request_are_not_retried():
    sleeps = Sleeps()
    async with open_sse_server() as server:
        server.add(
            json_reply(401, b'{"error":{"message":"bad key","type":"invalid_request_error","code":"invalid_api_key"}}'),
            json_reply(400, b'{"error":{"message":"This model\'s maximum context length is 8192 tokens","code":"context_length_exceeded"}}'),
        )
        async with engine(server.base_url, sleeps) as eng:
            _, auth = await collect(eng, REQ)
            _, ctx = await collect(eng, REQ)
    assert auth.category == "auth" and auth.provider_code == "invalid_api_key" and auth.stop_reason == "non_retryable"
    assert ctx.category == "context_length" and ctx.http_status == 400
    assert len(server.requests) == 2 and sleeps.delays == []


async def test_disconnect_before_and_after_the_first_chunk_are_retried_restarting_the_stream():
    sleeps = Sleeps()
    async with open_sse_server() as server:
        server.add(
            Reply(chunks=[], end="drop"),  # no answer at all: sent again
            Reply(chunks=sse('data: {"choices":[{"index":0,"delta":{"content":"par"}}]}\n\n'), end="abort"),
            Reply(chunks=OK),
        )
        async with engine(server.base_url, sleeps) as eng:
            events, failure = await collect(eng, REQ)
    assert failure is None and len(server.requests) == 3
    # the first retry streamed nothing before it; the second restarts a stream that had text
    assert events == [Retrying(1, 3, 0.25, "network"), TextDelta("par"),
                      Retrying(2, 3, 0.5, "network", restart=True), TextDelta("ok"), Finish("stop")]


async def test_a_stream_dropped_on_every_attempt_fails_with_retry_limit_and_the_last_partial_text():
    async with open_sse_server() as server:
        server.add(*[Reply(chunks=sse(f'data: {{"choices":[{{"index":0,"delta":{{"content":"p{n}"}}}}]}}\n\n'),
                           end="abort") for n in range(3)])
        async with engine(server.base_url, Sleeps()) as eng:
            events, failure = await collect(eng, REQ)
    assert [e.restart for e in events if isinstance(e, Retrying)] == [True, True]
    assert failure.category == "network" and failure.partial_text == "p2"
    assert failure.attempt_count == 3 and failure.stop_reason == "retry_limit"
    assert "after the server accepted the request with HTTP 200" in failure.message


async def test_without_retry_after_output_a_200_is_never_sent_again():
    # The policy's opt-out: the server answered 200 (it took the request, which may be billed)
    # and then dropped the connection: the request is not sent a second time.
    async with open_sse_server() as server:
        server.add(Reply(chunks=[], end="abort"), Reply(chunks=sse("data: [DONE]\n\n")))
        settings = ProviderSettings(provider="openai", base_url=server.base_url + "/v1", model="m", api_key="k")
        policy = RetryPolicy(max_attempts=3, sleep=Sleeps(), random=lambda: 0.0, retry_after_output=False)
        async with OpenAIChatEngine(settings, retry=policy) as eng:
            events, failure = await collect(eng, REQ)
    assert events == [] and len(server.requests) == 1
    assert failure.category == "network" and failure.stop_reason == "replay_unsafe"
    assert "after the server accepted the request with HTTP 200" in failure.message


async def test_connection_refused_is_network_failure():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens on this port now
    sleeps = Sleeps()
    async with engine(f"http://127.0.0.1:{port}", sleeps, attempts=2) as eng:
        events, failure = await collect(eng, REQ)
    assert failure.category == "network" and failure.attempt_count == 2 and failure.stop_reason == "retry_limit"


async def test_cancelling_the_consumer_closes_the_http_stream():
    async with open_sse_server() as server:
        server.add(Reply(chunks=sse('data: {"choices":[{"index":0,"delta":{"content":"first"}}]}\n\n'), end="hang"))
        async with engine(server.base_url, Sleeps()) as eng:
            with trio.fail_after(scaled(10)):
                got: list = []
                with trio.CancelScope() as scope:
                    async with eng.stream(REQ) as events:
                        async for event in events:
                            got.append(event)
                            scope.cancel()
                assert scope.cancelled_caught and got == [TextDelta("first")]
                await server.client_closed.wait()


async def test_models_listing_openai_compatible():
    async with open_sse_server() as server:
        server.add(json_reply(200, json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}, {"id": "a", "object": "model"}]}).encode()))
        async with engine(server.base_url, Sleeps()) as eng:
            with trio.fail_after(scaled(10)):
                models = await eng.list_models()
    assert server.requests[0].path == "/v1/models" and server.requests[0].headers["authorization"] == "Bearer k"
    assert [(m.id, m.current) for m in models] == [("a", False), ("m", True)]


async def test_models_listing_failure_is_mapped():
    async with open_sse_server() as server:
        server.add(json_reply(401, b'{"error":{"message":"no"}}'))
        async with engine(server.base_url, Sleeps()) as eng:
            with trio.fail_after(scaled(10)), pytest.raises(Exception) as info:
                await eng.list_models()
    assert getattr(info.value, "category", None) == "auth"


@pytest.mark.parametrize(
    ("status", "category", "retryable"),
    [(401, "auth", False), (403, "auth", False), (404, "invalid_request", False), (408, "network", True),
     (429, "rate_limit", True), (500, "provider", True), (529, "provider", True), (422, "invalid_request", False)],
)
def test_status_mapping(status, category, retryable):
    failure = failure_from_response(status, httpx.Headers(), b"not json", provider="p")
    assert (failure.category, failure.retryable, failure.http_status) == (category, retryable, status)


def test_insufficient_quota_is_not_retryable():
    failure = failure_from_response(429, httpx.Headers(), b'{"error":{"code":"insufficient_quota","message":"pay"}}', provider="p")
    assert failure.category == "rate_limit" and not failure.retryable


@pytest.mark.parametrize(
    "exc", [httpx.ConnectError("x"), httpx.ReadTimeout("x"), httpx.RemoteProtocolError("x"), httpx.WriteError("x"), httpx.PoolTimeout("x")]
)
def test_transport_errors_map_to_network(exc):
    failure = failure_from_transport(exc, provider="p")
    assert failure.category == "network" and failure.retryable and failure.provider_code == type(exc).__name__


def test_retry_policy_delays():
    policy = RetryPolicy(base_delay=1.0, max_delay=5.0, random=lambda: 0.999999)
    assert [round(policy.delay(n, None), 3) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]
    assert policy.delay(1, httpx.Headers({"retry-after-ms": "250"})) == 0.25
    assert policy.delay(1, httpx.Headers({"retry-after": "1000"})) == policy.max_retry_after
    assert policy.delay(1, httpx.Headers({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0


async def test_consecutive_calls_reuse_one_connection_and_a_stream_left_open_still_ends():
    done = sse('data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}\n\n', "data: [DONE]\n\n")
    async with open_sse_server() as server:
        server.add(Reply(chunks=done), Reply(chunks=done), Reply(chunks=done, end="hang"))
        async with engine(server.base_url, Sleeps()) as eng:
            for _ in range(2):
                events, failure = await collect(eng, REQ)
                assert failure is None and events == [TextDelta("x"), Finish("stop")]
            assert server.connections == 1  # the body's end was read: the connection went back to the pool
            # a server that keeps the stream open after [DONE]: the call still ends, complete
            events, failure = await collect(eng, REQ)
    assert failure is None and events == [TextDelta("x"), Finish("stop")]


def _engine_streaming(body: type[httpx.AsyncByteStream]) -> tuple[httpx.AsyncClient, OpenAIChatEngine]:
    """A one-attempt OpenAI Chat engine whose every reply is a 200 event stream with ``body()``."""

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=body())

    settings = ProviderSettings(provider="openai", base_url="http://model.invalid/v1", model="m", api_key="k")
    client = httpx.AsyncClient(transport=httpx.MockTransport(reply))
    return client, OpenAIChatEngine(settings, client=client, retry=RetryPolicy(max_attempts=1, sleep=Sleeps()))


async def _cancelled_after_first_event(eng: OpenAIChatEngine, first: trio.Event | None = None) -> list:
    """Stream ``REQ`` and cancel the consumer after its first event (once ``first`` is set, if
    given); return the events it got."""
    got: list = []
    with trio.CancelScope() as scope:
        async with eng.stream(REQ) as events:
            async for event in events:
                got.append(event)
                if first is not None:
                    await first.wait()
                scope.cancel()
    assert scope.cancelled_caught
    return got


async def test_an_interrupt_inside_the_network_read_leaves_the_transport_clean_up_to_the_reader(autojump_clock):
    """Cancelled while the body's read waits for the network, the consumer leaves at once: the
    transport's own shielded clean-up (httpcore closes the connection before it lets a cancelled
    read go) runs in the body reader's task, not the turn's (issue 19)."""
    release, cleaned, reading = trio.Event(), trio.Event(), trio.Event()

    class Body(httpx.AsyncByteStream):
        async def __aiter__(self):
            yield b'data: {"choices":[{"index":0,"delta":{"content":"first"}}]}\n\n'
            try:
                reading.set()
                await trio.sleep_forever()
            finally:  # as httpcore does: the connection is closed, shielded, before the cancel goes on
                with trio.CancelScope(shield=True):
                    await release.wait()
                cleaned.set()

    client, eng = _engine_streaming(Body)
    with trio.fail_after(scaled(60)):
        # cancelled once the read waits inside the transport
        assert await _cancelled_after_first_event(eng, reading) == [TextDelta("first")]
        assert not cleaned.is_set()  # the consumer left while the transport was still cleaning up
        release.set()
        await cleaned.wait()
    await client.aclose()


async def test_leaving_a_cancelled_stream_does_not_wait_for_the_response_to_close(autojump_clock):
    """An interrupt settles its turn at once: the response is closed in the background."""
    release, closed = trio.Event(), trio.Event()

    class Body(httpx.AsyncByteStream):
        async def __aiter__(self):
            yield b'data: {"choices":[{"index":0,"delta":{"content":"first"}}]}\n\n'
            await trio.sleep_forever()

        async def aclose(self) -> None:
            await release.wait()
            closed.set()

    client, eng = _engine_streaming(Body)
    with trio.fail_after(scaled(60)):
        assert await _cancelled_after_first_event(eng) == [TextDelta("first")]
        assert not closed.is_set()  # the stream was left while its response was still closing
        release.set()
        await closed.wait()  # ... and the close finished in the background
    await client.aclose()
