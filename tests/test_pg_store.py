"""The PostgreSQL backend (issue 13): opening, migrations, setting errors, and the lease contract
where N nodes differ from one file (row locks, concurrent contenders).

What both backends promise alike is tested on both in tests/test_store.py and tests/test_leases.py
(the store interface, the writer, kill -9, read-only reads, error translation, the lease clock).
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from pathlib import Path

import psycopg
import pytest

import roost.storage as storage
from roost.errors import (
    DatabasePermissionDenied,
    DatabaseSettingError,
    DatabaseUnreachable,
    DatabaseUrlInvalid,
    LeaseHeld,
    SchemaTooNew,
    StaleLease,
)
from roost.storage import PostgresStore, open_backend, open_postgres_store, pg_migrations, pg_schema_version
from _helpers.timing import scaled


@pytest.fixture
def pg(pg_url: str):
    s = open_postgres_store(pg_url)
    yield s
    s.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- opening and migrations ----------------------------------------------------------------------


def test_the_same_migration_list_creates_both_schemas(pg_url: str, tmp_path: Path) -> None:
    with storage.open_store(tmp_path / "roost.db") as sqlite_store, sqlite_store.read() as conn:
        sqlite_names = storage.schema_version(conn)
        sqlite_tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    with open_postgres_store(pg_url) as pg, pg.read() as conn:
        assert pg_schema_version(conn) == sqlite_names == [name for name, _ in pg_migrations()]
        pg_tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        columns = dict(conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'leases'"
        ).fetchall())
    roost_tables = {t for t in sqlite_tables if not t.startswith(("_sqlite", "items_fts", "sqlite_"))}
    assert roost_tables <= pg_tables, roost_tables - pg_tables
    assert columns["expires_at"] == "double precision"


def test_migrations_are_idempotent_and_concurrent_openers_serialise(pg_url: str) -> None:
    results: list[object] = []

    def open_one() -> None:
        try:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                results.append(storage.migrate_pg(conn))
        except Exception as exc:  # noqa: BLE001
            results.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [name for name, _ in pg_migrations()]
    assert sorted(results, key=len) == [[], [], every]  # one applied everything, the others nothing
    with open_postgres_store(pg_url) as pg, pg.read() as conn:
        assert pg_schema_version(conn) == every


def test_item_text_is_searchable_through_the_translated_fts(pg: PostgresStore) -> None:
    with pg.transaction() as conn:
        conn.execute("INSERT INTO threads (id, created_at, updated_at) VALUES ('t', 'x', 'x')")
        conn.execute(
            "INSERT INTO items (id, thread_id, seq, type, text, created_at)"
            " VALUES ('i1', 't', 1, 'user_message', 'the quick brown fox', 'x'),"
            " ('i2', 't', 2, 'user_message', 'lazy dogs', 'x')"
        )
    with pg.read() as conn:
        hits = conn.execute("SELECT id FROM items WHERE text_search @@ to_tsquery('simple', 'fox')").fetchall()
    assert hits == [("i1",)]


def test_a_schema_newer_than_the_code_is_refused(pg_url: str) -> None:
    open_postgres_store(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("INSERT INTO roost_migrations (name, applied_order) VALUES ('9999_from_the_future', 99)")
    with pytest.raises(SchemaTooNew) as err:
        open_postgres_store(pg_url)
    assert "ROOST_DATABASE_URL" in str(err.value) and "9999_from_the_future" in str(err.value)
    assert err.value.setting == "ROOST_DATABASE_URL"


# -- the setting and its errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["mysql://root@localhost/roost", "postgresql://h:notaport/db", "postgresql://h/db?bogus=1", "postgresql://h:0/db"],
)
def test_a_wrong_url_is_a_typed_error_naming_the_setting(url: str) -> None:
    with pytest.raises(DatabaseUrlInvalid) as err:
        open_backend(url)
    assert "ROOST_DATABASE_URL" in str(err.value)


def test_an_unreachable_server_is_a_typed_error_without_the_password() -> None:
    url = f"postgresql://roost:s3cret@127.0.0.1:{_free_port()}/roost"
    with pytest.raises(DatabaseUnreachable) as err:
        open_backend(url)
    message = str(err.value)
    assert "ROOST_DATABASE_URL" in message and "s3cret" not in message and "***" in message


def test_a_missing_database_is_unreachable(pg_server) -> None:
    with pytest.raises(DatabaseUnreachable, match="ROOST_DATABASE_URL"):
        open_backend(pg_server.url_for("no_such_database"))


def test_a_missing_permission_is_a_typed_error(pg_url: str, pg_server) -> None:
    """PostgreSQL 15 gives no CREATE on schema public to other roles: Roost cannot make its tables."""
    with psycopg.connect(pg_server.admin_url, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS roost_reader")
        admin.execute("CREATE ROLE roost_reader LOGIN")
    base = pg_url.replace("//roost@", "//roost_reader@")
    with pytest.raises(DatabasePermissionDenied) as err:
        open_postgres_store(base)
    assert "ROOST_DATABASE_URL" in str(err.value)
    assert isinstance(err.value, DatabaseSettingError)


def test_the_url_setting_selects_the_backend(pg_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROOST_DATABASE_URL", pg_url)
    with open_backend() as chosen:
        assert isinstance(chosen, PostgresStore)
    monkeypatch.setenv("ROOST_DATABASE_URL", "")
    with open_backend(path=tmp_path / "r.db") as chosen:
        assert isinstance(chosen, storage.Store)


# -- leases: row locks, races (the database clock: tests/test_leases.py, on both backends) -------


def _wait_until_blocked(pg_url: str, pid: int) -> None:
    """Return once backend ``pid`` waits on a lock (observed in pg_stat_activity, not slept on)."""
    deadline = time.monotonic() + 30
    with psycopg.connect(pg_url, autocommit=True) as watcher:
        while time.monotonic() < deadline:
            row = watcher.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            if row and row[0] == "Lock":
                return
            time.sleep(0.01)
    raise AssertionError(f"backend {pid} never blocked on a lock")


def _contend(pg_url: str, key: str, owner: str, started: threading.Event, pids: list[int], out: list[str]) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        pids.append(conn.info.backend_pid)
        started.set()
        try:
            with conn.transaction():
                lease = PostgresStore.acquire(conn, key, owner, 30.0)
            out.append(f"won {lease.token}")
        except LeaseHeld:
            out.append("held")


def test_two_connections_race_and_exactly_one_wins(pg: PostgresStore, pg_url: str) -> None:
    """The first contender holds its uncommitted acquisition while the second blocks on the row;
    after the commit the second sees a live lease. Both orders of a fresh and an existing row."""
    for key, prepare in (("fresh", False), ("existing", True)):
        if prepare:
            with pg.transaction() as conn:
                pg.release(conn, pg.acquire(conn, key, "old", 1.0))
        with psycopg.connect(pg_url, autocommit=True) as first:
            outcomes: list[str] = []
            pids: list[int] = []
            started = threading.Event()
            with first.transaction():
                mine = PostgresStore.acquire(first, key, "P1", 30.0)
                second = threading.Thread(target=_contend, args=(pg_url, key, "P2", started, pids, outcomes))
                second.start()
                started.wait(30)
                _wait_until_blocked(pg_url, pids[0])
            outcomes.append(f"won {mine.token}")
            second.join(30)
        assert sorted(outcomes) == ["held", f"won {2 if prepare else 1}"], outcomes


def test_many_simultaneous_contenders_one_winner(pg_url: str, pg: PostgresStore) -> None:
    outcomes: list[str] = []
    pids: list[int] = []
    barrier = threading.Barrier(6)

    def go(owner: str) -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            barrier.wait(30)
            try:
                outcomes.append(f"won {PostgresStore.acquire(conn, 'thread:race', owner, 30.0).token}")
            except LeaseHeld:
                outcomes.append("held")

    threads = [threading.Thread(target=go, args=(f"P{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["held"] * 5 + ["won 1"], (outcomes, pids)


def test_a_paused_holder_past_expiry_cannot_write(pg: PostgresStore) -> None:
    """A holder that stops renewing (paused) loses the lease when the database's clock passes its
    expiry; its guarded write then changes nothing."""
    with pg.transaction() as conn:
        paused = pg.acquire(conn, "thread:t1", "paused-node", 0.2)
    while True:  # wait for the database, not a local timer, to say it expired
        try:
            with pg.transaction() as conn:
                taker = pg.acquire(conn, "thread:t1", "taker", 60.0)
            break
        except LeaseHeld:
            time.sleep(0.02)
    assert taker.token == paused.token + 1
    with pytest.raises(StaleLease):
        with pg.transaction() as conn:
            pg.acquire(conn, "written-by-the-paused-node", "paused-node", 60.0)
            pg.check_fence(conn, paused.key, paused.token)
    with pytest.raises(StaleLease):
        with pg.transaction() as conn:
            pg.renew(conn, paused)
    with pg.read() as conn:
        assert pg.get_lease(conn, "written-by-the-paused-node") is None
        assert pg.get_lease(conn, "thread:t1")["owner"] == "taker"


def test_a_takeover_waits_for_a_guarded_write_in_flight(pg: PostgresStore, pg_url: str) -> None:
    """check_fence locks the lease row FOR SHARE: a takeover that starts between the check and the
    commit waits for the write's commit, so the write was made while its token still held."""
    with pg.transaction() as conn:
        holder = pg.acquire(conn, "thread:t1", "A", 60.0, now=100.0)
    outcomes: list[str] = []
    pids: list[int] = []
    started = threading.Event()

    def take_over() -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            pids.append(conn.info.backend_pid)
            started.set()
            with conn.transaction():
                outcomes.append(f"took {PostgresStore.acquire(conn, 'thread:t1', 'B', 60.0, now=500.0).token}")

    with psycopg.connect(pg_url, autocommit=True) as writer:
        with writer.transaction():
            PostgresStore.check_fence(writer, holder.key, holder.token)
            taker = threading.Thread(target=take_over)
            taker.start()
            started.wait(30)
            _wait_until_blocked(pg_url, pids[0])
            assert outcomes == []  # still waiting on the guarded write
            PostgresStore.acquire(writer, "guarded-write", "A", 60.0)
        taker.join(30)
    assert outcomes == ["took 2"]
    with pg.transaction() as conn:  # check_fence locks FOR SHARE: a write transaction on PostgreSQL
        assert pg.get_lease(conn, "guarded-write")["owner"] == "A"
        with pytest.raises(StaleLease):
            pg.check_fence(conn, holder.key, holder.token)


# -- the fixture itself --------------------------------------------------------------------------


@pytest.mark.parametrize(("ci", "outcome"), [("true", "1 error"), ("", "1 skipped")])
def test_without_a_server_ci_fails_and_a_laptop_skips(ci: str, outcome: str, tmp_path: Path) -> None:
    import os
    import sys

    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import pytest\n"
        "import _helpers.postgres as p\n"
        "p._bindir = lambda: None  # as on a machine without the postgresql package\n"
        "@pytest.fixture\n"
        "def server():\n"
        "    with p.start_cluster() as s:\n"
        "        yield s\n"
        "def test_needs_postgres(server):\n"
        "    pass\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ROOST_TEST_DATABASE_URL"}
    env.update(CI=ci, PYTHONPATH=str(Path(__file__).parent))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(probe), "-q", "-p", "no:cacheprovider", "-p", "no:trio"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=scaled(120),
    )
    assert outcome in done.stdout, done.stdout + done.stderr


# -- through the real `roost` command -------------------------------------------------------------


def _roost(roost_cmd: list[str], *args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "ROOST_DATABASE_URL"}
    if url is not None:
        env["ROOST_DATABASE_URL"] = url
    return subprocess.run([*roost_cmd, *args], env=env, capture_output=True, text=True, timeout=scaled(120))


def test_roost_db_check_opens_and_migrates_the_postgres_database(roost_cmd: list[str], pg_url: str) -> None:
    done = _roost(roost_cmd, "db", "check", url=pg_url)
    assert done.returncode == 0, done.stderr
    assert "backend: postgresql" in done.stdout
    assert f"schema: {len(pg_migrations())} migrations" in done.stdout
    assert "queued tasks: 0" in done.stdout and "lease holders: 0" in done.stdout
    # the server's clock as ISO 8601 UTC (wire-protocol.md: timestamps are ISO 8601 strings in UTC)
    (clock,) = [line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("server clock: ")]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", clock), clock
    with open_postgres_store(pg_url) as pg, pg.transaction() as conn:
        pg.enqueue_daemon_task(conn, payload={"task": "x"})
        pg.acquire(conn, "thread:a", "node-a:1:x", 60.0)
        pg.acquire(conn, "thread:b", "node-a:1:x", 60.0)
        pg.acquire(conn, "thread:c", "node-b:2:y", 60.0)
        pg.acquire(conn, "thread:old", "node-c:3:z", 1.0, now=0.0)  # long expired: not listed
    by_option = _roost(roost_cmd, "db", "check", "--database-url", pg_url, url="mysql://ignored")
    assert by_option.returncode == 0 and "backend: postgresql" in by_option.stdout, by_option.stderr
    assert "queued tasks: 1" in by_option.stdout and "lease holders: 2" in by_option.stdout
    assert "  node-a:1:x: 2 leases" in by_option.stdout and "  node-b:2:y: 1 leases" in by_option.stdout
    assert "node-c" not in by_option.stdout
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM roost_migrations").fetchone()[0] == len(pg_migrations())


def test_roost_db_check_reports_each_setting_error_in_one_line(
    roost_cmd: list[str], pg_url: str, pg_server
) -> None:
    with psycopg.connect(pg_server.admin_url, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS roost_nobody")
        admin.execute("CREATE ROLE roost_nobody LOGIN")
    open_postgres_store(pg_url).close()
    future = pg_url
    cases = {
        "must start with postgresql://": "sqlite:///tmp/x.db",
        "cannot reach the database server": f"postgresql://roost:hunter2@127.0.0.1:{_free_port()}/roost",
        "lacks a privilege": pg_server.url_for("postgres").replace("//roost@", "//roost_nobody@"),
        # a server that answers, without that database: named as such, with how to create it
        'the database "roost_no_such_db" of': pg_server.url_for("roost_no_such_db"),
    }
    for expected, url in cases.items():
        done = _roost(roost_cmd, "db", "check", url=url)
        assert done.returncode == 1, (url, done.stdout, done.stderr)
        assert expected in done.stderr and "ROOST_DATABASE_URL" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "hunter2" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        if "no_such_db" in url:
            assert "does not exist" in done.stderr and "createdb" in done.stderr and "cannot reach" not in done.stderr
    with psycopg.connect(future, autocommit=True) as conn:
        conn.execute("INSERT INTO roost_migrations (name, applied_order) VALUES ('9999_next', 99)")
    done = _roost(roost_cmd, "db", "check", url=future)
    assert done.returncode == 1 and "newer Roost" in done.stderr and "Traceback" not in done.stderr


def test_a_cron_slot_is_claimed_once_by_simultaneous_nodes(pg: PostgresStore, pg_url: str) -> None:
    with pg.transaction() as conn:
        job = pg.add_job(conn, name="j", cron="* * * * *", task="t", next_run=None)
    outcomes: list[str | None] = []
    barrier = threading.Barrier(5)

    def node(owner: str) -> None:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            barrier.wait(30)
            with conn.transaction():
                outcomes.append(PostgresStore.claim_slot(conn, job.id, "2026-01-01T00:00:00Z", owner))

    threads = [threading.Thread(target=node, args=(f"N{i}",)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(outcomes) == 5 and sum(o is not None for o in outcomes) == 1, outcomes
    with pg.read() as conn:
        assert len(pg.list_job_runs(conn, job.id)) == 1
