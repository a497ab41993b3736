"""A resource query whose stdout reader went away (``roost sessions --json | head -c 1``) exits 0
quietly, as ``run_main`` makes it for the trio commands and ``app-server`` does; it used to exit 1
(click's own broken-pipe handling). A query that fails keeps its exit status 1."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from _helpers.appserver import roost_argv
from _helpers.timing import scaled


def _with_closed_stdout(home: Path, *args: str) -> subprocess.CompletedProcess:
    """Run ``roost ARGS`` with stdout a pipe whose read end is already closed."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([*roost_argv(), *args], env={**os.environ, "ROOST_HOME": str(home)}, stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=scaled(60), check=False)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args", [["sessions", "--json"], ["sessions"], ["schedule", "list", "--json"],
                                  ["schedule", "list"], ["memory", "list", "--json"], ["objective", "list", "--json"],
                                  ["plugins"], ["status", "--json"]])
def test_a_query_with_a_closed_stdout_exits_0_quietly(tmp_path: Path, args: list[str]) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "ROOST_HOME": str(home)}
    subprocess.run([*roost_argv(), "schedule", "add", "nightly", "--cron", "0 3 * * *", "--task", "t"], env=env,
                   check=True, capture_output=True, timeout=scaled(60))
    done = _with_closed_stdout(home, *args)
    assert (done.returncode, done.stderr) == (0, ""), (args, done.returncode, done.stderr)


def test_a_failing_query_with_a_closed_stdout_keeps_exit_1(tmp_path: Path) -> None:
    done = _with_closed_stdout(tmp_path / "home", "sessions", "--show", "no-such-id", "--json")
    assert (done.returncode, done.stderr) == (1, ""), (done.returncode, done.stderr)
