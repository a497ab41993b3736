"""A database written by a newer Roost is refused by every command, on both backends, with one
line naming the database and what to do (issue 13: "a schema newer than the code get a clear error
naming the setting, never a traceback"); older code never writes into a newer schema."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest
from _helpers.timing import scaled

from roost.storage import open_postgres_store, open_store

INIT = (
    '{"id":"1","method":"initialize","params":{"protocol_version":"wuu-app-server/v0.1",'
    '"client":{"name":"t","version":"1"}}}\n'
)
COMMANDS = [
    (["sessions", "--json"], 1),
    (["status"], 2),
    (["exec", "hello", "--provider", "scripted"], 2),
    (["app-server", "--provider", "scripted"], 2),
]
#: each command's documented status for an unusable database (docs/operations.md "Upgrades and
#: migrations"); a --json query prints its error envelope on stdout and nothing on stderr
DOCUMENTED = [
    (["status", "--json"], 2),
    (["db", "check"], 1),
    (["schedule", "list"], 2),  # text output: an environment error, as status
    (["schedule", "list", "--json"], 1),
    (["memory", "list", "--json"], 1),
    (["objective", "list", "--json"], 1),
    (["sessions", "--json"], 1),
]


def _future_home(home: Path) -> None:
    open_store(home / "roost.db").close()
    with sqlite3.connect(home / "roost.db") as conn:
        conn.execute(
            "INSERT INTO _sqlite_migrations (migration_set, name, applied_at) VALUES ('roost', '9999_from_the_future', 'x')"
        )


def _future_pg(url: str) -> None:
    import psycopg

    open_postgres_store(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO roost_migrations (name, applied_order) VALUES ('9999_from_the_future', 99)")


@pytest.mark.parametrize("backend_name", ["sqlite", "postgres"])
@pytest.mark.parametrize(("args", "status"), COMMANDS, ids=[c[0][0] for c in COMMANDS])
def test_every_command_refuses_a_newer_schema_in_one_line(
    request: pytest.FixtureRequest, roost_cmd: list[str], roost_home: Path, backend_name: str, args: list[str], status: int
) -> None:
    env = None
    if backend_name == "sqlite":
        _future_home(roost_home)
        setting = "ROOST_HOME"
    else:
        import os

        url = request.getfixturevalue("pg_url")
        _future_pg(url)
        env = {**os.environ, "ROOST_DATABASE_URL": url}
        setting = "ROOST_DATABASE_URL"
    done = subprocess.run(
        [*roost_cmd, *args], input=INIT, capture_output=True, text=True, env=env, timeout=scaled(60)
    )
    out = done.stdout + done.stderr
    assert done.returncode == status, out
    assert "9999_from_the_future" in out and "newer Roost" in out and setting in out, out
    assert "Traceback" not in out
    assert len([line for line in done.stderr.splitlines() if "9999_from_the_future" in line]) <= 1


@pytest.mark.parametrize(("args", "status"), DOCUMENTED, ids=[" ".join(c[0]) for c in DOCUMENTED])
def test_each_command_exits_with_its_documented_status(
    roost_cmd: list[str], roost_home: Path, args: list[str], status: int
) -> None:
    _future_home(roost_home)
    done = subprocess.run([*roost_cmd, *args], capture_output=True, text=True, timeout=scaled(60))
    assert done.returncode == status, (done.stdout, done.stderr)
    if "--json" in args:
        doc = json.loads(done.stdout)
        assert set(doc) == {"protocolVersion", "error"} and "newer Roost" in doc["error"]
        assert "9999_from_the_future" not in done.stderr, done.stderr
    else:
        assert done.stdout == "" and "newer Roost" in done.stderr


def test_the_sqlite_file_is_left_as_it_was(roost_cmd: list[str], roost_home: Path) -> None:
    _future_home(roost_home)
    before = (roost_home / "roost.db").read_bytes()
    subprocess.run([*roost_cmd, "sessions", "--json"], capture_output=True, timeout=scaled(60))
    with sqlite3.connect(roost_home / "roost.db") as conn:
        names = [row[0] for row in conn.execute("SELECT name FROM _sqlite_migrations ORDER BY rowid")]
    assert names[-1] == "9999_from_the_future"
    assert len((roost_home / "roost.db").read_bytes()) == len(before)
