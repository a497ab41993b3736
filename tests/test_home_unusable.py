"""An unusable ``$ROOST_HOME`` is one line and exit status 2 on every command, never a traceback.

A fresh-user trial found ``roost serve``, ``roost attach`` (default socket) and ``roost repl
--vscode`` printing Python tracebacks for a ROOST_HOME that is a regular file (and for a read-only
one); the other commands already gave one line. The ``roost`` group now turns any
:class:`~roost.errors.RoostError` that escapes a sub-command into ``roost COMMAND: error: ...``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from _helpers.appserver import roost_argv
from _helpers.timing import scaled


@pytest.mark.parametrize("args", [["serve", "--provider", "scripted"], ["attach"], ["repl", "--vscode"],
                                  ["exec", "--provider", "scripted", "hi"], ["app-server"]])
def test_a_regular_file_as_roost_home_is_one_line_and_exit_2(tmp_path: Path, args: list[str]) -> None:
    home = tmp_path / "not-a-dir"
    home.write_text("")
    env = {**os.environ, "ROOST_HOME": str(home), "ROOST_PROVIDER": "scripted"}
    done = subprocess.run([*roost_argv(), *args], env=env, capture_output=True, text=True, timeout=scaled(60),
                          input='{"type":"user_input","text":"hi"}\n', check=False)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert errors and "ROOST_HOME" in errors[-1] and errors[-1].startswith(f"roost {args[0]}")
    assert errors[-1].endswith(f"ROOST_HOME {str(home)!r} is not a usable directory: it is a file, not a directory")


def _status(home: Path, *args: str, user: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "ROOST_HOME": str(home)}
    return subprocess.run([*(user or []), *roost_argv(), "status", *args], env=env, capture_output=True, text=True,
                          timeout=scaled(60), check=False)


def test_status_of_a_home_under_a_file_is_an_error_not_none_yet(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    home = tmp_path / "a-file" / "home"
    done = _status(home)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "none yet" not in done.stdout and "Traceback" not in done.stderr
    assert done.stderr.strip() == (f"roost status: error: ROOST_HOME {str(home)!r} is not a usable directory: "
                                   "a part of its path is a file, not a directory")
    as_json = _status(home, "--json")
    assert as_json.returncode == 2 and '"error":"ROOST_HOME' in as_json.stdout


def test_status_of_an_unreadable_home_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    home = tmp_path / "private"
    home.mkdir(mode=0o700)
    (home / "roost.db").write_text("")
    tmp_path.chmod(0o755)
    user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    if not user:
        home.chmod(0o000)
    try:
        done = _status(home, user=user)
    finally:
        home.chmod(0o700)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stderr.strip() == f"roost status: error: ROOST_HOME {str(home)!r} is not a usable directory: Permission denied"


_QUERIES = [["sessions"], ["sessions", "--repl"], ["schedule", "list"], ["schedule", "remove", "x"],
            ["memory", "list"], ["memory", "agents"], ["context", "list"], ["plugins"], ["objective", "list"]]


@pytest.mark.parametrize("args", _QUERIES)
def test_resource_commands_on_a_file_home_exit_2_like_status_and_exec(tmp_path: Path, args: list[str]) -> None:
    """Without --json an unusable home is the same usage/environment error (exit 2, ``error:``
    line) as for ``status``, ``exec``, ``demo`` and ``app-server``; it used to be exit 1."""
    home = tmp_path / "not-a-dir"
    home.write_text("")
    env = {**os.environ, "ROOST_HOME": str(home)}
    done = subprocess.run([*roost_argv(), *args], env=env, capture_output=True, text=True, timeout=scaled(60),
                          check=False)
    assert done.returncode == 2, (args, done.returncode, done.stderr)
    assert done.stdout == "" and "Traceback" not in done.stderr
    name = " ".join(args[:2]) if args[0] in ("schedule", "memory", "context", "objective") else args[0]
    assert done.stderr.strip() == (f"roost {name}: error: ROOST_HOME {str(home)!r} is not a usable directory: "
                                   "it is a file, not a directory")


@pytest.mark.parametrize("args", [["sessions"], ["schedule", "list"], ["memory", "list"], ["objective", "list"]])
def test_resource_queries_with_json_on_a_file_home_keep_the_wire_protocols_exit_1(tmp_path: Path,
                                                                                   args: list[str]) -> None:
    """wire-protocol.md "Resource queries": on failure a --json query exits with status 1 and
    prints the error envelope; that contract wins over the exit 2 of the text output."""
    home = tmp_path / "not-a-dir"
    home.write_text("")
    env = {**os.environ, "ROOST_HOME": str(home)}
    done = subprocess.run([*roost_argv(), *args, "--json"], env=env, capture_output=True, text=True,
                          timeout=scaled(60), check=False)
    assert done.returncode == 1, (args, done.returncode, done.stdout, done.stderr)
    assert done.stdout.startswith('{"protocolVersion":1,"error":"ROOST_HOME ') and done.stdout.count("\n") == 1
