"""Outbox chunks (roost.protocol._as_workers: a worker process's rendered lines, copied whole):
written in order with the outbox's own lines, never coalesced, and producers waiting for room
(``wait_room``) all resume once the writer drains."""

from __future__ import annotations

import trio
import trio.testing

from roost._json import dumps_line
from roost.protocol._coalesce import APP_SERVER_DELTAS, COALESCE_AFTER, app_server_thread_of
from roost.protocol._outbox import Outbox
from _helpers.timing import scaled


def _delta(n: int) -> bytes:
    return dumps_line({"method": "item/agentMessage/delta",
                       "params": {"thread_id": "w", "turn_id": "u", "item_id": "i", "delta": f"d{n} "}})


async def test_chunks_pass_whole_in_order_and_are_never_coalesced() -> None:
    outbox = Outbox(coalesce=APP_SERVER_DELTAS, lanes=app_server_thread_of)
    send, receive = trio.testing.memory_stream_pair()
    chunk = b"".join(_delta(n) for n in range(COALESCE_AFTER * 2))  # a worker's backlog, one entry
    outbox.deliver(dumps_line({"id": 1, "result": {}}))
    outbox.deliver_chunk(chunk)
    for n in range(COALESCE_AFTER):  # enough entries for the writer to coalesce a batch
        outbox.deliver_chunk(_delta(n))
    outbox.close()
    got = b""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run_writer, send)
        with trio.fail_after(scaled(10)):
            expected = len(dumps_line({"id": 1, "result": {}})) + len(chunk) + sum(
                len(_delta(n)) for n in range(COALESCE_AFTER))
            while len(got) < expected:
                got += await receive.receive_some()
    assert got == dumps_line({"id": 1, "result": {}}) + chunk + b"".join(_delta(n) for n in range(COALESCE_AFTER))
    assert outbox.coalesced == 0


async def test_every_producer_waiting_for_room_resumes() -> None:
    outbox = Outbox()
    send, receive = trio.testing.memory_stream_pair()
    outbox.deliver_chunk(b"x" * 1000 + b"\n")
    resumed = []

    async def producer(name: str) -> None:
        await outbox.wait_room(10)
        resumed.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer, "a")
        nursery.start_soon(producer, "b")
        await trio.testing.wait_all_tasks_blocked()
        assert resumed == []
        nursery.start_soon(outbox.run_writer, send)
        with trio.fail_after(scaled(10)):
            await receive.receive_some()
            while len(resumed) < 2:
                await trio.sleep(0)
        outbox.close()
    assert sorted(resumed) == ["a", "b"]
