"""Engine stream throughput and per-chunk latency against a local SSE server.

For each adapter (OpenAI Chat, OpenAI Responses, Anthropic): a loopback server streams ``--deltas``
(100,000) small text deltas in the provider's SSE format (written in ~64 KiB network chunks); we
report parsed events/s and bytes/s. Latency: ``--latency-chunks`` (2,000) single-event chunks sent
one at a time (the next only after the client saw the previous), median/p99 seconds from send to
the event reaching the consumer, and the median added over a raw httpx byte stream of the same
chunks. The scripted engine is measured with zero-latency pacing, 100 deltas per reply.

Output (one JSON line on stdout):

* ``benchmark``: ``"engines"``; ``deltas``, ``latency_chunks``: the two sizes (counts);
* ``raw_httpx_latency_median_s``: a chunk's median send-to-receipt time over raw httpx, in seconds;
* ``adapters``: one object per adapter, ``openai``, ``openai-responses`` and ``anthropic``, of
  * ``events_per_s``: text deltas parsed per second, ``bytes_per_s``: SSE bytes per second,
  * ``seconds``: wall time of the throughput stream, in seconds,
  * ``latency_median_s``, ``latency_p99_s``: send to the event reaching the consumer, in seconds,
  * ``added_latency_median_s``: the median over ``raw_httpx_latency_median_s``, in seconds;
* ``scripted``: the scripted engine: ``events_per_s`` (events per second), ``replies`` and
  ``deltas_per_reply`` (counts).

Run: ``.venv/bin/python benchmarks/bench_engines.py [--deltas 100000] [--latency-chunks 2000]``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _helpers.sse_server import Reply, open_sse_server  # noqa: E402
from _util import arg_parser  # noqa: E402

from roost.engines import (  # noqa: E402
    AnthropicEngine,
    EngineRequest,
    OpenAIChatEngine,
    OpenAIResponsesEngine,
    ProviderSettings,
    ScriptedEngine,
    TextDelta,
    UserMessage,
    parse_script,
)


def chat_event(i: int) -> bytes:
    return (
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"w%d "},"finish_reason":null}]}\n\n'  # noqa: E501 - one SSE event, as a provider sends it
        % i
    )


def responses_event(i: int) -> bytes:
    return (
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"m","output_index":0,'
        b'"content_index":0,"delta":"w%d "}\n\n' % i
    )


def anthropic_event(i: int) -> bytes:
    return (
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"w%d "}}\n\n' % i
    )


ADAPTERS = {
    "openai": (
        OpenAIChatEngine,
        "/v1",
        chat_event,
        [],
        [b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'],
    ),
    "openai-responses": (
        OpenAIResponsesEngine,
        "/v1",
        responses_event,
        [],
        [b'event: response.completed\ndata: {"type":"response.completed","response":{"status":"completed"}}\n\n'],
    ),
    "anthropic": (
        AnthropicEngine,
        "",
        anthropic_event,
        [
            b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":1,"output_tokens":1}}}\n\n'  # noqa: E501 - one SSE event, as a provider sends it
        ],
        [
            b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":9}}\n\n'  # noqa: E501 - one SSE event, as a provider sends it
            b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
        ],
    ),
}
REQ = EngineRequest(history=[UserMessage("go")], model="bench")


def group(events: list[bytes], size: int = 65536) -> list[bytes]:
    chunks, cur, n = [], [], 0
    for e in events:
        cur.append(e)
        n += len(e)
        if n >= size:
            chunks.append(b"".join(cur))
            cur, n = [], 0
    if cur:
        chunks.append(b"".join(cur))
    return chunks


async def throughput(name: str, deltas: int) -> dict:
    cls, prefix, make, head, tail = ADAPTERS[name]
    body = head + [make(i) for i in range(deltas)] + tail
    total_bytes = sum(len(b) for b in body)
    async with open_sse_server() as server:
        server.add(Reply(chunks=group(body)))
        async with cls(ProviderSettings(provider=name, base_url=server.base_url + prefix, api_key="k")) as engine:
            count = 0
            start = time.perf_counter()
            async with engine.stream(REQ) as events:
                async for event in events:
                    count += type(event) is TextDelta
            elapsed = time.perf_counter() - start
    assert count == deltas, (name, count)
    return {
        "events_per_s": round(deltas / elapsed),
        "bytes_per_s": round(total_bytes / elapsed),
        "seconds": round(elapsed, 3),
    }


async def latency(name: str | None, chunks: int) -> list[float]:
    """Per-chunk send->consumer latency (seconds). name=None measures raw httpx bytes."""
    cls, prefix, make, head, tail = ADAPTERS[name or "openai"]
    sent_at: list[float] = []
    seen = [trio.Event() for _ in range(chunks)]
    samples: list[float] = []

    def paced(i: int):
        async def step() -> None:
            if i:
                await seen[i - 1].wait()
            sent_at.append(time.perf_counter())

        return step

    body: list = list(head)
    for i in range(chunks):
        body += [paced(i), make(i)]
    body += tail
    async with open_sse_server() as server:
        server.add(Reply(chunks=body))
        if name is None:
            async with httpx.AsyncClient() as client:
                async with client.stream("POST", server.base_url + "/v1/chat/completions", content=b"{}") as response:
                    i = 0
                    async for _ in response.aiter_raw():
                        if i < chunks:
                            samples.append(time.perf_counter() - sent_at[i])
                            seen[i].set()
                            i += 1
        else:
            async with cls(ProviderSettings(provider=name, base_url=server.base_url + prefix, api_key="k")) as engine:
                async with engine.stream(REQ) as events:
                    i = 0
                    async for event in events:
                        if type(event) is TextDelta:
                            samples.append(time.perf_counter() - sent_at[i])
                            seen[i].set()
                            i += 1
    return samples


async def scripted(replies: int = 2000) -> dict:
    engine = ScriptedEngine(
        parse_script({"rules": [{"steps": [[{"text": "lorem ipsum dolor sit amet " * 8, "deltas": 100}]]}]}),
        pacing=False,
    )
    count = 0
    start = time.perf_counter()
    for _ in range(replies):
        async with engine.stream(REQ) as events:
            async for _event in events:
                count += 1
    elapsed = time.perf_counter() - start
    return {"events_per_s": round(count / elapsed), "replies": replies, "deltas_per_reply": 100}


async def main(deltas: int, latency_chunks: int) -> dict:
    out: dict = {"benchmark": "engines", "deltas": deltas, "latency_chunks": latency_chunks, "adapters": {}}
    await latency(None, latency_chunks)  # warm-up
    raw = await latency(None, latency_chunks)
    raw_median = statistics.median(raw)
    out["raw_httpx_latency_median_s"] = round(raw_median, 7)
    for name in ADAPTERS:
        figures = await throughput(name, deltas)
        lat = sorted(await latency(name, latency_chunks))
        figures["latency_median_s"] = round(statistics.median(lat), 7)
        figures["latency_p99_s"] = round(lat[int(len(lat) * 0.99) - 1], 7)
        figures["added_latency_median_s"] = round(statistics.median(lat) - raw_median, 7)
        out["adapters"][name] = figures
    out["scripted"] = await scripted()
    return out


if __name__ == "__main__":
    parser = arg_parser(__doc__)
    parser.add_argument("--deltas", type=int, default=100_000, help="deltas of the throughput stream (default 100000)")
    parser.add_argument(
        "--latency-chunks", type=int, default=2000, help="chunks of the latency measurement (default 2000)"
    )
    args = parser.parse_args()
    print(json.dumps(trio.run(main, args.deltas, args.latency_chunks)))
