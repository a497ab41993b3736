"""Tests for roost.protocol._framing: the sans-IO LineDecoder, read_frames and JsonlWriter."""

from __future__ import annotations

import os

import hypothesis.strategies as st
import pytest
import trio
import trio.testing
from hypothesis import given, settings

import roost.protocol as protocol
from roost._json import dumps_line
from roost.errors import ParseError
from roost.protocol import FrameError, JsonlWriter, LineDecoder, read_frames
from _helpers.timing import scaled


def _feed_all(decoder: LineDecoder, chunks: list[bytes]) -> list:
    out: list = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    out.extend(decoder.finish())
    return out


def test_exports_are_public():
    for name in protocol.__all__:
        assert hasattr(protocol, name)
    assert LineDecoder.__module__ == "roost.protocol"
    assert FrameError.__module__ == "roost.protocol"


def test_simple_lines():
    assert LineDecoder().feed(b'{"a":1}\n[1,2]\n"x"\nnull\n') == [{"a": 1}, [1, 2], "x", None]


def test_split_at_every_byte_boundary():
    data = b'{"id":"1","method":"initialize"}\n[1,"\xc3\xa9"]\r\n\n  \n42\n'
    expected = [{"id": "1", "method": "initialize"}, [1, "é"], 42]
    for i in range(len(data) + 1):
        for j in range(i, len(data) + 1):
            assert _feed_all(LineDecoder(), [data[:i], data[i:j], data[j:]]) == expected, (i, j)


def test_one_byte_at_a_time():
    data = b'{"a":[1,2,3]}\r\n{"b":"c"}\n'
    assert _feed_all(LineDecoder(), [data[i : i + 1] for i in range(len(data))]) == [
        {"a": [1, 2, 3]},
        {"b": "c"},
    ]


def test_crlf_accepted():
    assert LineDecoder().feed(b'{"a":1}\r\n2\r\n') == [{"a": 1}, 2]


def test_empty_and_whitespace_lines_skipped():
    assert LineDecoder().feed(b"\n\n   \n\t\r\n\r\n1\n\n") == [1]


def test_last_line_without_newline_needs_finish():
    decoder = LineDecoder()
    assert decoder.feed(b'1\n{"tail":true}') == [1]
    assert decoder.buffered_bytes == len(b'{"tail":true}')
    assert decoder.finish() == [{"tail": True}]
    assert decoder.finish() == []
    assert decoder.buffered_bytes == 0


def test_finish_with_only_whitespace_yields_nothing():
    decoder = LineDecoder()
    assert decoder.feed(b"1\n   ") == [1]
    assert decoder.finish() == []


def test_malformed_json_then_good_line():
    frames = LineDecoder().feed(b'{"a":\n{"b":2}\n')
    assert isinstance(frames[0], FrameError)
    assert frames[0].code == "parse_error"
    assert not frames[0].oversized
    assert frames[1] == {"b": 2}


def test_invalid_utf8_is_parse_error():
    frames = LineDecoder().feed(b'"\xff\xfe"\n3\n')
    assert isinstance(frames[0], FrameError)
    assert frames[0].code == "parse_error"
    assert frames[1] == 3
    # the message says what is wrong and where, never orjson's "surrogates not allowed"
    assert frames[0].message == "line is not valid UTF-8 (byte offset 1)"
    (surrogate,) = LineDecoder().feed(b'{"a":"\xed\xa0\x80"}\n')
    assert surrogate.message == "line is not valid UTF-8 (byte offset 6)"


def test_frame_error_to_exception():
    err = LineDecoder().feed(b"{\n")[0]
    exc = err.to_exception()
    assert isinstance(exc, ParseError)
    assert exc.to_wire()["code"] == "parse_error"
    assert exc.to_wire()["message"] == err.message


def test_oversized_line_in_one_chunk_then_good_line():
    decoder = LineDecoder(max_line_bytes=16)
    frames = decoder.feed(b'"' + b"x" * 40 + b'"\n{"ok":1}\n')
    assert len(frames) == 2
    assert isinstance(frames[0], FrameError) and frames[0].oversized
    assert frames[1] == {"ok": 1}


def test_oversized_line_across_chunks_reported_once_and_discarded():
    decoder = LineDecoder(max_line_bytes=16)
    frames = decoder.feed(b'"' + b"x" * 20)
    assert len(frames) == 1 and frames[0].oversized
    # The partial line is dropped at once: memory stays bounded while the rest streams in.
    assert decoder.buffered_bytes == 0
    for _ in range(100):
        assert decoder.feed(b"y" * 1000) == []
        assert decoder.buffered_bytes == 0
    assert decoder.feed(b'yyy"\n[1]\n') == [[1]]


def test_oversized_discard_resumes_mid_chunk_with_partial():
    decoder = LineDecoder(max_line_bytes=8)
    assert [f.oversized for f in decoder.feed(b"1" * 20)] == [True]
    assert decoder.feed(b'111\n{"a"') == []
    assert decoder.feed(b":2}\n") == [{"a": 2}]


def test_line_of_exactly_the_limit_is_accepted_also_with_crlf():
    line = b'"' + b"a" * 14 + b'"'  # 16 bytes
    assert LineDecoder(max_line_bytes=16).feed(line + b"\n") == ["a" * 14]
    assert LineDecoder(max_line_bytes=16).feed(line + b"\r\n") == ["a" * 14]
    decoder = LineDecoder(max_line_bytes=16)
    assert decoder.feed(line + b"\r") == []
    assert decoder.feed(b"\n") == ["a" * 14]
    over = LineDecoder(max_line_bytes=15).feed(line + b"\n")
    assert len(over) == 1 and over[0].oversized


def test_oversized_last_line_at_eof():
    decoder = LineDecoder(max_line_bytes=4)
    assert decoder.feed(b"1\n12345") == [1]
    frames = decoder.finish()
    assert len(frames) == 1 and frames[0].oversized


def test_memoryview_and_bytearray_input():
    decoder = LineDecoder()
    assert decoder.feed(memoryview(b"1\n2")) == [1]
    assert decoder.feed(bytearray(b"\n")) == [2]


def test_invalid_limit():
    with pytest.raises(ValueError, match="max_line_bytes"):
        LineDecoder(max_line_bytes=0)


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(_json_values, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
    crlf=st.booleans(),
)
def test_any_chunking_yields_the_same_values(values, cuts, crlf):
    lines = [dumps_line(v) for v in values]
    if crlf:
        lines = [line[:-1] + b"\r\n" for line in lines]
    data = b"".join(lines)
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in zip(points, points[1:])]
    assert _feed_all(LineDecoder(), chunks) == values


async def test_read_frames_from_a_stream():
    send, receive = trio.testing.memory_stream_pair()
    with trio.fail_after(scaled(5)):
        async with trio.open_nursery() as nursery:

            async def produce():
                await send.send_all(b'{"a":1}\n{"b"')
                await send.send_all(b':2}\n{bad\n"tail"')
                await send.aclose()

            nursery.start_soon(produce)
            frames = [f async for f in read_frames(receive, LineDecoder())]
    assert frames[0] == {"a": 1}
    assert frames[1] == {"b": 2}
    assert isinstance(frames[2], FrameError)
    assert frames[3] == "tail"


async def test_jsonl_writer_lines_never_interleave():
    send, receive = trio.testing.memory_stream_pair()
    writer = JsonlWriter(send)
    big = "z" * 200_000
    with trio.fail_after(scaled(10)):
        async with trio.open_nursery() as nursery:
            received: list = []

            async def consume():
                async for frame in read_frames(receive):
                    received.append(frame)

            nursery.start_soon(consume)
            async with trio.open_nursery() as senders:
                for i in range(20):
                    senders.start_soon(writer.send, {"i": i, "pad": big})
                senders.start_soon(writer.send, b'{"raw":true}\n')
            await writer.aclose()
    assert len(received) == 21
    assert not any(isinstance(f, FrameError) for f in received)
    assert sorted(f["i"] for f in received if "i" in f) == list(range(20))
    assert {"raw": True} in received


async def test_jsonl_writer_context_manager_closes_stream():
    send, receive = trio.testing.memory_stream_pair()
    with trio.fail_after(scaled(5)):
        async with JsonlWriter(send) as writer:
            await writer.send([1, 2])
        assert await receive.receive_some() == b"[1,2]\n"
        assert await receive.receive_some() == b""
        with pytest.raises(trio.ClosedResourceError):
            await writer.send(1)


async def test_open_stdio_stream_dups_descriptors():
    r, w = os.pipe()
    saved = os.dup(0)
    try:
        os.dup2(r, 0)
        stream = protocol.open_stdio_stream()
        os.close(r)
        os.write(w, b'{"x":1}\n')
        os.close(w)
        with trio.fail_after(scaled(5)):
            frames = [f async for f in read_frames(stream.receive_stream)]
        await stream.aclose()
        assert frames == [{"x": 1}]
        os.fstat(1)  # fd 1 is still open
    finally:
        os.dup2(saved, 0)
        os.close(saved)


def test_an_integer_too_large_for_a_double_is_valid_json_and_exact():
    """orjson refuses an integer of 309+ digits ("number is infinity when parsed as double");
    the line is valid JSON, so it decodes (exactly) and keeps its id."""
    big = 10**400 + 7
    (value,) = _feed_all(LineDecoder(), [b'{"id":3,"params":{"limit":%d}}\n' % big])
    assert value == {"id": 3, "params": {"limit": big}}
    (value,) = _feed_all(LineDecoder(), [b'{"id":%d,"method":"m"}\n' % -big])
    assert value["id"] == -big
    # what orjson refuses elsewhere on such a line stays refused
    for line in (b'{"id":1,"a":%d,"b":NaN}\n' % big, b'{"id":1,"a":%d,"b":1e400}\n' % big,
                 b'{"id":1,"a":%d,"b":"\\ud800"}\n' % big, b'{"id":1,"a":%d,}\n' % big):
        (frame,) = _feed_all(LineDecoder(), [line])
        assert isinstance(frame, FrameError), line
