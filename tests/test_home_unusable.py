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
