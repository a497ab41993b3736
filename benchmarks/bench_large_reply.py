"""Memory given back after one large reply (issue 18, finding 5): the daemon's RSS before, at the
peak of, and after streaming one ``--mib`` MiB reply to one reading client.

Starts the real ``roost serve`` (scripted engine, temporary ``ROOST_HOME``), attaches one client on
its Unix socket that reads everything, runs a small warm-up task, then one task whose reply is
``--mib`` MiB of text in ``--deltas`` token events at ``--rate`` a second, and samples ``VmRSS`` of the daemon
(``/proc/<pid>/status``) every 20 ms while it streams. After the ``result`` line it waits
``--settle`` seconds and reads ``VmRSS`` again. With ``--diagnose`` the daemon runs under
``tracemalloc`` (a wrapper installs a SIGUSR1 handler) and the top allocation sites still alive
after the reply are printed to stderr (slow: tracemalloc costs several times the CPU).

Output (one JSON line on stdout):

* ``bench``: ``"large_reply"``; ``reply_mib``: the reply's size (``--mib``, MiB); ``deltas``: the
  token events it streamed in (a count);
* ``text_complete``: whether the client received the whole reply (a boolean);
* ``stream_s``: from the task's dispatch to its ``result``, in seconds;
* the daemon's ``VmRSS``, in MiB: ``rss_base_mib`` (after the warm-up), ``rss_peak_mib`` (the
  largest sample while it streamed), ``rss_after_mib`` (``--settle`` s after the reply);
  ``held_after_mib``: after minus base, what the large reply left the daemon holding.

Run: ``.venv/bin/python benchmarks/bench_large_reply.py [--mib 30] [--deltas 3000] [--rate 1000] [--settle 2]
[--diagnose]`` (about 15 s).
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

from _util import arg_parser, emit  # noqa: E402

_MIB = 1 << 20

# Run inside the daemon with --diagnose: SIGUSR1 writes the live allocation sites to $ROOST_BENCH_TRACE.
_WRAPPER = """
import gc, os, signal, sys, tracemalloc
tracemalloc.start(12)
def dump(*_):
    gc.collect()
    snap = tracemalloc.take_snapshot()
    with open(os.environ["ROOST_BENCH_TRACE"] + ".part", "w") as f:
        for stat in snap.statistics("traceback")[:12]:
            f.write(f"{stat.size / 1048576:.2f} MiB in {stat.count} blocks\\n")
            for line in stat.traceback.format()[-12:]:
                f.write("    " + line + "\\n")
        for obj in gc.get_objects():  # who holds each large string (strings are not tracked)
            inner = [r for r in gc.get_referents(obj) if isinstance(r, dict) and not gc.is_tracked(r)]
            for ref in gc.get_referents(obj) + [v for d in inner for v in d.values()]:
                if isinstance(ref, str) and len(ref) > 1048576:
                    holders = [type(r).__qualname__ for r in gc.get_referrers(obj)][:4]
                    desc = type(obj).__qualname__
                    if hasattr(obj, "f_code"):
                        desc += f" {obj.f_code.co_qualname}"
                    f.write(f"large str ({len(ref) >> 20} MiB) in a {desc} held by {holders}\\n")
    os.replace(os.environ["ROOST_BENCH_TRACE"] + ".part", os.environ["ROOST_BENCH_TRACE"])  # whole or absent
signal.signal(signal.SIGUSR1, dump)
from roost.cli import main
sys.argv = ["roost", *sys.argv[1:]]
main()
"""


def rss_bytes(pid: int) -> int:
    """``VmRSS`` of ``pid`` in bytes (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def _task(stream: trio.SocketStream, text: str) -> int:
    """Send one ``user_input`` and read until its ``result`` line; return the token characters."""
    await stream.send_all(json.dumps({"type": "user_input", "text": text}).encode() + b"\n")
    chars, tail = 0, b""
    while True:
        data = await stream.receive_some(1 << 20)
        if not data:
            raise RuntimeError("the daemon closed the socket")
        *lines, tail = (tail + data).split(b"\n")
        for line in lines:
            event = json.loads(line)
            if event.get("type") == "token":
                chars += len(event.get("text") or "")
            elif event.get("type") == "result":
                return chars


async def _sample(pid: int, peak: list[int]) -> None:
    while True:
        peak[0] = max(peak[0], rss_bytes(pid))
        await trio.sleep(0.02)


async def main(args: argparse.Namespace) -> dict:
    home = tempfile.mkdtemp(prefix="roost-bench-big-")
    big = "abcd" * (args.mib * _MIB // 4)
    script = Path(home) / "script.json"
    script.write_text(
        json.dumps(
            {
                "rules": [
                    {
                        "match": {"prompt": "^big"},
                        "steps": [[{"text": big, "deltas": args.deltas, "tokens_per_second": args.rate}]],
                    }
                ],
                "default": "echo",
            }
        )
    )
    sock = os.path.join(home, "d.sock")
    env = dict(os.environ, ROOST_HOME=home, ROOST_BENCH_TRACE=os.path.join(home, "trace.txt"))
    if args.diagnose:
        argv = [sys.executable, "-c", _WRAPPER]
    else:
        exe = Path(sys.executable).with_name("roost")
        argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "roost"]
    daemon = await trio.lowlevel.open_process(
        [*argv, "serve", "--provider", "scripted", "--script", str(script), "--socket", sock, "--http-port", "0"],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        line = b""
        while b"\n" not in line:
            line += await daemon.stdout.receive_some(4096)
        stream = await trio.open_unix_socket(sock)
        await _task(stream, "warm up")
        await trio.sleep(args.settle)
        base = rss_bytes(daemon.pid)
        peak = [base]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_sample, daemon.pid, peak)
            started = time.perf_counter()
            chars = await _task(stream, "big reply")
            stream_s = time.perf_counter() - started
            nursery.cancel_scope.cancel()
        await trio.sleep(args.settle)
        after = rss_bytes(daemon.pid)
        if args.diagnose:
            daemon.send_signal(signal.SIGUSR1)
            trace = Path(env["ROOST_BENCH_TRACE"])
            with trio.move_on_after(120):
                while not trace.exists():
                    await trio.sleep(0.5)
            print(trace.read_text() if trace.exists() else "no trace written", file=sys.stderr)
        await stream.aclose()
        return {
            "bench": "large_reply",
            "reply_mib": args.mib,
            "deltas": args.deltas,
            "text_complete": chars == len(big),
            "stream_s": round(stream_s, 2),
            "rss_base_mib": round(base / _MIB, 1),
            "rss_peak_mib": round(peak[0] / _MIB, 1),
            "rss_after_mib": round(after / _MIB, 1),
            "held_after_mib": round((after - base) / _MIB, 1),
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
    parser.add_argument("--mib", type=int, default=30, help="size of the large reply in MiB (default 30)")
    parser.add_argument("--deltas", type=int, default=3000, help="token events it streams in (default 3000)")
    parser.add_argument("--rate", type=float, default=1000, help="token events per second (default 1000)")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds to wait before reading RSS (default 2)")
    parser.add_argument("--diagnose", action="store_true", help="run the daemon under tracemalloc; print what it holds")
    emit(trio.run(main, parser.parse_args()))
