"""The side-by-side harness (``../shared/peers/bench_codex.py``), with two corrections for Roost.

1. **Server CPU over the process tree.** The harness reads utime+stime of the server's pid only
   (``/proc/PID/stat`` fields 14-15: all of that process's threads, none of its children), so the
   CPU of ``roost app-server``'s worker processes (``ROOST_APPSERVER_WORKERS``, issue 19 "Every
   core") is not counted. Here the harness's ``proc_cpu_s`` counts the pid and its live
   descendants (for every backend alike: Codex's figures do not change, its child processes use
   next to no CPU), and the saturated phase adds the pid-only figure as
   ``server_cpu_utilisation_in_window_pid_only``.
2. **Roost variants.** The harness's Roost backend drops every ``ROOST_*`` variable from the
   server's environment, so a setting cannot be A/B-tested through the shell. ``--variant
   NAME=K=V[;K=V...]`` (repeatable) defines backend ``bench_peers_variants:NAME``: the harness's
   Roost backend with those variables set (``NAME=`` for none), to be named in ``--backend``.

Every other argument goes to the harness unchanged (``--help`` prints the harness's flags after
these).

Output (one JSON line on stdout: the harness's, which ``../shared/peers/README.md`` and
``bench_codex.py`` define; this script adds one field and changes what the CPU figures count):

* ``harness``, ``host`` (``cpus``, ``python``, ``machine``), ``workload`` (the effective workload,
  as ``--print-workload`` shows it), ``phases`` (the phases run), ``ok`` (every run of every
  backend passed its checks);
* ``backends``: per ``--backend`` entry, ``class``, ``version``, ``ok``, ``median`` (the median of
  each figure over the runs) and ``runs`` (every run's figures: per phase ``latency``,
  ``concurrent``, ``interrupt``, ``saturated``, with ``_ms`` milliseconds, ``_s`` seconds,
  ``_kb`` KiB, ``_per_s`` per second; ``server_cpu_*``: the server's process tree here);
* added by this script: ``saturated.server_cpu_utilisation_in_window_pid_only``, the server pid's
  own CPU seconds per wall second (cores) over the saturated window, as the harness alone counts
  it.

Usage: ``.venv/bin/python benchmarks/bench_peers.py [--peers DIR] [--variant w0=ROOST_APPSERVER_WORKERS=0
--variant w1=ROOST_APPSERVER_WORKERS=1] --backend codex_cleanhome:CodexCleanHome,
bench_peers_variants:w0,bench_peers_variants:w1 --phases saturated --repeat 3
[--codex-bin PATH]`` (run from a Roost checkout: the backend takes ``.venv/bin/roost`` there, or
``$ROOST_BIN``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import types
from pathlib import Path
from typing import Any

from _util import arg_parser

DEFAULT_PEERS = Path(__file__).resolve().parents[2] / "shared" / "peers"
if not DEFAULT_PEERS.is_dir():
    DEFAULT_PEERS = Path("/work/shared/peers")


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``NAME=K=V;K=V`` -> ``(NAME, {K: V})``; ``NAME=`` -> ``(NAME, {})``.

    Raises:
        argparse.ArgumentTypeError: no ``=`` after the name, or a setting without ``=``.
    """
    name, sep, rest = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME=K=V[;K=V...]")
    env: dict[str, str] = {}
    for item in filter(None, rest.split(";")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--variant {text!r}: {item!r} is not K=V")
        env[key] = value
    return name, env


def install(harness: Any, variants: dict[str, dict[str, str]]) -> None:
    """Patch ``harness`` (the imported ``bench_codex``) as the module doc says, and register the
    module ``bench_peers_variants`` holding one Roost backend class per variant."""
    pid_only = harness.proc_cpu_s
    calls: list[tuple[int, float, float]] = []

    def tree_cpu_s(pid: int) -> float | None:
        own = pid_only(pid)
        if own is None:
            return None
        total = own + sum(pid_only(kid) or 0.0 for kid, _state in harness.descendants(pid))
        calls.append((pid, own, total))
        return total

    saturated = harness.Phases.saturated

    def saturated_with_pid_only(self: Any) -> None:
        calls.clear()
        saturated(self)
        mine = [c for c in calls if c[0] == self.spid]  # CpuMeter.start, the window's start, its end
        res = self.res.get("saturated")
        if res and len(mine) >= 3 and res.get("window_s"):
            res["server_cpu_utilisation_in_window_pid_only"] = round((mine[2][1] - mine[1][1]) / res["window_s"], 3)

    harness.proc_cpu_s = tree_cpu_s
    harness.Phases.saturated = saturated_with_pid_only
    roost_backend = importlib.import_module("roost_backend")
    module = types.ModuleType("bench_peers_variants")
    for name, env in variants.items():

        def prepare(self: Any, mock_base_url: str, scratch_dir: str, _env: dict = env) -> Any:
            argv, server_env, cwd = roost_backend.RoostBackend.prepare(self, mock_base_url, scratch_dir)
            server_env.update(_env)
            return argv, server_env, cwd

        setattr(module, name, type(name, (roost_backend.RoostBackend,), {"prepare": prepare}))
    sys.modules[module.__name__] = module


def main() -> int:
    parser = arg_parser(__doc__, add_help=False)
    parser.add_argument("--peers", type=Path, default=DEFAULT_PEERS, help="the harness's folder")
    parser.add_argument("--variant", type=parse_variant, action="append", default=[], help="NAME=K=V[;K=V...]")
    args, rest = parser.parse_known_args()
    if "-h" in rest or "--help" in rest:
        parser.print_help()
        print()
    sys.path.insert(0, str(args.peers))
    os.environ.setdefault("PYTHONPATH", str(args.peers))
    harness = importlib.import_module("bench_codex")
    install(harness, dict(args.variant))
    return int(harness.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
