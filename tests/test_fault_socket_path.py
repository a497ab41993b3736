"""Issue 18, finding 7: only a socket at the daemon's socket path is ever removed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import trio
from _helpers.appserver import roost_argv
from _helpers.serve_client import open_daemon, short_socket_path
from _helpers.timing import scaled


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"rules": [], "default": "echo"}))
    return path


async def _serve(script: Path, sock: str) -> subprocess.CompletedProcess:
    argv = [*roost_argv(), "serve", "--provider", "scripted", "--script", str(script), "--socket", sock]
    with trio.fail_after(scaled(30)):
        return await trio.run_process(argv, capture_stdout=True, capture_stderr=True, check=False,
                                      stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("kind", ["file", "directory", "symlink"])
async def test_a_non_socket_at_the_socket_path_is_refused_and_kept(script: Path, tmp_path: Path, kind: str) -> None:
    sock = short_socket_path()
    target = tmp_path / "precious.txt"
    target.write_text("my notes")
    if kind == "file":
        Path(sock).write_text("my notes")
    elif kind == "directory":
        os.mkdir(sock)
    else:
        os.symlink(target, sock)
    result = await _serve(script, sock)
    assert result.returncode != 0
    err = result.stderr.decode()
    assert ("not a socket" in err or "is a directory" in err) and "--socket" in err, err
    assert "Traceback" not in err
    assert os.path.lexists(sock)
    if kind == "file":
        assert Path(sock).read_text() == "my notes"
    assert target.read_text() == "my notes"


async def test_a_stale_socket_is_still_replaced(script: Path) -> None:
    sock = short_socket_path()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(sock)
    stale.close()   # bound, never listening: connect is refused, so it is stale
    async with open_daemon(script=script, socket=sock) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")


@pytest.mark.parametrize("parent", ["missing", "file"])
async def test_a_socket_in_a_directory_that_is_not_there_is_refused_and_nothing_created(
    script: Path, tmp_path: Path, parent: str
) -> None:
    base = tmp_path / "d"
    if parent == "file":
        base.write_text("a file")
    sock = base / "deeper" / "x.sock" if parent == "missing" else base / "x.sock"
    result = await _serve(script, str(sock))
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert "the socket's directory" in err and "--socket" in err and "Traceback" not in err
    assert (not base.exists()) if parent == "missing" else base.read_text() == "a file"
