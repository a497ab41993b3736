"""The SSE decoder (roost.engines._sse) against httpx-sse, the well-kept reference, on random streams
split at random points (WHATWG "Interpreting an event stream"): CRLF/LF/CR line ends, comments,
multi-line data, fields without a space or a colon, id/retry lines, a BOM, multi-byte text."""

from __future__ import annotations

import httpx
from httpx_sse import EventSource
from hypothesis import given, settings
from hypothesis import strategies as st

from roost.engines._sse import SSEDecoder

LINES = st.sampled_from([
    "data: {\"a\": 1}", "data:{\"b\":2}", "data", "data: ", "data:  two spaces", "event: delta", "event:x",
    ": keep-alive", ":", "id: 7", "retry: 3000", "retry: nope", "unknown: field", "data: héllo ✓ 🦉",
    "event", "data: [DONE]",
])
ENDS = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def streams(draw) -> bytes:
    parts: list[str] = ["\ufeff"] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(0, 8))):
        for _ in range(draw(st.integers(0, 4))):
            parts.append(draw(LINES) + draw(ENDS))
        parts.append(draw(ENDS))  # the blank line that ends the block
    if draw(st.booleans()):
        parts.append(draw(LINES))  # an unterminated last block
    return "".join(parts).encode()


def reference(raw: bytes) -> list[tuple[str, str]]:
    response = httpx.Response(200, headers={"content-type": "text/event-stream"}, content=raw)
    return [(sse.event, sse.data) for sse in EventSource(response).iter_sse() if sse.data]


def decode(raw: bytes, cuts: list[int]) -> list[tuple[str, str]]:
    decoder = SSEDecoder()
    out: list[tuple[str, str]] = []
    start = 0
    for cut in sorted(set(cuts)) + [len(raw)]:
        if cut > start:
            out += decoder.feed(raw[start:cut])
            start = cut
    out += decoder.finish()
    return [(name or "message", data) for name, data in out if data]  # httpx-sse names unnamed events "message"


@settings(max_examples=400, deadline=None)
@given(streams(), st.lists(st.integers(0, 400), max_size=12))
def test_same_events_as_httpx_sse_whatever_the_network_splits(raw, cuts):
    cuts = [c for c in cuts if c <= len(raw)]
    # the standard strips a leading BOM; httpx-sse does not (it reads "\ufeffdata" as a field name)
    assert decode(raw, cuts) == reference(raw.removeprefix("\ufeff".encode()))


def test_event_names_multiline_data_and_a_crlf_split_between_cr_and_lf():
    raw = b"event: response.output_text.delta\r\ndata: {\"x\":\r\ndata: 1}\r\n\r\n: ping\r\n\r\ndata: [DONE]\r\n\r\n"
    for cut in range(len(raw) + 1):
        assert decode(raw, [cut]) == [("response.output_text.delta", '{"x":\n1}'), ("message", "[DONE]")]


def test_invalid_utf8_is_replaced_within_its_own_block():
    # blocks are decoded together: a truncated sequence still ends at its line, as when decoded alone
    raw = b"data: \xe2\x9c\n\nevent: e\xc3\ndata: \xff\n\n\ndata: ok\n\n"
    for cut in range(len(raw) + 1):
        assert decode(raw, [cut]) == [("message", "\ufffd"), ("e\ufffd", "\ufffd"), ("message", "ok")]
