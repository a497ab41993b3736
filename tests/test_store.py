"""The Store: migrations, the group-commit writer, concurrency, crash safety, the data API.

Every test runs on both backends (the ``database``/``backend`` fixtures of conftest.py: a SQLite
file, a PostgreSQL database) unless it is about one backend's own mechanism, and then
tests/test_backend_coverage.py names its twin on the other backend.
"""

from __future__ import annotations

import functools
import signal
import sqlite3
from pathlib import Path

import pytest
import trio
import trio.testing
from _helpers.storage_procs import Child

import roost.storage as storage
from roost.errors import Conflict, LifecycleError, NotFound, StoreClosed, StoreError, StoreFull, UsageError
from roost.storage import (
    add_held_input,
    append_item,
    add_job,
    claim_slot,
    create_thread,
    create_turn,
    create_worker,
    enqueue_daemon_task,
    list_items,
    open_store,
    reconcile,
)
from _helpers.timing import scaled

EVERY_MIGRATION = ["0001_core", "0002_schedule_jobs", "0003_tool_processes", "0004_schedule_settings",
                   "0005_attachment_blobs", "0006_background_processes", "0007_objectives",
                   "0008_cluster_nodes", "0009_node_bus", "0010_daemon_task_status"]


def is_sqlite(store) -> bool:
    return isinstance(store, storage.Store)


def seqs(store, thread_id: str) -> list[int]:
    with store.read() as conn:
        return [item.seq for item in store.list_items(conn, thread_id)]


def applied_migrations(store) -> list[str]:
    with store.read() as conn:
        return storage.schema_version(conn) if is_sqlite(store) else storage.pg_schema_version(conn)


def table_names(store) -> set[str]:
    """The database's tables (each backend's catalogue)."""
    sql = ("SELECT name FROM sqlite_master WHERE type = 'table'" if is_sqlite(store)
           else "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    with store.read() as conn:
        return {row[0] for row in conn.execute(sql)}


def driver_errors(store) -> tuple[type[Exception], type[Exception]]:
    """(the driver's base error, its integrity error) of the store's backend."""
    if is_sqlite(store):
        return sqlite3.Error, sqlite3.IntegrityError
    import psycopg

    return psycopg.Error, psycopg.IntegrityError


def test_open_store_migrates_once_and_is_idempotent(database) -> None:
    first = database.open()
    second = database.open()
    assert applied_migrations(second) == EVERY_MIGRATION
    tables = table_names(second)
    assert {"threads", "turns", "items", "runs", "held_input", "workers", "schedules",
            "schedule_runs", "daemon_tasks", "leases", "memory", "context_files"} <= tables
    if database.kind == "sqlite":  # SQLite's own: the WAL journal and the FTS5 table
        with second.read() as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert "items_fts" in tables
    first.close()
    second.close()
    first.close()  # idempotent
    third = database.open()  # a current schema: nothing to apply, nothing doubled
    assert applied_migrations(third) == EVERY_MIGRATION


def test_open_store_default_path_is_roost_home(roost_home: Path) -> None:
    store = open_store()
    assert store.path == roost_home / "roost.db"
    assert store.path.exists()
    store.close()


def test_memory_store_is_ephemeral() -> None:
    store = open_store(":memory:")
    path = store.path
    with store.transaction() as conn:
        create_thread(conn, id="t")
    assert path.exists()
    store.close()
    assert not path.exists()
    with pytest.raises(StoreClosed):
        with store.read():
            pass


def test_a_closed_store_refuses_reads_and_transactions(database) -> None:
    store = database.open()
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreClosed):
        with store.read():
            pass
    with pytest.raises(StoreClosed):
        with store.transaction():
            pass
    with database.open().read() as conn:  # the database itself is untouched
        assert storage.list_threads(conn) == []


def test_read_connections_refuse_writes(database) -> None:
    """A read connection (SQLite ``query_only``, PostgreSQL ``READ ONLY`` transaction) refuses a
    write, raw SQL or a store operation, with StoreReadOnly; nothing is stored."""
    from roost.errors import StoreReadOnly

    store = database.open()
    # Raw SQL on SQLite's connection gets the driver's error; PostgreSQL's read() translates.
    raw_refusal = sqlite3.OperationalError if is_sqlite(store) else StoreReadOnly
    with pytest.raises(raw_refusal):
        with store.read() as conn:
            conn.execute("INSERT INTO leases (key) VALUES ('x')")
    with pytest.raises(StoreReadOnly) as refused:
        with store.read() as conn:
            store.acquire(conn, "y", "A", 10.0)
    driver_error, _ = driver_errors(store)
    assert isinstance(refused.value.__cause__, driver_error)
    with store.read() as conn:
        assert store.get_lease(conn, "x") is None and store.get_lease(conn, "y") is None


async def test_fifty_tasks_append_twenty_items_each_without_gaps(database) -> None:
    # Two stores (two writers, two write connections) on one database, so the writers really
    # contend as two processes would; no "database is locked" (or serialisation error) may reach
    # a caller.
    stores = [database.open(), database.open()]
    with stores[0].transaction() as conn:
        create_thread(conn, id="t1")
    errors: list[BaseException] = []

    async def appender(store, n: int) -> None:
        for i in range(20):
            try:
                await store.writer.submit(append_item, "t1", type="user_message",
                                          payload={"task": n, "i": i})
            except BaseException as exc:  # recorded, then asserted absent
                errors.append(exc)
                raise

    with trio.fail_after(scaled(60)):
        async with trio.open_nursery() as nursery:
            for store in stores:
                await nursery.start(store.writer.run)
            async with trio.open_nursery() as tasks:
                for n in range(50):
                    tasks.start_soon(appender, stores[n % 2], n)
            nursery.cancel_scope.cancel()
    assert errors == []
    with stores[0].read() as conn:
        items = list_items(conn, "t1")
    assert [i.seq for i in items] == list(range(1, 1001))
    for n in range(50):  # each task's items in its own order
        assert [i.payload["i"] for i in items if i.payload["task"] == n] == list(range(20))
    total = stores[0].writer.stats.writes + stores[1].writer.stats.writes
    assert total == 1000


async def test_group_commit_batches_queued_writes(database) -> None:
    store = database.open(batch_max=10)
    with store.transaction() as conn:
        create_thread(conn, id="t1")
    for i in range(95):  # queued before the writer starts: the writer finds them all waiting
        store.writer.submit_nowait(append_item, "t1", type="user_message", payload={"i": i})
    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            last = await store.writer.submit(append_item, "t1", type="user_message", payload={})
            nursery.cancel_scope.cancel()
    assert last.seq == 96
    assert store.writer.stats.writes == 96
    assert store.writer.stats.transactions == 10  # 96 writes, at most 10 per transaction
    assert store.writer.stats.largest_group == 10
    assert seqs(store, "t1") == list(range(1, 97))


async def test_an_urgent_write_commits_ahead_of_the_queue_in_a_group_of_its_own(database) -> None:
    """The group in flight stops taking writes once an urgent one waits: the urgent write commits
    right after the first write of that group, before the rest of it and the backlog."""
    import threading

    store = database.open(batch_max=10)
    with store.transaction() as conn:
        create_thread(conn, id="t1")
    order: list[str] = []
    entered, in_flight = threading.Event(), threading.Event()

    def note(conn, label: str, pad: str = "") -> str:
        if label == "queued 0":
            entered.set()
            in_flight.wait(scaled(20))  # the first group is being committed until the test says
        order.append(label)
        return label

    async def urgent() -> None:
        assert await store.writer.submit_urgent(note, "urgent") == "urgent"

    # a backlog of five groups; the first carries enough text to commit in SQLite's worker thread
    store.writer.submit_nowait(note, "queued 0", "x" * (80 << 10))
    for i in range(1, 50):
        store.writer.submit_nowait(note, f"queued {i}")
    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.writer.run)
            await trio.to_thread.run_sync(entered.wait)  # the writer is committing its first group
            nursery.start_soon(urgent)
            await trio.testing.wait_all_tasks_blocked()  # the urgent write waits
            in_flight.set()
            tail = await store.writer.submit(note, "last")
            nursery.cancel_scope.cancel()
    assert tail == "last" and order[-1] == "last"
    assert order.index("urgent") == 1  # after the write in flight, not behind its group or the backlog
    assert [o for o in order if o.startswith("queued")] == [f"queued {i}" for i in range(50)]  # FIFO kept
    store.close()
    stopped = database.open()
    with pytest.raises(StoreClosed):  # a stopped writer refuses urgent writes like others
        async with trio.open_nursery() as nursery:
            await nursery.start(stopped.writer.run)
            nursery.cancel_scope.cancel()
        await stopped.writer.submit_urgent(note, "late")


async def test_one_failing_write_rolls_back_alone(database) -> None:
    store = database.open()
    _, integrity_error = driver_errors(store)
    with store.transaction() as conn:
        create_thread(conn, id="t1")

    def boom(conn) -> None:
        append_item(conn, "t1", type="x")
        raise ValueError("boom")

    results: dict[str, object] = {}

    async def run(name: str, fn, *args) -> None:
        try:
            results[name] = await store.writer.submit(fn, *args)
        except Exception as exc:
            results[name] = exc

    # All queued before start, so all four run in one transaction.
    with trio.fail_after(scaled(10)):
        async with trio.open_nursery() as outer:
            async with trio.open_nursery() as callers:
                callers.start_soon(run, "a", functools.partial(append_item, type="a"), "t1")
                callers.start_soon(run, "bad", boom)
                callers.start_soon(run, "dup", functools.partial(create_thread, id="t1"))
                callers.start_soon(run, "b", functools.partial(append_item, type="b"), "t1")
                await trio.testing.wait_all_tasks_blocked()
                await outer.start(store.writer.run)
            outer.cancel_scope.cancel()
    assert isinstance(results["bad"], ValueError)
    assert isinstance(results["dup"], Conflict)
    assert isinstance(results["dup"].__cause__, integrity_error)  # translated from the driver's error
    assert store.writer.stats.transactions == 1
    with store.read() as conn:
        items = list_items(conn, "t1")
        assert [i.seq for i in items] == [1, 2]  # the failed write took no seq
        assert sorted(i.type for i in items) == ["a", "b"]


async def test_writer_lifecycle_errors(database) -> None:
    store = database.open(queue_size=2)
    store.writer.submit_nowait(lambda conn: None)
    store.writer.submit_nowait(lambda conn: None)
    with pytest.raises(StoreFull):
        store.writer.submit_nowait(lambda conn: None)
    with trio.fail_after(scaled(10)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            await store.writer.submit(lambda conn: None)
            nursery.cancel_scope.cancel()
    with pytest.raises(StoreClosed):
        await store.writer.submit(lambda conn: None)
    with pytest.raises(StoreClosed):
        store.writer.submit_nowait(lambda conn: None)
    with pytest.raises(LifecycleError):
        await store.writer.serve()  # stopped for good: not restartable


async def test_sigkill_mid_write_leaves_a_consistent_database(database) -> None:
    """kill -9 of a writer process mid-group: SQLite's WAL and PostgreSQL's transactions keep
    whole groups only, the schema intact, the search index in step, and the next write goes on."""
    store = database.open()
    with store.transaction() as conn:
        create_thread(conn, id="t1")
    store.close()
    with trio.fail_after(scaled(60)):
        child = await Child.start("writer", database.where, "t1")
        try:
            for _ in range(5):
                await child.expect("committed")
            child.signal(signal.SIGKILL)  # while it is writing its next groups
            await child.process.wait()
        finally:
            await child.aclose()
    assert child.process.returncode == -signal.SIGKILL
    reopened = database.open()  # opens and migrates
    got = seqs(reopened, "t1")
    assert len(got) >= 1000 and len(got) % 200 == 0  # whole groups only
    assert got == list(range(1, len(got) + 1))
    assert applied_migrations(reopened) == EVERY_MIGRATION
    with reopened.read() as conn:
        ends = reopened.search_items(conn, "group end", thread_id="t1", limit=10_000)
        assert len(ends) == len(got) // 200  # the text index holds exactly the committed items
        if database.kind == "sqlite":
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    if database.kind == "sqlite":
        with reopened.transaction() as conn:
            conn.execute("INSERT INTO items_fts(items_fts) VALUES ('integrity-check')")
    with reopened.transaction() as conn:  # the dead writer holds no lock
        item = append_item(conn, "t1", type="after")
    assert item.seq == len(got) + 1


def test_data_api_round_trips(backend) -> None:
    store = backend
    with store.transaction() as conn:
        thread = create_thread(conn, title="Hello", cwd="/tmp", metadata={"k": [1, 2]}, pinned=True)
        child = create_thread(conn, kind="worker", parent_thread_id=thread.id)
        turn = create_turn(conn, thread.id)
        append_item(conn, thread.id, turn_id=turn.id, type="user_message", text="find the llama")
        storage.update_turn(conn, turn.id, status="completed", usage={"input_tokens": 3})
        storage.update_thread(conn, thread.id, title="Renamed", archived=True)
        run = storage.create_run(conn, thread_id=thread.id, owner="me")
        w1 = create_worker(conn, thread_id=child.id, root_thread_id=thread.id, name="a")
        w2 = create_worker(conn, thread_id=child.id, root_thread_id=thread.id, parent_id=w1.id)
        held, created = add_held_input(conn, thread.id, kind="queue", payload={"text": "hi"}, client_id="c1")
        again, created_again = add_held_input(conn, thread.id, kind="queue", payload={}, client_id="c1")
        sched = add_job(conn, name="nightly", cron="0 3 * * *", task="x", next_run="2026-01-01T03:00:00Z")
        first_claim = claim_slot(conn, sched.id, "2026-01-01T03:00:00Z", "me")
        second_claim = claim_slot(conn, sched.id, "2026-01-01T03:00:00Z", "other")
        task, _ = enqueue_daemon_task(conn, payload={"task": "y"}, client_id="k")
        storage.put_memory(conn, "ws:/tmp", "fact", {"v": 1})
        storage.put_memory(conn, "ws:/tmp", "fact", {"v": 2})
        storage.put_context_file(conn, thread.id, "README.md", "# hi")
        with pytest.raises(UsageError):
            create_thread(conn, kind="bogus")
    with store.read() as conn:
        got = storage.get_thread(conn, thread.id)
        assert (got.title, got.archived, got.pinned, got.metadata) == ("Renamed", True, True, {"k": [1, 2]})
        assert got.updated_at >= got.created_at
        assert storage.list_threads(conn) == [child]
        assert [t.id for t in storage.list_threads(conn, archived=True)] == [thread.id]
        done = storage.get_turn(conn, turn.id)
        assert done.status == "completed" and done.completed_at and done.usage == {"input_tokens": 3}
        hits = storage.search_items(conn, "llama")
        assert [(h.thread_id, h.seq) for h in hits] == [(thread.id, 1)] and "[llama]" in hits[0].snippet
        assert storage.search_items(conn, 'NEAR("x" OR') == []  # operators are literal
        assert storage.get_run(conn, run.id).owner == "me"
        assert [(w.spawn_order, w.depth) for w in storage.list_workers(conn, thread.id)] == [(1, 0), (2, 1)]
        assert w2.parent_id == w1.id
        assert created and not created_again and again.id == held.id
        assert first_claim is not None and second_claim is None
        assert storage.list_daemon_tasks(conn)[0].id == task.id
        assert storage.get_daemon_task(conn, task.id) == task and storage.get_daemon_task(conn, "nope") is None
        assert storage.schedule_run_status(conn, first_claim) == "claimed"
        assert storage.get_memory(conn, "ws:/tmp", "fact").value == {"v": 2}
        assert [c.path for c in storage.list_context_files(conn, thread.id)] == ["README.md"]
        with pytest.raises(NotFound):
            storage.get_thread(conn, "nope")
    with store.transaction() as conn:
        storage.delete_thread(conn, thread.id)
    with store.read() as conn:  # its items, inputs, workers and context files went with it
        assert storage.list_items(conn, thread.id) == [] and storage.list_held_input(conn, thread.id) == []
        assert storage.list_context_files(conn, thread.id) == []


def test_public_names_are_exported() -> None:
    for name in storage.__all__:
        obj = getattr(storage, name)
        module = getattr(obj, "__module__", None)
        if module is not None and callable(obj):
            assert not module.startswith("roost.storage._"), name


def test_sqlite_errors_are_translated() -> None:
    from roost.errors import StoreBusy
    from roost.storage import translate_error

    locked = sqlite3.OperationalError("database is locked")
    assert type(translate_error(locked)) is StoreBusy
    assert type(translate_error(sqlite3.IntegrityError("UNIQUE constraint failed"))) is Conflict
    assert type(translate_error(sqlite3.OperationalError("no such table: x"))) is StoreError
    assert type(translate_error(sqlite3.DatabaseError("file is not a database"))) is StoreError


def test_postgres_errors_are_translated(pg_url: str) -> None:
    """psycopg's errors become Roost's store errors, by class (SQLSTATE), both built by hand and
    raised by a real server: a lock wait past ``lock_timeout`` is StoreBusy, a duplicate key a
    Conflict, each ``from`` the psycopg error."""
    import psycopg
    from psycopg import errors as pg_errors

    from roost.errors import DatabasePermissionDenied, DatabaseUnreachable, StoreBusy, StoreReadOnly
    from roost.storage import translate_pg_error

    expected = {
        pg_errors.UniqueViolation("duplicate key value"): Conflict,
        pg_errors.ForeignKeyViolation("violates foreign key constraint"): Conflict,
        pg_errors.SerializationFailure("could not serialize access"): StoreBusy,
        pg_errors.DeadlockDetected("deadlock detected"): StoreBusy,
        pg_errors.LockNotAvailable("canceling statement due to lock timeout"): StoreBusy,
        pg_errors.InsufficientPrivilege("permission denied for schema public"): DatabasePermissionDenied,
        psycopg.OperationalError("connection refused"): DatabaseUnreachable,
        pg_errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"): StoreReadOnly,
        pg_errors.UndefinedTable('relation "x" does not exist'): StoreError,
        pg_errors.QueryCanceled("canceling statement due to statement timeout"): StoreError,
        pg_errors.AdminShutdown("terminating connection due to administrator command"): DatabaseUnreachable,
    }
    for error, roost_error in expected.items():
        assert type(translate_pg_error(error, pg_url)) is roost_error, error
    # a server without the URL's database (3D000; at connection start-up libpq has no SQLSTATE)
    for error in (pg_errors.InvalidCatalogName('database "nodb" does not exist'),
                  psycopg.OperationalError('connection failed: ... FATAL:  database "nodb" does not exist')):
        missing = translate_pg_error(error, "postgresql://u:pw@db.example:5433/nodb")
        assert type(missing) is DatabaseUnreachable and "createdb -h db.example -p 5433 -U u nodb" in str(missing)
        assert "does not exist" in str(missing) and "cannot reach" not in str(missing) and "pw" not in str(missing)
    with storage.open_postgres_store(pg_url) as store:
        with store.transaction() as conn:
            store.create_thread(conn, id="t")
            store.acquire(conn, "k", "A", 60.0)
        with psycopg.connect(pg_url, autocommit=True) as other, other.transaction():
            other.execute("SELECT 1 FROM leases WHERE key = 'k' FOR UPDATE")  # held until the end
            with pytest.raises(StoreBusy) as busy:
                with store.transaction() as conn:
                    conn.execute("SET LOCAL lock_timeout = '50ms'")
                    store.acquire(conn, "k", "B", 60.0, now=10.0**10)
        assert isinstance(busy.value.__cause__, pg_errors.LockNotAvailable)
        with pytest.raises(Conflict) as dup:
            with store.transaction() as conn:
                store.create_thread(conn, id="t")
        assert isinstance(dup.value.__cause__, pg_errors.UniqueViolation)
        with store.read() as conn:
            assert store.get_lease(conn, "k")["owner"] == "A"


def test_each_store_implements_the_store_interface(backend) -> None:
    """Every operation of StoreBackend is a method of the store, with the interface's parameters.
    On SQLite it is the room's module function itself, so code written against the interface
    runs the SQLite functions."""
    import inspect

    store = backend
    assert isinstance(store, storage.StoreBackend)
    for name in storage.OPERATIONS:
        declared = inspect.signature(getattr(storage.StoreBackend, name))
        assert list(declared.parameters)[1:] == list(inspect.signature(getattr(store, name)).parameters), name
        if is_sqlite(store):
            function = getattr(storage, name, None) or getattr(storage.leases, name)
            # the module function runs on either backend's connection; its SQLite body is the method
            assert getattr(store, name) is inspect.unwrap(function), name
    with store.transaction() as conn:
        thread = store.create_thread(conn, title="via the interface")
    with store.read() as conn:
        assert store.get_thread(conn, thread.id).title == "via the interface"
        assert store.page_threads(conn, archived=None, kind="chat", before=None, limit=5) == [thread]


# -- the store interface on both backends (issue 13): threads, turns, runs, items, inputs ---------


def test_threads_turns_runs_items_inputs_round_trip_on_each_backend(backend) -> None:
    store = backend
    # SQLite's functions raise sqlite3's IntegrityError outside the writer (which translates it).
    conflict = (Conflict, sqlite3.IntegrityError) if isinstance(store, storage.Store) else Conflict
    with store.transaction() as conn:
        thread = store.create_thread(conn, title="Hello", cwd="/tmp", metadata={"k": [1, 2]}, pinned=True)
        child = store.create_thread(conn, kind="worker", parent_thread_id=thread.id)
        turn = store.create_turn(conn, thread.id)
        first = store.append_item(conn, thread.id, turn_id=turn.id, type="user_message", text="find the llama")
        second = store.append_item(conn, thread.id, type="agent_message", payload={"text": "ok"})
        store.update_item(conn, second.id, status="in_progress", text="a spotted llama")
        store.update_turn(conn, turn.id, status="completed", usage={"input_tokens": 3})
        store.update_thread(conn, thread.id, title="Renamed", archived=True)
        run = store.create_run(conn, thread_id=thread.id, owner="me", metadata={"m": 1})
        store.update_run(conn, run.id, status="failed")
        held, created = store.add_held_input(conn, thread.id, kind="queue", payload={"text": "hi"}, client_id="c1")
        again, created_again = store.add_held_input(conn, thread.id, kind="queue", payload={}, client_id="c1")
        steer, _ = store.add_held_input(conn, thread.id, kind="steer", held=True)
        with pytest.raises(UsageError):
            store.create_thread(conn, kind="bogus")
        with pytest.raises(conflict):
            store.create_thread(conn, id=thread.id)  # refused alone: the transaction goes on
        with pytest.raises(conflict):
            store.create_turn(conn, "no-such-thread")
        with pytest.raises(NotFound):
            store.update_turn(conn, "no-such-turn", status="completed")
        store.create_thread(conn, title="after the conflicts")
    with store.read() as conn:
        got = store.get_thread(conn, thread.id)
        assert (got.title, got.archived, got.pinned, got.metadata) == ("Renamed", True, True, {"k": [1, 2]})
        assert [t.id for t in store.list_threads(conn, archived=True)] == [thread.id]
        assert child in store.list_threads(conn, parent_thread_id=thread.id)
        done = store.get_turn(conn, turn.id)
        assert done.status == "completed" and done.completed_at and done.usage == {"input_tokens": 3}
        assert [t.id for t in store.list_turns(conn, thread.id, status="completed")] == [turn.id]
        assert [(i.seq, i.type) for i in store.list_items(conn, thread.id)] == [(1, "user_message"), (2, "agent_message")]
        assert [i.id for i in store.list_items(conn, thread.id, after_seq=1)] == [second.id]
        assert [i.id for i in store.list_items(conn, thread.id, turn_id=turn.id)] == [first.id]
        assert store.get_item(conn, second.id).payload == {"text": "ok"}
        hits = store.search_items(conn, "llama")
        assert {h.item_id for h in hits} == {first.id, second.id} and all("[llama]" in h.snippet for h in hits)
        assert [h.item_id for h in store.search_items(conn, "find llama", thread_id=thread.id)] == [first.id]
        assert store.search_items(conn, 'NEAR("x" OR') == []  # operators are literal
        assert store.get_run(conn, run.id).status == "failed" and store.get_run(conn, run.id).completed_at
        assert [r.id for r in store.list_runs(conn, thread_id=thread.id)] == [run.id]
        assert store.latest_run_status(conn, thread.id) == "failed"
        assert store.first_user_text(conn, thread.id) == "find the llama"
        assert store.count_turns(conn, thread.id) == 1
        assert created and not created_again and again.id == held.id
        assert [(h.kind, h.position) for h in store.list_held_input(conn, thread.id)] == [("queue", 1), ("steer", 2)]
        assert [h.id for h in store.list_held_input(conn, thread.id, held=True)] == [steer.id]
        assert store.chat_ids_with_title(conn, "RENAM", limit=5) == [thread.id]
        page = store.page_threads(conn, archived=None, kind=None, before=None, limit=2)
        rest = store.page_threads(conn, archived=None, kind=None, before=(page[-1].updated_at, page[-1].id), limit=9)
        assert len(page) == 2 and len(rest) == 1 and not {t.id for t in page} & {t.id for t in rest}
        assert [t.id for t in store.chat_threads_with_cwd(conn)] == []  # the one with a cwd is archived
    with store.transaction() as conn:
        store.update_held_input(conn, steer.id, held=False)
        store.remove_held_input(conn, held.id)
        store.delete_thread(conn, thread.id)
    with store.read() as conn:
        with pytest.raises(NotFound):
            store.get_thread(conn, thread.id)
        assert store.list_items(conn, thread.id) == [] and store.list_held_input(conn, thread.id) == []


def test_concurrent_appenders_get_gap_free_seqs_on_each_backend(backend) -> None:
    """Four threads of this process append to one thread at once, each in its own transactions."""
    import threading

    store = backend
    with store.transaction() as conn:
        store.create_thread(conn, id="t")
    errors: list[BaseException] = []

    def appender(n: int) -> None:
        try:
            for i in range(15):
                with store.transaction() as conn:
                    store.append_item(conn, "t", type=f"w{n}-{i}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    workers = [threading.Thread(target=appender, args=(n,)) for n in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert errors == []
    with store.read() as conn:
        items = store.list_items(conn, "t")
    assert [i.seq for i in items] == list(range(1, 61))
    for n in range(4):  # each appender's items in its own order
        assert [i.type for i in items if i.type.startswith(f"w{n}-")] == [f"w{n}-{i}" for i in range(15)]


def test_memory_context_files_and_the_task_queue_on_each_backend(backend) -> None:
    store = backend
    with store.transaction() as conn:
        thread = store.create_thread(conn)
        store.put_memory(conn, "ws:/tmp", "fact", {"v": 1})
        store.put_memory(conn, "ws:/tmp", "fact", {"v": 2})  # replaced, not added
        store.put_memory(conn, "ws:/tmp", "a/b", None)
        store.put_memory(conn, "ws:/tmp", "a/c", [1])
        store.put_memory(conn, "agent:x", "Z", "z")
        store.put_context_file(conn, thread.id, "README.md", "# hi")
        store.put_context_file(conn, thread.id, "README.md", "# hello")
        store.put_context_file(conn, thread.id, "A.md", "a")
        first, created = store.enqueue_daemon_task(conn, payload={"task": "y"}, client_id="k")
        again, created_again = store.enqueue_daemon_task(conn, payload={"other": 1}, client_id="k")
        second, _ = store.enqueue_daemon_task(conn, payload={"task": "z"})
    with store.read() as conn:
        assert store.get_memory(conn, "ws:/tmp", "fact").value == {"v": 2}
        assert [e.key for e in store.list_memory(conn, "ws:/tmp")] == ["a/b", "a/c", "fact"]
        assert store.memory_value(conn, "ws:/tmp", "a/b") == (True, None)
        assert store.memory_value(conn, "ws:/tmp", "nope") == (False, None)
        assert store.memory_scope_counts(conn, "ws:") == [("/tmp", 3)]
        assert store.scope_has_memory(conn, "agent:x") and not store.scope_has_memory(conn, "agent:y")
        with pytest.raises(NotFound):
            store.get_memory(conn, "ws:/tmp", "nope")
        assert [(c.path, c.content) for c in store.list_context_files(conn, thread.id)] == [
            ("A.md", "a"), ("README.md", "# hello")]
        assert created and not created_again and again == first
        assert [t.position for t in store.list_daemon_tasks(conn)] == [1, 2]
        assert store.get_daemon_task(conn, second.id) == second and store.get_daemon_task(conn, "nope") is None
    with store.transaction() as conn:
        assert store.delete_memory_prefix(conn, "ws:/tmp", "a/") == 2
        assert store.delete_memory(conn, "ws:/tmp", "fact") and not store.delete_memory(conn, "ws:/tmp", "fact")
        assert store.delete_context_file(conn, thread.id, "A.md")
        done = store.update_daemon_task(conn, first.id, status="completed", run_id="run_1")
        assert (done.status, done.run_id) == ("completed", "run_1")
    with store.read() as conn:
        assert store.list_memory(conn, "ws:/tmp") == []
        assert [t.id for t in store.list_daemon_tasks(conn, status="queued")] == [second.id]


def test_concurrent_enqueuers_get_unique_ordered_positions_on_each_backend(backend) -> None:
    import threading

    store = backend
    errors: list[BaseException] = []

    def enqueuer(n: int) -> None:
        try:
            for i in range(10):
                with store.transaction() as conn:
                    store.enqueue_daemon_task(conn, payload={"n": n, "i": i}, client_id=f"c{n}-{i}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    workers = [threading.Thread(target=enqueuer, args=(n,)) for n in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert errors == []
    with store.read() as conn:
        tasks = store.list_daemon_tasks(conn)
    assert [t.position for t in tasks] == list(range(1, 41))
    for n in range(4):
        assert [t.payload["i"] for t in tasks if t.payload["n"] == n] == list(range(10))


def test_worker_trees_and_tool_process_records_on_each_backend(backend) -> None:
    store = backend
    with store.transaction() as conn:
        root = store.create_thread(conn, kind="orchestration")
        child = store.create_thread(conn, kind="worker", parent_thread_id=root.id)
        w1 = store.create_worker(conn, thread_id=child.id, root_thread_id=root.id, name="a")
        w2 = store.create_worker(conn, thread_id=child.id, root_thread_id=root.id, parent_id=w1.id)
        with pytest.raises(NotFound):
            store.create_worker(conn, thread_id=child.id, root_thread_id=root.id, parent_id="nope")
        store.record_tool_process(conn, 4242, "me", 100, "boot-1", child.id)
        store.record_tool_process(conn, 4242, "me", 101, "boot-1", child.id)  # replaced
        store.record_tool_process(conn, 4343, "other", 5_000_000_000, None, None)  # past 32 bits
    with store.read() as conn:
        assert [(w.spawn_order, w.depth) for w in store.list_workers(conn, root.id)] == [(1, 0), (2, 1)]
        assert store.get_worker(conn, w2.id).parent_id == w1.id
        assert store.queued_worker_roots(conn) == [root.id]
        assert [p["start_ticks"] for p in store.list_tool_processes(conn, "me")] == [101]
        assert {p["pgid"] for p in store.list_tool_processes(conn)} == {4242, 4343}
    with store.transaction() as conn:
        assert store.claim_queued_worker(conn, w1.id) is True
        assert store.claim_queued_worker(conn, w1.id) is False  # exactly once
        assert store.mark_worker_delivered(conn, w1.id) is True
        assert store.mark_worker_delivered(conn, w1.id) is False
        store.update_worker(conn, w2.id, status="completed", result={"text": "done"})
        assert store.forget_tool_process(conn, 4242, "me") and not store.forget_tool_process(conn, 4242, "me")
    with store.read() as conn:
        assert store.get_worker(conn, w1.id).status == "running"
        assert store.get_worker(conn, w1.id).result == {"delivered": True}
        assert [w.id for w in store.list_workers(conn, root.id, status="completed")] == [w2.id]
        assert store.queued_worker_roots(conn) == []
        assert [p["owner"] for p in store.list_tool_processes(conn)] == ["other"]


def test_schedules_and_their_run_records_on_each_backend(backend) -> None:
    store = backend
    with store.transaction() as conn:
        before = store.schedule_changes(conn)
        job = store.add_job(conn, name="nightly", cron="0 3 * * *", task="x", next_run="2026-01-01T03:00:00Z",
                            work_dir=None, provider="scripted")
        later = store.add_job(conn, name="hourly", cron="0 * * * *", task="y", next_run=None, work_dir="/p")
        with pytest.raises(Conflict):
            store.add_job(conn, name="nightly", cron="0 3 * * *", task="x", next_run=None)
        first = store.claim_slot(conn, job.id, "2026-01-01T03:00:00Z", "me")
        second = store.claim_slot(conn, job.id, "2026-01-01T03:00:00Z", "other")
        assert store.claim_slot(conn, "no-such-job", "2026-01-01T03:00:00Z", "me") is None
        assert store.record_skipped(conn, job.id, ["2026-01-02T03:00:00Z", "2026-01-01T03:00:00Z"], "missed") == 1
        upgraded = store.claim_slot(conn, job.id, "2026-01-02T03:00:00Z", "me")  # a missed slot may be claimed
        store.advance_next_run(conn, job.id, "2026-01-03T03:00:00Z")
        store.advance_next_run(conn, job.id, "2026-01-02T03:00:00Z")  # never backwards
        request = store.request_run(conn, "hourly")
        assert store.adopt_job(conn, job.id, "/p") and not store.adopt_job(conn, job.id, "/q")
    with store.read() as conn:
        assert store.schedule_changes(conn) > before
        assert first is not None and second is None and upgraded is not None
        assert store.schedule_run_status(conn, first) == "claimed"
        got = store.get_job(conn, "nightly")
        assert (got.next_run, got.work_dir, got.provider, got.enabled) == ("2026-01-03T03:00:00Z", "/p", "scripted", True)
        assert [j.name for j in store.list_jobs(conn)] == ["nightly", "hourly"]  # never-firing last
        assert [j.name for j in store.list_jobs(conn, project="/p")] == ["nightly", "hourly"]
        assert [r.id for r in store.list_requested_runs(conn)] == [request.id]
        assert store.has_running_run(conn, job.id) and not store.has_running_run(conn, later.id)
        assert {r.id for r in store.list_open_runs(conn)} == {first, upgraded}
    with store.transaction() as conn:
        assert store.claim_requested_run(conn, request.id, "me") and not store.claim_requested_run(conn, request.id, "x")
        store.mark_run_started(conn, first, "task_1", "2026-01-01T03:00:01Z")
        with pytest.raises(NotFound):
            store.mark_run_started(conn, "nope", "task_1", "2026-01-01T03:00:01Z")
        store.mark_run_finished(conn, first, "succeeded", "2026-01-01T03:00:09Z")
        store.mark_run_finished(conn, upgraded, "overlap", "2026-01-02T03:00:01Z")
        store.adopt_schedule_run(conn, request.id, "adopter")
        assert not store.has_running_run(conn, job.id)
        assert store.has_running_run(conn, later.id) and not store.has_running_run(conn, later.id, exclude=request.id)
        disabled = store.set_job_enabled(conn, "nightly", False, next_run=None)
        enabled = store.set_job_enabled(conn, "nightly", True, next_run="2026-02-01T03:00:00Z")
    with store.read() as conn:
        assert disabled.enabled is False and enabled.next_run == "2026-02-01T03:00:00Z"
        runs = store.list_job_runs(conn, job.id)
        assert {(r.slot, r.status, r.outcome) for r in runs} == {
            ("2026-01-01T03:00:00Z", "done", "succeeded"), ("2026-01-02T03:00:00Z", "skipped", "overlap")}
        assert store.get_job(conn, "nightly").last_run == "2026-01-01T03:00:01Z"
        assert store.list_job_runs(conn, later.id)[0].owner == "adopter"
        assert [j.name for j in store.list_jobs(conn, enabled_only=True)] == ["nightly", "hourly"]
    with store.transaction() as conn:
        store.remove_job(conn, "nightly")
        with pytest.raises(NotFound):
            store.remove_job(conn, "nightly")
    with store.read() as conn:
        assert store.list_job_runs(conn, job.id) == [] and [j.name for j in store.list_jobs(conn)] == ["hourly"]


async def test_the_writer_commits_groups_and_a_failing_write_alone_on_each_backend(backend) -> None:
    store = backend
    results: dict[int, object] = {}
    all_answered = trio.Event()

    async def one(n: int) -> None:
        try:
            results[n] = (await store.writer.submit(store.create_thread, id="dup" if n % 3 == 0 else f"t{n}")).id
        except Exception as exc:  # noqa: BLE001
            results[n] = type(exc).__name__
        if len(results) == 9:
            all_answered.set()

    with trio.fail_after(scaled(30)):
        async with trio.open_nursery() as nursery:
            for n in range(1, 10):
                nursery.start_soon(one, n)  # queued before the writer starts: grouped
            await nursery.start(store.writer.run)
            await all_answered.wait()
            urgent = await store.writer.submit_urgent(store.create_thread, id="urgent")
            nursery.cancel_scope.cancel()
    assert sorted(v for v in results.values() if v == "Conflict") == ["Conflict", "Conflict"]
    assert urgent.id == "urgent"
    assert store.writer.stats.largest_group >= 2 and store.writer.stats.failed == 2
    with store.read() as conn:
        ids = {t.id for t in store.list_threads(conn, limit=50)}
    assert ids == {"dup", "urgent"} | {f"t{n}" for n in range(1, 10) if n % 3}
    with pytest.raises(StoreClosed):
        await store.writer.submit(store.create_thread)


def test_reconcile_interrupts_dead_executions_only_on_each_backend(backend) -> None:
    store = backend
    run_reconcile = reconcile if isinstance(store, storage.Store) else store.reconcile
    with store.transaction() as conn:
        for tid in ("dead", "live"):
            store.create_thread(conn, id=tid)
            store.create_turn(conn, tid, id=f"turn-{tid}")
        store.update_turn(conn, "turn-dead", error={"note": "kept"})
        store.append_item(conn, "dead", turn_id="turn-dead", type="tool_call", status="in_progress")
        store.create_worker(conn, thread_id="dead", root_thread_id="dead", status="running")
        store.create_worker(conn, thread_id="dead", root_thread_id="dead", status="queued")
        store.create_run(conn, thread_id="live", id="run-live")
        store.acquire(conn, "thread:live", "other-process", 60.0)
        store.acquire(conn, "thread:mine", "me", 60.0)
    with store.transaction() as conn:
        report = run_reconcile(conn, "me")
    assert (report.turns_interrupted, report.workers_interrupted, report.leases_released) == (1, 1, 1)
    with store.read() as conn:
        dead = store.get_turn(conn, "turn-dead")
        assert dead.status == "interrupted" and dead.completed_at
        assert (dead.error["note"], dead.error["category"], dead.error["reason"]) == ("kept", "cancelled", "abandoned")
        assert store.list_items(conn, "dead")[0].status == "interrupted"
        assert [w.status for w in store.list_workers(conn, "dead")] == ["interrupted", "queued"]
        assert store.get_turn(conn, "turn-live").status == "running"
        assert store.get_run(conn, "run-live").status == "running"
        assert store.get_lease(conn, "thread:mine")["owner"] is None
        assert store.get_lease(conn, "thread:live")["owner"] == "other-process"


def test_objectives_and_their_task_outcomes_on_each_backend(backend) -> None:
    """Objectives (wire-protocol.md appendix) behave alike on both backends: ids in order, tasks
    appended, the durable failure counter skipping a task at MAX_FAILURES, completion."""
    from roost.errors import UsageError
    from roost.storage import MAX_FAILURES

    store = backend
    with store.transaction() as conn:
        first = store.create_objective(conn, title="Ship", tasks=["build", "test"], description="d")
        second = store.create_objective(conn, title="Empty", tasks=[])
        with pytest.raises(UsageError):
            store.create_objective(conn, title=" ", tasks=[])
    assert (first.id, second.id, second.status) == ("OBJ-0001", "OBJ-0002", "completed")
    with store.transaction() as conn:
        added = store.add_objective_task(conn, second.id, "later")
        assert added.index == 0 and store.get_objective(conn, second.id).status == "active"
        store.start_objective_task(conn, first.id, 0, "task_1")
        assert store.finish_objective_task(conn, first.id, 0, True).outcome == "succeeded"
        for attempt in range(MAX_FAILURES):
            outcome = store.finish_objective_task(conn, first.id, 1, False)
        assert (outcome.outcome, outcome.failures) == ("skipped", MAX_FAILURES)
        with pytest.raises(NotFound):
            store.start_objective_task(conn, first.id, 9, "task_9")
        store.set_objective_status(conn, second.id, "paused")
    with store.read() as conn:
        assert store.get_objective(conn, first.id).status == "completed"
        assert [o.id for o in store.list_objectives(conn)] == ["OBJ-0001", "OBJ-0002"]
        assert [o.id for o in store.list_objectives(conn, status="paused")] == ["OBJ-0002"]
        with pytest.raises(NotFound):
            store.get_objective(conn, "OBJ-9999")


def _dead_owner() -> str:
    """A ``default_owner``-shaped identity of a process of this host that has exited."""
    import socket
    import subprocess

    child = subprocess.Popen(["true"])
    child.wait()
    return f"{socket.gethostname()}:{child.pid}:gone"


def test_reconcile_settles_every_non_terminal_kind_on_each_backend(backend) -> None:
    """Issue 18, finding 3: no run, turn, item or background process stays non-terminal after a
    crash, on either backend (workers, leases: the test above; tasks, schedule runs, objectives
    are resumed by their components)."""
    store = backend
    run_reconcile = reconcile if isinstance(store, storage.Store) else store.reconcile
    dead = _dead_owner()
    mark = "?" if isinstance(store, storage.Store) else "%s"
    insert_process = (
        "INSERT INTO background_processes (id, thread_id, owner, pid, command, cwd, status, started_at)"
        f" VALUES ({mark}, 't1', {mark}, 1, 'sleep 9', NULL, 'running', '2026-01-01T00:00:00Z')"
    )
    with store.transaction() as conn:
        store.create_thread(conn, id="t1")
        store.create_turn(conn, "t1", id="queued-turn", status="queued")
        done = store.create_turn(conn, "t1", id="done-turn")
        store.update_turn(conn, done.id, status="completed")
        store.append_item(conn, "t1", turn_id=done.id, type="tool_call", status="in_progress")
        store.create_run(conn, thread_id="t1", id="run-dead", status="accepted", metadata={"runtime": {"owner": dead}})
        store.create_run(conn, thread_id="t1", id="run-alive", status="accepted",
                         metadata={"runtime": {"owner": "elsewhere:1:x"}})
        conn.execute(insert_process, ("bg-dead", dead))
        conn.execute(insert_process, ("bg-alive", "elsewhere:1:x"))
    with store.transaction() as conn:
        report = run_reconcile(conn, "me")
    assert (report.turns_interrupted, report.items_interrupted, report.runs_interrupted,
            report.background_processes_lost) == (1, 1, 1, 1)
    with store.read() as conn:
        assert store.get_turn(conn, "queued-turn").status == "interrupted"
        assert store.get_turn(conn, "done-turn").status == "completed"
        assert [i.status for i in store.list_items(conn, "t1")] == ["interrupted"]
        assert store.get_run(conn, "run-dead").status == "interrupted"
        assert store.get_run(conn, "run-alive").status == "accepted"   # its starter may still run
        rows = dict(conn.execute("SELECT id, status FROM background_processes").fetchall())
        assert rows == {"bg-dead": "lost", "bg-alive": "running"}


def test_begin_immediate_polls_for_the_lock_and_a_held_lock_ends_in_store_busy(tmp_path: Path) -> None:
    """Waiting for another process's write lock, ``BEGIN IMMEDIATE`` is tried again and again with
    SQLite's busy handler off (its 1-2-5-10 ms sleeps made a writer wait long after the lock was
    free); the waiter's write goes in once the lock is released. A lock held throughout ends in
    StoreBusy naming the wait, nothing written, and the connection keeps its busy timeout."""
    import threading
    import time

    from roost.errors import StoreBusy
    from roost.storage import connect, immediate

    path = tmp_path / "locks.db"
    setup = connect(path)
    setup.execute("PRAGMA journal_mode = WAL")
    setup.execute("CREATE TABLE t (x INTEGER)")
    holder = connect(path)
    holder.execute("BEGIN IMMEDIATE")

    waiter = connect(path, busy_timeout=30.0)
    statements: list[str] = []
    waiter.set_trace_callback(statements.append)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            with immediate(waiter):
                waiter.execute("INSERT INTO t VALUES (1)")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    deadline = time.monotonic() + scaled(30)
    while statements.count("BEGIN IMMEDIATE") < 3 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert statements.count("BEGIN IMMEDIATE") >= 3  # tried again, not one BEGIN asleep in SQLite
    assert "PRAGMA busy_timeout = 0" in statements
    holder.execute("ROLLBACK")
    thread.join(scaled(30))
    assert not thread.is_alive() and errors == []
    assert [tuple(r) for r in setup.execute("SELECT x FROM t")] == [(1,)]
    assert waiter.execute("PRAGMA busy_timeout").fetchone()[0] == 30000

    holder.execute("BEGIN IMMEDIATE")
    short = connect(path, busy_timeout=0.05)
    with pytest.raises(StoreBusy) as busy:
        with immediate(short):
            short.execute("INSERT INTO t VALUES (2)")
    assert "locked by another connection for 0.2 s" in str(busy.value)
    assert short.execute("PRAGMA busy_timeout").fetchone()[0] == 50 and not short.in_transaction
    holder.execute("ROLLBACK")
    assert [tuple(r) for r in setup.execute("SELECT x FROM t")] == [(1,)]

def test_nested_savepoints_unwind_as_a_stack_with_one_prepared_statement_each(tmp_path: Path) -> None:
    """immediate() nested: a failing inner block rolls back alone, at any depth, and the blocks
    around it commit; every savepoint has one SQL text, so the statements stay prepared (a
    fresh name per savepoint traced two new statements per write)."""
    from roost.storage._connect import connect, immediate

    conn = connect(tmp_path / "db.sqlite")
    storage.migrate(conn)
    traced: list[str] = []
    conn.set_trace_callback(traced.append)
    create_thread(conn, id="t1")
    with immediate(conn):
        append_item(conn, "t1", type="outer")
        for depth in range(3):
            with immediate(conn):
                append_item(conn, "t1", type=f"kept {depth}")
                with pytest.raises(ValueError), immediate(conn):
                    append_item(conn, "t1", type=f"lost {depth}")
                    with immediate(conn):
                        append_item(conn, "t1", type=f"lost inner {depth}")
                    raise ValueError("roll this block back")
    assert [i.type for i in list_items(conn, "t1")] == ["outer", "kept 0", "kept 1", "kept 2"]
    savepoints = {sql for sql in traced if "SAVEPOINT" in sql}
    assert savepoints == {"SAVEPOINT roost_sp", "RELEASE SAVEPOINT roost_sp", "ROLLBACK TO SAVEPOINT roost_sp"}
    conn.close()
