"""When ``roost app-server`` hands threads to its worker processes (roost.protocol._as_workers,
issue 19 "Every core"): the spread decision, against a fake session (no process is started).

The load the decision looks at is the session's: this process's running turns and the turns in
flight in its workers. Counting only this process's turns stopped the moves halfway (each move
lowers that count, and one ``turn/start`` under the threshold restarted the 2 s wait), so a
saturated session stayed split by accident.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from roost.protocol._as_workers import SUSTAINED_S, WorkerRouter


@attrs.define
class FakeRegistry:
    running: int = 0
    unloaded: list = attrs.Factory(list)
    unsubscribed: list = attrs.Factory(list)

    def running_count(self) -> int:
        return self.running

    def can_hand_off(self, thread_id: str, subscriber: Any) -> bool:
        return True

    def remove_subscriber(self, thread_id: str, subscriber: Any) -> None:
        self.unsubscribed.append(thread_id)

    async def unload(self, thread_id: str) -> None:
        self.unloaded.append(thread_id)


@attrs.define
class FakeRuntime:
    registry: FakeRegistry = attrs.Factory(FakeRegistry)


@attrs.define
class FakeSession:
    nursery: Any
    runtime: FakeRuntime = attrs.Factory(FakeRuntime)
    subscribed: set = attrs.Factory(set)


def router_for(nursery: Any, started: list[int], spread: int = 16) -> tuple[WorkerRouter, FakeSession]:
    session = FakeSession(nursery)
    router = WorkerRouter(session, 1, spread, argv=["roost-worker-not-started"])

    async def run(worker: Any) -> None:  # instead of a process
        started.append(worker.index)

    router._run = run  # type: ignore[method-assign]
    return router, session


def turn_start(router: WorkerRouter, thread_id: str, rid: str) -> bool:
    frame = {"id": rid, "method": "turn/start", "params": {"thread_id": thread_id, "prompt": "hi"}}
    return router.route(rid, "turn/start", frame["params"], frame)


async def test_a_saturated_session_moves_its_threads_as_its_own_count_falls(mock_clock) -> None:
    started: list[int] = []
    async with trio.open_nursery() as nursery:
        router, session = router_for(nursery, started)
        registry = session.runtime.registry
        registry.running = 20
        assert not turn_start(router, "thr_early", "1")  # the wait for sustained load begins
        mock_clock.jump(SUSTAINED_S / 2)
        assert not turn_start(router, "thr_half", "2")
        await trio.testing.wait_all_tasks_blocked()
        assert started == [0]  # started halfway, before any thread moves
        mock_clock.jump(SUSTAINED_S / 2)
        moved = []
        for i in range(12):  # each move takes a running turn from this process to the worker
            moved.append(turn_start(router, f"thr_{i}", f"r{i}"))
            registry.running -= 1
        assert moved == [True] * 12
        (worker,) = router.workers
        assert worker.running == {f"thr_{i}" for i in range(12)}
        assert router.load() == 20
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(registry.unloaded) == sorted(f"thr_{i}" for i in range(12))
        # the worker's terminal lines end its turns; a refused turn/start never ran
        chunk = b"".join(
            b'{"method":"turn/completed","params":{"thread_id":"thr_%d","turn":{"id":"t%d"}}}\n' % (i, i)
            for i in range(10)
        )
        router._ended(worker, chunk + b'{"method":"turn/error","params":{"thread_id":"thr_10","turn":{}}}\n')
        assert worker.running == {"thr_11"}
        router._scan(worker, b'{"id":"r11","error":{"code":"thread_busy","message":"busy"}}\n')
        assert worker.running == set()
        nursery.cancel_scope.cancel()


async def test_a_short_burst_starts_no_worker_and_moves_nothing(mock_clock) -> None:
    started: list[int] = []
    async with trio.open_nursery() as nursery:
        router, session = router_for(nursery, started)
        registry = session.runtime.registry
        registry.running = 30
        assert not turn_start(router, "thr_a", "1")
        mock_clock.jump(SUSTAINED_S / 2 - 0.1)
        assert not turn_start(router, "thr_b", "2")
        registry.running = 3  # the burst is over: the wait starts again at the next load
        assert not turn_start(router, "thr_c", "3")
        registry.running = 30
        mock_clock.jump(SUSTAINED_S / 2)
        assert not turn_start(router, "thr_d", "4")
        await trio.testing.wait_all_tasks_blocked()
        assert started == []
        assert router.owner == {}
        nursery.cancel_scope.cancel()
