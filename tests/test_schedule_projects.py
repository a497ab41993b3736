"""Schedules belong to a project (issue 17): two projects share one ROOST_HOME, each with its own
`roost serve`; every run goes to its own project's daemon and works in its own directory."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import trio
from _helpers.appserver import roost_argv
from _helpers.serve_client import open_daemon

from roost.storage import open_store
from _helpers.timing import scaled

RUNS = 2


def roost(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*roost_argv(), *args], capture_output=True, text=True, timeout=scaled(60), cwd=cwd)


def _by_session(client) -> dict[str, str]:
    texts: dict[str, str] = {}
    for e in client.of_type("token"):
        texts[e["sessionId"]] = texts.get(e["sessionId"], "") + e["text"]
    return texts


def _texts(client) -> list[str]:
    return list(_by_session(client).values())


def _log(home: Path) -> list[dict]:
    return [json.loads(x) for x in (home / "logs" / "roost.log").read_text().splitlines() if x.strip()]


def _sessions() -> list[dict]:
    return json.loads(roost("sessions", "--json", "--all").stdout)["items"]


async def test_two_projects_two_daemons_each_run_goes_to_its_own_project(tmp_path: Path, roost_home: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [], "default": "echo"}))
    alpha, beta = tmp_path / "alpha", tmp_path / "beta"
    alpha.mkdir()
    beta.mkdir()
    # each project adds its schedule from its own directory (no --work-dir: the current one)
    assert roost("schedule", "add", "a-job", "--cron", "0 3 * * *", "--task", "work of alpha", cwd=alpha).returncode == 0
    # beta's schedule stores its own model settings; its runs use them, not the daemon's
    assert roost("schedule", "add", "b-job", "--cron", "0 3 * * *", "--task", "work of beta",
                 "--provider", "scripted", "--model", "beta-model", cwd=beta).returncode == 0
    # cron jobs of both projects that came due while no daemon ran: each daemon catches up its own
    assert roost("schedule", "add", "a-cron", "--cron", "0 4 * * *", "--task", "cron of alpha", cwd=alpha).returncode == 0
    assert roost("schedule", "add", "b-cron", "--cron", "0 4 * * *", "--task", "cron of beta", cwd=beta).returncode == 0
    # a row written before schedules had a project: exactly one daemon adopts it
    store = open_store(roost_home / "roost.db")
    try:
        with store.transaction() as conn:
            conn.execute("UPDATE schedules SET next_run = '2020-01-01T04:00:00.000000Z' WHERE name LIKE '%-cron'")
            conn.execute("""INSERT INTO schedules (id, name, cron, created_at, updated_at, task, next_run)
                            VALUES ('s_old', 'legacy', '0 5 * * *', '2020-01-01T00:00:00.000000Z',
                                    '2020-01-01T00:00:00.000000Z', 'legacy work', NULL)""")
    finally:
        store.close()
    async with open_daemon(script=script, args=["--work-dir", str(alpha)]) as da, \
            open_daemon(script=script, args=["--work-dir", str(beta)]) as db_:
        async with da.unix() as ca, db_.unix() as cb:
            await ca.wait_for("hello")
            await cb.wait_for("hello")
            with trio.fail_after(scaled(30)):   # the legacy row is adopted by one of the two
                while (legacy := {j["name"]: j for j in json.loads(roost("schedule", "list", "--json").stdout)["items"]}
                       ["legacy"])["workDir"] is None:
                    await trio.sleep(0.1)
            assert legacy["workDir"] in (str(alpha.resolve()), str(beta.resolve()))
            for _ in range(RUNS):
                assert roost("schedule", "run", "a-job").returncode == 0
                assert roost("schedule", "run", "b-job").returncode == 0
            with trio.fail_after(scaled(180)):   # a hang guard: the runs are serial and the machine is shared
                while len(done := [s for s in _sessions() if s["isComplete"]]) != 2 * (RUNS + 1):
                    await trio.sleep(0.2)
            for client, text in ((ca, "work of alpha"), (cb, "work of beta")):   # read each client's events
                await client.wait_for("token", lambda e, c=client, t=text: _texts(c).count(t) == RUNS)
    texts_a, texts_b = _by_session(ca), _by_session(cb)
    # every run of a project went to that project's daemon, and only there (the catch-up runs may
    # have started before the clients attached: the daemon's log names the process that fired each)
    assert set(texts_a.values()) <= {"work of alpha", "cron of alpha"}
    assert set(texts_b.values()) <= {"work of beta", "cron of beta"}
    fired = [d for d in _log(roost_home) if d.get("event") == "schedule_fired"]
    by_job: dict[str, set[int]] = {}
    for d in fired:
        by_job.setdefault(d["schedule"], set()).add(d["pid"])
    assert by_job == {"a-job": {da.info["pid"]}, "a-cron": {da.info["pid"]},
                      "b-job": {db_.info["pid"]}, "b-cron": {db_.info["pid"]}}
    assert sorted(d["schedule"] for d in fired) == ["a-cron"] + ["a-job"] * RUNS + ["b-cron"] + ["b-job"] * RUNS
    by_id = {s["sessionId"]: s for s in done}
    assert {os.path.realpath(by_id[i]["workingDirectory"]) for i in texts_a} == {str(alpha.resolve())}
    assert {os.path.realpath(by_id[i]["workingDirectory"]) for i in texts_b} == {str(beta.resolve())}
    listed = {j["name"]: j for j in json.loads(roost("schedule", "list", "--json").stdout)["items"]}
    assert listed["a-job"]["lastResult"] == "succeeded" and listed["b-job"]["lastResult"] == "succeeded"
    assert (listed["b-job"]["provider"], listed["b-job"]["model"]) == ("scripted", "beta-model")
    assert listed["a-job"]["model"] is None
    store = open_store(roost_home / "roost.db")
    try:
        with store.read() as conn:
            models = {r[0]: r[1] for r in conn.execute("SELECT id, model FROM threads")}
    finally:
        store.close()
    assert {models[i] for i, t in texts_b.items() if t == "work of beta"} == {"beta-model"}
    assert "beta-model" not in {models[i] for i in texts_a}
    human = roost("schedule", "list").stdout
    assert "succeeded" in human and str(alpha.resolve()) in human


async def test_schedule_run_says_when_only_another_projects_daemon_runs(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [], "default": "echo"}))
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    assert roost("schedule", "add", "job", "--cron", "0 3 * * *", "--task", "t", cwd=mine).returncode == 0
    async with open_daemon(script=script, args=["--work-dir", str(other)]):
        fired = roost("schedule", "run", "job")
        assert fired.returncode == 0, fired.stderr
        assert f"no roost serve is running for {mine.resolve()} (only for other projects)" in fired.stderr
        listed = json.loads(roost("schedule", "list", "--json").stdout)["items"]
        assert listed[0]["lastRun"] is None   # the other project's daemon did not take it
    async with open_daemon(script=script, args=["--work-dir", str(mine)]):
        fired = roost("schedule", "run", "job")
        assert fired.stderr == "run of job requested; the running daemon starts it\n"
        with trio.fail_after(scaled(60)):
            while json.loads(roost("schedule", "list", "--json").stdout)["items"][0]["lastResult"] != "succeeded":
                await trio.sleep(0.2)
