"""The answer to ``turn/interrupt`` comes before the terminal notification it causes
(docs/app-server.md, ``turn/interrupt``): a client reads ``{interrupted: true}`` first, then
``turn/completed`` with status ``interrupted``.

The reader's immediate path queues the answer as it cancels the turn. The ordinary handler asks the
thread actor, and the interrupted turn could settle and emit its end before that handler got to
send the answer (an ephemeral thread's end writes nothing, so nothing held the turn back): the turn
now waits (bounded) for the handler's answer to be queued.
"""

from __future__ import annotations

import json
from pathlib import Path

import trio
import trio.testing

from test_compact import SCRIPT, CapturingEngine, new_thread, runtime_with

from roost.actors._messages import InterruptTurn, Origin, StartTurn
from roost.protocol import _as_turns  # noqa: F401  (registers turn/interrupt)
from roost.protocol._appserver import AppServerSession
from roost.protocol._engines import EngineCatalog
from _helpers.timing import scaled


async def test_an_interrupted_turn_ends_only_after_the_answer_is_on_its_way(tmp_path: Path) -> None:
    async with runtime_with(CapturingEngine(SCRIPT)) as runtime:
        actor = await new_thread(runtime, tmp_path, ephemeral=True)
        events: list[str] = []
        emit = actor.emit

        def record(method: str, params: dict) -> None:
            events.append(method)
            emit(method, params)

        actor.emit = record  # type: ignore[method-assign]
        started = await actor.ref.ask(StartTurn(prompt="slow please", origin=Origin()))
        answered = trio.Event()
        reply = await actor.ref.ask(InterruptTurn(ack=answered))
        assert reply["interrupted"] is True and reply["turn"]["status"] == "interrupting"
        await trio.testing.wait_all_tasks_blocked()  # the turn has settled as far as it may
        assert "turn/completed" not in events
        answered.set()  # the front door queued the answer
        with trio.fail_after(scaled(10)):
            ended = await actor.wait_turn_end(started["id"])
        assert ended["status"] == "interrupted" and events[-1] == "turn/completed"


async def test_the_ordinary_handler_answers_before_the_turn_completed_line(tmp_path: Path) -> None:
    async with runtime_with(CapturingEngine(SCRIPT)) as runtime:
        actor = await new_thread(runtime, tmp_path, ephemeral=True)
        started = await actor.ref.ask(StartTurn(prompt="slow please", origin=Origin()))
        session = AppServerSession(runtime=runtime, engines=EngineCatalog(None, setup_error="not configured"))
        lines: list[dict] = []
        with trio.fail_after(scaled(10)):
            async with trio.open_nursery() as nursery:
                session.serve_in(nursery)
                # not subscribed yet: the ordinary handler (subscribe, then the actor's mailbox)
                frame = {"id": 5, "method": "turn/interrupt", "params": {"thread_id": actor.thread.id}}
                await session._on_frame(frame)
                assert session._active_requests == 1
                while True:
                    lines.extend(json.loads(line) for line in session.outbox._take())
                    if any(line.get("method") == "turn/completed" for line in lines):
                        break
                    session.outbox._wake = trio.Event()  # wait as its writer does (run_writer)
                    session.outbox._writer_waiting = True
                    await session.outbox._wake.wait()
        order = [line.get("id", line.get("method")) for line in lines if "id" in line or "turn" in line.get("params", {})]
        assert order.index(5) < order.index("turn/completed")
        answer = next(line for line in lines if line.get("id") == 5)
        assert answer["result"]["interrupted"] is True
        completed = next(line for line in lines if line.get("method") == "turn/completed")
        assert completed["params"]["turn"]["id"] == started["id"]
        assert completed["params"]["turn"]["status"] == "interrupted"
