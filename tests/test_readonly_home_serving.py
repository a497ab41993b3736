"""A read-only ``$ROOST_HOME`` (its directory and its database): ``roost app-server`` starts and
serves the reads, each write is a ``storage_read_only`` error saying what to do and the session
goes on; ``roost exec`` (which must write its thread) stops with one line and exit status 2; a
read-only home with no database yet is one line naming the directory to make writable.

README and docs/operations.md ("Storage errors") say reads keep working on a read-only database.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from _helpers.appserver import RemoteError, open_app_server, roost_argv, scripted_env
from _helpers.timing import scaled


def _chattr(flag: str, path: Path) -> bool:
    return subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False).returncode == 0


@contextlib.contextmanager
def _read_only(home: Path) -> Iterator[None]:
    """Make ``home`` and every file in it read-only for the block (chmod; as root, chattr +i)."""
    files = [home, *home.iterdir()]
    if os.geteuid() != 0:
        for path in files:
            os.chmod(path, 0o555 if path.is_dir() else 0o444)
    elif not all(_chattr("+i", path) for path in reversed(files)):
        for path in files:
            _chattr("-i", path)
        pytest.skip("cannot make the home read-only here (no chattr +i)")
    try:
        yield
    finally:
        for path in files:
            if os.geteuid() == 0:
                _chattr("-i", path)
            else:
                os.chmod(path, 0o755 if path.is_dir() else 0o644)


async def test_app_server_on_a_read_only_home_serves_reads_and_refuses_writes(tmp_path: Path,
                                                                               roost_home: Path) -> None:
    env = scripted_env(roost_home)
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
    with _read_only(roost_home):
        async with open_app_server(env=env, cwd=tmp_path, stderr=subprocess.PIPE) as client:
            init = await client.initialize()
            # app-server-protocol.md: needs_setup with issues = the connection works, but the runtime
            # needs attention (it answered "ready" with no issues though every write failed)
            assert init["status"] == "needs_setup" and len(init["issues"]) == 1, init
            assert "storage_read_only" in init["issues"][0] and "writable" in init["issues"][0]
            assert tid in [t["id"] for t in (await client.request("thread/list", {}))["threads"]]
            resumed = await client.request("thread/resume", {"session_id": tid})
            assert resumed["thread"]["id"] == tid
            for method, params in (("thread/start", {"cwd": str(tmp_path)}),
                                   ("thread/rename", {"thread_id": tid, "title": "renamed"}),
                                   ("turn/start", {"thread_id": tid, "prompt": "hi"})):
                with pytest.raises(RemoteError) as refused:
                    await client.request(method, params)
                assert refused.value.code == "storage_read_only", (method, refused.value.error)
                assert "writable" in refused.value.error["message"]
            # the session goes on serving reads after the refused writes
            assert tid in [t["id"] for t in (await client.request("thread/list", {}))["threads"]]
            await client.close_stdin()
            with trio.fail_after(scaled(30)):
                assert await client.process.wait() == 0


def _roost(home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*roost_argv(), *args], env=scripted_env(home), cwd=cwd, capture_output=True, text=True,
                          timeout=scaled(60), check=False)


def test_exec_on_a_read_only_home_is_one_line_and_exit_2(tmp_path: Path, roost_home: Path) -> None:
    assert _roost(roost_home, tmp_path, "exec", "hi").returncode == 0
    with _read_only(roost_home):
        done = _roost(roost_home, tmp_path, "exec", "hi")
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # once, not also as a start-up reconciliation warning first
    last = lines[-1]
    assert last.startswith("roost exec: error: ") and "read-only" in last and "writable" in last, done.stderr


@pytest.mark.parametrize("command", [("app-server",), ("exec", "hi")])
def test_a_read_only_home_without_a_database_names_the_directory(tmp_path: Path, roost_home: Path,
                                                                 command: tuple[str, ...]) -> None:
    with _read_only(roost_home):
        done = _roost(roost_home, tmp_path, *command)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == ""
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"roost {command[0]}: error: "), done.stderr
    assert "cannot be created" in last and f"make {roost_home} writable" in last, last
    assert "its contents are fine" not in last   # there is no file whose contents could be fine


def test_resource_queries_on_a_read_only_home_without_a_database_are_empty(tmp_path: Path, roost_home: Path) -> None:
    with _read_only(roost_home):
        sessions = _roost(roost_home, tmp_path, "sessions", "--json")
        schedules = _roost(roost_home, tmp_path, "schedule", "list", "--json")
        refused = _roost(roost_home, tmp_path, "schedule", "add", "x", "--cron", "0 3 * * *", "--task", "t")
    assert (sessions.returncode, sessions.stdout) == (0, '{"protocolVersion":1,"items":[]}\n'), sessions.stderr
    assert (schedules.returncode, schedules.stdout) == (0, '{"protocolVersion":1,"items":[]}\n'), schedules.stderr
    assert refused.returncode == 2 and f"make {roost_home} writable" in refused.stderr, refused.stderr
    assert "Traceback" not in sessions.stderr + schedules.stderr + refused.stderr
    assert list(roost_home.iterdir()) == []


def test_a_read_only_home_whose_schema_is_behind_says_read_only(tmp_path: Path, roost_home: Path) -> None:
    import sqlite3

    assert _roost(roost_home, tmp_path, "exec", "hi").returncode == 0
    with contextlib.closing(sqlite3.connect(roost_home / "roost.db")) as conn:  # an older Roost's schema
        conn.executescript("DELETE FROM _sqlite_migrations WHERE name = '0009_node_bus';"
                           "DROP TABLE bus_messages; DROP TABLE bus_nodes;")
    with _read_only(roost_home):
        done = _roost(roost_home, tmp_path, "sessions", "--json")
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "needs a migration" in done.stdout and "read-only" in done.stdout and "writable" in done.stdout
    assert "migration failed" not in done.stdout and "Traceback" not in done.stderr


def test_an_initialize_waiting_at_start_on_a_read_only_home_reports_it(tmp_path: Path, roost_home: Path) -> None:
    """The first initialize, already on stdin at start, is answered before the runtime starts
    (issue 19): it reports the read-only store too."""
    import json

    assert _roost(roost_home, tmp_path, "exec", "hi").returncode == 0
    request = json.dumps({"id": 1, "method": "initialize", "params": {"protocol_version": "wuu-app-server/v0.1"}})
    with _read_only(roost_home):
        done = subprocess.run([*roost_argv(), "app-server"], env=scripted_env(roost_home), cwd=tmp_path,
                              input=request + "\n", capture_output=True, text=True, timeout=scaled(60), check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[0])["result"]
    assert result["status"] == "needs_setup" and "storage_read_only" in result["issues"][0], result
