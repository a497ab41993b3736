"""Benchmark ``roost serve --workers N`` (issue 19, "Every core"): one daemon on one SQLite
``$ROOST_HOME``, its front door and N-1 headless worker processes claiming from one task queue.

For each round and each N of ``--workers`` (default 1, 2; the counts alternate within a round):
start ``roost serve --workers N --max-concurrent C`` (scripted engine, each reply ``--deltas``
token deltas), attach ``--clients K`` Unix-socket clients at once, each dispatching its share of
``--tasks`` tasks one after another (waiting for each one's ``queued``), wait for every result,
check that every task's streamed text reached its client complete (deltas may be coalesced: the
text is counted, not the lines).

``--pythonpath A,B`` alternates copies of ``roost`` (each a directory holding ``roost/``; an
empty entry is this checkout) within each round: keys ``<basename>_w{N}_...``.

``--lock-stats`` also runs every daemon process with a measuring ``sitecustomize`` (on
``PYTHONPATH``, so the workers inherit it) that times each SQLite ``BEGIN IMMEDIATE`` and counts
calls, between two ``SIGUSR1`` snapshots around the measured window. ``--profile DIR`` writes a
cProfile of each process's main thread (thread CPU clock) over the same window to
``DIR/<role>-<N>.prof``.

Output (one JSON line on stdout; each round's row is also printed to stderr as it ends):

* ``bench``: ``"workers_procs"``; ``tasks``, ``clients``, ``rounds``, ``deltas``,
  ``max_concurrent``: the sizes (counts); ``poll_s``: the daemon's ``ROOST_TASK_POLL_S``, in
  seconds; ``cores``: ``os.cpu_count()``; ``loadavg_1m`` / ``loadavg_1m_after``: the machine's
  1-minute load average before and after (it may be shared);
* for each N, medians over the rounds: ``w{N}_tasks_per_s`` (tasks, one agent turn each, finished
  per wall second), ``w{N}_cpu_cores`` (CPU time, user + system from ``/proc``, of the front door
  and all its workers over the wall time: the cores the daemon used), ``w{N}_cpu_ms_per_task``
  (that CPU per task, in ms), ``w{N}_bench_cores`` (this script's own cores: its clients parse
  every event; on 2 cores it competes); ``w{N}_text_complete``: every task's text arrived whole
  in every round (a boolean);
* ``w{N}_runs``: one row per round, of ``tasks_per_s``, ``cpu_cores``, ``cpu_ms_per_task``,
  ``bench_cores``, ``text_complete`` (as above, for the round), ``wall_s`` (the round's measured
  window, the clients' first dispatch to the last result, in seconds), ``loadavg_1m``, and
  * ``cpu_split``: per process (``front``, ``worker-0``, ...), its share of the CPU, in cores;
  * ``run_queue_wait``: per process, the seconds its threads were runnable but waited for a CPU
    (``/proc/<pid>/task/*/schedstat``) per wall second: high when the machine is shared;
  * ``tasks_per_process``: tasks each process ran (from the ``ranOn`` of each task's row; a list
    of counts, largest first);
  * ``first_token_ms`` and ``result_ms``: per role that ran the tasks (``front``, ``worker``),
    ``{p50, p90}`` in ms over its tasks (and their ``count``) from a task's ``queued`` to its
    first ``token``, and to its ``result``, on the dispatching client's clock. The queue is one
    FIFO whichever process claims, so the difference between the two roles is how late a
    worker's events reach the client (over the node bus) against the front door's own;
  * with ``--lock-stats``: ``lock_wait_ms``, the waits for the SQLite write lock (a thread's first
    try to the ``BEGIN IMMEDIATE`` that took it): ``count``, ``over_1ms`` (counts), ``p50``,
    ``p90``, ``p99``, ``max`` (ms) and ``total_s`` (their sum, in seconds); ``lock_held``: per
    process, seconds it held the lock per wall second; ``to_thread_calls``: per process, its
    ``trio.to_thread.run_sync`` calls by caller (the six most frequent, counts); ``writes``: per
    process, its store writes by function (the twelve most frequent, counts).

Usage: ``.venv/bin/python benchmarks/bench_workers_procs.py [--tasks 400] [--workers 1,2] [--clients 4]
[--rounds 3] [--deltas 100] [--max-concurrent 4] [--poll-s 0.2] [--pythonpath A,B] [--lock-stats]
[--profile DIR]`` (about 30 s per variant).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from _util import arg_parser, at_least_one, emit, percentile  # noqa: E402

_TCK = os.sysconf("SC_CLK_TCK")

#: The measuring ``sitecustomize`` of ``--lock-stats`` / ``--profile`` (see the module doc).
SITECUSTOMIZE = r"""
import json, os, signal, sqlite3, threading, time

_OUT = os.environ["ROOST_BENCH_DIAG"]
_PROFILE = os.environ.get("ROOST_BENCH_PROFILE") == "1"
_waits, _held, _state, _snap = [], [0.0], threading.local(), [0]
_profiler = []


class _Timed(sqlite3.Connection):
    def execute(self, sql, *args):
        head = sql[:16].upper() if isinstance(sql, str) else ""
        if head.startswith("BEGIN IMMEDIATE"):
            start = time.perf_counter()
            try:
                result = super().execute(sql, *args)
            except sqlite3.OperationalError:
                if getattr(_state, "first", None) is None:
                    _state.first = start  # a wait polled in several tries counts as one
                raise
            now = time.perf_counter()
            first = getattr(_state, "first", None)
            _waits.append(now - (start if first is None else first))
            _state.first, _state.began = None, now
            return result
        if head.startswith(("COMMIT", "ROLLBACK")) and not head.startswith("ROLLBACK TO"):
            try:
                return super().execute(sql, *args)
            finally:
                began = getattr(_state, "began", None)
                if began is not None and not self.in_transaction:
                    _held[0] += time.perf_counter() - began
                    _state.began = None
        return super().execute(sql, *args)


_connect = sqlite3.connect


def _patched(*args, **kwargs):
    kwargs.setdefault("factory", _Timed)
    return _connect(*args, **kwargs)


sqlite3.connect = _patched


def _snapshot(signum, frame):
    _snap[0] += 1
    data = {"pid": os.getpid(), "t": time.perf_counter(), "waits": list(_waits), "held": _held[0],
            "threads": dict(_threads), "writes": dict(_writes)}
    role = "worker-" + os.environ["ROOST_WORKER_INDEX"] if "ROOST_WORKER_INDEX" in os.environ else "front"
    if _PROFILE and _snap[0] == 1:
        import cProfile
        _profiler.append(cProfile.Profile(time.thread_time))
        _profiler[0].enable()
    elif _profiler and _snap[0] == 2:
        _profiler[0].disable()
        _profiler[0].dump_stats(os.path.join(_OUT, f"{role}.prof"))
    with open(os.path.join(_OUT, f"snap-{os.getpid()}-{_snap[0]}.json"), "w") as f:
        json.dump({**data, "role": role}, f)


signal.signal(signal.SIGUSR1, _snapshot)

_threads = {}


def _count_threads():
    import sys
    import trio

    run_sync = trio.to_thread.run_sync

    async def counted(fn, *args, **kwargs):
        caller = sys._getframe(1).f_code
        key = f"{caller.co_qualname} ({os.path.basename(caller.co_filename)})"
        _threads[key] = _threads.get(key, 0) + 1
        return await run_sync(fn, *args, **kwargs)

    trio.to_thread.run_sync = counted


_count_threads()

_writes = {}


def _count_writes():
    from roost.storage._writer import StoreWriter

    def wrap(name):
        original = getattr(StoreWriter, name)
        is_async = name != "submit_nowait"

        def key(fn):
            inner = getattr(fn, "func", fn)  # functools.partial
            return f"{name}:{getattr(inner, '__qualname__', repr(inner))}"

        if is_async:
            async def counted(self, fn, *args, **kwargs):
                _writes[key(fn)] = _writes.get(key(fn), 0) + 1
                return await original(self, fn, *args, **kwargs)
        else:
            def counted(self, fn, *args, **kwargs):
                _writes[key(fn)] = _writes.get(key(fn), 0) + 1
                return original(self, fn, *args, **kwargs)

        setattr(StoreWriter, name, counted)

    for name in ("submit", "submit_urgent", "submit_control", "submit_nowait"):
        wrap(name)


_count_writes()
"""


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def process_cpu(pid: int) -> dict[int, float]:
    """``pid -> user + system CPU seconds`` of ``pid`` and its live child processes (``/proc``)."""
    found: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat(int(entry.name))
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:
            found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / _TCK
    return found


def run_queue_wait(pids: list[int]) -> dict[int, float]:
    """``pid -> seconds`` its live threads waited on a run queue for a CPU (``schedstat``)."""
    found: dict[int, float] = {}
    for pid in pids:
        total = 0
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                total += int((task / "schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue
        found[pid] = total / 1e9
    return found


def self_cpu() -> float:
    times = os.times()
    return times.user + times.system


class LeanClient:
    """One Unix-socket client that keeps only what the benchmark needs: each session's streamed
    text, the ``queued`` answers and the results (no event list to scan: that cost the old
    single-client loop quadratic CPU, inside the measured window)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.texts: dict[str, list[str]] = {}
        self.results: set[str] = set()
        self.queued: list[str] = []
        self.sids: list[str] = []  # the tasks this client dispatched
        #: sessionId -> perf_counter() of its queued, first token and result
        self.started: dict[str, float] = {}
        self.first_token: dict[str, float] = {}
        self.finished: dict[str, float] = {}
        self.hello = trio.Event()
        self._queued = trio.Event()
        self._result = trio.Event()

    async def reader(self) -> None:
        buffer = b""
        while data := await self.stream.receive_some(1 << 16):
            *lines, buffer = (buffer + data).split(b"\n")
            for line in lines:
                if line.strip():
                    self._take(json.loads(line))

    def _take(self, event: dict) -> None:
        kind = event.get("type")
        if kind == "token":
            self.texts.setdefault(event["sessionId"], []).append(event["text"])
            self.first_token.setdefault(event["sessionId"], time.perf_counter())

        elif kind == "queued":
            self.started[event["sessionId"]] = time.perf_counter()
            self.queued.append(event["sessionId"])
            self._queued.set()
        elif kind == "result":
            self.finished.setdefault(event["sessionId"], time.perf_counter())
            self.results.add(event["sessionId"])
            self._result.set()
        elif kind == "hello":
            self.hello.set()

    async def dispatch(self, text: str) -> str:
        count = len(self.queued)
        await self.stream.send_all(json.dumps({"type": "user_input", "text": text}).encode() + b"\n")
        while len(self.queued) == count:
            self._queued = trio.Event()
            await self._queued.wait()
        return self.queued[count]

    async def wait_results(self, sids: list[str]) -> None:
        while not self.results.issuperset(sids):
            self._result = trio.Event()
            await self._result.wait()


async def _wait_workers(daemon: Any, workers: int) -> None:
    """Until ``workers - 1`` workers are alive (a ``status`` request on a client of its own)."""
    async with daemon.unix() as client:
        await client.wait_for("hello")
        while workers > 1:
            mark = len(client.events)
            await client.send({"type": "status"})
            status = await client.wait_for("status", start=mark)
            if len(status["workers"]) == workers - 1 and all(w["alive"] for w in status["workers"]):
                return
            await trio.sleep(0.2)


async def _drive(socket: str, client_no: int, count: int, clients: list[LeanClient]) -> None:
    stream = await trio.open_unix_socket(socket)
    client = LeanClient(stream)
    clients.append(client)
    async with stream, trio.open_nursery() as nursery:
        nursery.start_soon(client.reader)
        await client.hello.wait()
        client.sids = [await client.dispatch(f"bench task {client_no}-{t}") for t in range(count)]
        with trio.fail_after(600):
            await client.wait_results(client.sids)
        nursery.cancel_scope.cancel()


def _signal_all(pids: list[int], diag: Path, n: int) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all((diag / f"snap-{p}-{n}.json").exists() for p in pids):
        time.sleep(0.01)


def _lock_figures(diag: Path, roles: dict[int, str], wall: float) -> dict[str, Any]:
    waits: list[float] = []
    held: dict[str, float] = {}
    threads: dict[str, dict[str, int]] = {}
    writes: dict[str, dict[str, int]] = {}
    for pid, role in roles.items():
        a = json.loads((diag / f"snap-{pid}-1.json").read_text())
        b = json.loads((diag / f"snap-{pid}-2.json").read_text())
        waits += b["waits"][len(a["waits"]) :]
        held[role] = round((b["held"] - a["held"]) / wall, 3)
        calls = {k: n - a["threads"].get(k, 0) for k, n in b["threads"].items()}
        threads[role] = dict(sorted(((k, n) for k, n in calls.items() if n), key=lambda kv: -kv[1])[:6])
        done = {k: n - a["writes"].get(k, 0) for k, n in b["writes"].items()}
        writes[role] = dict(sorted(((k, n) for k, n in done.items() if n), key=lambda kv: -kv[1])[:12])
    ms = sorted(w * 1000 for w in waits)
    return {
        "lock_wait_ms": {
            "count": len(ms),
            "over_1ms": sum(1 for w in ms if w > 1),
            "p50": round(percentile(ms, 50), 3) if ms else None,
            "p90": round(percentile(ms, 90), 3) if ms else None,
            "p99": round(percentile(ms, 99), 3) if ms else None,
            "max": round(ms[-1], 3) if ms else None,
            "total_s": round(sum(ms) / 1000, 3),
        },
        "lock_held": held,
        "to_thread_calls": threads,
        "writes": writes,
    }


async def run(
    tmp: Path, script: Path, workers: int, args: argparse.Namespace, label: str, pythonpath: str
) -> dict[str, Any]:
    from _helpers.serve_client import open_daemon

    home = tmp / f"home-{label}"
    home.mkdir()
    diag = home / "diag"
    diag.mkdir()
    env = {"ROOST_HOME": str(home), "ROOST_TASK_POLL_S": str(args.poll_s)}
    paths = [pythonpath, os.environ.get("PYTHONPATH", "")]
    if args.lock_stats or args.profile:
        (diag / "sitecustomize.py").write_text(SITECUSTOMIZE)
        paths.insert(0, str(diag))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if args.lock_stats or args.profile:
        env["ROOST_BENCH_DIAG"] = str(diag)
        env["ROOST_BENCH_PROFILE"] = "1" if args.profile else "0"
    per_client = [args.tasks // args.clients + (c < args.tasks % args.clients) for c in range(args.clients)]
    clients: list[LeanClient] = []
    with (home / "serve.err").open("wb") as err:
        serve_args = ["--workers", str(workers), "--max-concurrent", str(args.max_concurrent)]
        async with open_daemon(script=script, env=env, stderr=err, args=serve_args) as daemon:
            await _wait_workers(daemon, workers)
            await trio.sleep(1.0)  # the workers' start-up CPU is not the workload's
            front = daemon.process.pid
            before = process_cpu(front)
            pids = sorted(before)
            waited = run_queue_wait(pids)
            if args.lock_stats or args.profile:
                await trio.to_thread.run_sync(_signal_all, pids, diag, 1)
            mine, start = self_cpu(), time.perf_counter()
            async with trio.open_nursery() as nursery:
                for c, count in enumerate(per_client):
                    nursery.start_soon(_drive, daemon.socket, c, count, clients)
            wall = time.perf_counter() - start
            mine = self_cpu() - mine
            after = process_cpu(front)
            waited = {p: w - waited[p] for p, w in run_queue_wait(pids).items()}
            if args.lock_stats or args.profile:
                await trio.to_thread.run_sync(_signal_all, pids, diag, 2)
    cpu = {pid: after.get(pid, 0.0) - before[pid] for pid in before}
    roles = {front: "front"}
    for i, pid in enumerate(p for p in pids if p != front):  # from 0, as roost status numbers them
        roles[pid] = f"worker-{i}"
    ran: dict[str, int] = {}
    ran_by: dict[str, str] = {}  # task id -> "front" or "worker"
    with sqlite3.connect(home / "roost.db") as conn:
        for task_id, payload in conn.execute("SELECT id, payload FROM daemon_tasks"):
            owner = str(json.loads(payload).get("ranOn"))
            ran[owner] = ran.get(owner, 0) + 1
            ran_by[task_id] = "front" if f":{front}:" in owner else "worker"
    # progress events reach every client (wire.md "Routing"): each checks the texts of its own tasks
    complete = sum(len(c.sids) for c in clients) == args.tasks and all(
        "".join(c.texts.get(s, ())) == "tok " * args.deltas for c in clients for s in c.sids
    )
    total = sum(cpu.values())
    figures: dict[str, Any] = {
        "tasks_per_s": round(args.tasks / wall, 2),
        "cpu_cores": round(total / wall, 2),
        "cpu_ms_per_task": round(total * 1000 / args.tasks, 2),
        "cpu_split": {roles[p]: round(s / wall, 2) for p, s in sorted(cpu.items(), key=lambda x: roles[x[0]])},
        "bench_cores": round(mine / wall, 2),
        "run_queue_wait": {roles[p]: round(w / wall, 2) for p, w in sorted(waited.items(), key=lambda x: roles[x[0]])},
        "tasks_per_process": sorted(ran.values(), reverse=True),
        "text_complete": complete,
        "first_token_ms": _latencies(clients, ran_by, "first_token"),
        "result_ms": _latencies(clients, ran_by, "finished"),
        "wall_s": round(wall, 2),
    }
    if args.lock_stats:
        figures.update(_lock_figures(diag, roles, wall))
    if args.profile:
        out = Path(args.profile)
        out.mkdir(parents=True, exist_ok=True)
        for prof in diag.glob("*.prof"):
            prof.replace(out / f"{prof.stem}-{label}.prof")
    return figures


def _latencies(clients: list[LeanClient], ran_by: dict[str, str], field: str) -> dict[str, dict[str, float]]:
    """``{role: {p50, p90, count}}``: ms from each task's ``queued`` to ``field``'s time, on the
    client that dispatched it."""
    by_role: dict[str, list[float]] = {}
    for client in clients:
        for sid, start in client.started.items():
            end = getattr(client, field).get(sid)
            if end is not None and sid in ran_by:
                by_role.setdefault(ran_by[sid], []).append((end - start) * 1000)
    figures: dict[str, dict[str, float]] = {}
    for role, ms in sorted(by_role.items()):
        ms.sort()
        figures[role] = {"p50": round(percentile(ms, 50), 1), "p90": round(percentile(ms, 90), 1), "count": len(ms)}
    return figures


def _median(runs: list[dict], key: str) -> Any:
    return round(statistics.median(r[key] for r in runs), 2)


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--tasks", type=int, default=400, help="tasks per run (default 400)")
    parser.add_argument("--workers", default="1,2", help="comma-separated process counts (default 1,2)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients dispatching (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of every count (default 3)")
    parser.add_argument("--deltas", type=int, default=100, help="token deltas per reply (default 100)")
    parser.add_argument("--max-concurrent", type=int, default=4, help="runners per process (default 4)")
    parser.add_argument(
        "--poll-s", type=float, default=0.2, help="ROOST_TASK_POLL_S of the daemon (default 0.2; Roost's own is 1)"
    )
    parser.add_argument(
        "--pythonpath",
        default="",
        help="comma-separated copies of roost to alternate (a directory holding roost/; empty: this checkout)",
    )
    parser.add_argument("--lock-stats", action="store_true", help="time every process's write-lock waits")
    parser.add_argument("--profile", metavar="DIR", help="cProfile each process's measured window into DIR")
    args = parser.parse_args()
    try:
        counts = [int(n) for n in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers takes comma-separated process counts (e.g. 1,2), not {args.workers!r}")
    at_least_one(
        parser,
        tasks=args.tasks,
        clients=args.clients,
        rounds=args.rounds,
        deltas=args.deltas,
        max_concurrent=args.max_concurrent,
        workers=min(counts),
    )
    out: dict[str, Any] = {
        "bench": "workers_procs",
        "tasks": args.tasks,
        "clients": args.clients,
        "rounds": args.rounds,
        "deltas": args.deltas,
        "max_concurrent": args.max_concurrent,
        "poll_s": args.poll_s,
        "cores": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    variants = args.pythonpath.split(",")
    names = [f"{Path(v).name or v}_" if len(variants) > 1 else "" for v in variants]
    runs: dict[str, list[dict]] = {f"{name}w{n}": [] for name in names for n in counts}
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp_name:
        tmp = Path(tmp_name)
        os.chdir(tmp)  # `python -m roost` of the workers must not find a roost/ in the working directory
        script = tmp / "script.json"
        reply = {"text": "tok " * args.deltas, "deltas": args.deltas}
        script.write_text(
            json.dumps({"rules": [{"match": {"prompt": "^bench"}, "steps": [[reply]]}], "default": "echo"})
        )
        for r in range(args.rounds):
            for name, variant in zip(names, variants, strict=True):
                for n in counts:
                    key = f"{name}w{n}"
                    figures = trio.run(run, tmp, script, n, args, f"{key}-{r}", variant)
                    figures["loadavg_1m"] = round(os.getloadavg()[0], 2)
                    print(json.dumps({"run": key, "round": r, **figures}), file=sys.stderr)
                    runs[key].append(figures)
    for key, rs in runs.items():
        for field in ("tasks_per_s", "cpu_cores", "cpu_ms_per_task", "bench_cores"):
            out[f"{key}_{field}"] = _median(rs, field)
        out[f"{key}_text_complete"] = all(r["text_complete"] for r in rs)
        out[f"{key}_runs"] = rs
    out["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    emit(out)


if __name__ == "__main__":
    main()
