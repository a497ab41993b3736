"""Benchmark multi-agent orchestrations: ``roost serve -c`` running many three-agent runs at once.

Starts the real daemon on the scripted engine with a three-agent round-robin config (each agent
replies with ``--deltas`` deltas, one agent calls ``list_dir`` first; the Reviewer's reply ends the
run), dispatches ``--runs`` tasks over the Unix socket with ``--max-concurrent`` runners, waits for
every ``result``.

Output (one JSON line on stdout):

* ``bench``: ``"orchestration"``; ``runs``, ``max_concurrent``, ``deltas_per_reply``: the sizes
  (counts); ``agent_turns``: agent turns run (three per run, a count);
* ``wall_s``: from the first dispatch to the last result, in seconds;
* ``runs_per_s``, ``agent_turns_per_s``: completed runs and agent turns per second of wall time;
* ``server_cpu_ms_per_agent_turn``: the daemon's CPU (user + system, from ``/proc``) per agent
  turn, in ms;
* ``run_s_p50`` / ``run_s_p99``: dispatch (``queued``) to ``result`` per run, in seconds;
* ``peak_rss_mib``: the daemon's VmHWM, in MiB;
* ``run_cli_s``: wall time of one ``roost run --json`` of the same config (process start to exit),
  in seconds.

Usage: ``.venv/bin/python benchmarks/bench_orchestration.py [--runs 200] [--max-concurrent 20] [--deltas 100]
[--profile out.prof]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import arg_parser, emit, percentile  # noqa: E402

CONFIG = """
Orchestration:
  Name: Bench
  Agents:
    - {Name: Planner, Instructions: "You plan."}
    - {Name: Developer, Instructions: "You write code.", Plugins: [files], MaxToolRounds: 2}
    - {Name: Reviewer, Instructions: "You review."}
  Selection: {Type: roundrobin}
  Termination:
    Type: composite
    Strategies: [{Type: regex, Pattern: APPROVED, AgentNames: [Reviewer]}, {Type: maxiterations, MaxIterations: 6}]
"""


def _script(deltas: int) -> dict:
    words = "tok " * deltas
    return {
        "rules": [
            {"match": {"agent": "Planner"}, "steps": [[{"text": words, "deltas": deltas}]]},
            {
                "match": {"agent": "Developer"},
                "steps": [
                    [{"tool_call": {"name": "list_dir", "arguments": {"path": "."}}}],
                    [{"text": words, "deltas": deltas}],
                ],
            },
            {"match": {"agent": "Reviewer"}, "steps": [[{"text": words + "APPROVED", "deltas": deltas}]]},
        ],
        "default": "echo",
    }


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _roost_argv() -> list[str]:
    exe = Path(sys.executable).with_name("roost")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "roost"]


async def _dispatch_all(sock: str, runs: int) -> tuple[list[float], float]:
    """Send ``runs`` tasks; return each run's dispatch-to-result seconds and the total wall time."""
    stream = await trio.open_unix_socket(sock)
    sent: dict[int, float] = {}
    queued: list[str] = []
    started: dict[str, float] = {}
    durations: list[float] = []
    began = time.perf_counter()
    for i in range(runs):
        sent[i] = time.perf_counter()
        await stream.send_all(json.dumps({"type": "user_input", "text": f"task {i}"}).encode() + b"\n")
    buf = b""
    while len(durations) < runs:
        data = await stream.receive_some(1 << 16)
        if not data:
            raise RuntimeError("the daemon closed the connection")
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            if b'"queued"' in line or b'"result"' in line:
                event = json.loads(line)
                if event.get("type") == "queued":
                    started[event["sessionId"]] = sent[len(queued)]
                    queued.append(event["sessionId"])
                elif event.get("type") == "result":
                    if not event.get("succeeded"):
                        raise RuntimeError(f"a run failed: {event}")
                    durations.append(time.perf_counter() - started[event["sessionId"]])
    elapsed = time.perf_counter() - began
    await stream.aclose()
    return durations, elapsed


async def main(args: argparse.Namespace) -> dict:
    home = tempfile.mkdtemp(prefix="roost-bench-orch-")
    work = Path(home) / "work"
    work.mkdir()
    (work / "team.yaml").write_text(CONFIG)
    script = Path(home) / "script.json"
    script.write_text(json.dumps(_script(args.deltas)))
    sock = os.path.join(home, "d.sock")
    env = dict(os.environ, ROOST_HOME=home, ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script))
    t0 = time.perf_counter()
    done = await trio.run_process(
        [*_roost_argv(), "run", "--json", "-c", "team.yaml", "one run"],
        env=env,
        cwd=str(work),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    run_cli_s = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"roost run failed: {done.stderr.decode()[-2000:]}")
    prefix = [sys.executable, "-m", "cProfile", "-o", args.profile, "-m", "roost"] if args.profile else _roost_argv()
    daemon = await trio.lowlevel.open_process(
        [
            *prefix,
            "serve",
            "-c",
            "team.yaml",
            "--socket",
            sock,
            "--http-port",
            "0",
            "--max-concurrent",
            str(args.max_concurrent),
        ],
        stdout=subprocess.PIPE,
        env=env,
        cwd=str(work),
    )
    try:
        line = b""
        while b"\n" not in line:
            line += await daemon.stdout.receive_some(4096)
        cpu0 = _cpu_s(daemon.pid)
        print(f"dispatching {args.runs} runs, {args.max_concurrent} at once", file=sys.stderr)
        durations, elapsed = await _dispatch_all(sock, args.runs)
        cpu = _cpu_s(daemon.pid) - cpu0
        agent_turns = args.runs * 3
        return {
            "bench": "orchestration",
            "runs": args.runs,
            "max_concurrent": args.max_concurrent,
            "deltas_per_reply": args.deltas,
            "agent_turns": agent_turns,
            "wall_s": round(elapsed, 2),
            "runs_per_s": round(args.runs / elapsed, 1),
            "agent_turns_per_s": round(agent_turns / elapsed, 1),
            "server_cpu_ms_per_agent_turn": round(cpu / agent_turns * 1000, 2),
            "run_s_p50": round(percentile(durations, 50), 3),
            "run_s_p99": round(percentile(durations, 99), 3),
            "peak_rss_mib": _hwm_mib(daemon.pid),
            "run_cli_s": round(run_cli_s, 2),
        }
    finally:
        daemon.send_signal(signal.SIGTERM)
        with trio.move_on_after(10):
            await daemon.wait()
        if daemon.returncode is None:
            daemon.kill()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    parser = arg_parser(__doc__)
    parser.add_argument("--runs", type=int, default=200, help="runs dispatched (default 200)")
    parser.add_argument("--max-concurrent", type=int, default=20, help="the daemon's runners (default 20)")
    parser.add_argument("--deltas", type=int, default=100, help="token deltas per agent reply (default 100)")
    parser.add_argument(
        "--profile",
        metavar="OUT",
        default=None,
        help="run the daemon under cProfile, writing the profile to OUT (slows it down)",
    )
    emit(trio.run(main, parser.parse_args()))
