"""End-to-end: a bad numeric tuning variable (ROOST_MAX_LINE_BYTES, ROOST_MAX_PARALLEL, ...) is a
configuration error at start-up of each command that reads it (one line, exit 2), the way
ROOST_LEASE_TTL always was, never silently replaced by the default."""

from __future__ import annotations

import os
import subprocess
import sys
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


def test_a_line_limit_above_the_default_is_clamped_with_one_warning(tmp_path: Path) -> None:
    # ROOST_MAX_LINE_BYTES only lowers the 64 MiB limit (docs/app-server.md): a larger value is
    # the default, said once on stderr; a line beyond 64 MiB stays refused
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home"), "ROOST_MAX_LINE_BYTES": "999999999999"}
    code = (
        "from roost.protocol._framing import DEFAULT_MAX_LINE_BYTES, LineDecoder, line_limit\n"
        "assert line_limit() == line_limit() == DEFAULT_MAX_LINE_BYTES\n"
        "print(LineDecoder(max_line_bytes=line_limit()).feed(b'x' * (DEFAULT_MAX_LINE_BYTES + 2))[0].oversized)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=scaled(60))
    assert done.returncode == 0 and done.stdout == "True\n", done.stderr
    warnings = done.stderr.splitlines()
    assert len(warnings) == 1 and "ROOST_MAX_LINE_BYTES=999999999999" in warnings[0] and str(64 * 2**20) in warnings[0]
    lower = subprocess.run([sys.executable, "-c", "from roost.protocol._framing import line_limit; print(line_limit())"],
                           env={**env, "ROOST_MAX_LINE_BYTES": "1000"}, capture_output=True, text=True, timeout=scaled(60))
    assert lower.stdout == "1000\n" and lower.stderr == ""
