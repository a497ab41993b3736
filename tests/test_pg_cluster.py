"""Three real `roost serve` daemons on one PostgreSQL database (issue 13): the shared task queue
runs each task exactly once, a killed or paused node's task is resumed elsewhere and the stale
node writes nothing, a cron slot fires once, and `roost status --json` lists the nodes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from _helpers.appserver import roost_argv
from _helpers.serve_client import Daemon, open_daemon
from _helpers.timing import scaled

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")

#: Short leases so a dead node's tasks move within seconds (one TTL).
TTL = "3"
SCRIPT = {
    "rules": [
        {"match": {"prompt": "while you were working on"}, "steps": [[{"text": "resumed and done"}]]},
        {"match": {"prompt": "^brief"}, "steps": [[{"delay": 4}, {"text": "brief done"}]]},
        {"match": {"prompt": "^slow"}, "steps": [[{"text": "working", "deltas": 1}, {"delay": 120},
                                                  {"text": "never"}]]},
    ],
    "default": "echo",
}


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(SCRIPT))
    return path


def _env(tmp_path: Path, name: str, url: str) -> dict[str, str]:
    home = tmp_path / f"home-{name}"
    home.mkdir(exist_ok=True)
    return {"ROOST_HOME": str(home), "ROOST_DATABASE_URL": url, "ROOST_LEASE_TTL": TTL,
            "ROOST_TASK_POLL_S": "0.3"}


@asynccontextmanager
async def cluster(tmp_path: Path, url: str, script: Path, n: int = 3) -> AsyncIterator[list[Daemon]]:
    """``n`` daemons, each with its own ROOST_HOME, socket, port and stderr log, on ``url``."""
    async with AsyncExitStack() as stack:
        daemons = []
        for i in range(n):
            name = "abc"[i]
            err = stack.enter_context((tmp_path / f"serve-{name}.err").open("wb"))
            daemon = await stack.enter_async_context(
                open_daemon(script=script, env=_env(tmp_path, name, url), stderr=err,
                            args=["--work-dir", str(tmp_path)]))
            daemon.name = name  # type: ignore[attr-defined]
            daemons.append(daemon)
        yield daemons


def _rows(url: str, sql: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


def _log(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"serve-{name}.err").read_text(errors="replace")


async def _wait_rows(url: str, sql: str, params: tuple, pred: Any, timeout: float = 60) -> list[tuple]:
    with trio.fail_after(scaled(timeout)):
        while True:
            rows = _rows(url, sql, params)
            if pred(rows):
                return rows
            await trio.sleep(0.1)


def _runner_pid(url: str, task_id: str) -> int:
    """The pid of the node holding the task's lease (owners are ``host:pid:nonce``)."""
    (owner,), = _rows(url, "SELECT owner FROM leases WHERE key = %s", (f"task:{task_id}",))
    return int(owner.rsplit(":", 2)[1])


async def test_tasks_dispatched_on_each_node_run_exactly_once(tmp_path: Path, pg_url: str, script: Path) -> None:
    async with cluster(tmp_path, pg_url, script) as daemons:
        async with AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(d.unix()) for d in daemons]
            for client in clients:
                await client.wait_for("hello")
            sent: dict[str, int] = {}
            for round_ in range(3):
                for i, client in enumerate(clients):
                    text = f"task {round_} from {'abc'[i]}"
                    start = len(client.events)
                    await client.send({"type": "user_input", "text": text})
                    sid = (await client.wait_for("queued", start=start))["sessionId"]
                    sent[sid] = i
            # every dispatching client gets its own task's result, whichever node ran it
            for sid, i in sent.items():
                result = await clients[i].wait_for("result", lambda e, s=sid: e["sessionId"] == s, timeout=scaled(90))
                assert result["succeeded"] is True and result["lastMessage"] == result["task"]
        # in the database: each task claimed once (token 1), one completed turn, never twice
        for sid in sent:
            assert _rows(pg_url, "SELECT token FROM leases WHERE key = %s", (f"task:{sid}",)) == [(1,)]
            assert _rows(pg_url, "SELECT status FROM turns WHERE thread_id = %s", (sid,)) == [("completed",)]
        assert {s for (s,) in _rows(pg_url, "SELECT status FROM daemon_tasks")} <= {"finished", "collected"}
        started = [line for d in "abc" for line in _log(tmp_path, d).splitlines() if " started" in line
                   and "task thr_" in line]
        assert sorted(line.split("task ")[1].split()[0] for line in started) == sorted(sent)
        # the status query lists the three nodes on the database clock, and an empty queue
        status = subprocess.run([*roost_argv(), "status", "--json", "--database-url", pg_url],
                                capture_output=True, text=True, timeout=scaled(60),
                                env={**os.environ, "ROOST_HOME": str(tmp_path / "home-a")})
        assert status.returncode == 0, status.stderr
        body = json.loads(status.stdout)
        nodes = body["cluster"]["nodes"]
        assert sorted(n["pid"] for n in nodes) == sorted(d.process.pid for d in daemons)
        assert all(n["alive"] and n["state"] == "alive" and n["ageSeconds"] >= 0 for n in nodes)
        assert all(ISO_UTC.match(n["startedAt"]) and ISO_UTC.match(n["lastSeen"]) for n in nodes)
        assert body["cluster"]["queue"] == {"queued": 0, "running": 0}
        assert body["database"] == pg_url and body["warnings"] == []
        # without the URL: nothing is created, and the status names the database the daemons use
        env = {k: v for k, v in os.environ.items() if k != "ROOST_DATABASE_URL"}
        bare = subprocess.run([*roost_argv(), "status", "--json"], capture_output=True, text=True,
                              timeout=scaled(60), env={**env, "ROOST_HOME": str(tmp_path / "home-a")})
        assert bare.returncode == 0, bare.stderr
        body = json.loads(bare.stdout)
        assert body["database"] is None and "cluster" not in body
        (warning,) = body["warnings"]
        assert pg_url in warning and "--database-url" in warning and warning in bare.stderr
        # the daemons and the status query ran on PostgreSQL alone
        assert not any((tmp_path / f"home-{n}" / "roost.db").exists() for n in "abc")


async def _dispatch_and_leave(daemon: Daemon, text: str) -> str:
    """Dispatch ``text`` as client ``alice`` on ``daemon``, then disconnect; return its sessionId."""
    async with daemon.ws(client_id="alice") as client:
        await client.wait_for("hello")
        await client.send({"type": "user_input", "text": text})
        return (await client.wait_for("queued"))["sessionId"]


async def test_a_client_reconnecting_to_another_node_gets_its_results(
        tmp_path: Path, pg_url: str, script: Path) -> None:
    async with cluster(tmp_path, pg_url, script, n=2) as (node_a, node_b):
        # a task that finished while its client was away: pendingResults on the other node
        first = await _dispatch_and_leave(node_a, "brief one")
        await _wait_rows(pg_url, "SELECT status FROM daemon_tasks WHERE id = %s", (first,),
                         lambda r: r and r[0][0] == "finished")
        async with node_b.ws(client_id="alice") as client:
            hello = await client.wait_for("hello")
            assert hello["pendingResults"] == [first] and hello["inFlight"] is None
            result = await client.wait_for("result")
            assert result["sessionId"] == first and result["lastMessage"] == "brief done"
        await _wait_rows(pg_url, "SELECT status FROM daemon_tasks WHERE id = %s", (first,),
                         lambda r: r and r[0][0] == "collected")
        # a task still running when its client moves: the new node tells it the result
        second = await _dispatch_and_leave(node_a, "brief two")
        async with node_b.ws(client_id="alice") as client:
            hello = await client.wait_for("hello")
            assert hello["inFlight"]["sessionId"] == second and hello["pendingResults"] == []
            result = await client.wait_for("result", timeout=scaled(90))
            assert result["sessionId"] == second and result["lastMessage"] == "brief done"
        await _wait_rows(pg_url, "SELECT status FROM daemon_tasks WHERE id = %s", (second,),
                         lambda r: r and r[0][0] == "collected")
        # back on the dispatching node: nothing is told twice
        async with node_a.ws(client_id="alice") as client:
            hello = await client.wait_for("hello")
            assert hello["pendingResults"] == [] and hello["inFlight"] is None
            await client.send({"type": "user_input", "text": "echo after"})
            third = (await client.wait_for("queued"))["sessionId"]
            await client.wait_for("result", lambda e: e["sessionId"] == third, timeout=scaled(90))
            assert [e["sessionId"] for e in client.of_type("result")] == [third]


async def _slow_task(client: Any) -> str:
    await client.wait_for("hello")
    start = len(client.events)
    await client.send({"type": "user_input", "text": "slow job"})
    return (await client.wait_for("queued", start=start))["sessionId"]


async def test_kill_9_of_the_running_node_resumes_the_task_elsewhere(
        tmp_path: Path, pg_url: str, script: Path) -> None:
    async with cluster(tmp_path, pg_url, script) as daemons:
        async with AsyncExitStack() as stack:
            clients = {d.process.pid: await stack.enter_async_context(d.unix()) for d in daemons}
            sid = await _slow_task(next(iter(clients.values())))
            # wait until a node streams the task's turn, then kill that node
            await _wait_rows(pg_url, "SELECT 1 FROM turns WHERE thread_id = %s AND status = 'running'", (sid,), bool)
            victim = _runner_pid(pg_url, sid)
            names = {d.process.pid: d.name for d in daemons}  # type: ignore[attr-defined]
            # the status query shows the running node holding the task's and its thread's leases, and
            # the dispatching daemon (a) says which node runs the task
            with trio.fail_after(scaled(60)):
                while True:
                    body = await _status_json(tmp_path, pg_url)
                    mine = next((t for t in body["daemons"][0]["running"] if t["sessionId"] == sid), None)
                    if mine is not None and mine["runner"] is not None:
                        break
                    await trio.sleep(0.2)
            assert mine["runsOn"] == _node(tmp_path, names[victim]) and _pid(mine["runner"]) == victim
            assert mine["runsHere"] is (victim == daemons[0].process.pid)
            cluster_ = body["cluster"]
            runner = next(n for n in cluster_["nodes"] if n["pid"] == victim)
            assert {f"task:{sid}", f"thread:{sid}"} <= set(runner["leases"]) and runner["runningTasks"] == [sid]
            assert all(n["runningTasks"] == [] for n in cluster_["nodes"] if n["pid"] != victim)
            assert cluster_["queue"] == {"queued": 0, "running": 1}
            os.kill(victim, signal.SIGKILL)
            # a node of this host whose pid is gone is gone at once, not a TTL later
            with trio.fail_after(scaled(10)):
                while _alive_not_zombie(victim):
                    await trio.sleep(0.02)
            states = {n["pid"]: n["state"] for n in (await _status_json(tmp_path, pg_url))["cluster"]["nodes"]}
            assert states[victim] == "gone"
            survivors = [c for pid, c in clients.items() if pid != victim]
            with trio.fail_after(scaled(60)):
                while not any(c.of_type("task_resumed") for c in survivors):
                    await trio.sleep(0.1)
            resumed = next(e for c in survivors for e in c.of_type("task_resumed"))
            assert resumed["sessionId"] == sid and resumed["task"] == "slow job"
            await _wait_rows(pg_url, "SELECT status FROM daemon_tasks WHERE id = %s", (sid,),
                             lambda r: r and r[0][0] in ("finished", "collected"))
            # the status query marks the killed node gone once its heartbeat is a TTL old (database
            # clock); the survivors stay alive (its row is pruned after 10 TTLs: test_cluster_store)
            with trio.fail_after(scaled(60)):
                while True:
                    status = await trio.run_process(
                        [*roost_argv(), "status", "--json", "--database-url", pg_url], capture_stdout=True,
                        env={**os.environ, "ROOST_HOME": str(tmp_path / "home-a")})
                    states = {n["pid"]: n["state"] for n in json.loads(status.stdout)["cluster"]["nodes"]}
                    if states.get(victim) == "gone":
                        break
                    await trio.sleep(0.5)
            assert all(states[pid] == "alive" for pid in clients if pid != victim)
        # claimed twice (the victim, then one survivor); one turn completed, the victim's interrupted
        assert _rows(pg_url, "SELECT token FROM leases WHERE key = %s", (f"task:{sid}",)) == [(2,)]
        logs = {d.process.pid: _log(tmp_path, d.name) for d in daemons}  # type: ignore[attr-defined]
        assert sum(log.count(f"task {sid} started (resumed)") for log in logs.values()) == 1
        assert sum(log.count(f"task {sid} finished") for log in logs.values()) == 1
        assert f"task {sid} started (resumed)" not in logs[victim] and f"task {sid} finished" not in logs[victim]
        statuses = sorted(s for (s,) in _rows(pg_url, "SELECT status FROM turns WHERE thread_id = %s", (sid,)))
        assert statuses == ["completed", "interrupted"]
        (payload,), = _rows(pg_url, "SELECT payload FROM daemon_tasks WHERE id = %s", (sid,))
        assert json.loads(payload)["result"]["lastMessage"] == "resumed and done"
        # the resumed turn's prompt says which node died and which one resumes it
        survivor = next(pid for pid, log in logs.items() if f"task {sid} started (resumed)" in log)
        assert _resume_prompt(pg_url, sid).startswith(
            f"Node {_node(tmp_path, names[victim])} (process {json.loads(payload)['resumedFrom']['owner']}) died "
            f"(its process is gone) while you were working on this task; node {_node(tmp_path, names[survivor])} "
            f"(process {json.loads(payload)['claimedBy']}) resumes it.")
        assert json.loads(payload)["resumedFrom"]["owner"].split(":")[1] == str(victim)


def _node(tmp_path: Path, name: str) -> str:
    """The node name of daemon ``name`` (``<host>:<ROOST_HOME>``)."""
    return f"{socket.gethostname()}:{tmp_path / f'home-{name}'}"


def _resume_prompt(url: str, sid: str) -> str:
    """The prompt of the task's resuming turn (its one user message that is not the task's)."""
    texts = [t for (t,) in _rows(url, "SELECT text FROM items WHERE thread_id = %s AND type = 'user_message'"
                                      " ORDER BY seq", (sid,))]
    assert len(texts) == 2, texts
    return texts[1]


def _snapshot(url: str, sid: str) -> list:
    return [
        _rows(url, "SELECT id, seq, status, text, payload FROM items WHERE thread_id = %s ORDER BY seq", (sid,)),
        _rows(url, "SELECT id, status, completed_at, error FROM turns WHERE thread_id = %s ORDER BY id", (sid,)),
        _rows(url, "SELECT status, payload, updated_at FROM daemon_tasks WHERE id = %s", (sid,)),
        _rows(url, "SELECT key, owner, token, expires_at FROM leases WHERE key IN (%s, %s) ORDER BY key",
              (f"task:{sid}", f"thread:{sid}")),
        _rows(url, "SELECT metadata, updated_at FROM threads WHERE id = %s", (sid,)),
    ]


async def test_a_paused_node_past_its_ttl_writes_nothing_when_it_wakes(
        tmp_path: Path, pg_url: str, script: Path) -> None:
    async with cluster(tmp_path, pg_url, script) as daemons:
        async with AsyncExitStack() as stack:
            clients = {d.process.pid: await stack.enter_async_context(d.unix()) for d in daemons}
            names = {d.process.pid: d.name for d in daemons}  # type: ignore[attr-defined]
            sid = await _slow_task(next(iter(clients.values())))
            await _wait_rows(pg_url, "SELECT 1 FROM turns WHERE thread_id = %s AND status = 'running'", (sid,), bool)
            paused = _runner_pid(pg_url, sid)
            os.kill(paused, signal.SIGSTOP)
            try:
                # the leases expire on the database clock; another node resumes and finishes it
                await _wait_rows(pg_url, "SELECT status FROM daemon_tasks WHERE id = %s", (sid,),
                                 lambda r: r and r[0][0] in ("finished", "collected"))
                # its final state, settled (the resuming node released the task and thread leases)
                await _wait_rows(pg_url, "SELECT owner FROM leases WHERE key IN (%s, %s)",
                                 (f"task:{sid}", f"thread:{sid}"), lambda r: all(o is None for (o,) in r))
                before = _snapshot(pg_url, sid)
            finally:
                os.kill(paused, signal.SIGCONT)
            # the woken node notices it lost the task (its renewal is refused) ...
            with trio.fail_after(scaled(60)):
                while "lost its lease" not in _log(tmp_path, names[paused]):
                    await trio.sleep(0.1)
            # ... and its turn ends without persisting anything (every write is fenced by its token)
            with trio.fail_after(scaled(60)):
                while "its end is not persisted" not in _log(tmp_path, names[paused]):
                    await trio.sleep(0.1)
            after = _snapshot(pg_url, sid)
            # nothing of the execution changed; the task row may have become ``collected`` (a woken
            # dispatcher hands the relayed result to its client), its payload (the result) unchanged
            assert after[:2] + after[3:] == before[:2] + before[3:]
            assert after[2][0][1] == before[2][0][1] and after[2][0][0] in ("finished", "collected")
            log = _log(tmp_path, names[paused])
            assert f"task {sid} finished" not in log and f"task {sid} started (resumed)" not in log
            assert before[2][0][0] in ("finished", "collected")
            assert json.loads(before[2][0][1])["result"]["lastMessage"] == "resumed and done"
            # the resumed turn's prompt says the paused node lost its lease
            assert _resume_prompt(pg_url, sid).startswith(f"Node {_node(tmp_path, names[paused])} (process ")
            assert ") lost its lease (it did not renew it in time" in _resume_prompt(pg_url, sid)


async def test_a_schedule_slot_fires_once_with_three_daemons(tmp_path: Path, pg_url: str, script: Path) -> None:
    env = {**os.environ, "ROOST_HOME": str(tmp_path / "home-a"), "ROOST_DATABASE_URL": pg_url}
    (tmp_path / "home-a").mkdir()
    added = subprocess.run([*roost_argv(), "schedule", "add", "every-minute", "--cron", "* * * * *", "--task",
                            "tick", "--work-dir", str(tmp_path), "--catch-up", "once"],
                           capture_output=True, text=True, timeout=scaled(60), env=env)
    assert added.returncode == 0, added.stderr
    # its slots of the last ten minutes passed while no daemon ran: the three daemons race for them
    with psycopg.connect(pg_url) as conn:
        conn.execute("UPDATE schedules SET next_run = to_char((now() AT TIME ZONE 'UTC') - interval '10 minutes',"
                     " 'YYYY-MM-DD\"T\"HH24:MI:00\"Z\"') WHERE name = 'every-minute'")
    async with cluster(tmp_path, pg_url, script):
        rows = await _wait_rows(
            pg_url, "SELECT outcome FROM schedule_runs r JOIN schedules s ON s.id = r.schedule_id"
                    " WHERE s.name = 'every-minute' AND r.status = 'done' AND r.outcome = 'succeeded'", (), bool)
        await trio.sleep(2)  # give the other two schedulers every chance to fire it again
        # tasks first, then runs: a new minute's slot may fire in between, never the other way
        tasks = _rows(pg_url, "SELECT payload FROM daemon_tasks")
        runs = _rows(pg_url, "SELECT slot, status, outcome FROM schedule_runs r JOIN schedules s"
                             " ON s.id = r.schedule_id WHERE s.name = 'every-minute' ORDER BY slot")
    assert len(rows) >= 1
    slots = [slot for slot, _, _ in runs]
    assert len(slots) == len(set(slots))  # one row per slot, whichever node wrote it
    fired = [r for r in runs if r[2] == "succeeded"]
    ticks = [t for (t,) in tasks if json.loads(t)["task"] == "tick"]
    # every fired slot ran its task, and no slot ran two (a slot of the minute that began during
    # the wait may have its task and not yet its outcome)
    assert len(fired) <= len(ticks) <= len(runs)


async def _status_json(tmp_path: Path, url: str) -> dict:
    """``roost status --json --database-url URL`` of daemon a's home."""
    done = await trio.run_process([*roost_argv(), "status", "--json", "--database-url", url], capture_stdout=True,
                                  env={**os.environ, "ROOST_HOME": str(tmp_path / "home-a")})
    return json.loads(done.stdout)


def _pid(owner: str) -> int:
    return int(owner.rsplit(":", 2)[1])


def _alive_not_zombie(pid: int) -> bool:
    """Whether ``pid`` runs (a killed child not yet reaped is a zombie: not running)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"

