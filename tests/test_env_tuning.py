"""End-to-end: a bad numeric tuning variable (ROOST_MAX_LINE_BYTES, ROOST_MAX_PARALLEL, ...) is a
configuration error at start-up of each command that reads it (one line, exit 2), the way
ROOST_LEASE_TTL always was, never silently replaced by the default."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from _helpers.appserver import roost_argv
from _helpers.serve_client import short_socket_path
from _helpers.timing import scaled

BAD = [
    ("ROOST_MAX_LINE_BYTES", "abc", "a positive integer (bytes)"),
    ("ROOST_MAX_LINE_BYTES", "0", "a positive integer (bytes)"),
    ("ROOST_MAX_LINE_BYTES", "-5", "a positive integer (bytes)"),
    ("ROOST_MAX_PARALLEL", "0", "a positive integer"),
    ("ROOST_MAX_PARALLEL", "abc", "a positive integer"),
    ("ROOST_MAX_DEPTH", "x", "a positive integer"),
    ("ROOST_IDLE_UNLOAD_S", "nope", "a positive number of seconds"),
    ("ROOST_OUTBOX_BYTES", "-5", "a positive integer (bytes)"),
    ("ROOST_LEASE_TTL", "abc", "a positive number of seconds"),
]


@pytest.mark.parametrize("command", [["exec", "hi"], ["serve", "--socket", "SOCKET"], ["app-server"], ["repl"],
                                     ["attach", "SOCKET"]])
def test_a_bad_tuning_variable_fails_the_command_at_start(tmp_path: Path, command: list[str]) -> None:
    base = {**os.environ, "ROOST_HOME": str(tmp_path / "home"), "ROOST_PROVIDER": "scripted", "ROOST_SCRIPT": "demo"}
    argv = [*roost_argv(), *[short_socket_path() if a == "SOCKET" else a for a in command]]
    for name, value, what in BAD:
        done = subprocess.run(argv, env={**base, name: value}, capture_output=True, text=True, timeout=scaled(60),
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 2, (name, value, done.stderr)
        assert done.stdout == ""
        assert done.stderr == f"roost {command[0]}: {name} must be {what}, got {value!r}\n"
    helped = subprocess.run([*roost_argv(), command[0], "--help"], env={**base, "ROOST_MAX_DEPTH": "x"},
                            capture_output=True, text=True, timeout=scaled(60))
    assert helped.returncode == 0  # --help still works
