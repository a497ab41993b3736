"""Benchmark ``roost serve --workers N`` (issue 19, "Every core"): one daemon on one SQLite
``$ROOST_HOME``, its front door and N-1 headless worker processes claiming from one task queue.

For each N of ``--workers`` (default 1, 2): start ``roost serve --workers N --max-concurrent C``
(scripted engine, each reply ``--deltas`` token deltas), attach one Unix-socket client, dispatch
``--tasks`` tasks, wait for every result, check that every task's streamed text reached the
client complete (deltas may be coalesced: the text is counted, not the lines), and report:

* ``w{N}_tasks_per_s``: tasks (one agent turn each) finished per wall second;
* ``w{N}_cpu_cores``: CPU time (user + system) of the front door and all its workers divided by
  the wall time: the cores the daemon used;
* ``w{N}_cpu_ms_per_task``: that CPU time per task; ``w{N}_tasks_per_process``: tasks each
  process ran (from the ``ranOn`` of each task's row);
* ``w{N}_text_complete``: every task's text arrived whole.

Also ``cores`` (``os.cpu_count()``) and ``loadavg_1m`` at the start (the machine may be shared).

Usage: ``python benchmarks/bench_workers_procs.py [--tasks 200] [--workers 1,2] [--deltas 100]
[--max-concurrent 4]`` (about 20 s).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

from _util import emit  # noqa: E402


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live child processes (``/proc``, Linux)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat(int(entry.name))
        except OSError:
            continue
        if int(entry.name) == pid or int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def run(tmp: Path, script: Path, workers: int, tasks: int, concurrent: int, deltas: int) -> dict[str, Any]:
    from _helpers.serve_client import open_daemon

    home = tmp / f"home-{workers}"
    home.mkdir()
    env = {"ROOST_HOME": str(home), "ROOST_TASK_POLL_S": "0.2"}
    with (home / "serve.err").open("wb") as err:
        args = ["--workers", str(workers), "--max-concurrent", str(concurrent)]
        async with open_daemon(script=script, env=env, stderr=err, args=args) as daemon:
            async with daemon.unix() as client:
                await client.wait_for("hello")
                while workers > 1:  # every worker is up before the clock starts
                    mark = len(client.events)
                    await client.send({"type": "status"})
                    status = await client.wait_for("status", start=mark)
                    if len(status["workers"]) == workers - 1 and all(w["alive"] for w in status["workers"]):
                        break
                    await trio.sleep(0.2)
                await trio.sleep(1.0)  # the workers' start-up CPU is not the workload's
                before = tree_cpu_s(daemon.process.pid)
                start = time.perf_counter()
                sids = []
                for t in range(tasks):
                    mark = len(client.events)
                    await client.send({"type": "user_input", "text": f"bench task {t}"})
                    sids.append((await client.wait_for("queued", start=mark))["sessionId"])
                for sid in sids:
                    await client.wait_for("result", lambda e, s=sid: e["sessionId"] == s, timeout=600)
                wall = time.perf_counter() - start
                cpu = tree_cpu_s(daemon.process.pid) - before
                texts: dict[str, str] = {}
                for e in client.of_type("token"):
                    texts[e["sessionId"]] = texts.get(e["sessionId"], "") + e["text"]
                complete = all(texts.get(s) == "tok " * deltas for s in sids)
    ran: dict[str, int] = {}
    with sqlite3.connect(home / "roost.db") as conn:
        for (payload,) in conn.execute("SELECT payload FROM daemon_tasks"):
            owner = str(json.loads(payload).get("ranOn"))
            ran[owner] = ran.get(owner, 0) + 1
    return {
        "tasks_per_s": round(tasks / wall, 2),
        "cpu_cores": round(cpu / wall, 2),
        "cpu_ms_per_task": round(cpu * 1000 / tasks, 2),
        "tasks_per_process": sorted(ran.values(), reverse=True),
        "text_complete": complete,
        "wall_s": round(wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200, help="tasks per run (default 200)")
    parser.add_argument("--workers", default="1,2", help="comma-separated process counts (default 1,2)")
    parser.add_argument("--deltas", type=int, default=100, help="token deltas per reply (default 100)")
    parser.add_argument("--max-concurrent", type=int, default=4, help="runners per process (default 4)")
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    out: dict[str, Any] = {
        "bench": "workers_procs",
        "tasks": args.tasks,
        "deltas": args.deltas,
        "cores": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp_name:
        tmp = Path(tmp_name)
        script = tmp / "script.json"
        reply = {"text": "tok " * args.deltas, "deltas": args.deltas}
        script.write_text(
            json.dumps({"rules": [{"match": {"prompt": "^bench"}, "steps": [[reply]]}], "default": "echo"})
        )
        for n in counts:
            figures = trio.run(run, tmp, script, n, args.tasks, args.max_concurrent, args.deltas)
            out.update({f"w{n}_{k}": v for k, v in figures.items()})
    emit(out)


if __name__ == "__main__":
    main()
