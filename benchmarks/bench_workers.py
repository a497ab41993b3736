"""Heavy subagent workload: one turn spawns N workers (max_parallel P), each streaming D deltas.

Runs the real ``roost app-server`` (scripted engine, zero pacing unless said otherwise) twice:
``complete``, the turn runs to its end; ``freeze``, workers paced by ``--tps`` deltas/s so that
they are mid-stream, and when half of them have completed, ``turn/interrupt``.

Output (one JSON line on stdout):

* ``benchmark``: ``"workers"``;
* ``complete`` and ``freeze``: one object each, of
  * ``root_status``: the root turn's final status (``completed``, ``interrupted``);
  * ``workers``, ``max_parallel``, ``deltas_per_worker``: the sizes (counts);
  * ``wall_s``: from ``turn/start`` to the root's terminal notification, in seconds;
  * ``agent_updated_events``: ``agent/updated`` notifications seen (a count);
  * ``server_cpu_s``: the server's CPU time over the case, in seconds;
  * ``peak_rss_bytes``: the server's peak RSS (VmHWM), and ``rss_per_worker_bytes``: its growth
    per worker, in bytes;
* ``complete`` also: ``events_per_s`` (engine events, worker deltas + agent notifications, per
  second of wall time) and ``workers_completed`` (a count);
* ``freeze`` also: ``completed_before_interrupt`` and ``frozen`` (workers interrupted; counts),
  ``interrupt_to_last_worker_terminal_s`` and ``interrupt_to_root_terminal_s``: from the
  interrupt request to the last worker's terminal ``agent/updated`` and to the root's terminal
  event, in seconds.

Run: ``.venv/bin/python benchmarks/bench_workers.py [--workers 1000] [--parallel 100] [--deltas 50]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import arg_parser, emit  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"completed", "failed", "cancelled", "interrupted"}


def script(workers: int, deltas: int, tps: float | None) -> str:
    """The scripted-engine script (JSON, which is YAML too): the root spawns, then waits for all."""
    text: dict = {"text": "word " * deltas, "deltas": deltas}
    if tps:
        text["tokens_per_second"] = tps
    spawns = [
        {
            "tool_call": {
                "name": "spawn_agent",
                "arguments": {"name": f"w{i}", "prompt": f"job {i}", "run_in_background": True},
            }
        }
        for i in range(workers)
    ]
    doc = {
        "rules": [
            {"match": {"agent": "w[0-9]+"}, "steps": [[text]]},
            {
                "match": {"prompt": "^spawn"},
                "steps": [
                    spawns,
                    [{"tool_call": {"name": "wait_agents", "arguments": {}}}],
                    [{"text": "all workers done"}],
                ],
            },
        ],
        "default": "echo",
    }
    return orjson.dumps(doc).decode()


def proc_status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Client:
    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.buf = b""
        self.next_id = 0

    async def send(self, method: str, params: dict) -> str:
        self.next_id += 1
        rid = str(self.next_id)
        await self.process.stdin.send_all(orjson.dumps({"id": rid, "method": method, "params": params}) + b"\n")
        return rid

    async def lines(self):
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                yield line
            data = await self.process.stdout.receive_some(1 << 18)
            if not data:
                return
            self.buf += data


async def run_case(workers: int, parallel: int, deltas: int, tps: float | None, freeze: bool) -> dict:
    home = Path(tempfile.mkdtemp(prefix="roost-bench-workers-"))
    (home / "script.yaml").write_text(script(workers, deltas, tps))
    env = dict(
        os.environ,
        ROOST_HOME=str(home),
        ROOST_PROVIDER="scripted",
        ROOST_SCRIPT=str(home / "script.yaml"),
        ROOST_MAX_PARALLEL=str(parallel),
        ROOST_MAX_DEPTH="3",
    )
    exe = Path(sys.executable).with_name("roost")
    process = await trio.lowlevel.open_process(
        [str(exe), "app-server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=str(home),
    )
    client = Client(process)
    stream = client.lines()
    result: dict = {}
    try:
        await client.send("initialize", {"protocol_version": "wuu-app-server/v0.1"})
        rid = await client.send("thread/start", {"cwd": str(home), "permission_mode": "unconfined"})
        thread_id = None
        async for line in stream:
            msg = orjson.loads(line)
            if msg.get("id") == rid:
                thread_id = msg["result"]["thread"]["id"]
                break
        base_rss = proc_status(process.pid)["VmRSS"]
        cpu0 = proc_cpu(process.pid)
        start = time.perf_counter()
        await client.send("turn/start", {"thread_id": thread_id, "prompt": "spawn the workers"})
        agent_events = completed = frozen = 0
        interrupt_at = last_terminal = root_end = None
        live: set[str] = set()
        async for line in stream:
            if not line.startswith((b'{"method":"agent/', b'{"method":"turn/completed', b'{"method":"turn/error')):
                continue
            msg = orjson.loads(line)
            now = time.perf_counter()
            if msg["method"] == "agent/updated":
                agent_events += 1
                agent = msg["params"]["agent"]
                if agent["status"] in TERMINAL:
                    live.discard(agent["id"])
                    last_terminal = now
                    if agent["status"] == "completed":
                        completed += 1
                    elif agent["status"] == "interrupted":
                        frozen += 1
                else:
                    live.add(agent["id"])
                if freeze and interrupt_at is None and completed >= workers // 2:
                    interrupt_at = time.perf_counter()
                    await client.send("turn/interrupt", {"thread_id": thread_id})
            elif msg["method"] in ("turn/completed", "turn/error"):
                root_end = now
                result["root_status"] = msg["params"]["turn"]["status"]
                break
        wall = root_end - start
        status = proc_status(process.pid)
        result = {
            **result,
            "workers": workers,
            "max_parallel": parallel,
            "deltas_per_worker": deltas,
            "wall_s": round(wall, 3),
            "agent_updated_events": agent_events,
            "server_cpu_s": round(proc_cpu(process.pid) - cpu0, 3),
            "peak_rss_bytes": status["VmHWM"],
            "rss_per_worker_bytes": int((status["VmHWM"] - base_rss) / workers),
        }
        if freeze:
            result.update(
                {
                    "completed_before_interrupt": completed,
                    "frozen": frozen,
                    "interrupt_to_last_worker_terminal_s": round((last_terminal or root_end) - interrupt_at, 3),
                    "interrupt_to_root_terminal_s": round(root_end - interrupt_at, 3),
                }
            )
        else:
            result["events_per_s"] = round((workers * deltas + agent_events) / wall)
            result["workers_completed"] = completed
    finally:
        await process.stdin.aclose()
        with trio.move_on_after(60):
            await process.wait()
        if process.returncode is None:
            process.kill()
    return result


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--workers", type=int, default=1000, help="workers the turn spawns (default 1000)")
    parser.add_argument("--parallel", type=int, default=100, help="max_parallel: workers at once (default 100)")
    parser.add_argument("--deltas", type=int, default=50, help="deltas each worker streams (default 50)")
    parser.add_argument("--tps", type=float, default=100.0, help="pacing of the freeze case (deltas/s per worker)")
    args = parser.parse_args()

    async def both() -> dict:
        complete = await run_case(args.workers, args.parallel, args.deltas, None, False)
        print(f"complete: {complete}", file=sys.stderr)
        frozen = await run_case(args.workers, args.parallel, args.deltas, args.tps, True)
        return {"benchmark": "workers", "complete": complete, "freeze": frozen}

    emit(trio.run(both))


if __name__ == "__main__":
    main()
