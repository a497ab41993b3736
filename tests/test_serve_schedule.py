"""The cron Scheduler inside `roost serve`: a schedule fires as a daemon task, seen by attached clients."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import trio
from click.testing import CliRunner

from _helpers.appserver import roost_argv
from _helpers.serve_client import open_daemon
from roost.cli._main import main
from _helpers.timing import scaled


def roost(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*roost_argv(), *args], capture_output=True, text=True, timeout=scaled(60), env=env)


async def test_schedule_run_fires_once_through_the_daemon(tmp_path: Path, roost_home: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [], "default": "echo"}))
    added = roost("schedule", "add", "nightly", "--cron", "0 3 * * *", "--task", "scheduled hello",
                  "--work-dir", str(tmp_path))
    assert added.returncode == 0, added.stderr
    async with open_daemon(script=script, args=["--work-dir", str(tmp_path)]) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")
            fired = roost("schedule", "run", "nightly")  # fire now: the running scheduler picks it up
            assert fired.returncode == 0, fired.stderr
            # its socket is outside $ROOST_HOME/run: seen by its scheduler claiming the request
            assert fired.stderr == "run of nightly requested; the running daemon starts it\n"
            assert fired.stdout == ""
            started = await client.wait_for("agent_starting")
            sid = started["sessionId"]
            with trio.fail_after(scaled(30)):
                while True:
                    listed = json.loads(roost("schedule", "list", "--json").stdout)
                    job = listed["items"][0]
                    if job["lastRun"] is not None and job["name"] == "nightly":
                        break
                    await trio.sleep(0.2)
            assert job["nextRun"] is not None and job["due"] is False
            # the run is a session like any daemon task, complete once it finished
            with trio.fail_after(scaled(30)):
                while True:
                    sessions = json.loads(roost("sessions", "--json", "--all").stdout)["items"]
                    if sessions and sessions[0]["isComplete"]:
                        break
                    await trio.sleep(0.2)
            assert sessions[0]["sessionId"] == sid and sessions[0]["task"] == "scheduled hello"



async def test_schedule_run_sees_the_daemon_by_its_socket_lock(tmp_path: Path, monkeypatch) -> None:
    # a daemon whose socket is in $ROOST_HOME/run (the default place) is seen by its lock at once;
    # once it stopped, `schedule run` says the request waits for the next daemon
    import shutil
    import tempfile

    from roost.cli import _schedule

    home = Path(tempfile.mkdtemp(prefix="rh-", dir="/tmp"))  # short: AF_UNIX paths are <= 107 bytes
    try:
        monkeypatch.setenv("ROOST_HOME", str(home))
        script = tmp_path / "script.json"
        script.write_text(json.dumps({"rules": [], "default": "echo"}))
        assert roost("schedule", "add", "nightly", "--cron", "0 3 * * *", "--task", "hi",
                     "--work-dir", str(tmp_path)).returncode == 0
        (home / "run").mkdir(mode=0o700, exist_ok=True)
        async with open_daemon(script=script, socket=str(home / "run" / "d.sock"),
                               args=["--work-dir", str(tmp_path)]):
            assert _schedule._daemon_running() is True
            fired = roost("schedule", "run", "nightly")
            assert fired.returncode == 0, fired.stderr
            assert fired.stderr == "run of nightly requested; the running daemon starts it\n"
        assert _schedule._daemon_running() is False
        monkeypatch.setattr(_schedule, "CLAIM_WAIT", 0.3)
        fired = await trio.to_thread.run_sync(lambda: CliRunner().invoke(main, ["schedule", "run", "nightly"]))
        assert fired.exit_code == 0, fired.stderr
        assert fired.stderr == "run of nightly requested; no roost serve is running: it starts when one does\n"
    finally:
        shutil.rmtree(home, ignore_errors=True)
