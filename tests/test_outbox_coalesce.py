"""Outbox delta coalescing (DESIGN.md section 4: deltas coalesced when an outbox runs behind, never
reordered): unit properties, the outbox writer, and a real app-server client that reads late."""

from __future__ import annotations

import json
import os
import subprocess

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from _helpers.appserver import roost_argv
from roost._json import dumps_line
from roost.protocol._coalesce import APP_SERVER_DELTAS, COALESCE_AFTER, WIRE_TOKENS
from roost.protocol._outbox import Outbox
from _helpers.timing import scaled


def _delta(item: str, text: str, method: str = "item/agentMessage/delta") -> bytes:
    return dumps_line({"method": method, "params": {"thread_id": "t", "turn_id": "u", "item_id": item,
                                                    "delta": text}})


def _other(n: int) -> bytes:
    return dumps_line({"method": "item/completed", "params": {"n": n}})


_events = st.lists(st.one_of(
    st.tuples(st.just("delta"), st.sampled_from(["a", "b"]), st.text(max_size=5)),
    st.tuples(st.just("other"), st.integers(0, 9), st.just(""))), max_size=60)


def _encode(events: list) -> list[bytes]:
    return [_delta(k, t) if kind == "delta" else _other(k) for kind, k, t in events]


def _flatten(lines: list[bytes]) -> list[tuple]:
    """Each stream's text joined within runs, and the other lines, in order: what a client sees."""
    out: list[tuple] = []
    for line in lines:
        message = json.loads(line)
        if message["method"] == "item/agentMessage/delta":
            item, text = message["params"]["item_id"], message["params"]["delta"]
            if out and out[-1][0] == "text" and out[-1][1] == item:
                out[-1] = ("text", item, out[-1][2] + text)
            else:
                out.append(("text", item, text))
        else:
            out.append(("line", line))
    return out


@settings(max_examples=200, deadline=None)
@given(_events)
def test_coalescing_keeps_what_a_client_reads(events: list) -> None:
    lines = _encode(events)
    merged = APP_SERVER_DELTAS(lines)
    assert _flatten(merged) == _flatten(lines)
    assert len(merged) <= len(lines)
    assert [line for line in merged if b'"item/completed"' in line] == [line for line in lines if b'"item/completed"' in line]
    # no two neighbours of the same stream are left unmerged
    keys = [(json.loads(m)["params"].get("item_id"), b"delta" in m[:40]) for m in merged]
    assert all(not (a[1] and a == b) for a, b in zip(keys, keys[1:]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.text(max_size=6), st.booleans()), max_size=40))
def test_merging_without_decoding_writes_what_decoding_would(pieces: list) -> None:
    """A delta whose text comes last merges as bytes (no decode); one with a field after its
    text is decoded; a client reads the same texts either way, and the byte merge is exactly
    the line a decode and an encode would write."""
    lines = []
    for item, text, trailing in pieces:
        params = {"thread_id": "t", "turn_id": "u", "item_id": item, "delta": text}
        if trailing:
            params["seq"] = "\"" + text  # a field after the text (its value may hold quotes)
        lines.append(dumps_line({"method": "item/agentMessage/delta", "params": params}))
    merged = APP_SERVER_DELTAS(lines)
    assert _flatten(merged) == _flatten(lines)
    for line in merged:
        assert line == dumps_line(json.loads(line))  # valid, and as the encoder writes it


def test_only_consecutive_lines_of_one_stream_merge() -> None:
    lines = [_delta("a", "he"), _delta("a", "llo"), _delta("b", "x"), _delta("a", "!"),
             _delta("a", "?", method="item/reasoning/delta"), _other(1), _delta("a", "y"), _delta("a", "z"),
             b"not json but a delta prefix? no\n"]
    merged = APP_SERVER_DELTAS(lines)
    texts = [json.loads(m)["params"].get("delta") if m.startswith(b"{") else m for m in merged]
    assert texts == ["hello", "x", "!", "?", None, "yz", b"not json but a delta prefix? no\n"]
    # the serve dialect: tokens of one session and agent merge; another agent's break the run
    tokens = [dumps_line({"type": "token", "sessionId": "s", "agent": a, "text": t})
              for a, t in (("P", "a"), ("P", "b"), ("D", "c"), ("P", "d"))]
    assert [json.loads(m)["text"] for m in WIRE_TOKENS(tokens)] == ["ab", "c", "d"]


async def test_a_backlog_is_coalesced_and_a_trickle_is_not() -> None:
    class Sink(trio.abc.SendStream):
        def __init__(self) -> None:
            self.writes: list[bytes] = []

        async def send_all(self, data: bytes) -> None:
            self.writes.append(bytes(data))
            await trio.lowlevel.checkpoint()

        async def wait_send_all_might_not_block(self) -> None:
            await trio.lowlevel.checkpoint()

        async def aclose(self) -> None:
            await trio.lowlevel.checkpoint()

    outbox, sink = Outbox(coalesce=APP_SERVER_DELTAS), Sink()
    for i in range(1000):                          # queued before the writer runs: a backlog
        outbox.deliver(_delta("a", str(i % 10)))
    outbox.deliver(_other(1))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run_writer, sink)
        await trio.testing.wait_all_tasks_blocked()
        for i in range(COALESCE_AFTER - 1):         # a short burst stays as it is
            outbox.deliver(_delta("b", "x"))
        await trio.testing.wait_all_tasks_blocked()
        outbox.close()
    written = b"".join(sink.writes).splitlines(keepends=True)
    first = json.loads(written[0])["params"]["delta"]
    assert first == "".join(str(i % 10) for i in range(1000)) and json.loads(written[1])["method"] == "item/completed"
    assert len(written) == 2 + COALESCE_AFTER - 1 and outbox.coalesced == 999


async def test_a_late_app_server_client_gets_the_whole_text_in_fewer_lines(tmp_path) -> None:
    """A client that stops reading while a 5,000-delta reply streams, then reads: same text."""
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"rules": [{"steps": [[{"text": "ab" * 5000, "deltas": 5000}]]}]}))
    env = dict(os.environ, ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script))
    requests = [{"id": 1, "method": "initialize", "params": {"protocol_version": "wuu-app-server/v0.1"}},
                {"id": 2, "method": "thread/start", "params": {"ephemeral": True}}]
    with trio.fail_after(scaled(30)):
        proc = await trio.lowlevel.open_process([*roost_argv(), "app-server"], env=env, stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE)
        buf = b""

        async def line() -> dict:
            nonlocal buf
            while b"\n" not in buf:
                buf += await proc.stdout.receive_some(1 << 16)
            head, buf = buf.split(b"\n", 1)
            return json.loads(head)

        for request in requests:
            await proc.stdin.send_all(json.dumps(request).encode() + b"\n")
        while (message := await line()).get("id") != 2:
            pass
        thread_id = message["result"]["thread"]["id"]
        await proc.stdin.send_all(json.dumps({"id": 3, "method": "turn/start", "params": {
            "thread_id": thread_id, "prompt": "go"}}).encode() + b"\n")
        await trio.sleep(1.0)                        # the reply streams into a pipe nobody reads
        text, deltas = "", 0
        while True:
            message = await line()
            if message.get("method") == "item/agentMessage/delta":
                text, deltas = text + message["params"]["delta"], deltas + 1
            if message.get("method") in ("turn/completed", "turn/error"):
                break
        await proc.stdin.aclose()
        await proc.wait()
    assert message["params"]["turn"]["status"] == "completed"
    assert text == "ab" * 5000
    assert deltas < 5000  # the backlog reached the client merged
