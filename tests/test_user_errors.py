"""Expected conditions end with one line and a documented exit status, never a traceback (issue
17), and the plain repl's /help reads as text, not Markdown."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

from _helpers.appserver import roost_argv
from _helpers.serve_client import short_socket_path
from _helpers.timing import scaled


def test_a_busy_http_port_is_one_line_and_exit_1(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [], "default": "echo"}))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([*roost_argv(), "serve", "--provider", "scripted", "--script", str(script),
                               "--socket", short_socket_path(), "--http-port", str(port)],
                              capture_output=True, text=True, timeout=scaled(60), check=False)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "Error" not in done.stderr.replace("error", "")
    assert f"roost serve: cannot listen on 127.0.0.1:{port}: the port is in use by another process; " \
           "choose another --http-port (0 picks a free one)" in done.stderr
    help_text = subprocess.run([*roost_argv(), "serve", "--help"], capture_output=True, text=True, check=False).stdout
    assert "1  another daemon owns the socket, the HTTP port cannot be listened on" in help_text


def test_plain_repl_help_is_readable_text(tmp_path: Path) -> None:
    env = dict(os.environ, ROOST_PROVIDER="scripted")
    done = subprocess.run([*roost_argv(), "repl"], input="/help\n", capture_output=True, text=True,
                          timeout=scaled(60), env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "/status: status-line numbers" in out and "/exit: end the chat" in out
    assert "**" not in out and "`" not in out and "\n- " not in out
