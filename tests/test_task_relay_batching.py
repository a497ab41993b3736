"""The node-bus relay of a task run on another process (``roost/actors/_taskqueue_relay.py``):
deltas are coalesced for at most ``COALESCE_S`` seconds, but the task's end posts at once.

The clock is trio's ``MockClock`` (pytest-trio's ``mock_clock``: no time passes unless a test moves
it; ``autojump_clock``: it jumps to the next deadline whenever every task waits, so a sleep shows as
time passed). A batch posted with the clock standing still did not wait out ``COALESCE_S``.
Before the fix a finished task's last batch waited out the coalescing sleep begun by its first
event, so every task run on a ``roost serve --workers`` worker held its runner at least 50 ms
(issue 19: that capped a worker at 4 / 0.05 s = 80 tasks a second, whatever its cores)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from roost.actors._taskqueue_relay import BATCH_CHARS, COALESCE_S, TaskRelay


class _Bus:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict]] = []

    async def send(self, node: str, kind: str, data: dict) -> None:
        self.sent.append((node, kind, data))


class _Local:
    def task_started(self, task: Any) -> None: ...
    def task_notification(self, task: Any, method: str, params: dict) -> None: ...
    def task_event(self, task: Any, event: dict) -> None: ...
    def task_finished(self, task: Any) -> None: ...


class _Task:
    id, resumed, result = "thr_1", False, {"succeeded": True}


@asynccontextmanager
async def _running_relay() -> AsyncIterator[tuple[_Bus, TaskRelay]]:
    """A relay to ``node-a`` over a recording bus, its sender running until the block ends (the
    block closes the relay, or the sender ends with it)."""
    bus = _Bus()
    relay = TaskRelay(_Local(), bus, "node-a", "thr_1")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay.run)
        yield bus, relay


def _delta(relay: TaskRelay, text: str) -> None:
    relay.task_notification(_Task(), "item/agentMessage/delta", {"item_id": "i1", "delta": text})


def _texts(bus: _Bus) -> list[list[Any]]:
    return [[e.get("p", {}).get("delta", e["k"]) for e in data["events"]] for _, _, data in bus.sent]


async def test_deltas_wait_for_the_coalescing_window(mock_clock: trio.testing.MockClock) -> None:
    async with _running_relay() as (bus, relay):
        _delta(relay, "a")
        _delta(relay, "b")
        await trio.testing.wait_all_tasks_blocked()
        assert bus.sent == []  # coalescing: nothing posted while the clock stands still
        mock_clock.jump(COALESCE_S)
        await trio.testing.wait_all_tasks_blocked()
        assert _texts(bus) == [["ab"]]  # consecutive deltas of one item merged into one
        relay.close()
    assert len(bus.sent) == 1


async def test_the_task_end_posts_its_batch_at_once(autojump_clock: trio.testing.MockClock) -> None:
    async with _running_relay() as (bus, relay):
        relay.task_started(_Task())
        _delta(relay, "hello")
        for _ in range(3):
            await trio.lowlevel.checkpoint()  # the relay is coalescing now
        assert bus.sent == []
        relay.task_finished(_Task())  # closes the relay: the run ends without waiting out the window
    assert autojump_clock.current_time() == 0
    assert _texts(bus) == [["started", "hello", "finished"]]
    assert bus.sent[0][:2] == ("node-a", "task.events")


async def test_a_full_batch_posts_at_once(mock_clock: trio.testing.MockClock) -> None:
    async with _running_relay() as (bus, relay):
        _delta(relay, "x")
        await trio.testing.wait_all_tasks_blocked()
        _delta(relay, "y" * BATCH_CHARS)
        await trio.testing.wait_all_tasks_blocked()
        assert _texts(bus) == [["x" + "y" * BATCH_CHARS]]
        _delta(relay, "z")  # the next batch coalesces again
        await trio.testing.wait_all_tasks_blocked()
        assert len(bus.sent) == 1
        mock_clock.jump(COALESCE_S)
        await trio.testing.wait_all_tasks_blocked()
        assert _texts(bus)[1] == ["z"]
        relay.close()
    assert mock_clock.current_time() == COALESCE_S
