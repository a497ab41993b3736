"""Lease operation throughput: acquire (with release in between) and renew, per second.

"direct" runs the blocking functions on one connection (each its own BEGIN IMMEDIATE);
"writer" submits them one at a time through a StoreWriter (what a LeaseKeeper does).

Output (one JSON line on stdout):

* ``bench``: ``"leases"``; ``operations``: operations timed per figure (a count);
* ``direct`` and ``writer``: one object each, of
  * ``acquire_release_pairs_per_s``: acquire + release pairs per second,
  * ``renew_per_s``: renewals per second.

Run: ``.venv/bin/python benchmarks/bench_leases.py [--operations 2000]``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import trio
from _util import arg_parser

from roost._json import dumps
from roost.storage import acquire, connect, open_store, release, renew

N = 2000


def _direct(path: Path) -> dict:
    conn = connect(path)
    start = time.perf_counter()
    for _ in range(N):
        lease = acquire(conn, "k", "bench", 30.0)
        release(conn, lease)
    acquire_release = time.perf_counter() - start
    lease = acquire(conn, "k2", "bench", 30.0)
    start = time.perf_counter()
    for _ in range(N):
        lease = renew(conn, lease)
    renewing = time.perf_counter() - start
    conn.close()
    return {
        "acquire_release_pairs_per_s": round(N / acquire_release, 1),
        "renew_per_s": round(N / renewing, 1),
    }


async def _writer(path: Path) -> dict:
    store = open_store(path)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.writer.run)
        start = time.perf_counter()
        for _ in range(N):
            lease = await store.writer.submit(acquire, "w", "bench", 30.0)
            await store.writer.submit(release, lease)
        acquire_release = time.perf_counter() - start
        lease = await store.writer.submit(acquire, "w2", "bench", 30.0)
        start = time.perf_counter()
        for _ in range(N):
            lease = await store.writer.submit(renew, lease)
        renewing = time.perf_counter() - start
        nursery.cancel_scope.cancel()
    store.close()
    return {
        "acquire_release_pairs_per_s": round(N / acquire_release, 1),
        "renew_per_s": round(N / renewing, 1),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "leases.db"
        open_store(path).close()
        direct = _direct(path)
        writer = trio.run(_writer, path)
    result = {"bench": "leases", "operations": N, "direct": direct, "writer": writer}
    sys.stdout.buffer.write(dumps(result) + b"\n")


if __name__ == "__main__":
    parser = arg_parser(__doc__)
    parser.add_argument("--operations", type=int, default=N, help=f"operations per figure (default {N})")
    N = parser.parse_args().operations
    main()
