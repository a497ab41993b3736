"""App-server benchmarks (issue 4): turn overhead, delta throughput and interrupt latency.

Runs the real ``roost app-server`` subprocess (scripted engine, a script written to a temporary
directory, a temporary ``ROOST_HOME``) and talks JSONL to it over stdio with the lean client of
``benchmarks/_appclient.py``. Every reply streams ``--deltas`` (default 100) text deltas with zero
latency, the mock stream of the project's bar. Phases, in order, on one server process (after
``--warmup`` unmeasured turns):

1. ``seq``: one thread, ``--turns`` turns one after another. Latency is ``turn/start`` written to
   ``turn/completed`` read (p50/p99/mean ms, and p50 of the first and last 10 % of the turns, since
   a thread's history grows); server CPU per turn from ``/proc/<pid>/stat`` utime+stime (all
   threads; 10 ms ticks, so averaged over many turns) and for the main (trio) thread alone from
   ``/proc/<pid>/task/<pid>/stat``; turns/s and deltas/s delivered to the client.
2. ``conc``: ``--threads`` threads each run ``--turns-per-thread`` turns back to back, all at once;
   aggregate turns/s and deltas/s, CPU per turn, turn latency under that load.
3. ``interrupt``: a slow thread (``tokens_per_second: 20``) is interrupted ``--interrupts`` times as
   soon as its agent message starts streaming: on an otherwise idle server, then while the
   ``--threads`` other threads stream continuously, ``saturated`` (back-to-back zero-latency
   turns) and ``paced`` (back-to-back turns at ``--bg-tps`` tokens/s each). Latency is
   ``turn/interrupt`` written to the terminal ``turn/completed`` (status ``interrupted``) read;
   the interrupt's own response time is reported as ``..._response_...``.

Server CPU counts the server's whole process tree (its app-server worker processes too, issue 19
"Every core"; ``server_processes_max``); ``--workers N`` sets ``ROOST_APPSERVER_WORKERS`` for the
server (``0``: one process; default: the server's own default), and ``_cpu_utilisation`` is CPU
seconds per wall second (cores) of a phase, ``interrupt_saturated_cpu_utilisation`` over the
saturated interrupt scenario's measuring window.

Server memory: ``VmRSS`` after warm-up and after each phase, ``VmRSS``/``VmHWM`` at the end
(``/proc/<pid>/status``). ``meets_target`` compares the figures with the project's bar (below).

``--profile PATH`` then runs the ``seq`` phase again on a server under cProfile (a CPU-clock profile
of the main thread by default, so idle waits cost nothing; ``--profile-clock wall`` uses
``python -m cProfile -o PATH -m roost app-server``), subtracts a baseline run without the measured
turns (start-up, warm-up, shutdown), and adds the top functions by own time in µs per turn. The
profiler inflates small functions (about 4x in total); SQLite commits run in worker threads, which
cProfile does not see. ``--pythonpath DIR`` runs the server from a candidate copy of the ``roost``
package (``DIR/roost``) to measure a proposed change against the checkout.

Output (one JSON line on stdout; units in the key names: ``_ms`` milliseconds, ``_s`` seconds,
``_bytes`` bytes, ``_mib`` MiB, ``_per_s`` per second of wall time, ``_cpu_utilisation`` CPU
seconds per wall second, i.e. cores; ``p50``/``p99`` percentiles):

* the run: ``deltas_per_reply`` (a count), ``cpus`` (the machine's cores), ``workers`` (the
  ``--workers`` given, or ``"default"``), ``load_average_start`` / ``load_average_end`` (1, 5 and
  15-minute load averages), ``server_processes_max`` (most server processes seen at once),
  ``wall_s`` (the whole benchmark, in seconds);
* memory: ``rss_after_warmup_bytes``, ``rss_after_seq_bytes``, ``rss_after_conc_bytes``,
  ``rss_after_saturated_bytes``, ``rss_end_bytes`` (VmRSS), ``rss_peak_bytes`` (VmHWM), and
  ``rss_end_mib`` / ``rss_peak_mib``;
* ``seq``: ``seq_turns`` (a count); ``seq_turn_p50_ms``, ``seq_turn_p99_ms``, ``seq_turn_mean_ms``,
  ``seq_turn_first10pct_p50_ms``, ``seq_turn_last10pct_p50_ms`` (turn latency);
  ``seq_cpu_ms_per_turn`` (server process tree), ``seq_main_thread_cpu_ms_per_turn`` (its trio
  thread), ``seq_cpu_ms_per_turn_first10pct`` / ``_last10pct``; ``seq_turns_per_s``,
  ``seq_deltas_per_s``; ``seq_delta_lines_received``, ``seq_text_chars_received`` (counts),
  ``seq_text_complete`` (true when every turn's text arrived whole); ``seq_cpu_utilisation``;
* ``conc``: ``conc_threads``, ``conc_turns`` (counts), ``conc_turns_per_s``, ``conc_deltas_per_s``,
  ``conc_delta_lines_received``, ``conc_text_chars_received``, ``conc_text_complete``,
  ``conc_turn_p50_ms`` / ``_p99_ms``, ``conc_cpu_ms_per_turn``, ``conc_main_thread_cpu_ms_per_turn``,
  ``conc_cpu_utilisation``;
* ``interrupt``, for each scenario ``<s>`` of ``idle``, ``saturated`` and ``paced``:
  ``interrupt_<s>_p50_ms`` / ``_p99_ms`` (request to the terminal ``turn/completed``),
  ``interrupt_<s>_response_p50_ms`` / ``_p99_ms`` (to the interrupt's response),
  ``interrupt_<s>_first_delta_p50_ms`` / ``_p99_ms`` (the interrupted turn's ``turn/start`` to its
  first delta), ``interrupt_<s>_server_cpu_p50_ms`` / ``_p99_ms`` (the trio thread's CPU from the
  request to the terminal); for ``saturated`` and ``paced`` also ``interrupt_<s>_cpu_utilisation``,
  ``interrupt_<s>_bg_turns_per_s`` (background turns completed) and
  ``interrupt_<s>_bg_deltas_per_s``; ``interrupt_saturated_bg_turns`` (a count);
  ``interrupt_paced_bg_tokens_per_s_each`` (``--bg-tps``);
* with ``--trace-hops``: ``interrupt_<s>_hop_<hop>_p50_ms`` / ``_p99_ms``, each hop
  (``interrupt_read``, ``turn_cancelled``, ``turn_unwound``, ``settle_begin``, ``settle_end``,
  ``terminal_emitted``) in ms after the client wrote ``turn/interrupt``;
* with ``--profile``: ``profile_seq_turn_p50_ms``, ``profile_seq_cpu_ms_per_turn`` (the profiled
  run) and ``profile_top_own_time``: a list of ``{function, own_us_per_turn, cum_us_per_turn,
  calls_per_turn}`` (µs and calls per turn), its first row the profiled total;
* ``meets_target``: for each figure the bar bounds (``seq_cpu_ms_per_turn``, ``conc_cpu_ms_per_turn``,
  ``interrupt_idle_p50_ms``, ``interrupt_saturated_p50_ms``, ``interrupt_paced_p50_ms``,
  ``rss_peak_mib``), whether it is under the bar (a boolean).

Run: ``.venv/bin/python benchmarks/bench_appserver.py [--turns 300] [--threads 100]
[--turns-per-thread 10] [--interrupts 30] [--deltas 100] [--bg-tps 50] [--phases conc,interrupt]
[--profile out.prof]`` (about 40 s on an idle 2-core machine, plus about 20 s with ``--profile``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _appclient import AppClient, open_app_client  # noqa: E402
from _util import arg_parser, emit, percentile  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")
_MIB = 1024 * 1024
PROTOCOL = "wuu-app-server/v0.1"
#: The project's bar (issue 4): < 10 ms server CPU per turn, interrupts < 5 ms p50, < 80 MiB RSS.
#: (OpenAI Codex app-server, same 100-delta mock stream: ~55 ms CPU/turn, ~49 ms per sequential
#: turn, ~8 ms interrupt p50, 208 MiB RSS.)
TARGET_CPU_MS = 10.0
TARGET_INTERRUPT_MS = 5.0
TARGET_RSS_MIB = 80.0


# -- the server's /proc figures ---------------------------------------------------------------------


def proc_cpu_s(pid: int, tid: int | None = None) -> float:
    """CPU seconds (utime + stime) of process ``pid`` (all its threads), or of its task ``tid``."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path, "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / _TICK


def main_thread_cpu_ns(pid: int) -> int:
    """Nanoseconds the main (trio) thread of ``pid`` has run on a CPU (``/proc/.../schedstat``):
    a clock that stops while the machine's other load keeps the server off the CPU."""
    with open(f"/proc/{pid}/task/{pid}/schedstat", "rb") as f:
        return int(f.read().split()[0])


def proc_memory(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def children(pid: int) -> list[int]:
    """The live descendants of ``pid`` (a scan of ``/proc``)."""
    parent: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parent.setdefault(ppid, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in parent.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


#: The most processes the server's tree had at a CPU reading (itself and its worker processes).
PROCESSES_MAX = 1


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants (the app-server's worker processes)."""
    global PROCESSES_MAX
    total = proc_cpu_s(pid)
    kids = children(pid)
    PROCESSES_MAX = max(PROCESSES_MAX, 1 + len(kids))
    for child in kids:
        with contextlib.suppress(OSError, IndexError, ValueError):  # a child that exited meanwhile
            total += proc_cpu_s(child)
    return total


class CpuMeter:
    """Server CPU between :meth:`start` and :meth:`stop`: its process tree, and the front
    process's main thread."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.total = self.main = 0.0

    def start(self) -> None:
        self._t0, self._m0 = tree_cpu_s(self.pid), proc_cpu_s(self.pid, self.pid)

    def stop(self) -> None:
        self.total = tree_cpu_s(self.pid) - self._t0
        self.main = proc_cpu_s(self.pid, self.pid) - self._m0


# -- the script -------------------------------------------------------------------------------------

#: Every completed reply's text: each turn checks it received exactly this (issue 19: count what a
#: user receives, not lines).
REPLY_TEXT = "Roost streams this reply one small delta at a time to measure turn overhead. "


def expected_text(deltas: int) -> str:
    """The text a completed reply of ``deltas`` deltas carries (the scripted engine repeats a
    text shorter than its delta count: :func:`roost.engines.split_deltas`)."""
    from roost.engines import split_deltas

    return "".join(split_deltas(REPLY_TEXT, deltas))


def write_script(path: Path, *, deltas: int, bg_tps: float) -> None:
    """The scripted engine's replies: ``slow`` is paced (interrupt target), ``paced`` streams at
    ``bg_tps`` tokens/s, everything else streams ``deltas`` deltas with zero latency."""
    text = REPLY_TEXT
    path.write_text(
        "rules:\n"
        '  - match: {prompt: "^slow"}\n'
        "    steps:\n"
        f'      - - {{text: "{text}", deltas: 10000, tokens_per_second: 20}}\n'
        '  - match: {prompt: "^paced"}\n'
        "    steps:\n"
        f'      - - {{text: "{text}", deltas: {deltas}, tokens_per_second: {bg_tps}}}\n'
        "default:\n"
        f'  - - {{text: "{text}", deltas: {deltas}}}\n'
    )


#: Runs ``roost app-server`` under a cProfile whose timer is the main thread's CPU clock, so idle
#: waits (epoll, worker threads) cost nothing; the stats are written when the server exits.
_CPU_PROFILER = (
    "import cProfile, runpy, sys, time\n"
    "out = sys.argv[1]\n"
    "sys.argv = ['roost', 'app-server']\n"
    "profiler = cProfile.Profile(time.thread_time)\n"
    "profiler.enable()\n"
    "try:\n"
    "    runpy.run_module('roost', run_name='__main__', alter_sys=True)\n"
    "finally:\n"
    "    profiler.disable()\n"
    "    profiler.dump_stats(out)\n"
)


def server_argv(profile: Path | None, clock: str = "wall", *, module: bool = False) -> list[str]:
    """The server's command line: the ``roost`` script, or ``python -m roost`` (``module``), or
    under cProfile with the wall clock (``python -m cProfile``) or the main thread's CPU clock."""
    python = sys.executable
    if profile is not None and clock == "wall":
        return [python, "-m", "cProfile", "-o", str(profile), "-m", "roost", "app-server"]
    if profile is not None:
        return [python, "-c", _CPU_PROFILER, str(profile)]
    exe = Path(python).with_name("roost")
    return [str(exe), "app-server"] if exe.exists() and not module else [python, "-m", "roost", "app-server"]


def ms(values: list[float], p: float) -> float:
    return round(percentile(values, p) * 1000, 3)


def log(msg: str) -> None:
    print(f"bench_appserver: {msg}", file=sys.stderr, flush=True)


# -- phases -----------------------------------------------------------------------------------------


async def new_thread(client: AppClient, cwd: str) -> str:
    return (await client.request("thread/start", {"cwd": cwd}))["thread"]["id"]


#: Set by main: what each completed turn must deliver (:func:`expected_text`).
EXPECTED = REPLY_TEXT


async def run_turn(client: AppClient, thread_id: str, prompt: str) -> float:
    """One turn; returns its latency in seconds (request written -> terminal notification read).

    Raises:
        RuntimeError: the turn did not complete, or its text arrived incomplete or altered.
    """
    sent, turn = await client.start_turn(thread_id, prompt)
    params, arrived = await client.wait_terminal(turn["id"])
    status = params["turn"]["status"]
    if status != "completed":
        raise RuntimeError(f"turn {turn['id']} ended {status}: {params['turn'].get('error')}")
    text, _ = client.take_text(turn["id"])
    if text != EXPECTED:
        raise RuntimeError(
            f"turn {turn['id']}: received {len(text)} characters of text, not the "
            f"{len(EXPECTED)} of the reply: {text[:80]!r}"
        )
    return arrived - sent


async def sequential(client: AppClient, cwd: str, turns: int, deltas: int) -> dict[str, Any]:
    thread_id = await new_thread(client, cwd)
    meter = CpuMeter(client.process.pid)
    latencies: list[float] = []
    cpu: list[float] = []  # server CPU seconds of each turn (all threads)
    pid = client.process.pid
    d0, c0 = client.deltas, client.text_chars
    meter.start()
    t0 = time.perf_counter()
    before = proc_cpu_s(pid)
    for n in range(turns):
        latencies.append(await run_turn(client, thread_id, f"sequential turn {n}"))
        after = proc_cpu_s(pid)
        cpu.append(after - before)
        before = after
    elapsed = time.perf_counter() - t0
    meter.stop()
    received = _check_deltas("sequential", client.deltas - d0, turns, deltas)
    tenth = max(1, turns // 10)
    return {
        "seq_turns": turns,
        "seq_turn_p50_ms": ms(latencies, 50),
        "seq_turn_p99_ms": ms(latencies, 99),
        "seq_turn_mean_ms": round(sum(latencies) / turns * 1000, 3),
        "seq_turn_first10pct_p50_ms": ms(latencies[:tenth], 50),
        "seq_turn_last10pct_p50_ms": ms(latencies[-tenth:], 50),
        "seq_cpu_ms_per_turn_first10pct": round(sum(cpu[:tenth]) / tenth * 1000, 3),
        "seq_cpu_ms_per_turn_last10pct": round(sum(cpu[-tenth:]) / tenth * 1000, 3),
        "seq_turns_per_s": round(turns / elapsed, 1),
        "seq_deltas_per_s": round(turns * deltas / elapsed),
        "seq_delta_lines_received": received,
        "seq_text_chars_received": client.text_chars - c0,
        "seq_text_complete": client.text_chars - c0 == turns * len(EXPECTED),
        "seq_cpu_ms_per_turn": round(meter.total / turns * 1000, 3),
        "seq_main_thread_cpu_ms_per_turn": round(meter.main / turns * 1000, 3),
        "seq_cpu_utilisation": round(meter.total / elapsed, 3),
    }


def _check_deltas(phase: str, received: int, turns: int, deltas: int) -> int:
    """Check the delta lines a phase received: each turn's ``deltas`` deltas arrive as that many
    lines, or fewer when the server coalesced a backlog (DESIGN.md section 4), never more and never
    none. Returns ``received``.

    Raises:
        RuntimeError: the count is impossible.
    """
    if not turns <= received <= turns * deltas:
        raise RuntimeError(f"{phase}: expected {turns}..{turns * deltas} delta lines, received {received}")
    return received


async def concurrent(client: AppClient, thread_ids: list[str], per_thread: int, deltas: int) -> dict[str, Any]:
    meter = CpuMeter(client.process.pid)
    latencies: list[float] = []
    d0, c0 = client.deltas, client.text_chars

    async def worker(thread_id: str) -> None:
        for n in range(per_thread):
            latencies.append(await run_turn(client, thread_id, f"concurrent turn {n}"))

    meter.start()
    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for thread_id in thread_ids:
            nursery.start_soon(worker, thread_id)
    elapsed = time.perf_counter() - t0
    meter.stop()
    turns = len(thread_ids) * per_thread
    received = _check_deltas("concurrent", client.deltas - d0, turns, deltas)
    return {
        "conc_threads": len(thread_ids),
        "conc_turns": turns,
        "conc_turns_per_s": round(turns / elapsed, 1),
        "conc_deltas_per_s": round(turns * deltas / elapsed),
        "conc_delta_lines_received": received,
        "conc_text_chars_received": client.text_chars - c0,
        "conc_text_complete": client.text_chars - c0 == turns * len(EXPECTED),
        "conc_turn_p50_ms": ms(latencies, 50),
        "conc_turn_p99_ms": ms(latencies, 99),
        "conc_cpu_ms_per_turn": round(meter.total / turns * 1000, 3),
        "conc_main_thread_cpu_ms_per_turn": round(meter.main / turns * 1000, 3),
        "conc_cpu_utilisation": round(meter.total / elapsed, 3),
    }


async def interrupts(client: AppClient, thread_id: str, count: int) -> dict[str, list[Any]]:
    """Interrupt ``count`` slow turns of ``thread_id`` once each is streaming.

    Each turn is interrupted once its first text delta has arrived.

    Returns:
        ``{"terminal": [...], "response": [...], "first_delta": [...], "terminal_cpu": [...],
        "sent": [(turn id, perf_counter seconds), ...]}``:
        interrupt written -> terminal notification read, -> its response read, ``turn/start``
        written -> the turn's first delta read, all wall seconds; and the seconds the server's
        main thread ran on a CPU between the interrupt and the terminal notification (load on
        the machine does not inflate it).
    """
    out: dict[str, list[Any]] = {"terminal": [], "response": [], "first_delta": [], "terminal_cpu": [], "sent": []}
    pid = client.process.pid
    for n in range(count):
        started, turn = await client.start_turn(thread_id, f"slow turn {n}")
        await client.wait_first_delta(turn["id"])
        cpu0 = main_thread_cpu_ns(pid)
        sent, result, answered = await client.request_timed(
            "turn/interrupt", {"thread_id": thread_id, "turn_id": turn["id"]}
        )
        params, arrived = await client.wait_terminal(turn["id"])
        cpu1 = main_thread_cpu_ns(pid)
        if params["turn"]["status"] != "interrupted" or not result.get("interrupted"):
            raise RuntimeError(f"interrupt: turn {turn['id']} ended {params['turn']['status']}, reply {result}")
        _, first = client.take_text(turn["id"])
        out["terminal"].append(arrived - sent)
        out["response"].append(answered - sent)
        out["first_delta"].append(first - started)
        out["terminal_cpu"].append((cpu1 - cpu0) / 1e9)
        out["sent"].append((turn["id"], sent))
    return out


async def interrupts_under_load(
    client: AppClient, slow_thread: str, bg_threads: list[str], count: int, prompt: str, deltas: int
) -> tuple[dict[str, list[Any]], int, float]:
    """:func:`interrupts` while every thread of ``bg_threads`` runs ``prompt`` turns back to back.

    Returns:
        The latencies, the background turns completed, and the background deltas/s streamed:
        the larger of turns completed while measuring times ``deltas`` (the server coalesces
        deltas for a client that runs behind, so lines undercount them) and delta lines received
        (whole turns undercount slow, paced turns).
    """
    stop = trio.Event()
    warmed = trio.Event()
    done = 0
    first = 0

    async def background(thread_id: str) -> None:
        nonlocal done, first
        await run_turn(client, thread_id, prompt)
        first += 1
        if first == len(bg_threads):
            warmed.set()
        while not stop.is_set():
            await run_turn(client, thread_id, prompt)
            done += 1

    async with trio.open_nursery() as nursery:
        for thread_id in bg_threads:
            nursery.start_soon(background, thread_id)
        # Measure once every background thread has completed a turn (all are in their loop).
        with trio.fail_after(120):
            await warmed.wait()
        t0 = time.perf_counter()
        cpu0 = tree_cpu_s(client.process.pid)
        done0, lines0 = done, client.deltas
        result = await interrupts(client, slow_thread, count)
        elapsed = time.perf_counter() - t0
        result["cpu_utilisation"] = [(tree_cpu_s(client.process.pid) - cpu0) / elapsed]
        result["bg_turns_per_s"] = [(done - done0) / elapsed]
        # Whole turns undercount slow (paced) turns, lines undercount coalesced ones: take the larger.
        rate = max((done - done0) * deltas, client.deltas - lines0) / elapsed
        stop.set()
    return result, done, rate


def hop_breakdown(prefix: str, trace: Path, result: dict[str, list[Any]]) -> dict[str, float]:
    """Each hop of ``roost/_trace.py`` (``ROOST_TRACE_HOPS``) as ms after the client wrote
    ``turn/interrupt``, p50 and p99 over the interrupts of ``result`` (``--trace-hops``). The
    server's ``time.monotonic()`` and this client's ``time.perf_counter()`` are both
    ``CLOCK_MONOTONIC`` on Linux."""
    seen: dict[tuple[str, str], float] = {}
    for line in trace.read_text().splitlines() if trace.exists() else ():
        rec = json.loads(line)
        seen.setdefault((rec["turn"], rec["hop"]), rec["t"])
    hops: dict[str, list[float]] = {}
    for turn_id, sent in result["sent"]:
        for (turn, name), t in seen.items():
            if turn == turn_id:
                hops.setdefault(name, []).append(t - sent)
    out: dict[str, float] = {}
    for name, offsets in sorted(hops.items(), key=lambda kv: sorted(kv[1])[len(kv[1]) // 2]):
        out[f"{prefix}_hop_{name}_p50_ms"] = ms(offsets, 50)
        out[f"{prefix}_hop_{name}_p99_ms"] = ms(offsets, 99)
    return out


def summarise(prefix: str, result: dict[str, list[Any]]) -> dict[str, float]:
    return {
        f"{prefix}_p50_ms": ms(result["terminal"], 50),
        f"{prefix}_p99_ms": ms(result["terminal"], 99),
        f"{prefix}_response_p50_ms": ms(result["response"], 50),
        f"{prefix}_response_p99_ms": ms(result["response"], 99),
        f"{prefix}_first_delta_p50_ms": ms(result["first_delta"], 50),
        f"{prefix}_first_delta_p99_ms": ms(result["first_delta"], 99),
        f"{prefix}_server_cpu_p50_ms": ms(result["terminal_cpu"], 50),
        f"{prefix}_server_cpu_p99_ms": ms(result["terminal_cpu"], 99),
        **{
            f"{prefix}_{key}": round(result[key][0], 3)
            for key in ("cpu_utilisation", "bg_turns_per_s")
            if key in result
        },
    }


# -- profiling --------------------------------------------------------------------------------------


def top_costs(profile: Path, baseline: Path, turns: int, limit: int = 25) -> list[dict[str, Any]]:
    """The ``limit`` functions with the most own time per turn, from two cProfile runs.

    ``baseline`` is a run without the measured turns (start-up, warm-up, shutdown); subtracting it
    leaves the cost of ``turns`` sequential turns only. Figures are µs per turn.
    """
    import pstats

    base = pstats.Stats(str(baseline)).stats  # type: ignore[attr-defined]
    rows = []
    for key, (_, ncalls, tottime, cumtime, _) in pstats.Stats(str(profile)).stats.items():  # type: ignore[attr-defined]
        b = base.get(key, (0, 0, 0.0, 0.0, None))
        filename, line, name = key
        rows.append((tottime - b[2], cumtime - b[3], ncalls - b[1], f"{_short(filename)}:{line}({name})"))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    out = [
        {
            "function": where,
            "own_us_per_turn": round(tot / turns * 1e6, 1),
            "cum_us_per_turn": round(cum / turns * 1e6, 1),
            "calls_per_turn": round(n / turns, 2),
        }
        for tot, cum, n, where in rows[:limit]
    ]
    out.insert(0, {"function": "TOTAL (main thread, profiled)", "own_us_per_turn": round(total / turns * 1e6, 1)})
    return out


def _short(filename: str) -> str:
    for marker in ("/roost/", "/site-packages/", "/lib/python3"):
        if marker in filename:
            return filename[filename.index(marker) + 1 :]
    return filename


# -- main -------------------------------------------------------------------------------------------


async def run_server(
    args: argparse.Namespace, tmp: Path, *, profile: Path | None = None, label: str = "main"
) -> dict[str, Any]:
    """Run the phases on one server; with ``profile``, only warm-up and ``--turns`` sequential turns
    (none when ``label`` is ``"baseline"``) under cProfile."""
    home = tmp / f"home-{label}"
    home.mkdir()
    script = tmp / "bench.yaml"
    env = dict(os.environ, ROOST_HOME=str(home), ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script))
    if args.workers is not None:
        env["ROOST_APPSERVER_WORKERS"] = str(args.workers)
    trace = tmp / f"hops-{label}.jsonl"
    if args.trace_hops:
        env["ROOST_TRACE_HOPS"] = str(trace)
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([args.pythonpath, *filter(None, [env.get("PYTHONPATH")])])
    workdir = str(tmp)
    figures: dict[str, Any] = {}
    stderr_log = open(tmp / f"server-{label}.log", "wb")  # noqa: SIM115 - closed in the finally below
    try:
        argv = server_argv(profile, args.profile_clock, module=bool(args.pythonpath))
        async with open_app_client(argv, env=env, cwd=workdir, stderr=stderr_log) as client:
            pid = client.process.pid
            await client.request("initialize", {"protocol_version": PROTOCOL, "client": {"name": "bench"}})
            # Warm-up: imports, caches, the SQLite page cache (not measured).
            warm = await new_thread(client, workdir)
            for n in range(args.warmup):
                await run_turn(client, warm, f"warm-up {n}")
            mem = proc_memory(pid)
            figures["rss_after_warmup_bytes"] = mem["VmRSS"]
            if label == "baseline":
                return figures
            log(f"sequential: {args.turns} turns ({label})")
            figures.update(await sequential(client, workdir, args.turns, args.deltas))
            if profile is not None:
                return figures
            figures["rss_after_seq_bytes"] = proc_memory(pid)["VmRSS"]
            threads = [await new_thread(client, workdir) for _ in range(args.threads)]
            if "conc" in args.phases:
                log(f"concurrent: {args.threads} threads x {args.turns_per_thread} turns")
                figures.update(await concurrent(client, threads, args.turns_per_thread, args.deltas))
                figures["rss_after_conc_bytes"] = proc_memory(pid)["VmRSS"]
            if "interrupt" in args.phases:
                slow = await new_thread(client, workdir)
                log(f"interrupt: {args.interrupts} idle")
                result = await interrupts(client, slow, args.interrupts)
                figures.update(summarise("interrupt_idle", result))
                if args.trace_hops:
                    figures.update(hop_breakdown("interrupt_idle", trace, result))
                log(f"interrupt: {args.interrupts} with {args.threads} threads streaming back to back")
                result, done, rate = await interrupts_under_load(
                    client, slow, threads, args.interrupts, "load", args.deltas
                )
                figures.update(summarise("interrupt_saturated", result))
                if args.trace_hops:
                    figures.update(hop_breakdown("interrupt_saturated", trace, result))
                figures["interrupt_saturated_bg_turns"] = done
                figures["interrupt_saturated_bg_deltas_per_s"] = round(rate)
                figures["rss_after_saturated_bytes"] = proc_memory(pid)["VmRSS"]
                log(f"interrupt: {args.interrupts} with {args.threads} threads streaming at {args.bg_tps} tokens/s")
                result, done, rate = await interrupts_under_load(
                    client, slow, threads, args.interrupts, "paced", args.deltas
                )
                figures.update(summarise("interrupt_paced", result))
                if args.trace_hops:
                    figures.update(hop_breakdown("interrupt_paced", trace, result))
                figures["interrupt_paced_bg_tokens_per_s_each"] = args.bg_tps
                figures["interrupt_paced_bg_deltas_per_s"] = round(rate)
            mem = proc_memory(pid)
            figures["rss_end_bytes"] = mem["VmRSS"]
            figures["rss_peak_bytes"] = mem["VmHWM"]
            figures["rss_end_mib"] = round(mem["VmRSS"] / _MIB, 1)
            figures["rss_peak_mib"] = round(mem["VmHWM"] / _MIB, 1)
    except BaseException:
        stderr_log.close()
        tail = (tmp / f"server-{label}.log").read_bytes()[-4000:].decode(errors="replace")
        log(f"the server's stderr ended with:\n{tail}")
        raise
    finally:
        stderr_log.close()
    return figures


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    global EXPECTED
    EXPECTED = expected_text(args.deltas)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="roost-bench-") as raw:
        tmp = Path(raw)
        write_script(tmp / "bench.yaml", deltas=args.deltas, bg_tps=args.bg_tps)
        figures: dict[str, Any] = {
            "deltas_per_reply": args.deltas,
            "cpus": os.cpu_count(),
            "workers": "default" if args.workers is None else args.workers,
            "load_average_start": [round(x, 2) for x in os.getloadavg()],
        }
        figures.update(await run_server(args, tmp))
        figures["server_processes_max"] = PROCESSES_MAX
        figures["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
        if args.profile:
            log(f"profile: {args.turns} sequential turns under cProfile -> {args.profile}")
            prof = Path(args.profile).resolve()
            prof.parent.mkdir(parents=True, exist_ok=True)
            baseline = prof.with_name(prof.name + ".baseline")
            await run_server(args, tmp, profile=baseline, label="baseline")
            profiled = await run_server(args, tmp, profile=prof, label="profile")
            figures["profile_seq_turn_p50_ms"] = profiled["seq_turn_p50_ms"]
            figures["profile_seq_cpu_ms_per_turn"] = profiled["seq_cpu_ms_per_turn"]
            figures["profile_top_own_time"] = top_costs(prof, baseline, args.turns)
    checks = {
        "seq_cpu_ms_per_turn": TARGET_CPU_MS,
        "conc_cpu_ms_per_turn": TARGET_CPU_MS,
        "interrupt_idle_p50_ms": TARGET_INTERRUPT_MS,
        "interrupt_saturated_p50_ms": TARGET_INTERRUPT_MS,
        "interrupt_paced_p50_ms": TARGET_INTERRUPT_MS,
        "rss_peak_mib": TARGET_RSS_MIB,
    }
    figures["meets_target"] = {key: figures[key] < limit for key, limit in checks.items() if key in figures}
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--turns", type=int, default=300, help="sequential turns on one thread")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured warm-up turns")
    parser.add_argument("--threads", type=int, default=100, help="concurrent threads (and background threads)")
    parser.add_argument("--turns-per-thread", type=int, default=10, help="turns per concurrent thread")
    parser.add_argument("--interrupts", type=int, default=30, help="interrupts per interrupt scenario")
    parser.add_argument("--deltas", type=int, default=100, help="text deltas per reply")
    parser.add_argument(
        "--bg-tps", type=float, default=50.0, help="tokens/s of each background thread in the paced interrupt scenario"
    )
    parser.add_argument(
        "--profile", metavar="PATH", default=None, help="also profile the sequential phase with cProfile into PATH"
    )
    parser.add_argument(
        "--profile-clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="cProfile timer: the main thread's CPU time (default; idle waits cost "
        "nothing) or wall time (python -m cProfile; idle waits show as epoll.poll)",
    )
    parser.add_argument(
        "--pythonpath",
        metavar="DIR",
        default=None,
        help="run the server as python -m roost with DIR first on PYTHONPATH "
        "(measure a candidate copy of the roost package)",
    )
    parser.add_argument(
        "--phases",
        default="conc,interrupt",
        help="phases after the sequential one, comma-separated: conc, interrupt "
        "(default both; empty for the sequential phase only)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="ROOST_APPSERVER_WORKERS for the server (0: one process; default: its default)",
    )
    parser.add_argument(
        "--trace-hops",
        action="store_true",
        help="run the server with ROOST_TRACE_HOPS and report each hop of the interrupts "
        "(interrupt_<scenario>_hop_<hop>_p50_ms/_p99_ms: ms after the client wrote turn/interrupt)",
    )
    args = parser.parse_args(argv)
    args.phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    emit(trio.run(main_async, args))


if __name__ == "__main__":
    main()
