"""Execution leases: fencing tokens, hand-over, the LeaseKeeper, and two OS processes.

Every test runs on both backends (conftest.py's ``backend``: a SQLite file, a PostgreSQL
database); tests/test_backend_coverage.py keeps it so. PostgreSQL's own lease mechanics (row
locks, many contenders) are in tests/test_pg_store.py.
"""

from __future__ import annotations

import gc
import signal
import time
import weakref

import pytest
import trio
import trio.testing
from _helpers.storage_procs import Child

from roost.errors import LeaseHeld, LifecycleError, StaleLease
from roost.storage import LeaseKeeper, Store, fenced
from _helpers.timing import scaled


def test_acquire_increments_token_and_excludes(backend) -> None:
    store = backend
    with store.transaction() as conn:
        a = store.acquire(conn, "k", "A", 10.0, now=100.0)
        with pytest.raises(LeaseHeld) as held:
            store.acquire(conn, "k", "B", 10.0, now=105.0)
        assert (held.value.owner, held.value.expires_at) == ("A", 110.0)
        with pytest.raises(LeaseHeld):
            store.acquire(conn, "k", "A", 10.0, now=105.0)  # even the same owner: one execution
        b = store.acquire(conn, "k", "B", 10.0, now=110.0)  # expired: anyone may take it
        assert (a.token, b.token) == (1, 2)
        assert store.release(conn, b) is True
        assert store.release(conn, b) is False  # idempotent
        c = store.acquire(conn, "k", "A", 10.0, now=111.0)  # released: free, token keeps growing
        assert c.token == 3
    with store.read() as conn:
        assert store.get_lease(conn, "k") == {"key": "k", "owner": "A", "token": 3, "expires_at": 121.0,
                                              "successor": None}
        assert store.get_lease(conn, "never") is None


def test_acquire_then_commits_the_lease_and_the_write_together_or_neither(backend) -> None:
    """acquire_then (a turn's admission, issue 12): the lease and the first write in one
    transaction; a live holder stops it before the write runs, a failing write undoes the lease."""
    store = _with_thread(backend)
    ran: list[str] = []

    def write(conn, kind: str):
        ran.append(kind)
        return store.append_item(conn, "t1", type=kind)

    def failing(conn) -> None:
        store.append_item(conn, "t1", type="lost")
        raise RuntimeError("the write failed")

    with store.transaction() as conn:
        lease, item = store.acquire_then(conn, "thread:t1", "A", 10.0, write, "first", now=100.0)
        assert (lease.owner, lease.token, lease.expires_at, item.seq) == ("A", 1, 110.0, 1)
        with pytest.raises(LeaseHeld):
            store.acquire_then(conn, "thread:t1", "B", 10.0, write, "never", now=105.0)
        assert ran == ["first"]  # a held lease: the write did not run
        store.release(conn, lease)
        with pytest.raises(RuntimeError):
            store.acquire_then(conn, "thread:t1", "B", 10.0, failing, now=106.0)
    with store.read() as conn:
        row = store.get_lease(conn, "thread:t1")
        assert (row["owner"], row["token"]) == (None, 1)  # the failed write took no lease
        assert [i.type for i in store.list_items(conn, "t1")] == ["first"]


def test_held_elsewhere_many_agrees_with_held_elsewhere_key_by_key(backend) -> None:
    from roost.storage import leases

    store = backend
    with store.transaction() as conn:
        store.acquire(conn, "thread:a", "A", 60.0)
        store.acquire(conn, "thread:b", "B", 60.0)
        store.release(conn, store.acquire(conn, "thread:freed", "A", 60.0))
        store.acquire(conn, "thread:expired", "A", 10.0, now=100.0)
    # more keys than one IN (...) query holds, most of them without a row
    keys = ["thread:a", "thread:b", "thread:freed", "thread:expired"] + [f"thread:none-{i}" for i in range(1200)]
    with store.read() as conn:
        many = leases.held_elsewhere_many(conn, keys, "B")
        one_by_one = {k: row for k in keys if (row := leases.held_elsewhere(conn, k, "B")) is not None}
        assert leases.held_elsewhere_many(conn, [], "B") == {}
    assert set(many) == {"thread:a"}
    assert many == one_by_one
    assert many["thread:a"]["owner"] == "A"


def test_renew_extends_and_detects_supersession(backend) -> None:
    store = backend
    with store.transaction() as conn:
        a = store.acquire(conn, "k", "A", 10.0, now=100.0)
        a2 = store.renew(conn, a, now=108.0)
        assert (a2.token, a2.expires_at) == (1, 118.0)
        late = store.renew(conn, a2, now=200.0)  # past expiry but nobody took it: still ours
        assert late.expires_at == 210.0
        store.acquire(conn, "k", "B", 10.0, now=300.0)
        with pytest.raises(StaleLease):
            store.renew(conn, late, now=301.0)


def test_a_stale_guarded_write_rolls_back_its_transaction(backend) -> None:
    """check_fence in the write's transaction: a stale token undoes the whole transaction."""
    store = backend
    with store.transaction() as conn:
        a = store.acquire(conn, "thread:t1", "A", 10.0, now=100.0)
        store.acquire(conn, "thread:t1", "B", 10.0, now=200.0)
    with pytest.raises(StaleLease):
        with store.transaction() as conn:
            store.acquire(conn, "side-effect", "A", 10.0, now=100.0)  # a write before the guard
            store.check_fence(conn, a.key, a.token)
    with store.read() as conn:
        assert store.get_lease(conn, "side-effect") is None
        assert store.get_lease(conn, "thread:t1")["owner"] == "B"


def test_stale_token_write_changes_nothing(backend) -> None:
    """A write wrapped by fenced() with a superseded token, on a connection of its own after
    another write of the same transaction: the whole transaction changes nothing."""
    store = _with_thread(backend)
    with store.transaction() as conn:
        a = store.acquire(conn, "thread:t1", "A", 10.0, now=100.0)
        store.append_item(conn, "t1", type="by-a")
        store.acquire(conn, "thread:t1", "B", 10.0, now=200.0)
    before = _dump(store)
    guarded = _fenced(store)(a.key, a.token, store.append_item)
    with pytest.raises(StaleLease):
        with store.transaction() as conn:
            store.update_thread(conn, "t1", title="stale")
            guarded(conn, "t1", type="stale")
    assert _dump(store) == before


def test_expiry_is_judged_on_the_database_clock(backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Expiry is judged on the store's clock (db_clock: PostgreSQL's now(); SQLite, one host's
    file, the host's clock), not on a node's: a node whose clock is wildly wrong still sees a
    live lease as live, and renewals extend it from the database's clock."""
    from roost.storage import db_clock

    store = backend
    skewed = 0.0 if isinstance(store, Store) else time.time() - 10**6  # SQLite's clock is the host's
    monkeypatch.setattr(time, "time", lambda: skewed)
    with store.transaction() as conn:
        lease = store.acquire(conn, "k", "A", 30.0)
        clock = db_clock(conn)
        assert lease.expires_at == pytest.approx(clock + 30.0, abs=5)
        renewed = store.renew(conn, lease, 60.0)
        assert renewed.expires_at == pytest.approx(clock + 60.0, abs=5)
        with pytest.raises(LeaseHeld):
            store.acquire(conn, "k", "B", 30.0)  # live on the database's clock, whatever ours says
    if not isinstance(store, Store):
        assert abs(clock - skewed) > 10**5  # PostgreSQL's clock was used, not the node's
    with store.read() as conn:
        assert store.get_lease(conn, "k")["expires_at"] == pytest.approx(renewed.expires_at)


def _fenced(store):
    """The backend's fenced() (SQLite: roost.storage.fenced; PostgreSQL: PostgresStore.fenced)."""
    return fenced if isinstance(store, Store) else store.fenced


def _with_thread(store, thread_id: str = "t1"):
    with store.transaction() as conn:
        store.create_thread(conn, id=thread_id)
    return store


async def test_stale_write_through_the_writer_rolls_back_alone(backend) -> None:
    store = _with_thread(backend)
    with store.transaction() as conn:
        stale = store.acquire(conn, "thread:t1", "A", 10.0, now=100.0)
        fresh = store.acquire(conn, "thread:t1", "B", 10.0, now=200.0)
    guard = _fenced(store)
    with trio.fail_after(scaled(10)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            with pytest.raises(StaleLease):
                await store.writer.submit(guard(stale.key, stale.token, store.append_item), "t1", type="x")
            ok = await store.writer.submit(guard(fresh.key, fresh.token, store.append_item), "t1", type="y")
            nursery.cancel_scope.cancel()
    assert ok.seq == 1
    with store.read() as conn:
        assert [i.type for i in store.list_items(conn, "t1")] == ["y"]


def test_hand_over_reserves_for_the_successor(backend) -> None:
    store = backend
    with store.transaction() as conn:
        a = store.acquire(conn, "k", "A", 10.0, now=100.0)
        store.hand_over(conn, a, "B", ttl=5.0, now=101.0)
        with pytest.raises(StaleLease):
            store.check_fence(conn, "k", a.token)  # the old holder is fenced off at once
        with pytest.raises(StaleLease):
            store.hand_over(conn, a, "C", now=101.0)
        with pytest.raises(LeaseHeld) as held:
            store.acquire(conn, "k", "C", 10.0, now=102.0)
        assert held.value.owner == "B"
        b = store.acquire(conn, "k", "B", 10.0, now=102.0)
        assert b.token == 2 and store.get_lease(conn, "k")["successor"] is None
        store.hand_over(conn, b, "D", ttl=5.0, now=103.0)
        c = store.acquire(conn, "k", "C", 10.0, now=108.5)  # D never came: the reservation lapsed
        assert c.token == 3


async def test_keeper_renews_releases_and_cancels_on_supersession(backend) -> None:
    store = _with_thread(backend)
    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            keeper = LeaseKeeper(store.writer, owner="A")
            await nursery.start(keeper.run)
            async with keeper.hold("thread:t1", ttl=0.6) as ex:
                with ex.cancel_scope:
                    await ex.renewed.wait()
                    item = await ex.submit(store.append_item, "t1", type="fenced")
                    assert item.seq == 1
                    # Another process takes the lease over (simulated time past expiry).
                    with store.transaction() as conn:
                        store.acquire(conn, "thread:t1", "B", 60.0, now=time.time() + 3600)
                    await trio.sleep_forever()  # cancelled by the keeper's next renewal
                assert ex.cancel_scope.cancelled_caught
                assert ex.lost_reason == "superseded"
                assert ex.renewals >= 1
                with pytest.raises(StaleLease):
                    await ex.submit(store.append_item, "t1", type="late")
            async with keeper.hold("thread:t2", ttl=30):
                pass
            with store.read() as conn:
                assert store.get_lease(conn, "thread:t2")["owner"] is None  # released on exit
                assert store.get_lease(conn, "thread:t1")["owner"] == "B"  # not ours to release
            nursery.cancel_scope.cancel()
    with store.read() as conn:
        assert [i.type for i in store.list_items(conn, "t1")] == ["fenced"]


async def test_keeper_hand_over_between_two_keepers(backend) -> None:
    store = _with_thread(backend)
    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            a = LeaseKeeper(store.writer, owner="A")
            b = LeaseKeeper(store.writer, owner="B")
            c = LeaseKeeper(store.writer, owner="C")
            for keeper in (a, b, c):
                await nursery.start(keeper.run)
            async with a.hold("thread:t1", ttl=30) as ex_a:
                await ex_a.submit(store.append_item, "t1", type="a")
                await ex_a.hand_over("B")
                with pytest.raises(StaleLease):
                    await ex_a.submit(store.append_item, "t1", type="a-late")
                with pytest.raises(LeaseHeld):
                    async with c.hold("thread:t1", ttl=30):
                        pass
                async with b.hold("thread:t1", ttl=30) as ex_b:
                    assert ex_b.lease.token == ex_a.lease.token + 1
                    await ex_b.submit(store.append_item, "t1", type="b")
            nursery.cancel_scope.cancel()
    with store.read() as conn:
        assert [i.type for i in store.list_items(conn, "t1")] == ["a", "b"]


async def test_keeper_forgets_finished_executions(backend) -> None:
    """A long-running server holds one execution per turn: once a hold has ended, the keeper
    keeps no reference to it (its lease, scope and events), however many turns have run."""
    store = _with_thread(backend)
    finished: list[weakref.ref] = []
    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            keeper = LeaseKeeper(store.writer, owner="A")
            await nursery.start(keeper.run)
            for n in range(5):
                async with keeper.hold(f"thread:t{n}", ttl=30) as ex:
                    finished.append(weakref.ref(ex))
                    await trio.testing.wait_all_tasks_blocked()  # the keeper watches it
                del ex
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            # (the keeper's loop may still name the last one it received)
            assert [ref() for ref in finished[:-1]] == [None] * 4
            assert keeper.executions == frozenset()
            nursery.cancel_scope.cancel()


async def test_keeper_hold_with_commits_the_first_write_with_the_acquisition(backend) -> None:
    """hold_with: the acquisition and the execution's first write are one commit; then the
    execution is held, renewed and fenced as with hold; a first write that fails takes no lease."""
    store = _with_thread(backend)

    def admit(conn, kind: str):
        return store.append_item(conn, "t1", type=kind)

    def failing(conn) -> None:
        raise RuntimeError("the admission failed")

    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            keeper = LeaseKeeper(store.writer, owner="A")
            await nursery.start(keeper.run)
            before = store.writer.stats.transactions
            async with keeper.hold_with("thread:t1", admit, "admitted", ttl=0.6, control=True) as held:
                ex, first = held
                assert store.writer.stats.transactions == before + 1  # one commit for both
                assert (first.seq, ex.lease.owner) == (1, "A")
                with ex.cancel_scope:
                    await ex.renewed.wait()
                    await ex.submit(store.append_item, "t1", type="fenced")
                    with pytest.raises(LeaseHeld):
                        async with keeper.hold_with("thread:t1", admit, "not admitted"):
                            pytest.fail("A holds thread:t1: a second hold_with must raise LeaseHeld")
            with pytest.raises(RuntimeError):
                async with keeper.hold_with("thread:t2", failing):
                    pytest.fail("the failing first write must raise, with no lease taken")
            with store.read() as conn:
                assert store.get_lease(conn, "thread:t1")["owner"] is None  # released on exit
                assert store.get_lease(conn, "thread:t2") is None  # never taken
            nursery.cancel_scope.cancel()
    with store.read() as conn:
        assert [i.type for i in store.list_items(conn, "t1")] == ["admitted", "fenced"]


async def test_keeper_writes_no_release_after_the_callers_own(backend) -> None:
    """Execution.mark_released: the caller's committed write released the lease (a turn's end,
    with its turn row), so the hold's exit commits no release of its own; without it, it does."""
    store = _with_thread(backend)
    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            keeper = LeaseKeeper(store.writer, owner="A")
            await nursery.start(keeper.run)
            async with keeper.hold("thread:t1", ttl=30) as ex:
                await ex.submit(store.release, ex.lease)
                ex.mark_released()
                ended = store.writer.stats.transactions
            assert store.writer.stats.transactions == ended  # no second release
            async with keeper.hold("thread:t1", ttl=30) as ex:
                held = store.writer.stats.transactions
            assert store.writer.stats.transactions == held + 1  # the hold's own release
            with store.read() as conn:
                assert store.get_lease(conn, "thread:t1")["owner"] is None
            nursery.cancel_scope.cancel()


async def test_keeper_must_be_running(backend) -> None:
    keeper = LeaseKeeper(backend.writer, owner="A")
    with pytest.raises(LifecycleError):
        async with keeper.hold("k"):
            pass


def _where(store) -> str:
    return str(store.path) if isinstance(store, Store) else store.url


async def test_two_processes_race_and_exactly_one_wins(backend) -> None:
    for round_ in range(3):
        key = f"thread:race{round_}"
        with trio.fail_after(scaled(30)):
            children = [await Child.start("race", _where(backend), key, f"P{i}") for i in range(2)]
            try:
                for child in children:
                    await child.expect("ready")
                for child in children:
                    await child.send("go")
                outcomes = sorted([await child.readline() for child in children])
            finally:
                for child in children:
                    await child.aclose()
        assert outcomes == ["held", "won 1"], outcomes


async def test_sigstopped_holder_is_fenced_off_and_cancelled_on_sigcont(backend) -> None:
    store = _with_thread(backend)
    key = "thread:t1"
    with trio.fail_after(scaled(40)):
        child = await Child.start("holder", _where(store), key, "t1", "1.5")
        try:
            assert await child.expect("acquired") == "acquired 1"
            assert await child.expect("wrote") == "wrote 1"
            await child.expect("renewed")
            child.signal(signal.SIGSTOP)  # just after a renewal: it holds no lock now
            while True:  # until the database judges the lease expired (its clock, not ours)
                try:
                    with store.transaction() as conn:
                        lease = store.acquire(conn, key, "taker", 60.0)
                        assert lease.token == 2
                        store.append_item(conn, "t1", type="taker")
                    break
                except LeaseHeld:
                    await trio.sleep(0.05)
            child.signal(signal.SIGCONT)
            rest = await child.rest()
            await child.process.wait()
        finally:
            await child.aclose()
    assert child.process.returncode == 0
    lines = [line for line in rest if line != "renewed"]
    assert lines == ["lost superseded", "stale-write-refused"]
    with store.read() as conn:
        items = store.list_items(conn, "t1")
        assert [(i.seq, i.type) for i in items] == [(1, "agent_message"), (2, "taker")]
        assert store.get_lease(conn, key)["owner"] == "taker"  # the holder's release changed nothing


def _dump(store) -> list:
    """The thread, its items and its lease, through the store interface (either backend)."""
    with store.read() as conn:
        thread = store.get_thread(conn, "t1")
        return [(thread.title, thread.updated_at), [(i.seq, i.type) for i in store.list_items(conn, "t1")],
                store.get_lease(conn, "thread:t1")]


async def test_the_keeper_takes_every_execution_waiting_each_time_it_runs(backend) -> None:
    """Admissions in a burst, several per scheduler batch (100 threads starting turns), do not
    fill the keeper's bounded queue: each time the keeper runs it takes every execution waiting,
    not one (one a batch made ``turn/start`` fail with "the lease keeper's queue is full")."""
    import contextlib

    store = _with_thread(backend)
    with store.transaction() as conn:
        leases = [store.acquire(conn, f"thread:burst{i}", "A", 60.0) for i in range(30)]
    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            keeper = LeaseKeeper(store.writer, owner="A", queue_size=8)
            await nursery.start(keeper.run)
            async with contextlib.AsyncExitStack() as stack:
                for i in range(0, 30, 3):  # three admissions per scheduler batch
                    for lease in leases[i : i + 3]:
                        await stack.enter_async_context(keeper.adopt(lease))
                    await trio.lowlevel.checkpoint()
                await trio.testing.wait_all_tasks_blocked()
                assert len(keeper._held) == 30
            nursery.cancel_scope.cancel()
