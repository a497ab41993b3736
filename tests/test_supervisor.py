"""Supervision: strategies, restart types, intensity and escalation, ordered shutdown, abandonment."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roost.errors import ChildNotFound, LifecycleError, RestartIntensityExceeded
from roost.supervisor import ChildSpec, Restart, Strategy, Supervisor


class Handle:
    """What a probe child reports as started: tests crash or finish it through this."""

    def __init__(self) -> None:
        self._send, self._recv = trio.open_memory_channel(1)

    def crash(self) -> None:
        self._command("crash")

    def finish(self) -> None:
        self._command("finish")

    def _command(self, command: str) -> None:
        try:
            self._send.send_nowait(command)
        except trio.WouldBlock:
            pass  # already told; the instance is on its way out


class Probe:
    """Builds child specs that log starts and stops and check there is one live instance per id."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.live: dict[str, int] = {}
        self.max_live: dict[str, int] = {}
        self.handles: dict[str, Handle] = {}

    def spec(self, id: str, restart: Restart = Restart.PERMANENT, *, shutdown_timeout: float = 1.0,
             stubborn: float = 0.0, fail_start: bool = False) -> ChildSpec:
        async def start(*, task_status):
            self.live[id] = self.live.get(id, 0) + 1
            self.max_live[id] = max(self.max_live.get(id, 0), self.live[id])
            self.events.append(f"start {id}")
            try:
                if fail_start:
                    raise ValueError(f"{id} cannot start")
                handle = Handle()
                self.handles[id] = handle
                task_status.started(handle)
                command = await handle._recv.receive()
                if command == "crash":
                    raise RuntimeError(f"{id} crashed")
            finally:
                if stubborn:
                    with trio.CancelScope(shield=True):
                        await trio.sleep(stubborn)
                self.live[id] -= 1
                self.events.append(f"stop {id}")

        return ChildSpec(id, start, restart=restart, shutdown_timeout=shutdown_timeout)


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


@pytest.mark.parametrize(
    "strategy, expected",
    [
        (Strategy.ONE_FOR_ONE, ["stop b", "start b"]),
        (Strategy.ONE_FOR_ALL, ["stop b", "stop c", "stop a", "start a", "start b", "start c"]),
        (Strategy.REST_FOR_ONE, ["stop b", "stop c", "start b", "start c"]),
    ],
)
async def test_strategies(strategy, expected):
    probe = Probe()
    sup = Supervisor([probe.spec("a"), probe.spec("b"), probe.spec("c")], strategy=strategy)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        assert probe.events == ["start a", "start b", "start c"]
        probe.events.clear()
        probe.handles["b"].crash()
        await settle()
        assert probe.events == expected
        assert [c.state for c in sup.which_children()] == ["running"] * 3
        nursery.cancel_scope.cancel()
    assert max(probe.max_live.values()) == 1


@pytest.mark.parametrize(
    "restart, how, restarted",
    [
        (Restart.PERMANENT, "finish", True),
        (Restart.PERMANENT, "crash", True),
        (Restart.TRANSIENT, "finish", False),
        (Restart.TRANSIENT, "crash", True),
        (Restart.TEMPORARY, "finish", False),
        (Restart.TEMPORARY, "crash", False),
    ],
)
async def test_restart_types(restart, how, restarted):
    probe = Probe()
    sup = Supervisor([probe.spec("x", restart)])
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        getattr(probe.handles["x"], how)()
        await settle()
        assert probe.events.count("start x") == (2 if restarted else 1)
        assert [c.id for c in sup.which_children()] == (["x"] if restarted else [])
        nursery.cancel_scope.cancel()


async def test_intensity_exceeded_escalates_and_stops_all(caplog):
    caplog.set_level(logging.INFO, "roost.supervisor")
    probe = Probe()
    sup = Supervisor([probe.spec("a"), probe.spec("b")], intensity=2, period=10)
    with pytest.RaisesGroup(RestartIntensityExceeded, allow_unwrapped=True, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            for _ in range(3):
                probe.handles["b"].crash()
                await settle()
    assert probe.events[-2:] == ["stop b", "stop a"]
    assert probe.live == {"a": 0, "b": 0}
    assert "restart intensity exceeded" in caplog.text
    assert caplog.text.count("restarting ['b']") == 2


async def test_intensity_window_slides(autojump_clock):
    probe = Probe()
    sup = Supervisor([probe.spec("a")], intensity=1, period=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        for _ in range(4):
            probe.handles["a"].crash()
            await settle()
            await trio.sleep(6)  # each restart falls out of the window before the next
        assert probe.events.count("start a") == 5
        nursery.cancel_scope.cancel()


async def test_escalation_reaches_parent_which_restarts_the_subtree():
    probe = Probe()
    inner_runs = []

    def make_inner():
        inner = Supervisor([probe.spec("leaf")], name="inner", intensity=0)
        inner_runs.append(inner)
        return inner

    outer = Supervisor([Supervisor.child_spec("inner", make_inner)], name="outer", intensity=5)
    async with trio.open_nursery() as nursery:
        await nursery.start(outer.run)
        probe.handles["leaf"].crash()  # intensity 0: the inner supervisor escalates at once
        await settle()
        assert len(inner_runs) == 2
        assert outer.which_children()[0].restarts == 1
        assert "leaf" in outer.render_tree()
        nursery.cancel_scope.cancel()


async def test_shutdown_is_reverse_order():
    probe = Probe()
    sup = Supervisor([probe.spec(n) for n in "abcd"])
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        nursery.cancel_scope.cancel()
    assert probe.events[4:] == ["stop d", "stop c", "stop b", "stop a"]


async def test_child_ignoring_cancellation_is_bounded_by_shutdown_timeout(autojump_clock, caplog):
    """The siblings' stop goes on after the stubborn child's timeout; the supervisor itself still
    waits for it (structured cancellation: no child outlives its supervisor)."""
    probe = Probe()
    sup = Supervisor([probe.spec("a"), probe.spec("slow", shutdown_timeout=2.0, stubborn=100.0)])
    start = trio.current_time()
    stopped_a: list[float] = []

    async def watch() -> None:
        while "stop a" not in probe.events:
            await trio.sleep(0.01)
        stopped_a.append(trio.current_time() - start)

    async with trio.open_nursery() as outer:
        outer.start_soon(watch)
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
            nursery.cancel_scope.cancel()
    # "a" was stopped right after the slow child's 2 s timeout, not after its 100 s...
    assert stopped_a == [pytest.approx(2.0, abs=0.05)]
    assert "abandoned" in caplog.text
    # ...and the supervisor ended only once the abandoned instance had ended.
    assert probe.live["slow"] == 0 and probe.events[-1] == "stop slow"


async def test_dynamic_children():
    probe = Probe()
    sup = Supervisor([probe.spec("static")])
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        handle = await sup.start_child(probe.spec("dyn1", Restart.TEMPORARY))
        assert isinstance(handle, Handle)
        await sup.start_child(probe.spec("dyn2", Restart.TRANSIENT))
        with pytest.raises(ValueError):
            await sup.start_child(probe.spec("dyn1"))
        assert [c.id for c in sup.which_children()] == ["static", "dyn1", "dyn2"]
        await sup.terminate_child("dyn1")
        assert probe.events[-1] == "stop dyn1"
        with pytest.raises(ChildNotFound):
            await sup.terminate_child("dyn1")
        with pytest.raises(ValueError, match="cannot start"):
            await sup.start_child(probe.spec("bad", fail_start=True))
        assert [c.id for c in sup.which_children()] == ["static", "dyn2"]
        nursery.cancel_scope.cancel()
    assert probe.events[-2:] == ["stop dyn2", "stop static"]


async def test_initial_start_failure_stops_started_children_and_raises():
    probe = Probe()
    sup = Supervisor([probe.spec("a"), probe.spec("b", fail_start=True), probe.spec("c")])
    with pytest.RaisesGroup(ValueError, allow_unwrapped=True, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await nursery.start(sup.run)
    assert probe.events == ["start a", "start b", "stop b", "stop a"]
    with pytest.raises(LifecycleError):
        await sup.run()


# -- property: random crash sequences -----------------------------------------------------------

ops = st.lists(
    st.tuples(st.sampled_from(["crash", "finish", "wait"]), st.integers(0, 3)), min_size=1, max_size=25
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    strategy=st.sampled_from(list(Strategy)),
    restarts=st.lists(st.sampled_from(list(Restart)), min_size=4, max_size=4),
    intensity=st.integers(0, 6),
    operations=ops,
)
def test_random_crash_sequences_keep_invariants(strategy, restarts, intensity, operations):
    probe = Probe()
    specs = [probe.spec(f"c{i}", restarts[i], stubborn=0.5 if i == 3 else 0.0, shutdown_timeout=0.1)
             for i in range(4)]
    outcome: dict[str, object] = {}

    async def main():
        sup = Supervisor(specs, strategy=strategy, intensity=intensity, period=1000)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(sup.run)
                for op, index in operations:
                    cid = f"c{index}"
                    live_ids = {c.id for c in sup.which_children() if c.state == "running"}
                    if op == "wait":
                        await trio.sleep(0.3)
                    elif cid in live_ids:
                        getattr(probe.handles[cid], op)()
                    await trio.testing.wait_all_tasks_blocked()
                outcome["children"] = [(c.id, c.state) for c in sup.which_children()]
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            assert group.subgroup(RestartIntensityExceeded) is not None, group
            outcome["escalated"] = True
        await trio.sleep(5)  # let abandoned instances end

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    # Never two live instances of one child id, and nothing left running at the end.
    assert all(n <= 1 for n in probe.max_live.values()), probe.max_live
    assert all(n == 0 for n in probe.live.values()), probe.live
    if "children" in outcome:
        for cid, state in outcome["children"]:
            index = int(cid[1:])
            assert state in {"running", "starting", "stopping", "abandoned", "stopped"}
            # Only children whose spec allows it may still be supervised after they ended.
            if restarts[index] is Restart.TEMPORARY:
                assert probe.events.count(f"start {cid}") == 1


async def test_factory_spec_builds_a_fresh_instance_per_start_and_inject_fault_restarts_it(caplog):
    """ChildSpec.of_factory: every (re)start runs a new instance; inject_fault crashes a child by
    path through a nested supervisor, and the restart is logged with its reason."""
    caplog.set_level(logging.INFO, logger="roost.supervisor")
    built: list[Supervisor] = []

    def inner() -> Supervisor:
        sup = Supervisor([Probe().spec("leaf")], name="inner")
        built.append(sup)
        return sup

    root = Supervisor([ChildSpec.of_factory("inner", inner)], name="root")
    async with trio.open_nursery() as nursery:
        await nursery.start(root.run)
        root.inject_fault("inner/leaf")            # the leaf restarts inside the same inner
        await settle()
        assert len(built) == 1 and built[0].which_children()[0].restarts == 1
        root.inject_fault("inner")                 # the inner supervisor restarts as a new one
        await settle()
        assert len(built) == 2 and built[1] is root.child_value("inner") and built[0] is not built[1]
        with pytest.raises(ChildNotFound):
            root.inject_fault("inner/nope")
        nursery.cancel_scope.cancel()
    messages = [r.getMessage() for r in caplog.records]
    assert any("child leaf exited (InjectedFault" in m for m in messages), messages
    assert any("child inner restarted" in m for m in messages), messages
