"""The TurnActor (issue 12, item 2): a turn is an actor of its own under its thread, restart type
temporary. A bug in a turn fails that turn with one terminal event; the thread actor lives on and
serves the next turn. In-process, on a runtime with the scripted engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
import trio.testing

from test_compact import SCRIPT, CapturingEngine, new_thread, runtime_with, turn

from roost.actors._messages import Origin, StartTurn
from roost.actors._turn import StopTurn, TurnActor
from roost import storage
from roost.storage import leases, utc_now
from roost.storage._rows import new_id
from _helpers.timing import scaled


async def stopped(turn_actor: TurnActor) -> None:
    """Wait until ``turn_actor`` has stopped (after its end it releases the lease, then stops)."""
    with trio.fail_after(scaled(10)):
        while turn_actor.state.value != "stopped":
            await trio.sleep(0.01)


async def test_a_crashing_turn_fails_alone_and_the_thread_lives_on(tmp_path: Path) -> None:
    async with runtime_with(CapturingEngine(SCRIPT)) as runtime:
        actor = await new_thread(runtime, tmp_path)
        events: list[tuple[str, dict]] = []
        emit = actor.emit

        def record(method: str, params: dict) -> None:
            events.append((method, params))
            emit(method, params)

        actor.emit = record  # type: ignore[method-assign]
        assert (await turn(actor, "hello"))["status"] == "completed"

        async def body(crashing: TurnActor, execution: Any) -> None:
            raise RuntimeError("a bug in the turn")

        crashing = TurnActor(actor, new_id("turn"), Origin(), start=StartTurn(origin=Origin()), body=body)
        actor.active, actor.idle = crashing, trio.Event()
        await actor.launch(crashing)
        with trio.fail_after(scaled(10)):
            ended = await actor.wait_turn_end(crashing.id)
        assert ended["status"] == "failed" and ended["error"]["category"] == "internal"
        terminal = [p for m, p in events if m in ("turn/completed", "turn/error") and p["turn"]["id"] == crashing.id]
        assert len(terminal) == 1 and terminal[0]["turn"]["status"] == "failed"
        await stopped(crashing)  # temporary: it released its lease and ended, never restarted
        assert actor.state.value == "running" and actor.active is None
        assert (await turn(actor, "hello again"))["status"] == "completed"


async def test_a_turn_answers_stop_through_its_mailbox(tmp_path: Path) -> None:
    async with runtime_with(CapturingEngine(SCRIPT)) as runtime:
        actor = await new_thread(runtime, tmp_path)
        started = await actor.ref.ask(StartTurn(prompt="slow please", origin=Origin()))
        running = actor.active
        assert running is not None and running.id == started["id"]
        assert await running.ref.ask(StopTurn(reason="interrupted")) is True
        with trio.fail_after(scaled(10)):
            ended = await actor.wait_turn_end(started["id"])
        assert ended["status"] == "interrupted" and ended["error"]["reason"] == "interrupted"
        await stopped(running)


async def test_the_admission_takes_the_lease_and_writes_the_turn_in_one_commit(tmp_path: Path) -> None:
    """Issue 12, Performance: a turn's execution lease and its admission (turn row, user item)
    are one control-lane transaction, not two; the turn then writes under that lease, and its
    end (turn row and the lease's release) is one more: no separate release write follows."""
    async with runtime_with(CapturingEngine(SCRIPT)) as runtime:
        actor = await new_thread(runtime, tmp_path)
        writer = runtime.services.store.writer
        release = trio.Event()

        async def body(admitted: TurnActor, execution: Any) -> None:
            assert execution.lease.token == admitted.token
            await release.wait()
            admitted.status, admitted.completed_at = "completed", utc_now()
            await admitted.finish()

        start = StartTurn(prompt="hello", origin=Origin())
        turn_actor = TurnActor(actor, new_id("turn"), Origin(), start=start, body=body)
        actor.active, actor.idle = turn_actor, trio.Event()
        await trio.testing.wait_all_tasks_blocked()
        before = writer.stats.transactions
        await actor.launch(turn_actor)  # returns once admitted
        assert writer.stats.transactions == before + 1
        with runtime.services.store.read() as conn:
            lease = storage.get_lease(conn, leases.thread_lease_key(actor.thread.id))
            items = storage.list_items(conn, actor.thread.id)
        assert lease["owner"] == runtime.services.keeper.owner and lease["token"] == turn_actor.token
        assert [(i.type, i.turn_id) for i in items] == [("user_message", turn_actor.id)]
        release.set()
        with trio.fail_after(scaled(10)):
            ended = await actor.wait_turn_end(turn_actor.id)
        assert ended["status"] == "completed"
        await stopped(turn_actor)
        await trio.testing.wait_all_tasks_blocked()
        assert writer.stats.transactions == before + 2
        with runtime.services.store.read() as conn:
            assert storage.get_lease(conn, leases.thread_lease_key(actor.thread.id))["owner"] is None
