"""Scheduled cron orchestrations: 10,000 schedules, 1,000 of them firing in the same minute.

Measures, with the real Scheduler actor, store and writer (the TaskQueue is a stand-in whose
``dispatch`` returns at once and whose tasks succeed at once), the runs of one slot (all
``FIRING`` schedules fire in it). The clock is the real wall clock shifted (``SystemClock(offset=)``)
so that the slot comes a few seconds after start-up instead of up to a minute later.

Output (one JSON line on stdout):

* ``bench``: ``"scheduler"``; ``schedules``: schedules stored, ``firing_same_minute``: of them,
  those due in the slot (counts);
* ``fired``: runs the slot started (a count);
* ``delay_ms_p50``, ``delay_ms_p99``, ``delay_ms_max``: wall time from the slot to the start of
  each dispatch (the run start), in ms;
* ``load_ms``: reading and parsing the schedules at start-up, in ms;
* ``idle_cpu_percent``: CPU used by the process over ``IDLE_SECONDS`` (5 s) of real time while the
  scheduler sleeps towards the next slot (only the 1 s change-counter read runs), in percent of
  one core; ``idle_wakeups``: times the scheduler woke up in that time (a count);
* ``lost_claims``: due slots whose claim another owner won (a count; 0 with one scheduler);
* ``bytes_per_schedule``: Python memory (tracemalloc) held by the loaded jobs and their heap,
  divided by the number of schedules, in bytes; ``rss_bytes_per_schedule``: the RSS growth per
  schedule, in bytes, for comparison.

Run: ``.venv/bin/python benchmarks/bench_scheduler.py [SCHEDULES] [FIRING]`` (defaults 10000 and
1000; about 2 min: the slot is real time).
"""

from __future__ import annotations

import datetime
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _util import arg_parser, cpu_seconds, current_rss_bytes, emit, percentile  # noqa: E402

from roost.actors._scheduler import Scheduler  # noqa: E402
from roost.scheduling import ManualClock, SystemClock, format_slot, parse_cron  # noqa: E402
from roost.storage import _schedules2 as db  # noqa: E402
from roost.storage import open_store  # noqa: E402

UTC = datetime.UTC
LEAD_SECONDS = 4.0
IDLE_SECONDS = 5.0


def populate(store, n: int, firing: int, slot: datetime.datetime, now: datetime.datetime) -> None:
    """``firing`` jobs fire at ``slot`` (minute m, every hour); the rest fire at other minutes/days."""
    minute = slot.minute
    other = [f"{(minute + 1 + i % 58) % 60} {i % 24} * * *" for i in range(n - firing)]
    crons = [f"{minute} * * * *"] * firing + other
    with store.transaction() as conn:
        for i, cron in enumerate(crons):
            next_run = format_slot(parse_cron(cron, now=now).next_after(now))
            db.add_job(conn, name=f"job{i:05d}", cron=cron, task=f"scheduled task {i}", next_run=next_run)


class StandInQueue:
    def __init__(self) -> None:
        self.n = 0
        self.done = trio.Event()
        self.expected = 0

    async def dispatch(self, task, *, config, work_dir, client_id, source):
        self.n += 1
        if self.n >= self.expected:
            self.done.set()
        return f"task_{self.n}"

    async def wait_task(self, task_id):
        await trio.lowlevel.checkpoint()
        return "succeeded"


async def measure_memory(path: Path, n: int) -> dict:
    store = open_store(path)
    queue = StandInQueue()
    try:
        async with trio.open_nursery() as outer:
            await outer.start(store.writer.run)
            rss0 = current_rss_bytes()
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            sched = Scheduler(
                store,
                dispatch=queue.dispatch,
                wait_task=queue.wait_task,
                clock=ManualClock(datetime.datetime(2026, 1, 1, tzinfo=UTC)),
                change_poll=None,
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(sched.run)
                await sched.wait_quiet()
                held = tracemalloc.get_traced_memory()[0] - base
                tracemalloc.stop()
                rss = current_rss_bytes() - rss0
                assert len(sched.jobs()) == n
                sched.stop()
            outer.cancel_scope.cancel()
    finally:
        store.close()
    return {"bytes_per_schedule": round(held / n), "rss_bytes_per_schedule": round(rss / n)}


async def measure_firing(path: Path, n: int, firing: int, slot: datetime.datetime) -> dict:
    store = open_store(path)
    queue = StandInQueue()
    queue.expected = firing
    # shift the clock so that the slot (a minute boundary) is LEAD_SECONDS ahead of the real now
    offset = (slot - datetime.datetime.now(UTC)).total_seconds() - LEAD_SECONDS
    clock = SystemClock(offset=offset)
    try:
        with store.transaction() as conn:
            conn.execute("UPDATE schedules SET next_run = NULL")  # recomputed from the shifted now
        async with trio.open_nursery() as outer:
            await outer.start(store.writer.run)
            sched = Scheduler(store, dispatch=queue.dispatch, wait_task=queue.wait_task, clock=clock)
            async with trio.open_nursery() as nursery:
                t0 = time.perf_counter()
                await nursery.start(sched.run)
                await sched.wait_quiet()
                load_ms = (time.perf_counter() - t0) * 1000
                with trio.fail_after(LEAD_SECONDS + 60):
                    await queue.done.wait()
                await sched.wait_quiet(at_least=slot)
                delays = list(sched.dispatch_delays)
                # idle: the next slot is an hour away for the 1,000; others are spread out
                cpu0, wall0 = cpu_seconds(), time.perf_counter()
                wakeups0 = sched.stats["wakeups"]
                await trio.sleep(IDLE_SECONDS)
                cpu_idle = cpu_seconds() - cpu0
                wall_idle = time.perf_counter() - wall0
                idle_wakeups = sched.stats["wakeups"] - wakeups0
                stats = dict(sched.stats)
                sched.stop()
            outer.cancel_scope.cancel()
    finally:
        store.close()
    return {
        "fired": len(delays),
        "delay_ms_p50": round(percentile(delays, 50) * 1000, 2),
        "delay_ms_p99": round(percentile(delays, 99) * 1000, 2),
        "delay_ms_max": round(max(delays) * 1000, 2),
        "load_ms": round(load_ms, 1),
        "idle_cpu_percent": round(100 * cpu_idle / wall_idle, 3),
        "idle_wakeups": idle_wakeups,
        "lost_claims": stats["lost_claims"],
    }


async def main(n: int, firing: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "roost.db"
        store = open_store(path)
        now = datetime.datetime.now(UTC)
        slot = (now + datetime.timedelta(minutes=2)).replace(second=0, microsecond=0)
        populate(store, n, firing, slot, now)
        store.close()
        memory = await measure_memory(path, n)
        firing_figures = await measure_firing(path, n, firing, slot)
    emit({"bench": "scheduler", "schedules": n, "firing_same_minute": firing, **firing_figures, **memory})


if __name__ == "__main__":
    parser = arg_parser(__doc__)
    parser.add_argument("schedules", nargs="?", type=int, default=10_000, help="schedules stored (default 10000)")
    parser.add_argument(
        "firing", nargs="?", type=int, default=1_000, help="of them, how many fire in the same minute (default 1000)"
    )
    parsed = parser.parse_args()
    trio.run(main, parsed.schedules, parsed.firing)
