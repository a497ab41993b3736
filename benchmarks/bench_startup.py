"""Benchmark start-up: what a user waits for when a client spawns ``roost``.

Two commands, each spawned ``--runs`` times (after one untimed warm-up spawn that also creates
the store), alternating so that machine load hits both alike:

* ``roost app-server``: wall time from ``spawn`` to the ``initialize`` response line on stdout
  (the request is written at once; the server reads it when it is ready). Goal: p50 < 250 ms.
* ``roost app-server`` as the side-by-side harness spawns it (``/work/shared/peers``,
  ``roost_backend.py``): a fresh ``ROOST_HOME`` for every run (so the store is created and
  migrated each time) and ``--provider openai-responses --base-url URL --model mock-model
  --api-key-env MOCK_KEY`` (the URL is never contacted before a turn); figures
  ``app_server_fresh_home_initialize_*``, and ``app_server_fresh_home_cpu_ms_to_initialize_p50``:
  the server's CPU (every thread, ``/proc``, 10 ms ticks) when its response arrived.
* ``roost sessions --json``: wall time from ``spawn`` to exit, with its one envelope line checked.
  Goal: p50 < 200 ms.

``roost_bytecode`` says whether the ``roost`` package the command runs has current ``.pyc``
files: with ``PYTHONDONTWRITEBYTECODE=1`` and an editable install nothing writes them, and every
start compiles Roost's source (``scripts/dev.py`` compiles the venv and the package after
installing). ``--bytecode off`` measures that case: ``PYTHONPYCACHEPREFIX`` points at a private
folder that mirrors every installed ``.pyc`` (symlinks) except the ``roost`` package's own.

``--baseline DIR`` also measures the package in DIR, alternating with the measured one spawn by
spawn (a change and its parent under the same load: compare only within one run).

Output (one JSON line on stdout; progress goes to stderr):

* ``runs``: timed spawns of each command (a count); ``pythonpath``: the ``--pythonpath`` given (or
  null); ``roost_bytecode``: ``cached`` (current ``.pyc`` files), ``partial`` (some) or
  ``missing`` (none);
* for each command ``<c>`` of ``app_server_initialize`` (spawn to the ``initialize`` response),
  ``app_server_fresh_home_initialize`` (the same as the harness spawns it) and ``sessions_json``
  (spawn to exit): ``<c>_ms_p50``, ``<c>_ms_min``, ``<c>_ms_max`` (wall time, in ms) and
  ``<c>_cpu_ms_p50`` (the child's user + system CPU over its whole life, from ``wait4``, in ms;
  less sensitive to load on a shared machine);
* ``app_server_fresh_home_cpu_ms_to_initialize_p50``: the server's CPU (every thread, ``/proc``,
  10 ms ticks) when its response arrived, in ms;
* with ``--baseline``: ``baseline_pythonpath``, ``baseline_roost_bytecode`` and every figure above
  again with the prefix ``baseline_``, for the package in DIR;
* ``loadavg_1m_start``, ``loadavg_1m_end``: the machine's 1-minute load average at the start and
  the end.

Usage: ``.venv/bin/python benchmarks/bench_startup.py [--runs 15] [--roost .venv/bin/roost] [--pythonpath DIR]
[--baseline DIR] [--bytecode as-is|off]``
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _util import arg_parser, emit  # noqa: E402

_ROOT = Path(__file__).resolve().parent.parent
_INITIALIZE = b'{"id":1,"method":"initialize","params":{"protocol_version":"wuu-app-server/v0.1"}}\n'


def _loadavg() -> float:
    return os.getloadavg()[0]


def _wait_cpu(proc: subprocess.Popen) -> float:
    """Reap ``proc`` and return its user + system CPU seconds (``os.wait4``)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


#: The harness's ``roost app-server`` options (``/work/shared/peers/roost_backend.py``).
HARNESS_ARGS = (
    "--provider",
    "openai-responses",
    "--base-url",
    "http://127.0.0.1:9/v1",
    "--model",
    "mock-model",
    "--api-key-env",
    "MOCK_KEY",
)


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` used so far (``/proc/PID/stat``,
    clock ticks: 10 ms resolution); NaN when unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spawn_app_server(
    roost: str, env: dict[str, str], args: tuple[str, ...] = (), to_initialize: list[float] | None = None
) -> tuple[float, float]:
    """Spawn ``roost app-server ARGS``, send ``initialize`` and return (seconds to the response, CPU s).

    ``to_initialize``, when given, gets the CPU seconds the server had used when its response
    arrived (less sensitive to a loaded machine than wall time).

    Raises:
        RuntimeError: the first line is not the ``initialize`` response.
    """
    start = time.perf_counter()
    proc = subprocess.Popen(
        [roost, "app-server", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(_INITIALIZE)
    proc.stdin.flush()
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - start
    if to_initialize is not None:
        to_initialize.append(_proc_cpu(proc.pid))
    proc.stdin.close()
    proc.stdout.read()
    cpu = _wait_cpu(proc)
    if not line.startswith(b'{"id":1,"result":'):
        raise RuntimeError(f"unexpected initialize answer: {line[:200]!r}")
    return elapsed, cpu


def spawn_sessions(roost: str, env: dict[str, str]) -> tuple[float, float]:
    """Run ``roost sessions --json`` to exit and return (seconds, CPU s).

    Raises:
        RuntimeError: it failed or did not print one ``items`` envelope.
    """
    start = time.perf_counter()
    proc = subprocess.Popen([roost, "sessions", "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    out = proc.stdout.read()
    cpu = _wait_cpu(proc)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0 or not out.startswith(b'{"protocolVersion":1,"items":'):
        raise RuntimeError(f"roost sessions --json failed ({proc.returncode}): {out[:200]!r}")
    return elapsed, cpu


def bytecode_state(python: str, env: dict[str, str]) -> str:
    """Return ``cached``, ``partial`` or ``missing`` for the ``roost`` package ``python`` imports."""
    out = subprocess.run(
        [python, "-c", "import roost, os; print(os.path.dirname(roost.__file__))"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd="/",
    ).stdout.strip()
    sources = list(Path(out).rglob("*.py"))
    current = 0
    for src in sources:
        pyc = Path(importlib.util.cache_from_source(str(src)))
        if pyc.exists() and pyc.stat().st_mtime >= src.stat().st_mtime:
            current += 1
    if current == len(sources):
        return "cached"
    return "missing" if current == 0 else "partial"


def _figures(name: str, samples: list[tuple[float, float]]) -> dict[str, Any]:
    walls = [w * 1000 for w, _ in samples]
    cpus = [c * 1000 for _, c in samples]
    return {
        f"{name}_ms_p50": round(statistics.median(walls), 1),
        f"{name}_ms_min": round(min(walls), 1),
        f"{name}_ms_max": round(max(walls), 1),
        f"{name}_cpu_ms_p50": round(statistics.median(cpus), 1),
    }


def _hide_package_bytecode(roost_dir: Path, prefix: Path) -> None:
    """Make ``PYTHONPYCACHEPREFIX=prefix`` find the stdlib and site-packages bytecode but not Roost's.

    The prefix mirrors every ``__pycache__`` the interpreter would look for under it, except the
    ``roost`` package's: each directory on ``sys.path`` is linked file by file (``.pyc`` only).
    """
    import sysconfig

    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        base = Path(sysconfig.get_paths()[key]).resolve()
        for cache in base.rglob("__pycache__"):
            if roost_dir in cache.parents:
                continue
            target = prefix / cache.parent.relative_to("/")
            target.mkdir(parents=True, exist_ok=True)
            for pyc in cache.glob("*.pyc"):
                link = target / pyc.name
                if not link.exists():
                    link.symlink_to(pyc)


def _run_once(roost: str, env: dict[str, str], tmp: Path, i: int, out: dict[str, list]) -> str:
    """One timed spawn of each command with ``env``; appends to ``out``; returns a progress note."""
    out["app"].append(spawn_app_server(roost, env))
    home = tmp / f"fresh-{i}"
    out["fresh"].append(
        spawn_app_server(roost, {**env, "ROOST_HOME": str(home), "MOCK_KEY": "mock"}, HARNESS_ARGS, out["fresh_cpu"])
    )
    shutil.rmtree(home, ignore_errors=True)
    out["sessions"].append(spawn_sessions(roost, env))
    return (
        f"app-server {out['app'][-1][0] * 1000:.0f} ms, fresh home {out['fresh'][-1][0] * 1000:.0f} ms, "
        f"sessions {out['sessions'][-1][0] * 1000:.0f} ms"
    )


def _prepare(args: argparse.Namespace, python: str, env: dict[str, str], tmp: Path, name: str) -> str:
    """Set up ``env`` for ``--bytecode`` and return the package's bytecode state."""
    state = bytecode_state(python, env)
    if args.bytecode == "off":
        where = subprocess.run(
            [python, "-c", "import roost, os; print(os.path.dirname(roost.__file__))"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
            cwd="/",
        ).stdout.strip()
        roost_dir = Path(where).resolve()
        _hide_package_bytecode(roost_dir, tmp / f"pycache-{name}")
        env["PYTHONPYCACHEPREFIX"] = str(tmp / f"pycache-{name}")
        state = "missing"
    return state


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--runs", type=int, default=15, help="timed spawns of each command (default 15)")
    parser.add_argument(
        "--roost",
        default=str(_ROOT / ".venv" / "bin" / "roost"),
        help="the roost executable (default: this checkout's .venv/bin/roost)",
    )
    parser.add_argument(
        "--pythonpath",
        default=None,
        help="a directory holding another copy of the roost package to measure "
        "(put first on PYTHONPATH), e.g. an older commit's tree",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="DIR",
        help="also measure the roost package in DIR (put first on PYTHONPATH), spawn by "
        "spawn alternating with the measured one (which goes first on odd runs); its "
        "figures carry the prefix baseline_",
    )
    parser.add_argument(
        "--bytecode",
        choices=("as-is", "off"),
        default="as-is",
        help="as-is: whatever .pyc files exist; off: Roost's own modules compile from "
        "source on every start (an editable install under PYTHONDONTWRITEBYTECODE=1)",
    )
    args = parser.parse_args()
    python = str(Path(args.roost).with_name("python"))
    load_start = _loadavg()
    tmp = Path(tempfile.mkdtemp(prefix="roost-bench-startup-"))
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
        env.update(ROOST_HOME=str(tmp / "home"), ROOST_PROVIDER="scripted", PYTHONDONTWRITEBYTECODE="1")
        sides: dict[str, dict[str, str]] = {"": dict(env)}
        if args.pythonpath:
            sides[""]["PYTHONPATH"] = os.path.abspath(args.pythonpath)
        if args.baseline:
            sides["baseline_"] = {**env, "PYTHONPATH": os.path.abspath(args.baseline)}
        states = {
            prefix: _prepare(args, python, side_env, tmp, prefix or "measured") for prefix, side_env in sides.items()
        }
        for side_env in sides.values():
            spawn_sessions(args.roost, side_env)  # warm-up: creates the store, warms the page cache
            spawn_app_server(args.roost, side_env)
        samples: dict[str, dict[str, list]] = {
            p: {"app": [], "fresh": [], "fresh_cpu": [], "sessions": []} for p in sides
        }
        for i in range(args.runs):
            order = list(sides) if i % 2 == 0 else list(sides)[::-1]
            notes = [
                f"{p.rstrip('_') or 'measured'}: {_run_once(args.roost, sides[p], tmp, i, samples[p])}" for p in order
            ]
            print(f"run {i + 1}/{args.runs}: " + "; ".join(notes), file=sys.stderr)
        figures: dict[str, Any] = {"runs": args.runs, "roost_bytecode": states[""], "pythonpath": args.pythonpath}
        if args.baseline:
            figures.update(baseline_pythonpath=args.baseline, baseline_roost_bytecode=states["baseline_"])
        for prefix, got in samples.items():
            figures.update(_figures(f"{prefix}app_server_initialize", got["app"]))
            figures.update(_figures(f"{prefix}app_server_fresh_home_initialize", got["fresh"]))
            figures[f"{prefix}app_server_fresh_home_cpu_ms_to_initialize_p50"] = round(
                statistics.median(got["fresh_cpu"]) * 1000, 1
            )
            figures.update(_figures(f"{prefix}sessions_json", got["sessions"]))
        figures.update(loadavg_1m_start=round(load_start, 2), loadavg_1m_end=round(_loadavg(), 2))
        emit(figures)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
