"""Cross-node interrupt latency (issue 13, "Cross-node work"): a client on node A interrupts a turn
that node B runs, and waits for ``turn/completed`` (interrupted) on A.

Output (one JSON line on stdout; each ``_p50_ms`` / ``_p99_ms`` pair, in ms, comes with a
``_samples`` count):

* ``load_avg_1m``: the machine's 1-minute load average at the start;
* ``sqlite_interrupt_p50_ms`` / ``_p99_ms``: two real ``roost app-server`` processes on one SQLite
  store (one ROOST_HOME). B streams a slow reply; A's client sends ``turn/interrupt``; latency is
  request written on A to ``turn/completed`` read on A (relayed from B). The bus polls (adaptive
  50-200 ms), so two hops of polling are inside this figure.
* ``postgres_interrupt_p50_ms`` / ``_p99_ms``: the same with both app-servers on one PostgreSQL
  database (``ROOST_DATABASE_URL``), woken by ``LISTEN/NOTIFY``; ``postgres_interrupt_error`` says
  why when the app-server cannot run on PostgreSQL in this build.
* ``{sqlite,postgres}_bus_rtt_p50_ms`` / ``_p99_ms``: the bus alone, two NodeBus nodes on separate
  store objects in this process: a request from A answered by B's handler. ``postgres_poll_only_*``:
  the same with notifications missed on purpose (the polling fallback).

PostgreSQL: ``--pg-url`` (a database this script may write), else ``$ROOST_TEST_DATABASE_URL``,
else a throwaway cluster through ``tests/_helpers/postgres.py``. Run:
``.venv/bin/python benchmarks/bench_crossnode.py [--interrupts 30] [--requests 50] [--pg-url URL]``
(about 1 min).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from _appclient import open_app_client  # noqa: E402
from _util import arg_parser, emit, percentile  # noqa: E402

SCRIPT = (
    "rules:\n"
    '  - match: {prompt: "^slow"}\n'
    "    steps:\n"
    '      - - {text: "' + "word " * 400 + '", deltas: 400, tokens_per_second: 20}\n'
    "default: echo\n"
)


def _server_argv() -> list[str]:
    exe = Path(sys.executable).with_name("roost")
    return [str(exe), "app-server"] if exe.exists() else [sys.executable, "-m", "roost", "app-server"]


async def appserver_interrupts(env: dict[str, str], workdir: str, count: int) -> list[float]:
    """Interrupt ``count`` turns of B from A; the latencies in ms (A's request to A's turn/completed)."""
    argv = _server_argv()
    latencies: list[float] = []
    async with open_app_client(argv, env=env, cwd=workdir) as a, open_app_client(argv, env=env, cwd=workdir) as b:
        init = {"protocol_version": "wuu-app-server/v0.1"}
        await a.request("initialize", init)
        await b.request("initialize", init)
        tid = (await b.request("thread/start", {"cwd": workdir}))["thread"]["id"]
        await a.request("thread/resume", {"session_id": tid})
        for _ in range(count):
            _, turn = await b.start_turn(tid, "slow")
            await b.wait_first_delta(turn["id"])
            sent, reply, _ = await a.request_timed("turn/interrupt", {"thread_id": tid, "turn_id": turn["id"]})
            if not reply.get("interrupted"):
                raise RuntimeError(f"interrupt not applied: {reply}")
            params, arrived = await a.wait_terminal(turn["id"], timeout=30)
            if params["turn"]["status"] != "interrupted":
                raise RuntimeError(f"turn ended {params['turn']['status']}")
            latencies.append((arrived - sent) * 1000)
            await b.wait_terminal(turn["id"], timeout=30)
    return latencies


async def bus_round_trips(open_store: Any, count: int, *, deaf: bool = False) -> list[float]:
    """Request round trips (ms) between two NodeBus nodes, each on its own store object."""
    from roost.actors import NodeBus

    stores = [open_store(), open_store()]
    if deaf:
        stores = [_Deaf(s) for s in stores]
    a, b = NodeBus(stores[0], "bench-A", "bench"), NodeBus(stores[1], "bench-B", "bench")

    async def echo(message: Any) -> Any:
        return message.body["data"]

    b.on("echo", echo)
    out: list[float] = []
    try:
        async with trio.open_nursery() as outer:
            for store in stores:
                await outer.start(store.writer.run)
            async with trio.open_nursery() as nodes:
                await nodes.start(a.serve)
                await nodes.start(b.serve)
                for n in range(count):
                    began = time.perf_counter()
                    assert await a.request("bench-B", "echo", n) == n
                    out.append((time.perf_counter() - began) * 1000)
                    await trio.sleep(0.25)  # let both nodes back off to idle polling, as between clicks
                nodes.cancel_scope.cancel()
            outer.cancel_scope.cancel()
    finally:
        for store in stores:
            store.close()
    return out


class _Deaf:
    """A store whose LISTEN connection waits for another node's wake-ups (polling only)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def bus_listener(self, node_id: str) -> Any:
        return self._store.bus_listener("nobody")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@contextlib.contextmanager
def postgres_url(given: str | None) -> Iterator[str]:
    """A database URL: ``given``, ``$ROOST_TEST_DATABASE_URL``'s fresh database, or a throwaway cluster's."""
    if given:
        yield given
        return
    sys.path.insert(0, str(ROOT / "tests"))
    from _helpers.postgres import fresh_database, start_cluster

    with start_cluster() as server, fresh_database(server) as url:
        yield url


def _threads_in(url: str) -> int:
    """How many threads the PostgreSQL database holds (did the app-servers really run on it)."""
    from roost.storage import open_postgres_store

    with open_postgres_store(url) as store, store.read() as conn:
        return len(store.list_threads(conn))


def _stats(prefix: str, values: list[float]) -> dict[str, Any]:
    return {
        f"{prefix}_p50_ms": round(percentile(values, 50), 2),
        f"{prefix}_p99_ms": round(percentile(values, 99), 2),
        f"{prefix}_samples": len(values),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from roost.storage import open_postgres_store, open_store

    figures: dict[str, Any] = {"load_avg_1m": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="roost-xnode-") as tmp:
        home, work = Path(tmp) / "home", Path(tmp) / "work"
        work.mkdir()
        script = Path(tmp) / "script.yaml"
        script.write_text(SCRIPT)
        env = dict(os.environ, ROOST_HOME=str(home), ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script))
        env.pop("ROOST_DATABASE_URL", None)
        print("sqlite: two app-servers", file=sys.stderr)
        figures |= _stats("sqlite_interrupt", await appserver_interrupts(env, str(work), args.interrupts))
        db = home / "bus.db"
        figures |= _stats("sqlite_bus_rtt", await bus_round_trips(lambda: open_store(db), args.requests))
        with postgres_url(args.pg_url) as url:
            print("postgres: bus", file=sys.stderr)
            figures |= _stats(
                "postgres_bus_rtt", await bus_round_trips(lambda: open_postgres_store(url), args.requests)
            )
            figures |= _stats(
                "postgres_poll_only", await bus_round_trips(lambda: open_postgres_store(url), args.requests, deaf=True)
            )
            print("postgres: two app-servers", file=sys.stderr)
            try:
                pg_env = dict(env, ROOST_HOME=str(Path(tmp) / "pghome"), ROOST_DATABASE_URL=url)
                latencies = await appserver_interrupts(pg_env, str(work), args.interrupts)
                if not _threads_in(url):
                    raise RuntimeError("the app-server did not store its thread in PostgreSQL (it ran on SQLite)")
                figures |= _stats("postgres_interrupt", latencies)
            except Exception as exc:  # this build's app-server may not open PostgreSQL yet
                figures["postgres_interrupt_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--interrupts", type=int, default=30, help="turns of B interrupted from A (default 30)")
    parser.add_argument("--requests", type=int, default=50, help="bus round trips per backend (default 50)")
    parser.add_argument("--pg-url", default=None, help="a PostgreSQL database URL (default: a throwaway cluster)")
    args = parser.parse_args(argv)
    emit(trio.run(run, args))


if __name__ == "__main__":
    main()
