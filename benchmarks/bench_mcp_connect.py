"""``roost plugins --json`` with broken MCP servers: the wait is the slowest server's, not the sum.

Writes a throwaway ``$ROOST_HOME/config.toml`` with one working stdio server (the test suite's
``tests/_helpers/mcp_server.py``) and ``--broken`` servers that never answer the handshake (the
same script's ``garbage`` mode: a non-JSON-RPC line on stdout, then silence), each with
``connect_timeout = --timeout``; runs the real ``roost plugins --json`` ``--runs`` times.

Output (one JSON line on stdout):

* ``broken_servers``: servers that never connect (a count); ``timeout_s``: their
  ``connect_timeout``, the bound the servers' own timeouts set, in seconds;
* ``serial_bound_s``: what connecting and stopping them one after another would cost (broken x
  (timeout + the SDK's 2 s stdio shutdown grace)), in seconds;
* ``wall_p50_s``, ``wall_min_s``, ``wall_max_s``: one ``roost plugins --json``, spawn to exit, in
  seconds;
* ``statuses``: each MCP server's name -> the status it is listed with (``notes``, the working
  one, and ``broken0``, ``broken1``, ...);
* ``traceback_on_stderr``: whether any run's stderr held a traceback (a boolean);
* ``loadavg``: the machine's 1-minute load average at the end.

Run: ``.venv/bin/python benchmarks/bench_mcp_connect.py [--broken 2] [--timeout 3] [--runs 3]`` (about 20 s).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import arg_parser, emit  # noqa: E402

SERVER = Path(__file__).resolve().parent.parent / "tests" / "_helpers" / "mcp_server.py"
SDK_STDIO_GRACE_S = 2.0  # mcp.client.stdio.PROCESS_TERMINATION_TIMEOUT


def write_config(home: Path, broken: int, timeout: float) -> None:
    py, server = json.dumps(sys.executable), json.dumps(str(SERVER))
    text = f'[mcp_servers.notes]\ncommand = {py}\nargs = [{server}, "stdio"]\n'
    for i in range(broken):
        text += (
            f'[mcp_servers.broken{i}]\ncommand = {py}\nargs = [{server}, "garbage"]\nconnect_timeout = {timeout:g}\n'
        )
    (home / "config.toml").write_text(text)


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--broken", type=int, default=2, help="servers that never connect (default 2)")
    parser.add_argument("--timeout", type=float, default=3.0, help="their connect_timeout, s (default 3)")
    parser.add_argument("--runs", type=int, default=3, help="runs of roost plugins --json (default 3)")
    args = parser.parse_args()
    roost = str(Path(sys.executable).with_name("roost"))
    walls: list[float] = []
    statuses: dict[str, str] = {}
    traceback = False
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        write_config(home, args.broken, args.timeout)
        env = dict(os.environ, ROOST_HOME=str(home))
        for _ in range(args.runs):
            began = time.perf_counter()
            done = subprocess.run([roost, "plugins", "--json"], capture_output=True, env=env, cwd=tmp, check=True)
            walls.append(time.perf_counter() - began)
            items = json.loads(done.stdout)["items"]
            statuses = {p["name"]: p["status"] for p in items if p["source"] == "mcp"}
            traceback = traceback or b"Traceback" in done.stderr
    emit(
        {
            "broken_servers": args.broken,
            "timeout_s": args.timeout,
            "serial_bound_s": round(args.broken * (args.timeout + SDK_STDIO_GRACE_S), 3),
            "wall_p50_s": round(statistics.median(walls), 3),
            "wall_min_s": round(min(walls), 3),
            "wall_max_s": round(max(walls), 3),
            "statuses": statuses,
            "traceback_on_stderr": traceback,
            "loadavg": os.getloadavg()[0],
        }
    )


if __name__ == "__main__":
    main()
