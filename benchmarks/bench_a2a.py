"""Benchmark ``roost serve --a2a``: A2A ``message/send`` and ``message/stream`` through the real daemon.

Starts the daemon (scripted engine, echo replies, ``--max-concurrent N``), and with the official
``a2a-sdk`` client sends ``--calls`` blocking ``message/send`` calls one after another, then
``--calls`` streamed calls, then ``--calls`` sends ``--parallel`` at a time.

Output (one JSON line on stdout):

* ``calls``, ``parallel``: the two sizes (counts);
* ``card_ms``: reading the agent card once, in ms (client side, includes the daemon's lazy SDK
  app build);
* ``send_ms_p50`` / ``send_ms_p99``: one blocking ``message/send`` (a whole daemon task: queue,
  persistence, one scripted turn, result) round trip, in ms;
* ``stream_ms_p50`` / ``stream_ms_p99``: one ``message/stream`` until its final status update, in ms;
* ``parallel_calls_per_s``: finished sends per second with ``--parallel`` in flight;
* ``daemon_cpu_ms_per_call``: the daemon's CPU time (``/proc``) per call over the whole run, in ms;
* ``loadavg_1m``: the machine's 1-minute load average at the end.

Run: ``.venv/bin/python benchmarks/bench_a2a.py [--calls 100] [--parallel 10]`` (about 10 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import arg_parser, emit, percentile  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


async def _main(calls: int, parallel: int) -> dict:
    import httpx
    from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
    from a2a.types import Message, Part, Role, TextPart

    work = Path(tempfile.mkdtemp(prefix="bench-a2a-"))
    script = work / "script.json"
    script.write_text(json.dumps({"rules": [], "default": "echo"}))
    env = dict(os.environ, ROOST_HOME=str(work / "home"))
    argv = [
        sys.executable,
        "-m",
        "roost",
        "serve",
        "--provider",
        "scripted",
        "--script",
        str(script),
        "--socket",
        str(work / "d.sock"),
        "--http-port",
        "0",
        "--a2a",
        "--work-dir",
        str(work),
        "--max-concurrent",
        str(parallel),
    ]
    proc = await trio.lowlevel.open_process(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=str(ROOT)
    )
    try:
        line = b""
        while b"\n" not in line:
            line += await proc.stdout.receive_some(4096)
        port = json.loads(line.split(b"\n")[0])["httpPort"]
        cpu0 = _cpu_ms(proc.pid)

        def message(i: int) -> Message:
            return Message(
                role=Role.user, parts=[Part(root=TextPart(text=f"call {i}"))], message_id=f"m{i}-{time.time()}"
            )

        async with httpx.AsyncClient(timeout=120) as http:
            t0 = time.perf_counter()
            card = await A2ACardResolver(http, f"http://127.0.0.1:{port}").get_agent_card()
            card_ms = (time.perf_counter() - t0) * 1000
            sender = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
            streamer = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)

            async def one(client: object, i: int) -> float:
                start = time.perf_counter()
                async for _ in client.send_message(message(i)):  # type: ignore[attr-defined]
                    pass
                return (time.perf_counter() - start) * 1000

            sends = [await one(sender, i) for i in range(calls)]
            streams = [await one(streamer, i) for i in range(calls)]
            limiter = trio.Semaphore(parallel)

            async def limited(i: int) -> None:
                async with limiter:
                    await one(sender, i)

            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for i in range(calls):
                    nursery.start_soon(limited, i)
            parallel_s = time.perf_counter() - t0
        cpu = _cpu_ms(proc.pid) - cpu0
    finally:
        proc.terminate()
        await proc.wait()
    return {
        "calls": calls,
        "parallel": parallel,
        "card_ms": round(card_ms, 1),
        "send_ms_p50": round(percentile(sends, 50), 2),
        "send_ms_p99": round(percentile(sends, 99), 2),
        "stream_ms_p50": round(percentile(streams, 50), 2),
        "stream_ms_p99": round(percentile(streams, 99), 2),
        "parallel_calls_per_s": round(calls / parallel_s, 1),
        "daemon_cpu_ms_per_call": round(cpu / (3 * calls), 2),
        "loadavg_1m": os.getloadavg()[0],
    }


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--calls", type=int, default=100, help="calls per phase (send, stream, parallel)")
    parser.add_argument("--parallel", type=int, default=10, help="sends in flight in the parallel phase")
    args = parser.parse_args()
    emit(trio.run(_main, args.calls, args.parallel))


if __name__ == "__main__":
    main()
