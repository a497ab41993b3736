#!/usr/bin/env python3
"""Set up (or refresh) the local virtual environment, then run the demo or the tests.

Usage::

    python3 scripts/dev.py demo [ROOST DEMO ARGS...]   # runs `roost demo` on the scripted engine
    python3 scripts/dev.py test [PYTEST ARGS...]       # the checks, then the whole test suite
    python3 scripts/dev.py roost [ARGS...]             # any other `roost` command

The virtual environment lives in ``.venv`` beside this repository. It is created when missing and
re-installed whenever ``pyproject.toml`` changes (a hash of it is kept in ``.venv/.roost-stamp``).
Only the Python standard library is used here, so a fresh machine needs nothing but Python 3.11+.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".roost-stamp"


def _bin(name: str) -> Path:
    sub = "Scripts" if os.name == "nt" else "bin"
    return VENV / sub / name


def ensure_venv() -> None:
    """Create ``.venv`` and install Roost with its test extras when missing or stale."""
    if sys.version_info < (3, 11):  # noqa: UP036 (runs under any python3, before the venv exists)
        sys.exit(f"Roost needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if _bin("python").exists() and STAMP.exists() and STAMP.read_text().strip() == digest:
        return
    if not _bin("python").exists():
        print("creating virtual environment in .venv ...", file=sys.stderr)
        venv.EnvBuilder(with_pip=True, clear=False).create(VENV)
    print("installing roost and its test dependencies ...", file=sys.stderr)
    pip = [str(_bin("python")), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "install", "-e", f"{ROOT}[test]"], check=True)
    compile_bytecode(packages=True)
    STAMP.write_text(digest)


# The static checks `test` runs before pytest, in order; each must exit 0 (configured in pyproject.toml).
CHECKS = (
    ("ruff", "check", "roost", "scripts", "benchmarks"),
    ("ruff", "format", "--check", "roost", "scripts", "benchmarks"),
    ("mypy",),
    ("lint-imports",),
)


def run_checks(env: dict[str, str]) -> int:
    """Run each of :data:`CHECKS`; return the first non-zero exit status (0 when all pass)."""
    for tool, *args in CHECKS:
        print(f"$ {tool} {' '.join(args)}", file=sys.stderr, flush=True)
        status = subprocess.run([str(_bin(tool)), *args], cwd=ROOT, env=env).returncode
        if status != 0:
            print(f"{tool} failed (exit {status}); the tests did not run", file=sys.stderr)
            return status
    return 0


def compile_bytecode(*, packages: bool) -> None:
    """Write missing or stale ``.pyc`` files for ``roost/`` (and, with ``packages``, the venv's).

    Start-up time is a goal (issue 19: ``roost app-server`` answers ``initialize`` in under
    250 ms). Under ``PYTHONDONTWRITEBYTECODE=1`` nothing caches bytecode by itself, and an
    editable install leaves Roost's own modules to be compiled from source on every start (about
    a third of the start-up CPU). Only timestamps are checked when everything is current.
    """
    python = str(_bin("python"))
    targets = [str(ROOT / "roost")]
    if packages:
        targets.append(
            subprocess.run(
                [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
    subprocess.run([python, "-m", "compileall", "-q", "-j", "0", *targets], check=True, stdout=subprocess.DEVNULL)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "roost"}:
        print(__doc__, file=sys.stderr)
        return 2
    ensure_venv()
    compile_bytecode(packages=False)
    command, rest = argv[0], argv[1:]
    env = dict(os.environ)
    if command == "test":
        status = run_checks(env)
        if status != 0:
            return status
        # deadlines bound waits on real processes (never an outcome): on 2 loaded cores, double them
        env.setdefault("ROOST_TEST_TIMEOUT_SCALE", "2")
        return subprocess.run([str(_bin("python")), "-m", "pytest", *rest], cwd=ROOT, env=env).returncode
    # `roost` runs where it was asked to, like the installed command: relative paths (a config,
    # a work directory) and a new thread's cwd are the caller's, not this repository's
    args = [str(_bin("roost")), "demo", *rest] if command == "demo" else [str(_bin("roost")), *rest]
    return subprocess.run(args, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
