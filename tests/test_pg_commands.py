"""Every command on the configured backend (issue 13): with ``--database-url`` /
``ROOST_DATABASE_URL`` pointing at PostgreSQL, ``roost exec``, ``roost app-server`` (threads, turns,
usage, background processes) and the ``--json`` resource queries read and write that database,
and nothing creates or touches ``$ROOST_HOME/roost.db``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psycopg
from _helpers.appserver import open_app_server, roost_argv, scripted_env
from _helpers.timing import scaled

SCRIPT = {"rules": [], "default": "echo"}


def _rows(url: str, sql: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    home = tmp_path / "home"
    home.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    return home, script


def test_exec_and_the_json_queries_use_postgres_only(tmp_path: Path, pg_url: str) -> None:
    home, script = _setup(tmp_path)
    env = scripted_env(home, script)
    done = subprocess.run([*roost_argv(), "exec", "--database-url", pg_url, "--provider", "scripted", "--script",
                           str(script), "hello from exec"], capture_output=True, text=True, timeout=scaled(120),
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "hello from exec" in done.stdout
    # the thread, its turn and its items are rows of the PostgreSQL database
    (thread_id,), = _rows(pg_url, "SELECT id FROM threads")
    assert _rows(pg_url, "SELECT status FROM turns WHERE thread_id = %s", (thread_id,)) == [("completed",)]
    assert _rows(pg_url, "SELECT count(*) FROM items WHERE thread_id = %s", (thread_id,))[0][0] >= 2
    # a schedule written and a --json resource query reading it back, the URL from the environment
    pg_env = {**env, "ROOST_DATABASE_URL": pg_url}
    added = subprocess.run([*roost_argv(), "schedule", "add", "nightly", "--cron", "0 3 * * *", "--task", "tidy",
                            "--work-dir", str(tmp_path)], capture_output=True, text=True, timeout=scaled(60), env=pg_env)
    assert added.returncode == 0, added.stderr
    assert _rows(pg_url, "SELECT name FROM schedules") == [("nightly",)]
    listed = subprocess.run([*roost_argv(), "schedule", "list", "--json"], capture_output=True, text=True,
                            timeout=scaled(60), env=pg_env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "nightly" in listed.stdout and "0 3 * * *" in listed.stdout
    status = subprocess.run([*roost_argv(), "status", "--json", "--database-url", pg_url], capture_output=True,
                            text=True, timeout=scaled(60), env=env, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["cluster"]["queue"] == {"queued": 0, "running": 0}
    assert not (home / "roost.db").exists()


async def test_app_server_threads_turns_usage_and_processes_on_postgres(tmp_path: Path, pg_url: str) -> None:
    home, script = _setup(tmp_path)
    env = scripted_env(home, script, ROOST_DATABASE_URL=pg_url)
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        thread_id = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        end = await client.run_turn(thread_id, "hello from the app-server")
        assert end["turn"]["status"] == "completed"
        usage = await client.request("usage/overview", {})
        assert isinstance(usage, dict)
        processes = await client.request("process/list", {"thread_id": thread_id})
        assert isinstance(processes, dict)
    assert _rows(pg_url, "SELECT status FROM turns WHERE thread_id = %s", (thread_id,)) == [("completed",)]
    texts = [t for (t,) in _rows(pg_url, "SELECT text FROM items WHERE thread_id = %s ORDER BY seq", (thread_id,))]
    assert any("hello from the app-server" in (t or "") for t in texts)
    assert not (home / "roost.db").exists()


def test_run_repl_and_objectives_on_postgres(tmp_path: Path, pg_url: str) -> None:
    home, script = _setup(tmp_path)
    env = scripted_env(home, script, ROOST_DATABASE_URL=pg_url)

    def roost(*args: str, stdin: str | None = None) -> str:
        done = subprocess.run([*roost_argv(), *args], capture_output=True, text=True, timeout=scaled(120), env=env,
                              cwd=tmp_path, input=stdin)
        assert done.returncode == 0, done.stderr
        return done.stdout

    roost("init")
    roost("run", "-c", ".roost/config/orchestration.yaml", "say hi")
    (run_id,), = _rows(pg_url, "SELECT id FROM threads WHERE kind = 'orchestration'")
    assert run_id in roost("sessions", "--json", "--all")
    roost("repl", stdin="hello repl\n/exit\n")
    (chat_id,), = _rows(pg_url, "SELECT id FROM threads WHERE kind = 'chat'")
    assert "hello repl" in roost("sessions", "--repl", "--json") and chat_id in roost("sessions", "--repl", "--json")
    objective = roost("objective", "create", "--title", "obj one", "--tasks", "a", "--tasks", "b").strip()
    assert _rows(pg_url, "SELECT id, title FROM objectives") == [(objective, "obj one")]
    listed = json.loads(roost("objective", "list", "--json"))
    assert [o["id"] for o in listed["items"]] == [objective]
    assert not (home / "roost.db").exists()
