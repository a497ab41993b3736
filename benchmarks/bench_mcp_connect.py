"""``roost plugins --json`` with broken MCP servers: the wait is the slowest server's, not the sum.

Writes a throwaway ``$ROOST_HOME/config.toml`` with one working stdio server (the test suite's
``tests/_helpers/mcp_server.py``) and ``--broken`` servers that never answer the handshake (the
same script's ``garbage`` mode: a non-JSON-RPC line on stdout, then silence), each with
``connect_timeout = --timeout``; runs the real ``roost plugins --json`` ``--runs`` times and prints
one JSON line: wall seconds p50/min/max, the bound the servers' own timeouts set (``timeout_s``),
what connecting and stopping them one after another would cost (``serial_bound_s``: broken x
(timeout + the SDK's 2 s stdio shutdown grace)), each server's listed status, and whether stderr
held a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _util import emit  # noqa: E402

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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
