"""Benchmark ``roost serve``: many WebSocket clients attached while tasks stream.

Starts the real daemon (scripted engine, ``--stamp-events`` so each broadcast event carries its
emit time), attaches ``--clients`` WebSocket clients from ``--procs`` client processes, dispatches
``--tasks`` tasks over the Unix socket (``--max-concurrent`` = tasks, so they stream at once), each
streaming ``--deltas`` token events at ``--rate`` deltas/s.

Output (one JSON line on stdout):

* ``bench``: ``"serve"``; ``clients``, ``tasks``, ``deltas_per_task``: the sizes (counts);
  ``rate_per_task``: each task's token events per second;
* ``connections_per_s``: clients attached (``hello`` received) per second, all processes at once;
* ``idle_conn_kib``: growth of the daemon's RSS per idle attached connection, in KiB;
* ``events_per_s``: broadcast events received by all clients per second of streaming;
* ``stream_s``: the streaming's wall time, from the dispatch until every client received
  everything, in seconds;
* ``latency_ms_p50`` / ``latency_ms_p99``: emit (daemon clock) to receipt (client clock), same
  host, in ms, sampled on the first 25 clients of each process;
* ``delivered`` / ``expected``: events received vs. events broadcast times clients (counts; fewer
  delivered when the daemon merged a backlog's tokens for a client that ran behind);
* ``text_chars_delivered`` / ``text_chars_expected`` (counts) / ``text_complete`` (a boolean):
  characters of streamed text all clients received against what they should have: what a user
  sees, whatever the lines.

Run: ``.venv/bin/python benchmarks/bench_serve.py [--clients 1000] [--tasks 20] [--deltas 50]
[--rate 10] [--procs 4]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio
from _util import arg_parser, at_least_one

ROOT = Path(__file__).resolve().parents[1]
SAMPLED = 25


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def worker(port: int, count: int, expected_chars: int) -> None:
    """Client process: attach ``count`` clients, print 'ready', wait for 'go' on stdin, count events
    and the characters of token text each client receives (until ``expected_chars`` each)."""
    from trio_websocket import ConnectionClosed, open_websocket_url

    try:
        import orjson as fastjson

        loads = fastjson.loads
    except ImportError:
        loads = json.loads
    latencies: list[float] = []
    received = [0]
    chars = [0]
    done = [0]
    all_attached = trio.Event()
    attached = [0]
    go = trio.Event()
    finished = trio.Event()
    limiter = trio.CapacityLimiter(64)

    async def client(index: int) -> None:
        async with limiter:
            ws_cm = open_websocket_url(f"ws://127.0.0.1:{port}/attach", max_message_size=64 << 20)
            ws = await ws_cm.__aenter__()
            await ws.get_message()  # hello
        attached[0] += 1
        if attached[0] == count:
            all_attached.set()
        text = 0
        sample = index < SAMPLED
        try:
            while text < expected_chars:
                message = await ws.get_message()
                now = time.time()
                received[0] += 1
                event = None
                if '"token"' in message[:20]:
                    event = loads(message)
                    text += len(event.get("text") or "")
                if sample:
                    event = event or loads(message)
                    if "t" in event:
                        latencies.append((now - event["t"]) * 1000)
        except ConnectionClosed:
            pass
        chars[0] += text
        done[0] += 1
        if done[0] == count:
            finished.set()
        await go.wait()
        await ws_cm.__aexit__(None, None, None)

    async with trio.open_nursery() as nursery:
        for index in range(count):
            nursery.start_soon(client, index)
        await all_attached.wait()
        print("ready", flush=True)
        with trio.move_on_after(600):
            await finished.wait()
        print(json.dumps({"received": received[0], "chars": chars[0], "latencies": latencies}), flush=True)
        go.set()


async def main(args: argparse.Namespace) -> dict:
    home = tempfile.mkdtemp(prefix="roost-bench-serve-")
    script = Path(home) / "script.json"
    script.write_text(
        json.dumps(
            {
                "rules": [
                    {
                        "match": {"prompt": "^stream"},
                        "steps": [
                            [{"text": "tok " * args.deltas, "deltas": args.deltas, "tokens_per_second": args.rate}]
                        ],
                    }
                ],
                "default": "echo",
            }
        )
    )
    sock = os.path.join(home, "d.sock")
    env = dict(os.environ, ROOST_HOME=home)
    exe = Path(sys.executable).with_name("roost")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "roost"]
    daemon = await trio.lowlevel.open_process(
        [
            *argv,
            "serve",
            "--provider",
            "scripted",
            "--script",
            str(script),
            "--socket",
            sock,
            "--http-port",
            "0",
            "--max-concurrent",
            str(args.tasks),
            "--stamp-events",
        ],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        line = b""
        while b"\n" not in line:
            line += await daemon.stdout.receive_some(4096)
        port = json.loads(line.split(b"\n")[0])["httpPort"]
        base_rss = rss_kib(daemon.pid)
        procs = min(args.procs, args.clients)  # a client process with no clients would never report ready
        per = [args.clients // procs + (1 if i < args.clients % procs else 0) for i in range(procs)]
        # events per client: per task agent_starting + deltas tokens
        expected_chars = args.tasks * len("tok " * args.deltas)  # the script's text, per client
        started = time.perf_counter()
        workers = [
            await trio.lowlevel.open_process(
                [sys.executable, __file__, "--worker", str(port), str(n), str(expected_chars)],
                stdout=subprocess.PIPE,
                stdin=subprocess.PIPE,
            )
            for n in per
        ]
        readers = []
        for proc in workers:
            buf = b""
            while b"ready\n" not in buf:
                data = await proc.stdout.receive_some(4096)
                if not data:
                    raise RuntimeError("a client process died")
                buf += data
            readers.append(buf.split(b"ready\n", 1)[1])
        attach_s = time.perf_counter() - started
        await trio.sleep(1.0)  # let the daemon settle before measuring idle memory
        idle_rss = rss_kib(daemon.pid)
        stream = await trio.open_unix_socket(sock)
        start = time.perf_counter()
        for i in range(args.tasks):
            await stream.send_all(json.dumps({"type": "user_input", "text": f"stream {i}"}).encode() + b"\n")
        results, buf = 0, b""
        while results < args.tasks:
            buf += await stream.receive_some(1 << 16)
            *lines, buf = buf.split(b"\n")
            results += sum(1 for line in lines if b'"type":"result"' in line)
        outputs = []
        for proc, rest in zip(workers, readers, strict=True):
            buf = rest
            while b"\n" not in buf:
                buf += await proc.stdout.receive_some(1 << 20)
            while True:
                try:
                    outputs.append(json.loads(buf.split(b"\n")[0]))
                    break
                except json.JSONDecodeError:
                    buf += await proc.stdout.receive_some(1 << 20)
        elapsed = time.perf_counter() - start
        for proc in workers:
            await proc.stdin.send_all(b"go\n")
            proc.kill()
        await stream.aclose()
        latencies = sorted(x for o in outputs for x in o["latencies"])
        received = sum(o["received"] for o in outputs)
        chars = sum(o["chars"] for o in outputs)

        def pct(p: float) -> float:
            return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))], 2) if latencies else None

        return {
            "bench": "serve",
            "clients": args.clients,
            "tasks": args.tasks,
            "deltas_per_task": args.deltas,
            "rate_per_task": args.rate,
            "connections_per_s": round(args.clients / attach_s, 1),
            "idle_conn_kib": round((idle_rss - base_rss) / args.clients, 1),
            "events_per_s": round(received / elapsed, 1),
            "stream_s": round(elapsed, 2),
            "latency_ms_p50": pct(0.50),
            "latency_ms_p99": pct(0.99),
            "delivered": received,
            "expected": args.clients * args.tasks * (args.deltas + 1),
            "text_chars_delivered": chars,
            "text_chars_expected": args.clients * expected_chars,
            "text_complete": chars == args.clients * expected_chars,
        }
    finally:
        daemon.send_signal(signal.SIGTERM)
        with trio.move_on_after(10):
            await daemon.wait()
        if daemon.returncode is None:
            daemon.kill()
        import shutil

        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        trio.run(worker, int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        sys.exit(0)
    parser = arg_parser(__doc__)
    parser.add_argument("--clients", type=int, default=1000, help="WebSocket clients attached (default 1000)")
    parser.add_argument("--tasks", type=int, default=20, help="tasks streaming at once (default 20)")
    parser.add_argument("--deltas", type=int, default=50, help="token events per task (default 50)")
    parser.add_argument("--rate", type=float, default=10.0, help="token events per second per task (default 10)")
    parser.add_argument("--procs", type=int, default=4, help="client processes the clients spread over (default 4)")
    args = parser.parse_args()
    at_least_one(parser, clients=args.clients, tasks=args.tasks, deltas=args.deltas, procs=args.procs)
    print(json.dumps(trio.run(main, args)))
