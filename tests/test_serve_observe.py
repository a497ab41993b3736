"""Seeing into `roost serve` (issue 17): structured logs, `roost status`, Prometheus `/metrics`."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import httpx
import trio
from _helpers.appserver import roost_argv
from _helpers.serve_client import open_daemon
from _helpers.timing import scaled

SCRIPT = {
    "rules": [
        {"match": {"prompt": "^approve"},
         "steps": [[{"tool_call": {"name": "shell", "arguments": {"command": "echo approved-run"}}}],
                   [{"text": "tool said: {tool_output}"}]]},
        {"match": {"prompt": "^slow"}, "steps": [[{"text": "working"}, {"delay": 120}, {"text": "never"}]]},
    ],
    "default": "echo",
}


def roost(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*roost_argv(), *args], capture_output=True, text=True, timeout=scaled(60), cwd=cwd)


def _script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(SCRIPT))
    return path


def _log_lines(home: Path) -> list[dict]:
    path = home / "logs" / "roost.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def _wait_log(home: Path, event: str, count: int = 1) -> list[dict]:
    with trio.fail_after(scaled(30)):
        while True:
            if (home / "logs" / "roost.log").exists():
                found = [d for d in _log_lines(home) if d.get("event") == event]
                if len(found) >= count:
                    return found
            await trio.sleep(0.1)


async def test_daemon_logs_tasks_clients_approvals_and_schedules(tmp_path: Path, roost_home: Path) -> None:
    script = _script(tmp_path)
    assert roost("schedule", "add", "nightly", "--cron", "0 3 * * *", "--task", "scheduled", cwd=tmp_path).returncode == 0
    err = (tmp_path / "serve.err").open("wb")
    async with open_daemon(script=script, args=["--work-dir", str(tmp_path)], stderr=err) as daemon:
        async with daemon.unix() as client:
            await client.wait_for("hello")
            await client.send({"type": "user_input", "text": "approve this"})
            await client.wait_for("approval_request")
            await client.send({"type": "approval_response", "approved": True})
            result = await client.wait_for("result")
            assert result["succeeded"] is True
            assert roost("schedule", "run", "nightly").returncode == 0
            fired = (await _wait_log(roost_home, "schedule_fired"))[0]
            await _wait_log(roost_home, "task_finished", 2)
        await _wait_log(roost_home, "client_dropped")
    err.close()
    lines = _log_lines(roost_home)
    events = [d.get("event") for d in lines]
    for event in ("daemon_started", "client_connected", "task_accepted", "task_started", "approval_asked",
                  "approval_answered", "task_finished", "schedule_fired", "client_dropped"):
        assert event in events, (event, events)
    assert all({"ts", "level", "logger", "msg", "pid"} <= set(d) for d in lines)
    assert all(d["logger"].startswith("roost.") for d in lines)
    (answered,) = [d for d in lines if d.get("event") == "approval_answered"]
    assert answered["approved"] is True and answered["task_id"] == result["sessionId"]
    finished = {d["task_id"]: d for d in lines if d.get("event") == "task_finished"}
    assert finished[result["sessionId"]]["succeeded"] is True
    assert fired["schedule"] == "nightly" and finished[fired["task_id"]]["source"] == "schedule"
    # the supervision tree's stop messages come through the roost.supervisor logger, to the file
    assert any(d["logger"] == "roost.supervisor" for d in lines)
    # readable lines on stderr, not JSON
    stderr = (tmp_path / "serve.err").read_text()
    assert " INFO roost.serve: task " in stderr and "schedule 'nightly' fired" in stderr
    assert not any(line.startswith("{") for line in stderr.splitlines())


def test_the_supervisor_logger_is_routed_to_the_file(tmp_path: Path) -> None:
    from roost.cli._logs import setup_daemon_logging

    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging.getLogger("roost").handlers[:], logging.getLogger("roost").level)
    try:
        path = setup_daemon_logging(False, tmp_path)
        logging.getLogger("roost.supervisor").warning("root: child scheduler exited (boom); restarting",
                                                      extra={"event": "child_restarted", "child": "scheduler"})
        logging.getLogger("roost.supervisor").debug("not logged without -v")
        for handler in logging.getLogger("roost").handlers:
            handler.flush()
        (line,) = [json.loads(x) for x in path.read_text().splitlines()]
        assert line["logger"] == "roost.supervisor" and line["event"] == "child_restarted"
        assert line["child"] == "scheduler" and line["level"] == "WARNING"
        setup_daemon_logging(True, tmp_path)   # -v: debug too
        logging.getLogger("roost.serve").debug("a debug detail")
        for handler in logging.getLogger("roost").handlers:
            handler.flush()
        assert json.loads(path.read_text().splitlines()[-1])["msg"] == "a debug detail"
    finally:
        for handler in logging.getLogger("roost").handlers:
            handler.close()
        root.handlers[:], _, logging.getLogger("roost").handlers[:], _ = saved
        root.setLevel(saved[1])
        logging.getLogger("roost").setLevel(saved[3])


async def test_status_shows_daemons_queue_clients_tree_and_schedules(tmp_path: Path, roost_home: Path) -> None:
    script = _script(tmp_path)
    assert roost("schedule", "add", "nightly", "--cron", "0 3 * * *", "--task", "t", cwd=tmp_path).returncode == 0
    none = roost("status")
    assert none.returncode == 0 and "no roost serve is running for this home" in none.stdout
    assert "nightly" in none.stdout
    doc = json.loads(roost("status", "--json").stdout)
    assert doc["daemons"] == [] and [s["name"] for s in doc["schedules"]] == ["nightly"]
    async with open_daemon(script=script, args=["--work-dir", str(tmp_path)]) as daemon:
        async with daemon.ws(client_id="watcher") as client:
            await client.wait_for("hello")
            await client.send({"type": "user_input", "text": "slow one"})
            await client.wait_for("agent_starting")
            await client.send({"type": "user_input", "text": "queued behind it"})
            await client.wait_for("queued", lambda e: e["position"] == 0)
            doc = json.loads(roost("status", "--json").stdout)
            (d,) = doc["daemons"]
            assert d["pid"] == daemon.info["pid"] and d["workDir"] == str(tmp_path.resolve())
            assert [t["task"] for t in d["running"]] == ["slow one"]
            assert d["running"][0]["runsHere"] is True and d["running"][0]["runner"].split(":")[1] == str(d["pid"])
            (entry,) = [json.loads(p.read_text()) for p in (roost_home / "run" / "daemons").glob("*.json")]
            assert entry["database"] == str(roost_home / "roost.db") == doc["database"] and doc["warnings"] == []
            assert [(t["task"], t["position"]) for t in d["queue"]] == [("queued behind it", 0)]
            # the attached client, and not the status query's own connection
            assert [c["client"].rsplit("/", 1)[-1] for c in d["clients"]] == ["watcher"]
            assert "scheduler" in d["tree"] and "store_writer" in d["tree"]
            assert doc["schedules"][0]["nextRun"] is not None
            text = roost("status").stdout
            assert "running 1, queued 1" in text and "supervision tree:" in text and "watcher" in text
            # the status question is answered on the socket itself
            async with daemon.unix() as raw:
                await raw.wait_for("hello")
                await raw.send({"type": "status"})
                answer = await raw.wait_for("status")
                assert answer["running"][0]["task"] == "slow one"
    after = roost("status")
    assert "no roost serve is running" in after.stdout and "nightly" in after.stdout


async def test_metrics_endpoint_follows_the_token_rules(tmp_path: Path) -> None:
    script = _script(tmp_path)
    async with open_daemon(script=script, token="s3cret") as daemon:
        url = f"http://127.0.0.1:{daemon.port}/metrics"
        async with daemon.ws(client_id="a") as client:
            await client.wait_for("hello")
            await client.send({"type": "user_input", "text": "hello there"})
            await client.wait_for("result")
            start = len(client.events)
            await client.send({"type": "user_input", "text": "slow stop me"})
            await client.wait_for("token", start=start)
            await client.send({"type": "interrupt"})
            stopped = await client.wait_for("result", start=start)
            assert stopped["succeeded"] is False

            def get(**headers: str) -> httpx.Response:
                return httpx.get(url, headers=headers, timeout=scaled(10))

            assert (await trio.to_thread.run_sync(get)).status_code == 401
            assert (await trio.to_thread.run_sync(lambda: get(authorization="Bearer wrong"))).status_code == 401
            assert (await trio.to_thread.run_sync(
                lambda: get(authorization="Bearer s3cret", origin="http://evil"))).status_code == 403
            ok = await trio.to_thread.run_sync(lambda: get(authorization="Bearer s3cret"))
    assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/plain")
    body = ok.text
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(body) for s in fam.samples}
    assert samples[("roost_tasks_accepted_total", (("source", "client"),))] == 2
    assert samples[("roost_tasks_finished_total", (("outcome", "succeeded"),))] == 1
    assert samples[("roost_tasks_finished_total", (("outcome", "interrupted"),))] == 1   # not "failed"
    assert ("roost_tasks_finished_total", (("outcome", "failed"),)) not in samples
    assert samples[("roost_turns_total", (("status", "completed"),))] == 1
    assert samples[("roost_tokens_total", (("kind", "output"),))] > 0
    assert samples[("roost_provider_request_seconds_count", (("provider", "scripted"),))] == 2
    assert samples[("roost_connections", ())] == 1 and samples[("roost_queue_depth", ())] == 0
    assert ("roost_supervisor_restarts", ()) in samples


def test_status_of_a_home_that_does_not_exist_creates_nothing(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "never" / "home"
    monkeypatch.setenv("ROOST_HOME", str(home))
    done = roost("status", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["daemons"] == [] and not (tmp_path / "never").exists()
    home.parent.mkdir()
    home.write_text("")  # a file where the home should be: exit 2 with the reason
    bad = roost("status")
    assert bad.returncode == 2 and "not a directory" in bad.stderr


def test_status_creates_no_database_and_names_the_one_the_daemons_use(roost_home: Path) -> None:
    import os
    import socket

    fresh = roost("status", "--json")
    assert fresh.returncode == 0, fresh.stderr
    doc = json.loads(fresh.stdout)
    assert (doc["database"], doc["warnings"], doc["schedules"]) == (None, [], [])
    assert not (roost_home / "roost.db").exists()  # a read-only command writes no file
    # a daemon of this home on PostgreSQL (its registry entry; this test's pid stands in for it)
    registry = roost_home / "run" / "daemons"
    registry.mkdir(parents=True)
    (registry / f"{os.getpid()}.json").write_text(json.dumps({
        "pid": os.getpid(), "socket": str(roost_home / "none.sock"), "workDir": "/w", "httpPort": None,
        "startedAt": "2026-01-01T00:00:00Z", "database": "postgresql://roost:***@db.example:5432/roost"}))
    told = roost("status", "--json")
    doc = json.loads(told.stdout)
    (warning,) = doc["warnings"]
    assert "postgresql://roost:***@db.example:5432/roost" in warning and "--database-url" in warning
    assert "ROOST_DATABASE_URL" in warning and warning in told.stderr
    assert doc["daemons"][0]["database"] == "postgresql://roost:***@db.example:5432/roost"
    text = roost("status")
    assert "db.example" in text.stderr and "database: none yet" in text.stdout
    assert not (roost_home / "roost.db").exists()
    # an unreachable database: the error envelope on stdout, exit status 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = roost("status", "--json", "--database-url", f"postgresql://roost:hunter2@127.0.0.1:{port}/roost")
    assert down.returncode == 2
    envelope = json.loads(down.stdout)
    assert envelope["protocolVersion"] == 1 and "cannot reach the database server" in envelope["error"]
    assert "hunter2" not in down.stdout + down.stderr

