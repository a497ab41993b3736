"""Benchmark a cluster of ``roost serve`` daemons on one PostgreSQL database (issue 13).

For each daemon count of ``--nodes`` (default 1, 2, 3) on a fresh database: start the daemons
(scripted engine, each reply ``--deltas`` token deltas, each daemon its own ROOST_HOME, socket and
port), attach one Unix-socket client to each, dispatch ``--tasks`` tasks round-robin from the
clients (the shared queue runs each once, on whichever node claims it) and wait for every result
at its dispatching client. Then, with the largest count (at least 2), kill (``kill -9``) or stop
(SIGSTOP) the node running a slow task and time its resumption on a surviving node (same host: the
dead owner is recognised at once; another host waits out the lease, ``ROOST_LEASE_TTL``). The
dispatch-to-start latency across nodes: a task dispatched on node A (``--no-claim``: A runs
nothing) until its ``agent_starting`` at a client of idle node B, with the default
``ROOST_TASK_POLL_S`` (1 s); each task is dispatched after a random pause, so the samples cover
every phase of B's poll. Last, one daemon on SQLite runs the same workload.

Output (one JSON line on stdout):

* ``tasks``, ``deltas``: the sizes (counts); ``lease_ttl_s``: the daemons' lease TTL, in seconds;
  ``cores``: the machine's cores; ``load_avg_1m``: its 1-minute load average at the start;
* for each daemon count N of ``--nodes``, on PostgreSQL:
  * ``n{N}_tasks_per_s``: tasks (one agent turn each) finished per wall second,
  * ``n{N}_cpu_ms_per_turn``: CPU time (user + system, from ``/proc``) of all daemons per task, in
    ms, and ``n{N}_cpu_ms_per_turn_per_node``: each node's CPU per task it ran (a list by node, ms),
  * ``n{N}_tasks_per_node``: tasks each node ran (a list of counts, from their logs),
  * ``n{N}_wall_s``: wall time from the first dispatch to the last result, in seconds;
* ``kill9_to_task_resumed_s``, ``sigstop_to_task_resumed_s``: from the signal to the
  ``task_resumed`` event on a surviving node, in seconds;
* ``dispatch_to_start_ms_p50``, ``_p99``, ``_max`` (ms) and ``dispatch_to_start_ms_samples`` (a
  count): the dispatch-to-start latency across nodes (all ``--wake-only`` measures, with the
  first five fields);
* ``sqlite_1_tasks_per_s``, ``sqlite_1_cpu_ms_per_turn``, ``sqlite_1_cpu_ms_per_turn_per_node``,
  ``sqlite_1_tasks_per_node``, ``sqlite_1_wall_s``: the same as ``n1_*`` for one daemon on SQLite;
* ``cross_node_interrupt_ms_p50``/``_p99``: ``null`` (cross-node interrupts are another change,
  branch h/s21-xnode; ``bench_crossnode.py`` measures them).

The machine has few cores: CPU per turn shows scaling honestly, next to the wall figures.

Needs PostgreSQL: ``--database-url`` (a role that may CREATE DATABASE) or
``$ROOST_TEST_DATABASE_URL``, else a throwaway cluster of the Debian ``postgresql`` server
binaries (tests/_helpers/postgres.py).

Usage: ``.venv/bin/python benchmarks/bench_cluster.py [--tasks 60] [--nodes 1,2,3] [--deltas 100]``
(about 1 min).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from _util import arg_parser, emit, percentile  # noqa: E402

TTL = 3.0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def server(url: str | None) -> Any:
    from _helpers.postgres import PgServer, start_cluster

    if url:
        yield PgServer(admin_url=url, startup_seconds=0.0, owned=False)
    else:
        with start_cluster() as pg:
            yield pg


@contextmanager
def database(pg: Any) -> Any:
    from _helpers.postgres import fresh_database

    with fresh_database(pg) as url:
        yield url


async def run_cluster(tmp: Path, script: Path, url: str | None, nodes: int, tasks: int) -> dict[str, Any]:
    """Start ``nodes`` daemons (``url`` None: SQLite, one daemon), run ``tasks``, return figures."""
    from _helpers.serve_client import open_daemon

    env_common = {"ROOST_LEASE_TTL": str(TTL), "ROOST_TASK_POLL_S": "0.2"}
    if url:
        env_common["ROOST_DATABASE_URL"] = url
    async with AsyncExitStack() as stack:
        daemons, logs = [], []
        for i in range(nodes):
            home = tmp / f"home-{i}"
            home.mkdir()
            log = home / "serve.err"
            err = stack.enter_context(log.open("wb"))
            env = {**env_common, "ROOST_HOME": str(home)}
            daemons.append(
                await stack.enter_async_context(
                    open_daemon(script=script, env=env, stderr=err, args=["--max-concurrent", "4"])
                )
            )
            logs.append(log)
        clients = [await stack.enter_async_context(d.unix()) for d in daemons]
        for c in clients:
            await c.wait_for("hello")
        before = [cpu_s(d.process.pid) for d in daemons]
        start = time.perf_counter()
        owner: dict[str, int] = {}
        for t in range(tasks):
            c = clients[t % nodes]
            mark = len(c.events)
            await c.send({"type": "user_input", "text": f"bench task {t}"})
            owner[(await c.wait_for("queued", start=mark))["sessionId"]] = t % nodes
        for sid, i in owner.items():
            await clients[i].wait_for("result", lambda e, s=sid: e["sessionId"] == s, timeout=300)
        wall = time.perf_counter() - start
        cpu = [cpu_s(d.process.pid) - b for d, b in zip(daemons, before, strict=True)]
        ran = [log.read_text(errors="replace").count(" finished: succeeded") for log in logs]
        return {
            "tasks_per_s": round(tasks / wall, 2),
            "cpu_ms_per_turn": round(sum(cpu) * 1000 / tasks, 2),
            "cpu_ms_per_turn_per_node": [round(c * 1000 / r, 2) if r else None for c, r in zip(cpu, ran, strict=True)],
            "tasks_per_node": ran,
            "wall_s": round(wall, 2),
        }


async def wake_latency(tmp: Path, script: Path, url: str, samples: int) -> dict[str, Any]:
    """Milliseconds from dispatch on node A (``--no-claim``) to the task's start on idle node B."""
    from _helpers.serve_client import open_daemon

    rng = random.Random(13)
    async with AsyncExitStack() as stack:
        daemons = []
        for name, extra in (("a", ["--no-claim"]), ("b", [])):
            home = tmp / f"wake-home-{name}"
            home.mkdir()
            env = {"ROOST_LEASE_TTL": str(TTL), "ROOST_DATABASE_URL": url, "ROOST_HOME": str(home)}
            daemons.append(await stack.enter_async_context(open_daemon(script=script, env=env, args=extra)))
        on_a, on_b = [await stack.enter_async_context(d.unix()) for d in daemons]
        await on_a.wait_for("hello")
        await on_b.wait_for("hello")
        times: list[float] = []
        for i in range(samples):
            await trio.sleep(rng.uniform(0.0, 1.0))
            mark_a, mark_b = len(on_a.events), len(on_b.events)
            await on_a.send({"type": "user_input", "text": f"bench wake {i}"})
            sid = (await on_a.wait_for("queued", start=mark_a))["sessionId"]
            queued_at = time.perf_counter()
            await on_b.wait_for("agent_starting", lambda e, s=sid: e.get("sessionId") == s, start=mark_b)
            times.append((time.perf_counter() - queued_at) * 1000)
            await on_a.wait_for("result", lambda e, s=sid: e["sessionId"] == s, start=mark_a, timeout=60)
        ordered = sorted(times)
        return {
            "p50": round(percentile(ordered, 50), 1),
            "p99": round(percentile(ordered, 99), 1),
            "max": round(ordered[-1], 1),
            "samples": samples,
        }


async def resume_time(tmp: Path, script: Path, url: str, nodes: int, how: signal.Signals) -> float:
    """Seconds from ``how`` (SIGKILL or SIGSTOP) of the node running a slow task to the
    ``task_resumed`` event on another node."""
    import psycopg
    from _helpers.serve_client import open_daemon

    async with AsyncExitStack() as stack:
        daemons = []
        for i in range(nodes):
            home = tmp / f"{how.name}-home-{i}"
            home.mkdir()
            env = {
                "ROOST_LEASE_TTL": str(TTL),
                "ROOST_TASK_POLL_S": "0.2",
                "ROOST_DATABASE_URL": url,
                "ROOST_HOME": str(home),
            }
            daemons.append(await stack.enter_async_context(open_daemon(script=script, env=env)))
        clients = {d.process.pid: await stack.enter_async_context(d.unix()) for d in daemons}
        first = next(iter(clients.values()))
        await first.wait_for("hello")
        mark = len(first.events)
        await first.send({"type": "user_input", "text": "slow bench"})
        sid = (await first.wait_for("queued", start=mark))["sessionId"]
        with trio.fail_after(60):
            while True:
                with psycopg.connect(url) as conn:
                    row = conn.execute(
                        "SELECT owner FROM leases WHERE key = %s AND owner IS NOT NULL", (f"task:{sid}",)
                    ).fetchone()
                if row:
                    break
                await trio.sleep(0.05)
        victim = int(row[0].rsplit(":", 2)[1])
        survivors = [c for pid, c in clients.items() if pid != victim]
        start = time.perf_counter()
        os.kill(victim, how)
        try:
            with trio.fail_after(120):
                while not any(c.of_type("task_resumed") for c in survivors):
                    await trio.sleep(0.01)
            return round(time.perf_counter() - start, 3)
        finally:
            if how is signal.SIGSTOP:
                os.kill(victim, signal.SIGCONT)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(n) for n in args.nodes.split(",")]
    figures: dict[str, Any] = {
        "tasks": args.tasks,
        "deltas": args.deltas,
        "lease_ttl_s": TTL,
        "cores": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmpdir:
        tmp = Path(tmpdir)
        script = tmp / "script.json"
        text = "tok " * args.deltas
        script.write_text(
            json.dumps(
                {
                    "rules": [
                        {"match": {"prompt": "^slow"}, "steps": [[{"text": "working", "deltas": 1}, {"delay": 300}]]},
                        {"match": {"prompt": "while you were working on"}, "steps": [[{"text": "resumed"}]]},
                        {"match": {"prompt": "^bench"}, "steps": [[{"text": text, "deltas": args.deltas}]]},
                    ],
                    "default": "echo",
                }
            )
        )
        with server(args.database_url or os.environ.get("ROOST_TEST_DATABASE_URL")) as pg:
            for n in [] if args.wake_only else counts:
                with database(pg) as url:
                    run_dir = tmp / f"n{n}"
                    run_dir.mkdir()
                    for key, value in (await run_cluster(run_dir, script, url, n, args.tasks)).items():
                        figures[f"n{n}_{key}"] = value
            with database(pg) as url:
                for key, value in (await wake_latency(tmp, script, url, args.wake_samples)).items():
                    figures[f"dispatch_to_start_ms_{key}"] = value
            if args.wake_only:
                return figures
            biggest = max(max(counts), 2)
            for how, key in ((signal.SIGKILL, "kill9"), (signal.SIGSTOP, "sigstop")):
                with database(pg) as url:
                    figures[f"{key}_to_task_resumed_s"] = await resume_time(tmp, script, url, biggest, how)
        sqlite_dir = tmp / "sqlite"
        sqlite_dir.mkdir()
        for key, value in (await run_cluster(sqlite_dir, script, None, 1, args.tasks)).items():
            figures[f"sqlite_1_{key}"] = value
    figures["cross_node_interrupt_ms_p50"] = None  # cross-node interrupts: branch h/s21-xnode
    figures["cross_node_interrupt_ms_p99"] = None
    return figures


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = arg_parser(__doc__)
    parser.add_argument("--tasks", type=int, default=60, help="tasks per daemon count (default 60)")
    parser.add_argument("--nodes", default="1,2,3", help="daemon counts to run, comma-separated (default 1,2,3)")
    parser.add_argument("--deltas", type=int, default=100, help="token deltas per scripted reply (default 100)")
    parser.add_argument(
        "--wake-samples", type=int, default=20, help="tasks of the dispatch-to-start measurement (default 20)"
    )
    parser.add_argument(
        "--wake-only", action="store_true", help="measure only the dispatch-to-start latency across nodes"
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="an existing PostgreSQL server (a role that may CREATE DATABASE); default: "
        "$ROOST_TEST_DATABASE_URL, else a throwaway cluster",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    emit(trio.run(main, parse()))
