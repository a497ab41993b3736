"""Control before data (DESIGN.md section 4; issue 19): bounded stream slices and outbox lanes."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing
from _helpers.timing import scaled
from hypothesis import given, settings
from hypothesis import strategies as st

from roost._json import dumps_line
from roost.actors._fair import FairEvents
from roost.protocol._coalesce import APP_SERVER_DELTAS, app_server_thread_of
from roost.protocol._outbox import Outbox

#: An argument this large makes a group commit in the store writer's worker thread, not on the
#: event loop's thread (roost.storage._writer: a group in flight while others wait).
IN_THREAD = "x" * (80 << 10)


class _Greedy:
    """An async iterator that never checkpoints (like an engine handing out a buffered chunk)."""

    def __init__(self, n: int) -> None:
        self.n, self.i = n, 0

    def __aiter__(self) -> _Greedy:
        return self

    async def __anext__(self) -> int:
        if self.i >= self.n:
            raise StopAsyncIteration
        self.i += 1
        sum(range(200))  # a little work per event
        return self.i


async def test_a_stream_that_never_checkpoints_lets_other_tasks_run() -> None:
    ran_during = 0
    done = False

    async def control() -> None:
        nonlocal ran_during
        while not done:
            await trio.lowlevel.checkpoint()
            ran_during += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(control)
        await trio.lowlevel.checkpoint()
        events = 0
        async for _ in FairEvents(_Greedy(20_000)):
            events += 1
        done = True
    assert events == 20_000
    assert ran_during > 0


async def test_greedy_streams_take_turns() -> None:
    order: list[str] = []

    async def consume(name: str) -> None:
        async for _ in FairEvents(_Greedy(20_000)):
            if not order or order[-1] != name:
                order.append(name)
        order.append(f"{name} done")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume, "a")
        nursery.start_soon(consume, "b")
    first_done = min(order.index("a done"), order.index("b done"))
    assert {"a", "b"} <= set(order[:first_done])  # both progressed before either finished
    assert len(order) > 4  # they alternated, slice by slice


async def test_a_parked_stream_is_cancelled_at_once() -> None:
    finished: list[str] = []

    async def consume(name: str) -> None:
        async for _ in FairEvents(_Greedy(1_000_000)):
            pass
        finished.append(name)

    async with trio.open_nursery() as nursery:
        for name in "abc":
            nursery.start_soon(consume, name)
        await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert finished == []


# -- outbox lanes ------------------------------------------------------------------------------------


def _delta(thread: str, item: str, text: str) -> bytes:
    return dumps_line({"method": "item/agentMessage/delta",
                       "params": {"thread_id": thread, "turn_id": "u", "item_id": item, "delta": text}})


def _note(thread: str | None, n: int) -> bytes:
    params = {"thread_id": thread, "n": n} if thread else {"n": n}
    return dumps_line({"method": "item/completed", "params": params})


def _response(n: int, thread: str) -> bytes:
    return dumps_line({"id": n, "result": {"thread_id": thread}})


class _Sink(trio.abc.SendStream):
    def __init__(self) -> None:
        self.data = b""

    async def send_all(self, data: bytes) -> None:
        self.data += bytes(data)
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def _write_all(lines: list[bytes], *, before_writer: int) -> list[dict]:
    """Deliver ``lines`` (the first ``before_writer`` as a backlog), drain, return what was written."""
    outbox, sink = Outbox(coalesce=APP_SERVER_DELTAS, lanes=app_server_thread_of), _Sink()
    for line in lines[:before_writer]:
        outbox.deliver(line)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run_writer, sink)
        for line in lines[before_writer:]:
            outbox.deliver(line)
            await trio.lowlevel.checkpoint()
        outbox.close()
    return [json.loads(line) for line in sink.data.splitlines()]


def _view(message: dict) -> tuple:
    p = message.get("params") or message.get("result") or {}
    if message.get("method") == "item/agentMessage/delta":
        return ("delta", p["thread_id"], p["item_id"], p["delta"])
    if "id" in message:
        return ("response", message["id"])
    return ("note", p.get("thread_id"), p["n"])


def _texts_before(views: list[tuple], index: int, thread: str | None) -> dict:
    """Each item's text delivered before position ``index`` (of ``thread``, or of all threads)."""
    out: dict = {}
    for v in views[:index]:
        if v[0] == "delta" and (thread is None or v[1] == thread):
            out[(v[1], v[2])] = out.get((v[1], v[2]), "") + v[3]
    return out


_lines = st.lists(st.one_of(
    st.builds(_delta, st.sampled_from(["A", "B", "C"]), st.sampled_from(["i", "j"]), st.text("xyz", min_size=1, max_size=3)),
    st.builds(_note, st.sampled_from(["A", "B", None]), st.integers(0, 99)),
    st.builds(_response, st.integers(0, 99), st.sampled_from(["A", "B"]))), max_size=80)


@settings(max_examples=150, deadline=None)
@given(_lines, st.integers(0, 80))
async def test_lanes_keep_every_order_that_matters(lines: list[bytes], before_writer: int) -> None:
    sent = [_view(json.loads(line)) for line in lines]
    got = [_view(m) for m in await _write_all(lines, before_writer=min(before_writer, len(lines)))]
    # every text arrives whole; lines that are not deltas keep their order
    assert _texts_before(got, len(got), None) == _texts_before(sent, len(sent), None)
    assert [v for v in got if v[0] != "delta"] == [v for v in sent if v[0] != "delta"]
    for v in (v for v in sent if v[0] == "note"):
        # a notification comes after the deltas sent before it: its thread's, or all for none
        thread = v[1]
        assert _texts_before(got, got.index(v), thread) == _texts_before(sent, sent.index(v), thread)


async def test_control_passes_a_backlog_of_other_threads_deltas() -> None:
    lines = [_delta("A", "i", "x") for _ in range(2000)]
    lines += [_delta("B", "k", "first"), _response(1, "B"), _note("B", 7)]
    got = [_view(m) for m in await _write_all(lines, before_writer=len(lines))]
    assert got[0] == ("response", 1)  # the answer is not queued behind thread A's text
    assert got[1:3] == [("delta", "B", "k", "first"), ("note", "B", 7)]  # B's order is kept
    assert _texts_before(got, len(got), "A") == {("A", "i"): "x" * 2000}


# -- the store writer ---------------------------------------------------------------------------------


async def test_a_group_in_flight_stops_for_an_urgent_write(tmp_path) -> None:
    """The group being committed takes no further write once an urgent one waits; the rest go
    first in the next ordinary group, in order, each answered once."""
    import threading

    from roost.storage import open_store

    store = open_store(tmp_path / "roost.db", batch_max=10)
    order: list[str] = []
    started, release = threading.Event(), threading.Event()

    def note(conn, label: str, pad: str = "") -> str:
        if label == "queued 0":
            started.set()
            release.wait(10)
        order.append(label)
        return label

    store.writer.submit_nowait(note, "queued 0", IN_THREAD)  # the group commits in the worker thread
    for i in range(1, 10):
        store.writer.submit_nowait(note, f"queued {i}")
    results: list[str] = []

    async def urgent() -> None:
        results.append(await store.writer.submit_urgent(note, "urgent"))

    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.writer.run)
            await trio.to_thread.run_sync(started.wait)  # the group's first write is running
            nursery.start_soon(urgent)
            await trio.testing.wait_all_tasks_blocked()   # the urgent write waits
            release.set()
            results.append(await store.writer.submit(note, "last"))
            nursery.cancel_scope.cancel()
    assert order == ["queued 0", "urgent", *(f"queued {i}" for i in range(1, 10)), "last"]
    assert results == ["urgent", "last"]
    assert store.writer.stats.writes == 12 and store.writer.stats.failed == 0
    store.close()


async def test_a_small_urgent_write_commits_on_the_event_loop_thread_in_a_group_of_its_own(tmp_path) -> None:
    """No worker-thread hand-off for a small write (an interrupted turn's end, a lease renewal, a
    small group of data): it runs on the trio thread, an urgent one alone in its transaction, and
    is durable when answered; a large one still goes to the worker thread."""
    import sqlite3
    import threading

    from roost.storage import open_store

    db = tmp_path / "roost.db"
    store = open_store(db)
    ran_on: dict[str, threading.Thread] = {}

    def note(conn, label: str, payload: str = "") -> str:
        ran_on[label] = threading.current_thread()
        conn.execute("CREATE TABLE IF NOT EXISTS notes (label TEXT)")
        conn.execute("INSERT INTO notes VALUES (?)", (label,))
        return label

    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            await store.writer.submit(note, "ordinary")
            before = store.writer.stats.transactions
            assert await store.writer.submit_urgent(note, "urgent") == "urgent"
            assert store.writer.stats.transactions == before + 1  # a group of its own
            assert ran_on["urgent"] is threading.current_thread()  # the event loop's thread
            assert await store.writer.submit_urgent(note, "large", payload="x" * (1 << 20)) == "large"
            text = "y" * (1 << 20)

            def captured(conn) -> str:  # the text is in the closure, not in the arguments
                return note(conn, "captured", payload=text)

            assert await store.writer.submit_urgent(captured) == "captured"
            nursery.cancel_scope.cancel()
    assert ran_on["ordinary"] is threading.current_thread()
    assert ran_on["large"] is not threading.current_thread()  # too large for the loop's thread
    assert ran_on["captured"] is not threading.current_thread()
    reader = sqlite3.connect(db)  # committed (another connection sees it)
    labels = [r[0] for r in reader.execute("SELECT label FROM notes")]
    assert labels == ["ordinary", "urgent", "large", "captured"]
    reader.close()
    store.close()


async def test_an_urgent_write_never_waits_for_a_lock_on_the_event_loop_thread(tmp_path) -> None:
    """With the write lock held by another connection (another process), an urgent write goes to
    the worker thread and waits there: the event loop keeps running, and it commits once the lock
    is free."""
    import sqlite3
    import threading

    from roost.storage import open_store

    db = tmp_path / "roost.db"
    store = open_store(db)
    ran_on: list[threading.Thread] = []

    def note(conn) -> str:
        ran_on.append(threading.current_thread())
        return "done"

    other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            result: list[str] = []
            answered = trio.Event()

            async def urgent() -> None:
                result.append(await store.writer.submit_urgent(note))
                answered.set()

            nursery.start_soon(urgent)
            # The loop is not blocked while the lock is held elsewhere: every task gets to wait
            # (the write waits for the lock in the worker thread).
            await trio.testing.wait_all_tasks_blocked()
            assert result == []
            other.execute("COMMIT")
            await answered.wait()
            nursery.cancel_scope.cancel()
    assert result == ["done"] and ran_on[0] is not threading.current_thread()
    other.close()
    store.close()


async def test_a_new_turns_admission_commits_ahead_of_queued_data_writes(tmp_path) -> None:
    """The lease and the turn row of a new turn (admission: control) do not wait behind writes
    the streams queued before them: a backlog queued behind a group in flight finds them
    committed (with FIFO admission every backlog write ran first)."""
    import threading

    from test_compact import SCRIPT, CapturingEngine, new_thread, runtime_with

    from roost.actors._messages import Origin, StartTurn

    async with runtime_with(CapturingEngine(SCRIPT)) as runtime:
        actor = await new_thread(runtime, tmp_path)
        writer = runtime.services.store.writer
        started, release = threading.Event(), threading.Event()
        seen: list[int] = []

        def blocking(conn, pad: str) -> None:
            started.set()
            release.wait(10)

        def backlog(conn) -> None:
            seen.append(conn.execute("SELECT count(*) FROM turns WHERE thread_id = ?", (actor.thread.id,)).fetchone()[0])

        with trio.fail_after(scaled(20)):
            writer.submit_nowait(blocking, IN_THREAD)
            await trio.to_thread.run_sync(started.wait)  # a group is in flight
            for _ in range(20):
                writer.submit_nowait(backlog)  # data queued before the turn starts
            async with trio.open_nursery() as nursery:

                async def start() -> None:
                    await actor.ref.ask(StartTurn(prompt="hello", origin=Origin()))

                nursery.start_soon(start)
                await trio.testing.wait_all_tasks_blocked()
                release.set()
            await writer.submit(backlog)
        # Every backlog write saw the turn row, but at most the one that was running when the
        # admission write arrived (a group in flight runs at least one write before it stops).
        assert len(seen) == 21 and seen.count(0) <= 1 and seen[-1] == 1, seen


async def test_control_writes_cut_a_long_group_short_after_a_bounded_number_of_its_writes(tmp_path) -> None:
    """A group of data in flight when control writes (admissions) wait commits a bounded number of
    its writes (``_DATA_BEFORE_CONTROL``), then the control lane, then the rest: an admission
    never waits for a whole group of ``batch_max`` data writes, and data still moves under a
    stream of admissions."""
    import threading

    from roost.storage import open_store
    from roost.storage._writer import _DATA_BEFORE_CONTROL

    store = open_store(tmp_path / "roost.db", batch_max=100)
    order: list[str] = []
    started, release = threading.Event(), threading.Event()

    def note(conn, label: str, pad: str = "") -> str:
        if label == "data 0":
            started.set()
            release.wait(10)
        order.append(label)
        return label

    store.writer.submit_nowait(note, "data 0", IN_THREAD)  # the group commits in the worker thread
    for i in range(1, 60):
        store.writer.submit_nowait(note, f"data {i}")
    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.writer.run)
            await trio.to_thread.run_sync(started.wait)  # one group of sixty is being committed
            for i in range(3):
                nursery.start_soon(store.writer.submit_control, note, f"control {i}")
            await trio.testing.wait_all_tasks_blocked()
            release.set()
            assert await store.writer.submit(note, "last") == "last"
            nursery.cancel_scope.cancel()
    cut = _DATA_BEFORE_CONTROL
    assert order[:cut] == [f"data {i}" for i in range(cut)]
    assert set(order[cut : cut + 3]) == {f"control {i}" for i in range(3)}
    assert order[cut + 3 :] == [f"data {i}" for i in range(cut, 60)] + ["last"]  # FIFO kept
    store.close()


async def test_control_writes_go_ahead_of_queued_data_and_behind_urgent_ones(tmp_path) -> None:
    """The control lane (admissions): ahead of the queue (also of writes a group cut short by an
    urgent write left), behind urgent writes, committed together in slices of at most
    ``_INLINE_MAX_WRITES`` on the event loop's thread (a bulk of them never waits for the
    worker thread's hand-offs)."""
    import threading

    from roost.storage import open_store

    store = open_store(tmp_path / "roost.db", batch_max=50)
    order: list[str] = []
    threads: dict[str, threading.Thread] = {}
    started, release = threading.Event(), threading.Event()

    def note(conn, label: str, pad: str = "") -> str:
        if label == "in flight 0":
            started.set()
            release.wait(10)
        order.append(label)
        threads[label] = threading.current_thread()
        return label

    store.writer.submit_nowait(note, "in flight 0", IN_THREAD)  # the group commits in the worker thread
    for i in range(1, 3):
        store.writer.submit_nowait(note, f"in flight {i}")
    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.writer.run)
            await trio.to_thread.run_sync(started.wait)  # a group of three is being committed
            for i in range(3):
                store.writer.submit_nowait(note, f"queued {i}")
            for i in range(12):
                nursery.start_soon(store.writer.submit_control, note, f"control {i}")
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(store.writer.submit_urgent, note, "urgent")
            await trio.testing.wait_all_tasks_blocked()
            release.set()
            assert await store.writer.submit(note, "last") == "last"
            nursery.cancel_scope.cancel()
    controls = {f"control {i}" for i in range(12)}  # (their tasks start in any order)
    assert order[:2] == ["in flight 0", "urgent"]  # the group in flight stopped for the urgent write only
    assert set(order[2:14]) == controls  # then the control lane, ahead of the data queued before it
    assert order[14:] == ["in flight 1", "in flight 2", "queued 0", "queued 1", "queued 2", "last"]
    assert all(threads[c] is threading.current_thread() for c in controls)  # twelve: two slices, inline
    assert order[-1] == "last"
    store.close()


async def test_the_size_of_an_urgent_write_does_not_count_what_a_library_record_leads_to() -> None:
    """An interrupted turn's end closes over its execution, whose trio events lead to tasks and
    the whole runtime: only Roost's records are looked into, so the write still counts as small."""
    from roost.storage._keeper import Execution
    from roost.storage._write_size import carries_at_most as _carries_at_most
    from roost.storage._writer import _Write
    from roost.storage.leases import Lease

    execution = Execution(Lease(key="thread:t", owner="me", token=1, expires_at=0.0, ttl=15.0), None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(execution.lost.wait)  # a task waits on one of its events
        await trio.testing.wait_all_tasks_blocked()

        def end_of_turn(conn) -> str:
            return execution.lease.key

        assert _carries_at_most([_Write(end_of_turn, (), {}, None)], 1000, look_at=64)
        execution.lost.set()


async def test_small_data_groups_commit_on_the_loop_thread_in_bounded_slices(tmp_path, monkeypatch) -> None:
    """Ordinary (data) groups commit on the event loop's thread too, each stopping once it has
    done ``INLINE_SLICE_S`` of SQLite work (at least one write): the rest goes first in the next
    group, in order. With no slice left after each write, five writes are five transactions."""
    import threading

    from roost.storage import _writer, open_store

    monkeypatch.setattr(_writer, "INLINE_SLICE_S", 0.0)
    store = open_store(tmp_path / "roost.db")
    order: list[str] = []
    threads: set[threading.Thread] = set()

    def note(conn, label: str) -> str:
        order.append(label)
        threads.add(threading.current_thread())
        return label

    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            before = store.writer.stats.transactions
            for i in range(5):
                store.writer.submit_nowait(note, f"data {i}")
            assert await store.writer.submit(note, "last") == "last"
            nursery.cancel_scope.cancel()
    assert order == [f"data {i}" for i in range(5)] + ["last"]
    assert store.writer.stats.transactions - before == 6  # one slice per write
    assert threads == {threading.current_thread()}
    store.close()


async def test_a_data_group_commits_in_the_worker_thread_once_a_second_for_the_wal_checkpoint(
    tmp_path, monkeypatch
) -> None:
    """Inline groups never run a WAL checkpoint; once ``_THREADED_EVERY_S`` has passed since the
    last group in the worker thread, the next data group commits there (with the connection's
    ``wal_autocheckpoint``), so the WAL cannot grow without bound."""
    import threading

    from roost.storage import _writer, open_store

    store = open_store(tmp_path / "roost.db")
    threads: list[threading.Thread] = []

    def note(conn) -> int:
        threads.append(threading.current_thread())
        return int(conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])

    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            assert await store.writer.submit(note) == 0  # inline: no checkpoint on the loop's thread
            monkeypatch.setattr(_writer, "_THREADED_EVERY_S", 0.0)  # the second is due now
            assert await store.writer.submit(note) > 0  # the worker thread, checkpoints restored
            nursery.cancel_scope.cancel()
    assert threads[0] is threading.current_thread() and threads[1] is not threading.current_thread()
    store.close()


async def test_an_urgent_write_on_an_idle_writer_commits_before_its_caller_yields(tmp_path) -> None:
    """With no group in the worker thread, an urgent write commits in its caller's task, at once:
    no other task runs between the call and its answer (under saturation the writer task's turn
    and the caller's wake-up were each a scheduler batch). Durable when answered."""
    import sqlite3

    from roost.storage import open_store

    db = tmp_path / "roost.db"
    store = open_store(db)
    others_ran: list[bool] = []

    def note(conn) -> str:
        conn.execute("CREATE TABLE IF NOT EXISTS notes (label TEXT)")
        conn.execute("INSERT INTO notes VALUES ('urgent')")
        return "urgent"

    async def other() -> None:
        others_ran.append(True)

    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(other)  # runs at this task's next schedule point
            assert await store.writer.submit_urgent(note) == "urgent"
            assert others_ran == []  # answered without a schedule point
            reader = sqlite3.connect(db)
            assert reader.execute("SELECT label FROM notes").fetchall() == [("urgent",)]
            reader.close()
            nursery.cancel_scope.cancel()
    store.close()


async def test_an_urgent_write_waiting_for_a_group_in_the_worker_thread_hurries_it(tmp_path) -> None:
    """While an urgent write waits for a group committing in the worker thread, the interpreter's
    switch interval is short (that thread needs the GIL back at every SQLite call); once the group
    is done it is restored, and the urgent write has committed."""
    import sys
    import threading

    from roost.storage import _writer, open_store

    store = open_store(tmp_path / "roost.db")
    started, release = threading.Event(), threading.Event()
    default = sys.getswitchinterval()

    def blocking(conn, pad: str) -> None:
        started.set()
        release.wait(10)

    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            store.writer.submit_nowait(blocking, IN_THREAD)
            await trio.to_thread.run_sync(started.wait)  # a group is in flight in the worker thread
            assert sys.getswitchinterval() == default
            nursery.start_soon(store.writer.submit_urgent, lambda conn: None)
            await trio.testing.wait_all_tasks_blocked()
            assert sys.getswitchinterval() == pytest.approx(_writer._HURRY_SWITCH_S)
            release.set()
            await store.writer.submit(lambda conn: None)
            assert sys.getswitchinterval() == default
            nursery.cancel_scope.cancel()
    store.close()
