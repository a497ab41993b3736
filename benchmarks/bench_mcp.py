"""MCP plugin tool calls (issue 16): what a call through Roost's connection actor costs.

Starts the test suite's MCP server (``tests/_helpers/mcp_server.py``, the official SDK's server
API) over stdio under an :func:`roost.plugins.open_mcp_host`, then calls its read-only ``echo``
tool through :func:`roost.tools.run_tool` (argument validation, policy, the actor's mailbox, the
SDK client): start-up to connected (s), sequential call latency p50/p99 (µs) and calls/s, and
calls/s with ``--concurrency`` calls in flight; then kills the server mid-run (its ``crash`` tool)
and measures the time until it is connected again (s, with ``ROOST_MCP_BACKOFF_S``'s first delay).

Output (one JSON line on stdout):

* ``connect_s``: host start-up to the server connected, in seconds;
* ``calls``: calls of the sequential phase (a count); ``call_p50_us`` / ``call_p99_us``: one call's
  latency, in µs; ``sequential_calls_per_s``: calls per second, one at a time;
* ``concurrency``: calls in flight in the second phase (a count); ``concurrent_calls_per_s``: calls
  per second with that many in flight;
* ``reconnect_after_crash_s``: from the crash to connected again, in seconds.

Run: ``.venv/bin/python benchmarks/bench_mcp.py [--calls 500] [--concurrency 16]`` (about 10 s).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).parent))
from _util import arg_parser, emit, percentile  # noqa: E402

from roost.plugins import McpServerConfig, open_mcp_host  # noqa: E402
from roost.tools import ToolContext, run_tool  # noqa: E402

SERVER = Path(__file__).resolve().parent.parent / "tests" / "_helpers" / "mcp_server.py"


async def main(calls: int, concurrency: int) -> dict:
    config = McpServerConfig(
        name="bench",
        transport="stdio",
        command=sys.executable,
        args=(str(SERVER), "stdio"),
        env={"MCP_NOTES": os.devnull},
    )
    ctx = ToolContext(cwd=Path.cwd(), permission_mode="unconfined")
    began = time.perf_counter()
    async with open_mcp_host([config]) as host:
        connected_s = time.perf_counter() - began
        tools = host.tools()
        echo = tools["mcp__bench__echo"]
        latencies = []
        t0 = time.perf_counter()
        for i in range(calls):
            start = time.perf_counter()
            result = await run_tool(echo, {"text": str(i)}, ctx)
            latencies.append((time.perf_counter() - start) * 1e6)
            assert result.output == f"echo: {i}", result
        sequential_s = time.perf_counter() - t0

        async def worker(n: int) -> None:
            for _ in range(n):
                result = await run_tool(echo, {"text": "x"}, ctx)
                assert not result.is_error, result

        t0 = time.perf_counter()
        per = max(1, calls // concurrency)
        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(worker, per)
        concurrent_s = time.perf_counter() - t0
        state = host.states["bench"]
        crashed = await run_tool(tools["mcp__bench__crash"], {}, ctx)
        assert crashed.is_error
        t0 = time.perf_counter()
        while state.state != "connected":
            await trio.sleep(0.01)
        reconnect_s = time.perf_counter() - t0
    return {
        "connect_s": round(connected_s, 3),
        "calls": calls,
        "call_p50_us": round(percentile(latencies, 50)),
        "call_p99_us": round(percentile(latencies, 99)),
        "sequential_calls_per_s": round(calls / sequential_s, 1),
        "concurrency": concurrency,
        "concurrent_calls_per_s": round(per * concurrency / concurrent_s, 1),
        "reconnect_after_crash_s": round(reconnect_s, 3),
    }


if __name__ == "__main__":
    parser = arg_parser(__doc__)
    parser.add_argument("--calls", type=int, default=500, help="calls per phase (default 500)")
    parser.add_argument("--concurrency", type=int, default=16, help="calls in flight in the second phase (16)")
    args = parser.parse_args()
    emit(trio.run(main, args.calls, args.concurrency))
