"""Control before data (issue 19): the app-server's reader applies ``turn/interrupt`` itself.

When the thread is loaded, the session follows it and no earlier request of that thread is still
being handled, the reader cancels the active turn and queues the answer as it reads the line: no
request task, no mailbox, no checkpoint. Otherwise the ordinary handler answers, in order.
"""

from __future__ import annotations

import json

import trio
import trio.testing

from roost.protocol import _as_turns  # noqa: F401  (registers turn/interrupt)
from roost.protocol._appserver import IMMEDIATE, AppServerSession
from roost.protocol._engines import EngineCatalog


class _Registry:
    """Records interrupts; answers like ThreadRegistry.interrupt_now for one active turn."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    def interrupt_now(self, thread_id: str, turn_id: str | None = None, reason: str = "interrupted") -> dict | None:
        self.calls.append((thread_id, turn_id))
        if turn_id not in (None, "turn-1"):
            return None
        return {"thread_id": thread_id, "turn": {"id": "turn-1", "status": "interrupting"}, "interrupted": True}

    async def get(self, thread_id: str) -> None:
        """The ordinary handler's lookup: stays in flight until the test cancels it (so the
        request counts are not decided by how fast a fake lookup fails)."""
        await trio.sleep_forever()


class _Runtime:
    def __init__(self) -> None:
        self.registry = _Registry()


def _session() -> AppServerSession:
    session = AppServerSession(runtime=_Runtime(), engines=EngineCatalog(None, setup_error="not configured"))
    session.subscribed.add("thr_1")
    return session


def _queued(session: AppServerSession) -> list[dict]:
    return [json.loads(line) for line in session.outbox._take()]


def _interrupt(rid: int, **params: str) -> dict:
    return {"id": rid, "method": "turn/interrupt", "params": {"thread_id": "thr_1", **params}}


async def test_the_reader_answers_an_interrupt_without_a_task_or_a_checkpoint() -> None:
    assert "turn/interrupt" in IMMEDIATE
    session = _session()
    async with trio.open_nursery() as nursery:
        session._requests = nursery
        with trio.testing.assert_no_checkpoints():
            await session._on_frame(_interrupt(7, turn_id="turn-1"))
        assert session._active_requests == 0  # no request task was started
        assert session.runtime.registry.calls == [("thr_1", "turn-1")]
        assert _queued(session) == [
            {"id": 7, "result": {"thread_id": "thr_1", "turn": {"id": "turn-1", "status": "interrupting"},
                                 "interrupted": True}}
        ]


async def test_an_interrupt_behind_an_earlier_request_of_its_thread_waits_its_turn() -> None:
    session = _session()
    async with trio.open_nursery() as nursery:
        session._requests = nursery
        session._chains["thread:thr_1"] = trio.Event()  # an earlier request of thr_1 is being handled
        await session._on_frame(_interrupt(8))
        assert session.runtime.registry.calls == []  # not applied ahead of the earlier request
        assert session._active_requests == 1  # left to the ordinary handler, in order
        nursery.cancel_scope.cancel()


async def test_the_ordinary_handler_answers_what_the_reader_cannot() -> None:
    session = _session()
    session.subscribed.clear()  # a thread this session does not follow: the handler subscribes it
    async with trio.open_nursery() as nursery:
        session._requests = nursery
        await session._on_frame(_interrupt(9))
        assert session._active_requests == 1
        nursery.cancel_scope.cancel()
    session = _session()
    async with trio.open_nursery() as nursery:
        session._requests = nursery
        await session._on_frame(_interrupt(10, turn_id="turn-0"))  # not the active turn
        await session._on_frame({"id": 11, "method": "turn/interrupt", "params": {"turn_id": 3}})  # malformed
        assert session.runtime.registry.calls == [("thr_1", "turn-0")]
        assert session._active_requests == 2
        nursery.cancel_scope.cancel()
