"""The Scheduler actor with a manual clock and a fake TaskQueue (no real sleeping)."""

from __future__ import annotations

import datetime
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from roost.actors._scheduler import Scheduler, SchedulesChanged
from roost.errors import NotFound
from roost.scheduling import ManualClock, format_slot, parse_cron
from roost.storage import _schedules2 as db
from roost.storage import open_store
from _helpers.timing import scaled

UTC = datetime.timezone.utc
T0 = datetime.datetime(2026, 1, 1, 0, 1, tzinfo=UTC)


class FakeQueue:
    """Stands in for the serve TaskQueue: records dispatches; tasks end when the test says."""

    def __init__(self) -> None:
        self.dispatched: list[tuple[str, str, str]] = []  # (task_id, task, source)
        self._ends: dict[str, trio.Event] = {}
        self._outcomes: dict[str, str] = {}
        self.changed = trio.Event()
        self.fail_dispatch = False

    async def dispatch(self, task, *, config, work_dir, client_id, source):
        assert client_id is None
        if self.fail_dispatch:
            raise RuntimeError("queue refused")
        task_id = f"task_{len(self.dispatched) + 1}"
        self.dispatched.append((task_id, task, source))
        self._ends[task_id] = trio.Event()
        self.changed.set()
        self.changed = trio.Event()
        return task_id

    async def wait_task(self, task_id):
        if task_id not in self._ends:
            raise NotFound(task_id)
        await self._ends[task_id].wait()
        return self._outcomes[task_id]

    def finish(self, task_id, outcome="succeeded"):
        self._outcomes[task_id] = outcome
        self._ends[task_id].set()

    def finish_all(self):
        for task_id, end in self._ends.items():
            if not end.is_set():
                self.finish(task_id)

    async def wait_dispatched(self, n):
        while len(self.dispatched) < n:
            await self.changed.wait()


def add(store, name, cron, **kw):
    with store.transaction() as conn:
        return db.add_job(conn, name=name, cron=cron, task=kw.pop("task", f"task of {name}"),
                          next_run=format_slot(parse_cron(cron, now=kw.pop("now", T0)).next_after(kw.pop("after", T0))),
                          **kw)


def runs(store, name):
    with store.read() as conn:
        job = db.get_job(conn, name)
        return sorted(db.list_job_runs(conn, job.id, limit=10_000), key=lambda r: r.slot)


def job(store, name):
    with store.read() as conn:
        return db.get_job(conn, name)


async def settle_runs(store, name, predicate):
    """Wait (on the writer's commits, re-reading after each checkpoint) until predicate(runs)."""
    while not predicate(runs(store, name)):
        await trio.sleep(0)  # checkpoint only: lets the writer thread's commit land


async def settle_all(store):
    """Wait until no run record is claimed or running (re-reading after each checkpoint)."""
    def open_runs():
        with store.read() as conn:
            return conn.execute(
                "SELECT COUNT(*) FROM schedule_runs WHERE status IN ('claimed', 'running')").fetchone()[0]

    while open_runs():
        await trio.sleep(0)


@asynccontextmanager
async def running(store, queue, clock, **kw):
    # Like the root supervisor: the writer starts first and stops last.
    async with trio.open_nursery() as outer:
        await outer.start(store.writer.run)
        async with trio.open_nursery() as nursery:
            sched = Scheduler(store, dispatch=queue.dispatch, wait_task=queue.wait_task, clock=clock,
                              change_poll=kw.pop("change_poll", None), **kw)
            await nursery.start(sched.run)
            await sched.wait_quiet()
            try:
                yield sched
            finally:
                sched.stop()
        outer.cancel_scope.cancel()


@pytest.fixture
def store(tmp_path: Path):
    s = open_store(tmp_path / "roost.db")
    yield s
    s.close()
    while _OPENED:
        _OPENED.pop().close()


_OPENED: list = []


def fresh_store(path):
    """Another Store on the same file (a second process's, or the next daemon's after a restart)."""
    s = open_store(path)
    _OPENED.append(s)
    return s


async def test_fires_each_slot_once_and_next_run_comes_from_the_slot(store):
    add(store, "five", "*/5 * * * *")
    clock, queue = ManualClock(T0), FakeQueue()
    with trio.fail_after(scaled(20)):
        async with running(store, queue, clock) as sched:
            assert clock.sleepers == [T0.replace(minute=5)]  # sleeps until the slot, no tick
            clock.advance_to(T0.replace(minute=5))
            await queue.wait_dispatched(1)
            await sched.wait_quiet()
            assert queue.dispatched == [("task_1", "task of five", "schedule")]
            # the run finishes late (at 00:08): the next run is still 00:10, from the slot
            clock.advance_to(T0.replace(minute=8))
            queue.finish("task_1")
            await settle_runs(store, "five", lambda rs: rs[0].status == "done")
            r = runs(store, "five")[0]
            assert (r.slot, r.session_id, r.outcome, r.started_at) == (
                "2026-01-01T00:05:00.000000Z", "task_1", "succeeded", "2026-01-01T00:05:00.000000Z")
            assert r.finished_at == "2026-01-01T00:08:00.000000Z"
            assert job(store, "five").next_run == "2026-01-01T00:10:00.000000Z"
            assert job(store, "five").last_run == "2026-01-01T00:05:00.000000Z"
            assert list(sched.dispatch_delays) == [0.0]


async def test_two_schedulers_racing_on_one_database_fire_each_slot_exactly_once(store, tmp_path):
    for i in range(15):
        add(store, f"job{i}", "* * * * *")
    other = fresh_store(tmp_path / "roost.db")  # a second process's store: own writer, own readers
    clock, queue = ManualClock(T0), FakeQueue()
    with trio.fail_after(scaled(30)):
        async with running(store, queue, clock, owner="daemon-a") as a, \
                   running(other, queue, clock, owner="daemon-b") as b:
            for minute in range(2, 12):
                clock.advance_to(T0.replace(minute=minute))
                await a.wait_quiet()
                await b.wait_quiet()
                queue.finish_all()
                await settle_all(store)  # both runs' ends recorded before the next slot
            assert len(queue.dispatched) == 15 * 10
            assert a.stats["fired"] + b.stats["fired"] == 150
            assert a.stats["lost_claims"] + b.stats["lost_claims"] == 150
    for i in range(15):
        slots = [r.slot for r in runs(store, f"job{i}") if r.status != "skipped"]
        assert slots == [format_slot(T0.replace(minute=m)) for m in range(2, 12)]


async def test_slow_run_with_overlap_skip_skips_the_slot(store):
    add(store, "slow", "* * * * *")
    clock, queue = ManualClock(T0), FakeQueue()
    with trio.fail_after(scaled(20)):
        async with running(store, queue, clock) as sched:
            clock.advance_to(T0.replace(minute=2))
            await queue.wait_dispatched(1)
            clock.advance_to(T0.replace(minute=3))
            await sched.wait_quiet(T0.replace(minute=3))
            assert len(queue.dispatched) == 1
            queue.finish("task_1")
            await settle_runs(store, "slow", lambda rs: rs[0].status == "done")
            clock.advance_to(T0.replace(minute=4))
            await queue.wait_dispatched(2)
            await sched.wait_quiet()
    got = [(r.slot[11:16], r.status, r.outcome) for r in runs(store, "slow")]
    assert got == [("00:02", "done", "succeeded"), ("00:03", "skipped", "overlap"), ("00:04", "running", None)]


async def test_slow_run_with_overlap_queue_runs_after_the_previous(store):
    add(store, "queued", "* * * * *", overlap="queue")
    clock, queue = ManualClock(T0), FakeQueue()
    with trio.fail_after(scaled(20)):
        async with running(store, queue, clock) as sched:
            clock.advance_to(T0.replace(minute=2))
            await queue.wait_dispatched(1)
            clock.advance_to(T0.replace(minute=3))
            await sched.wait_quiet(T0.replace(minute=3))
            assert len(queue.dispatched) == 1
            assert [r.status for r in runs(store, "queued")] == ["running", "claimed"]
            clock.advance_to(T0.replace(minute=3, second=40))
            queue.finish("task_1", "failed")
            await queue.wait_dispatched(2)
            await settle_runs(store, "queued", lambda rs: rs[1].status == "running")
    got = [(r.slot[11:16], r.status, r.outcome, r.started_at and r.started_at[11:19]) for r in runs(store, "queued")]
    assert got == [("00:02", "done", "failed", "00:02:00"), ("00:03", "running", None, "00:03:40")]


def dead_owner() -> str:
    import socket

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return f"{socket.gethostname()}:{proc.pid}:deadbeef"


@pytest.mark.parametrize("policy", ["once", "none"])
async def test_restart_catch_up(store, policy):
    add(store, "every5", "*/5 * * * *", catch_up=policy)
    add(store, "hourly", "0 * * * *", catch_up=policy)
    clock, queue = ManualClock(T0), FakeQueue()
    with trio.fail_after(scaled(20)):
        async with running(store, queue, clock):
            pass  # a daemon ran briefly and stopped; nothing was due
        clock.advance_to(datetime.datetime(2026, 1, 1, 1, 2, tzinfo=UTC))  # down for an hour
        async with running(fresh_store(store.path), queue, clock) as sched:
            if policy == "once":
                await queue.wait_dispatched(2)
            await sched.wait_quiet()
    if policy == "once":
        assert sorted(t for _, t, _ in queue.dispatched) == ["task of every5", "task of hourly"]
    else:
        assert queue.dispatched == []
    every5 = runs(store, "every5")
    ran = [r.slot[11:16] for r in every5 if r.status != "skipped"]
    missed = [r.slot[11:16] for r in every5 if r.outcome == "missed"]
    assert ran == (["01:00"] if policy == "once" else [])
    assert missed == [f"00:{m:02d}" for m in range(5, 60, 5)] + ([] if policy == "once" else ["01:00"])
    assert [r.slot[11:16] for r in runs(store, "hourly") if r.status != "skipped"] == (
        ["01:00"] if policy == "once" else [])
    assert job(store, "every5").next_run == "2026-01-01T01:05:00.000000Z"


async def test_restart_mid_run_never_refires_and_settles_the_run(store):
    add(store, "long", "0 * * * *")
    add(store, "lost", "30 * * * *")
    clock, queue = ManualClock(T0), FakeQueue()
    owner = dead_owner()
    with trio.fail_after(scaled(20)):
        async with running(store, queue, clock, owner=owner):
            clock.advance_to(T0.replace(minute=30))
            await queue.wait_dispatched(1)
            clock.advance_to(T0.replace(hour=1, minute=0))
            await queue.wait_dispatched(2)
        # the daemon died with both runs in flight; the queue resumed task_2 only
        del queue._ends["task_1"]
        async with running(fresh_store(store.path), queue, clock) as sched:
            await settle_runs(store, "lost", lambda rs: rs[0].status == "done")
            queue.finish("task_2")
            await settle_runs(store, "long", lambda rs: rs[0].status == "done")
            await sched.wait_quiet()
            assert len(queue.dispatched) == 2
    assert [(r.slot[11:16], r.outcome, r.session_id) for r in runs(store, "lost")] == [("00:30", "interrupted", "task_1")]
    assert [(r.slot[11:16], r.outcome, r.session_id) for r in runs(store, "long")] == [("01:00", "succeeded", "task_2")]


async def test_unparsable_rows_do_not_stall_the_others(store):
    add(store, "healthy", "* * * * *")
    with store.transaction() as conn:  # rows an older version could have written
        for name, cron in (("six", "* * * * * *"), ("feb31", "0 0 31 2 *"), ("junk", "not cron")):
            conn.execute(
                """INSERT INTO schedules (id, name, cron, created_at, updated_at, task, next_run)
                   VALUES (?, ?, ?, '2025-01-01T00:00:00.000000Z', '2025-01-01T00:00:00.000000Z', 't', ?)""",
                (f"sched_{name}", name, cron, "2025-06-01T00:00:00.000000Z"))
    add(store, "healthy2", "*/2 * * * *")
    clock, queue = ManualClock(T0), FakeQueue()
    with trio.fail_after(scaled(20)):
        async with running(store, queue, clock) as sched:
            for minute in (2, 3, 4):
                clock.advance_to(T0.replace(minute=minute))
                await sched.wait_quiet()
                queue.finish_all()
                await settle_runs(store, "healthy", lambda rs: all(r.status == "done" for r in rs))
                await settle_runs(store, "healthy2", lambda rs: all(r.status == "done" for r in rs))
            assert len(queue.dispatched) == 5
    assert sorted(t for _, t, _ in queue.dispatched) == ["task of healthy"] * 3 + ["task of healthy2"] * 2
    for name in ("six", "feb31", "junk"):
        assert job(store, name).next_run is None  # marked as never firing
        assert runs(store, name) == []


async def test_wakes_on_change_counter_and_on_tell(store):
    clock, queue = ManualClock(T0), FakeQueue()
    with trio.fail_after(scaled(20)):
        async with running(store, queue, clock, change_poll=0.01) as sched:
            assert clock.sleepers == []  # nothing scheduled: no timer at all
            add(store, "late", "*/10 * * * *")  # as `roost schedule add` does, from outside
            while "late" not in sched.jobs():
                await sched._state_changed.wait()
            assert clock.sleepers == [T0.replace(minute=10)]
            with store.transaction() as conn:
                db.set_job_enabled(conn, "late", False, next_run=None)
            while clock.sleepers:
                await sched._state_changed.wait()
            with store.transaction() as conn:  # manual "run now" of a disabled job
                db.request_run(conn, "late")
            sched.ref.tell(SchedulesChanged())
            await queue.wait_dispatched(1)
    assert queue.dispatched == [("task_1", "task of late", "schedule")]
    assert [r.source for r in runs(store, "late")] == ["manual"]


async def test_dispatch_failure_is_recorded(store):
    add(store, "broken", "* * * * *")
    clock, queue = ManualClock(T0), FakeQueue()
    queue.fail_dispatch = True
    with trio.fail_after(scaled(20)):
        async with running(store, queue, clock) as sched:
            clock.advance_to(T0.replace(minute=2))
            await sched.wait_quiet()
            await settle_runs(store, "broken", lambda rs: rs and rs[0].status == "done")
    assert [(r.status, r.outcome) for r in runs(store, "broken")] == [("done", "failed")]


async def test_task_outcomes_adapter_bridges_the_queue_listener():
    from types import SimpleNamespace

    from roost.actors._scheduler import TaskOutcomes

    known = {"t1": SimpleNamespace(id="t1", status="running", result=None),
             "t2": SimpleNamespace(id="t2", status="finished", result={"succeeded": False})}

    async def lookup(task_id):
        return known.get(task_id)

    outcomes = TaskOutcomes(lookup)
    got = {}
    with trio.fail_after(scaled(10)):
        async with trio.open_nursery() as nursery:
            async def wait(task_id):
                try:
                    got[task_id] = await outcomes.wait(task_id)
                except LookupError:
                    got[task_id] = "unknown"

            for task_id in ("t1", "t2", "t3"):
                nursery.start_soon(wait, task_id)
            while "t2" not in got or "t3" not in got:
                await trio.sleep(0)
            # as the TaskQueue does: the task is finished, then the listener is told
            known["t1"].status, known["t1"].result = "finished", {"succeeded": True}
            outcomes.finished_task(known["t1"])
    assert got == {"t1": "succeeded", "t2": "failed", "t3": "unknown"}
    outcomes.finished("never-waited", "failed")  # not remembered
    assert outcomes._outcomes == {} and outcomes._ended == {}


def test_claim_rules(store):
    add(store, "j", "* * * * *")
    with store.transaction() as conn:
        job_id = db.get_job(conn, "j").id
        assert db.record_skipped(conn, job_id, ["s1", "s2"], "missed") == 2
        assert db.record_skipped(conn, job_id, ["s1"], "missed") == 0  # kept once
        first = db.claim_slot(conn, job_id, "s1", "a")
        assert first is not None  # a missed record does not veto a live claim...
        assert db.claim_slot(conn, job_id, "s1", "b") is None  # ...but a claim is exclusive
        overlap = db.claim_slot(conn, job_id, "s3", "a")
        db.mark_run_finished(conn, overlap, "overlap", "s3")
        assert db.claim_slot(conn, job_id, "s3", "b") is None  # an overlap skip is final
        assert db.claim_slot(conn, "sched_gone", "s1", "a") is None  # removed job: nothing claimed


async def test_runs_as_a_permanent_child_of_a_supervisor(store):
    """As `roost serve` starts it: a fresh Scheduler per (re)start, after the store writer."""
    from roost.supervisor import ChildSpec, Restart, Supervisor

    add(store, "sup", "*/5 * * * *")
    clock, queue = ManualClock(T0), FakeQueue()
    instances: list[Scheduler] = []

    async def start_scheduler(*, task_status):
        sched = Scheduler(store, dispatch=queue.dispatch, wait_task=queue.wait_task, clock=clock,
                          change_poll=None)
        instances.append(sched)
        await sched.run(task_status=task_status)

    root = Supervisor([
        ChildSpec("store_writer", store.writer.run, restart=Restart.PERMANENT),
        ChildSpec("scheduler", start_scheduler, restart=Restart.PERMANENT),
    ], name="root")
    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            await nursery.start(root.run)
            assert "scheduler" in root.render_tree()
            await instances[0].wait_quiet()
            clock.advance_to(T0.replace(minute=5))
            await queue.wait_dispatched(1)
            nursery.cancel_scope.cancel()
    assert [r.session_id for r in runs(store, "sup")] == ["task_1"]
