"""The cron Scheduler inside `roost serve`: a schedule fires as a daemon task, seen by attached clients."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import trio

from _helpers.appserver import roost_argv
from _helpers.serve_client import open_daemon


def roost(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*roost_argv(), *args], capture_output=True, text=True, timeout=60)


async def test_schedule_run_fires_once_through_the_daemon(tmp_path: Path, roost_home: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [], "default": "echo"}))
    added = roost("schedule", "add", "nightly", "--cron", "0 3 * * *", "--task", "scheduled hello",
                  "--work-dir", str(tmp_path))
    assert added.returncode == 0, added.stderr
    async with open_daemon(script=script) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")
            fired = roost("schedule", "run", "nightly")  # fire now: the running scheduler picks it up
            assert fired.returncode == 0, fired.stderr
            started = await client.wait_for("agent_starting")
            sid = started["sessionId"]
            with trio.fail_after(30):
                while True:
                    listed = json.loads(roost("schedule", "list", "--json").stdout)
                    job = listed["items"][0]
                    if job["lastRun"] is not None and job["name"] == "nightly":
                        break
                    await trio.sleep(0.2)
            assert job["nextRun"] is not None and job["due"] is False
            # the run is a session like any daemon task, complete once it finished
            with trio.fail_after(30):
                while True:
                    sessions = json.loads(roost("sessions", "--json", "--all").stdout)["items"]
                    if sessions and sessions[0]["isComplete"]:
                        break
                    await trio.sleep(0.2)
            assert sessions[0]["sessionId"] == sid and sessions[0]["task"] == "scheduled hello"
