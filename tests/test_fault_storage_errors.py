"""Issue 18, finding 6: a full disk, a read-only database and a corrupt one are told apart.

Each gets its own typed error code and a message that says what to do; reads keep being served;
a healthy database is never called corrupt nor is its user told to move it aside.
"""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import pytest
import trio
from _helpers.appserver import (
    AppServerClient,
    RemoteError,
    open_app_server,
    roost_argv,
    scripted_env,
)
from _helpers.timing import scaled


def _chattr(flag: str, path: Path) -> bool:
    return subprocess.run(["chattr", flag, str(path)], capture_output=True, check=False).returncode == 0


async def _prepare(home: Path, tmp_path: Path) -> str:
    """A database with one thread in it; returns the thread id."""
    async with open_app_server(env=scripted_env(home), cwd=tmp_path) as client:
        await client.initialize()
        return (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]


async def test_a_read_only_database_serves_reads_and_refuses_writes_typed(tmp_path: Path, roost_home: Path) -> None:
    tid = await _prepare(roost_home, tmp_path)
    db = roost_home / "roost.db"
    if os.geteuid() != 0:
        os.chmod(db, 0o444)
        os.chmod(roost_home, 0o555)
    elif not _chattr("+i", db):
        pytest.skip("cannot make the database read-only here (no chattr +i)")
    try:
        async with open_app_server(env=scripted_env(roost_home), cwd=tmp_path, stderr=subprocess.PIPE) as client:
            await client.initialize()
            listed = await client.request("thread/list", {})
            assert tid in [t["id"] for t in listed["threads"]]          # reads still work
            with pytest.raises(RemoteError) as refused:
                await client.request("thread/start", {"cwd": str(tmp_path)})
            assert refused.value.code == "storage_read_only", refused.value.error
            message = refused.value.error["message"]
            assert "writable" in message and "move it aside" not in message
            await client.close_stdin()
            err = await _stderr(client)
        assert "Traceback" not in err, err
    finally:
        if os.geteuid() == 0:
            _chattr("-i", db)
        else:
            os.chmod(roost_home, 0o755)
            os.chmod(db, 0o644)


async def _stderr(client: AppServerClient) -> str:
    assert client.process.stderr is not None
    chunks = []
    with trio.fail_after(scaled(20)):
        while chunk := await client.process.stderr.receive_some(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


async def test_a_full_disk_answers_storage_full_and_reads_go_on(tmp_path: Path, roost_home: Path) -> None:
    tid = await _prepare(roost_home, tmp_path)
    sizes = [p.stat().st_size for p in roost_home.iterdir() if p.is_file()]
    limit = max(sizes) + 256 * 1024      # room to start; not for a 2 MiB prompt
    env = scripted_env(roost_home)

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))   # Python ignores SIGXFSZ

    process = await trio.lowlevel.open_process(
        [*roost_argv(), "app-server"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=env, cwd=str(tmp_path), preexec_fn=limit_file_size)
    client = AppServerClient(process)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client._reader)
        await client.initialize()
        with pytest.raises(RemoteError) as refused:
            await client.request("turn/start", {"thread_id": tid, "prompt": "x" * (2 << 20)})
        assert refused.value.code == "storage_full", refused.value.error
        assert "free space" in refused.value.error["message"]
        listed = await client.request("thread/list", {})
        assert tid in [t["id"] for t in listed["threads"]]
        await client.close_stdin()
        with trio.fail_after(scaled(20)):
            await process.wait()
        nursery.cancel_scope.cancel()


async def test_only_a_corrupt_database_is_called_corrupt(tmp_path: Path, roost_home: Path) -> None:
    (roost_home / "roost.db").write_bytes(b"this is not a database at all" * 100)
    result = await trio.run_process([*roost_argv(), "sessions", "--json"], env=scripted_env(roost_home),
                                    capture_stdout=True, capture_stderr=True, check=False, cwd=str(tmp_path))
    out = (result.stdout + result.stderr).decode()
    assert result.returncode != 0
    assert "integrity check" in out and "move it aside" in out, out
    assert "Traceback" not in out


def test_a_read_only_home_serves_read_only_queries(tmp_path: Path, roost_home: Path) -> None:
    env = {**os.environ, "ROOST_HOME": str(roost_home)}

    def roost(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*roost_argv(), *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=scaled(60), check=False)

    assert roost("schedule", "add", "nightly", "--cron", "0 3 * * *", "--task", "t").returncode == 0
    files = [roost_home, *roost_home.iterdir()]
    if os.geteuid() != 0:
        for path in files:
            os.chmod(path, 0o555 if path.is_dir() else 0o444)
    elif not all(_chattr("+i", path) for path in reversed(files)):
        pytest.skip("cannot make the home read-only here (no chattr +i)")
    try:
        listed = roost("schedule", "list")
        assert listed.returncode == 0 and "nightly" in listed.stdout, listed.stderr
        sessions = roost("sessions", "--json")
        assert sessions.returncode == 0 and '"items"' in sessions.stdout, sessions.stdout
        status = roost("status")
        assert status.returncode == 0 and "nightly" in status.stdout, status.stderr
        refused = roost("schedule", "add", "other", "--cron", "0 4 * * *", "--task", "t")
        assert refused.returncode == 2 and "writable" in refused.stderr and "move it aside" not in refused.stderr
        assert "Traceback" not in listed.stderr + sessions.stderr + status.stderr + refused.stderr
    finally:
        for path in files:
            if os.geteuid() == 0:
                _chattr("-i", path)
            else:
                os.chmod(path, 0o755 if path.is_dir() else 0o644)
