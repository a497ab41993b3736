"""Store write throughput: group commit against one transaction per item.

Both runs use the real StoreWriter on a WAL file with synchronous=NORMAL; ``--tasks`` concurrent
tasks each append ``--per-task`` items to one thread. The per-item run is the same writer with
``batch_max=1`` (one BEGIN IMMEDIATE ... COMMIT per item).

Output (one JSON line on stdout):

* ``bench``: ``"store_writes"``;
* ``items``: items appended in each run (tasks x per-task, a count);
* ``concurrent_tasks``: appending tasks (a count);
* ``group_commit``: the writer with group commit (``batch_max=512``), and ``per_item_transaction``:
  the writer with one transaction per item; each an object of
  * ``items_per_s``: items appended per second of wall time,
  * ``transactions``: transactions committed (a count),
  * ``mean_group``: items per transaction (mean),
  * ``seconds``: wall time of the run, in seconds;
* ``speedup``: group commit's ``items_per_s`` over the per-item run's (a ratio).

Run: ``.venv/bin/python benchmarks/bench_store.py [--tasks 100] [--per-task 50]``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import trio
from _util import arg_parser

from roost._json import dumps
from roost.storage import append_item, create_thread, open_store

TASKS = 100
PER_TASK = 50


async def _run(path: Path, batch_max: int) -> dict:
    store = open_store(path, batch_max=batch_max)
    with store.transaction() as conn:
        create_thread(conn, id="bench")

    async def appender(n: int) -> None:
        for i in range(PER_TASK):
            await store.writer.submit(
                append_item,
                "bench",
                type="agent_message",
                payload={"task": n, "i": i, "text": "x" * 100},
                text="hello world",
            )

    async with trio.open_nursery() as nursery:
        await nursery.start(store.writer.run)
        start = time.perf_counter()
        async with trio.open_nursery() as tasks:
            for n in range(TASKS):
                tasks.start_soon(appender, n)
        elapsed = time.perf_counter() - start
        nursery.cancel_scope.cancel()
    stats = store.writer.stats
    store.close()
    return {
        "items_per_s": round(stats.writes / elapsed, 1),
        "transactions": stats.transactions,
        "mean_group": round(stats.writes / stats.transactions, 1),
        "seconds": round(elapsed, 3),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        grouped = trio.run(_run, Path(tmp) / "group.db", 512)
        single = trio.run(_run, Path(tmp) / "single.db", 1)
    result = {
        "bench": "store_writes",
        "items": TASKS * PER_TASK,
        "concurrent_tasks": TASKS,
        "group_commit": grouped,
        "per_item_transaction": single,
        "speedup": round(grouped["items_per_s"] / single["items_per_s"], 2),
    }
    sys.stdout.buffer.write(dumps(result) + b"\n")


if __name__ == "__main__":
    parser = arg_parser(__doc__)
    parser.add_argument("--tasks", type=int, default=TASKS, help=f"concurrent appending tasks (default {TASKS})")
    parser.add_argument("--per-task", type=int, default=PER_TASK, help=f"items each task appends (default {PER_TASK})")
    parsed = parser.parse_args()
    TASKS, PER_TASK = parsed.tasks, parsed.per_task
    main()
