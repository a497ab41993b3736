"""Actor-kernel costs: tell throughput, ask latency, spawn/cancel cost, idle memory, supervisor churn.

Each phase runs in its own ``trio.run`` so phases do not share scheduler state.

Output (one JSON line on stdout; units are in the key names: ``_per_s`` per second, ``_us``
microseconds, ``_s`` seconds, ``_bytes`` bytes):

* ``benchmark``: ``"kernel"``; ``python``, ``trio``: their versions;
* ``tell`` (a ``--mailbox`` mailbox, the sender yielding on ``MailboxFull``) and
  ``tell_unbounded_sender`` (a mailbox that holds every message): ``messages`` and ``mailbox``
  (counts), ``msgs_per_s`` (messages handled per second), ``s`` (wall seconds), ``cpu_s`` (CPU
  seconds), ``mailbox_full_yields`` (times the sender found the mailbox full);
* ``ask`` (10 s timeout) and ``ask_no_timeout``: ``asks`` (a count), ``timeout_s`` (seconds, or
  null), ``asks_per_s``, and the round trip's ``p50_us``, ``p99_us``, ``max_us``;
* ``actors``: ``count`` idle actors; ``spawn_total_s``, ``spawn_us_per_actor``, ``spawn_cpu_s``;
  ``cancel_total_s``, ``cancel_us_per_actor``, ``cancel_cpu_s``; memory per idle actor:
  ``rss_bytes_per_idle_actor`` (RSS growth) and ``tracemalloc_bytes_per_idle_actor``;
* ``supervisor_children``: ``count`` dynamic children; ``start_total_s``, ``start_us_per_child``,
  ``stop_total_s``, ``stop_us_per_child``;
* ``peak_rss_bytes``: the process's peak RSS; ``wall_s``: wall time of all phases.

Run: ``.venv/bin/python benchmarks/bench_kernel.py [--actors 10000] [--messages 200000]
[--asks 20000] [--children 1000] [--mailbox SIZE]`` (about 30 s).
"""

from __future__ import annotations

import gc
import platform
import sys
import time
import tracemalloc
from typing import Any

import attrs
import trio
import trio.testing
from _util import arg_parser, cpu_seconds, current_rss_bytes, emit, peak_rss_bytes, percentile

from roost.actors import Actor
from roost.errors import MailboxFull
from roost.supervisor import ChildSpec, Restart, Supervisor


@attrs.frozen
class Ping:
    """The benchmark message: a sequence number."""

    n: int


class Counter(Actor):
    """Counts handled messages; sets :attr:`done` when ``target`` have been handled."""

    def __init__(self, target: int, *, mailbox_size: int | None = None) -> None:
        super().__init__(name="counter", mailbox_size=mailbox_size)
        self.target = target
        self.handled = 0
        self.done = trio.Event()

    async def handle(self, message: Ping) -> int:
        self.handled += 1
        if self.handled == self.target:
            self.done.set()
        return message.n


class Idle(Actor):
    """An actor that only waits on its mailbox (the cost of a parked thread/connection actor)."""


# -- tell -----------------------------------------------------------------------------------------


async def _tell(messages: int, mailbox: int) -> dict[str, Any]:
    actor = Counter(messages, mailbox_size=mailbox)
    full_hits = 0
    async with trio.open_nursery() as nursery:
        ref = await nursery.start(actor.run)
        msg = Ping(0)
        t0 = time.perf_counter()
        c0 = cpu_seconds()
        sent = 0
        while sent < messages:
            try:
                ref.tell(msg)
            except MailboxFull:
                full_hits += 1
                await trio.sleep(0)
                continue
            sent += 1
        with trio.fail_after(60):
            await actor.done.wait()
        elapsed = time.perf_counter() - t0
        cpu = cpu_seconds() - c0
        actor.stop()
    assert actor.handled == messages
    return {
        "msgs_per_s": round(messages / elapsed),
        "s": round(elapsed, 4),
        "cpu_s": round(cpu, 4),
        "mailbox_full_yields": full_hits,
    }


# -- ask ------------------------------------------------------------------------------------------


async def _ask(asks: int, timeout: float | None) -> dict[str, Any]:
    actor = Counter(asks + 100)
    samples: list[float] = []
    async with trio.open_nursery() as nursery:
        ref = await nursery.start(actor.run)
        for i in range(100):  # warm-up
            await ref.ask(Ping(i), timeout=timeout)
        clock = time.perf_counter_ns
        t0 = time.perf_counter()
        for i in range(asks):
            s = clock()
            reply = await ref.ask(Ping(i), timeout=timeout)
            samples.append((clock() - s) / 1000)
            if reply != i:
                raise AssertionError(f"ask {i} got {reply!r}")
        elapsed = time.perf_counter() - t0
        actor.stop()
    return {
        "asks_per_s": round(asks / elapsed),
        "p50_us": round(percentile(samples, 50), 2),
        "p99_us": round(percentile(samples, 99), 2),
        "max_us": round(max(samples), 1),
    }


# -- spawn / cancel / memory ----------------------------------------------------------------------


async def _spawn_cancel(actors: int) -> dict[str, Any]:
    """Start ``actors`` idle actors in one nursery, measure time and RSS, then cancel the nursery."""
    gc.collect()
    rss0 = current_rss_bytes()
    keep: list[Idle] = []
    async with trio.open_nursery() as nursery:
        t0 = time.perf_counter()
        c0 = cpu_seconds()
        for _ in range(actors):
            actor = Idle()
            await nursery.start(actor.run)
            keep.append(actor)
        spawn_s = time.perf_counter() - t0
        spawn_cpu = cpu_seconds() - c0
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        rss1 = current_rss_bytes()
        t_cancel0 = time.perf_counter()
        c1 = cpu_seconds()
        nursery.cancel_scope.cancel()
    cancel_s = time.perf_counter() - t_cancel0
    cancel_cpu = cpu_seconds() - c1
    stopped = sum(1 for a in keep if a.state.value == "stopped")
    if stopped != actors:
        raise AssertionError(f"only {stopped}/{actors} actors stopped")
    return {
        "spawn_total_s": round(spawn_s, 4),
        "spawn_us_per_actor": round(spawn_s / actors * 1e6, 2),
        "spawn_cpu_s": round(spawn_cpu, 4),
        "cancel_total_s": round(cancel_s, 4),
        "cancel_us_per_actor": round(cancel_s / actors * 1e6, 2),
        "cancel_cpu_s": round(cancel_cpu, 4),
        "rss_bytes_per_idle_actor": round((rss1 - rss0) / actors),
    }


async def _traced_memory(actors: int) -> int:
    """Bytes allocated by Python per idle actor (tracemalloc), for ``actors`` parked actors."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        async with trio.open_nursery() as nursery:
            for _ in range(actors):
                await nursery.start(Idle().run)
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
            nursery.cancel_scope.cancel()
    finally:
        tracemalloc.stop()
    return round((after - before) / actors)


# -- supervisor dynamic children ------------------------------------------------------------------


def _idle_child_spec(i: int) -> ChildSpec:
    async def start(*, task_status: Any) -> None:
        await Idle(name=f"idle-{i}").run(task_status=task_status)

    return ChildSpec(f"idle-{i}", start, restart=Restart.TEMPORARY, shutdown_timeout=5.0)


async def _supervisor(children: int) -> dict[str, Any]:
    specs = [_idle_child_spec(i) for i in range(children)]
    sup = Supervisor(name="bench")
    async with trio.open_nursery() as nursery:
        await nursery.start(sup.run)
        t0 = time.perf_counter()
        for spec in specs:
            await sup.start_child(spec)
        start_s = time.perf_counter() - t0
        if len(sup.which_children()) != children:
            raise AssertionError("not every child is running")
        await trio.testing.wait_all_tasks_blocked()
        t1 = time.perf_counter()
        nursery.cancel_scope.cancel()
    stop_s = time.perf_counter() - t1
    if any(info.state != "stopped" for info in sup.which_children()):
        raise AssertionError("a child did not stop")
    return {
        "start_total_s": round(start_s, 4),
        "start_us_per_child": round(start_s / children * 1e6, 2),
        "stop_total_s": round(stop_s, 4),
        "stop_us_per_child": round(stop_s / children * 1e6, 2),
    }


def _phase(fn: Any, *args: Any) -> Any:
    """Run one phase in a fresh ``trio.run`` on a collected heap.

    The cyclic garbage a phase leaves (``Cancelled`` tracebacks hold frames) would otherwise be
    traversed by the garbage collector during the next phase and inflate its figures several-fold.
    """
    gc.collect()
    return trio.run(fn, *args)


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--actors", type=int, default=10_000, help="idle actors to spawn and cancel")
    parser.add_argument("--messages", type=int, default=200_000, help="messages for the tell phase")
    parser.add_argument("--asks", type=int, default=20_000, help="sequential asks for the latency phase")
    parser.add_argument("--children", type=int, default=1_000, help="dynamic supervisor children")
    parser.add_argument(
        "--mailbox",
        type=int,
        default=Actor.mailbox_size,
        help="mailbox capacity of the tell phase (sender yields when full)",
    )
    args = parser.parse_args()
    for name in ("actors", "messages", "asks", "children", "mailbox"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")

    wall0 = time.perf_counter()
    tell_small = _phase(_tell, args.messages, args.mailbox)
    tell_big = _phase(_tell, args.messages, args.messages)
    ask = _phase(_ask, args.asks, 10.0)
    ask_untimed = _phase(_ask, args.asks, None)
    spawn = _phase(_spawn_cancel, args.actors)
    traced = _phase(_traced_memory, args.actors)
    sup = _phase(_supervisor, args.children)

    emit(
        {
            "benchmark": "kernel",
            "python": platform.python_version(),
            "trio": trio.__version__,
            "tell": {"messages": args.messages, "mailbox": args.mailbox, **tell_small},
            "tell_unbounded_sender": {"messages": args.messages, "mailbox": args.messages, **tell_big},
            "ask": {"asks": args.asks, "timeout_s": 10.0, **ask},
            "ask_no_timeout": {"asks": args.asks, "timeout_s": None, **ask_untimed},
            "actors": {
                "count": args.actors,
                **spawn,
                "tracemalloc_bytes_per_idle_actor": traced,
            },
            "supervisor_children": {"count": args.children, **sup},
            "peak_rss_bytes": peak_rss_bytes(),
            "wall_s": round(time.perf_counter() - wall0, 2),
        }
    )


if __name__ == "__main__":
    sys.exit(main())
