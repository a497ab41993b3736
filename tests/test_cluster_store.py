"""The store operations of a cluster (issue 13) on both backends: task claims, node heartbeats,
the portable data modules (blobs, usage, background processes), and the restartable writer."""

from __future__ import annotations

import sqlite3
import threading

import pytest
import trio

import roost.storage as storage
from roost.errors import StaleLease
from roost.storage import (
    beat_node,
    claim_daemon_task,
    create_thread,
    create_turn,
    enqueue_daemon_task,
    forget_node,
    get_bg_process,
    get_daemon_task,
    insert_bg_process,
    list_bg_processes,
    list_nodes,
    list_usage_records,
    queue_depth,
    read_blob,
    received_bg_processes,
    record_bg_exit,
    read_blob_chunk,
    task_lease_key,
    update_bg_process,
    update_daemon_task,
    update_turn,
    withdraw_daemon_task,
)

PNG = "iVBORw0KGgo="  # 8 bytes


def _queue(store, n: int) -> list[str]:
    with store.transaction() as conn:
        return [enqueue_daemon_task(conn, payload={"task": f"t{i}"}, id=f"task{i}")[0].id for i in range(n)]


def test_claims_take_the_queue_in_order_once_each(backend) -> None:
    ids = _queue(backend, 3)
    got = []
    for owner in ("A", "B", "A", "B"):
        with backend.transaction() as conn:
            claimed = claim_daemon_task(conn, owner, 10.0)
        got.append(None if claimed is None else (claimed[0].id, claimed[1].owner, claimed[1].token, claimed[2]))
    assert got == [("task0", "A", 1, False), ("task1", "B", 1, False), ("task2", "A", 1, False), None]
    with backend.read() as conn:
        assert [get_daemon_task(conn, i).status for i in ids] == ["running"] * 3
        assert queue_depth(conn) == {"queued": 0, "running": 3}


def test_a_running_task_is_resumed_once_its_executor_is_gone(backend) -> None:
    _queue(backend, 1)
    with backend.transaction() as conn:
        task, lease, resumed = claim_daemon_task(conn, "A", 10.0)
        # the thread of the task runs under A too
        storage.acquire(conn, f"thread:{task.id}", "A", 10.0)
    with backend.transaction() as conn:
        assert claim_daemon_task(conn, "B", 10.0) is None  # A is alive: nothing to claim
        storage.release(conn, lease)
        assert claim_daemon_task(conn, "B", 10.0) is None  # its thread is still under A's lease
        thread = storage.get_lease(conn, f"thread:{task.id}")
        storage.release(conn, storage.Lease(key=thread["key"], owner="A", token=thread["token"],
                                            expires_at=0, ttl=10.0))
        again = claim_daemon_task(conn, "B", 10.0)
    assert again is not None
    task2, lease2, resumed2 = again
    assert (task2.id, lease2.token, resumed2) == (task.id, 2, True)
    # A's late result is refused: its token is stale
    with backend.transaction() as conn:
        with pytest.raises(StaleLease):
            storage.fenced(task_lease_key(task.id), lease.token, update_daemon_task)(conn, task.id, status="finished")
    with backend.read() as conn:
        assert get_daemon_task(conn, task.id).status == "running"


def test_a_queued_task_is_withdrawn_or_claimed_never_both(backend) -> None:
    _queue(backend, 3)
    with backend.transaction() as conn:
        assert withdraw_daemon_task(conn, "task1", {"task": "t1", "result": {"succeeded": False}}) is True
        claimed = claim_daemon_task(conn, "A", 10.0)
    assert claimed is not None and claimed[0].id == "task0"
    with backend.transaction() as conn:
        assert withdraw_daemon_task(conn, "task0", {"task": "t0"}) is False  # running: claimed first
        assert withdraw_daemon_task(conn, "task1", {"task": "t1"}) is False  # withdrawn already
        assert withdraw_daemon_task(conn, "nope", {"task": "?"}) is False
        assert claim_daemon_task(conn, "B", 10.0)[0].id == "task2"  # the withdrawn one is skipped
        assert claim_daemon_task(conn, "B", 10.0) is None
    with backend.read() as conn:
        withdrawn = get_daemon_task(conn, "task1")
        assert (withdrawn.status, withdrawn.payload["result"]) == ("finished", {"succeeded": False})
        assert get_daemon_task(conn, "task0").status == "running"


def test_simultaneous_claimers_of_two_connections_never_share_a_task(backend) -> None:
    _queue(backend, 6)
    won: list[str] = []
    lock = threading.Lock()

    def claimer(owner: str) -> None:
        while True:
            with backend.transaction() as conn:
                claimed = claim_daemon_task(conn, owner, 10.0)
            if claimed is None:
                return
            with lock:
                won.append(claimed[0].id)

    threads = [threading.Thread(target=claimer, args=(o,)) for o in ("A", "B", "C")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == [f"task{i}" for i in range(6)]


def test_node_heartbeats_list_the_cluster_with_their_leases(backend) -> None:
    with backend.transaction() as conn:
        beat_node(conn, "host:1:a", 5.0)
        beat_node(conn, "host:2:b", 5.0)
        storage.acquire(conn, "thread:x", "host:2:b", 30.0)
    with backend.read() as conn:
        nodes = {n["owner"]: n for n in list_nodes(conn)}
    assert set(nodes) == {"host:1:a", "host:2:b"}
    assert nodes["host:2:b"]["leases"] == ["thread:x"] and nodes["host:1:a"]["leases"] == []
    assert all(n["alive"] and 0 <= n["ageSeconds"] < 5 for n in nodes.values())
    with backend.transaction() as conn:
        assert forget_node(conn, "host:1:a") is True
    with backend.read() as conn:
        assert [n["owner"] for n in list_nodes(conn)] == ["host:2:b"]


def test_blobs_usage_and_background_processes_on_each_backend(backend) -> None:
    with backend.transaction() as conn:
        thread = create_thread(conn, title="t")
        turn = create_turn(conn, thread.id)
        update_turn(conn, turn.id, usage={"input_tokens": 3, "output_tokens": 4})
        item = storage.append_item(conn, thread.id, type="user_message",
                                   payload={"images": [{"media_type": "image/png", "data": PNG}]})
        insert_bg_process(conn, id="bg1", thread_id=thread.id, owner="o", pid=12, command="sleep 1", cwd=None)
    with backend.read() as conn:
        stored = storage.get_item(conn, item.id).payload["images"][0]
        assert stored["data"] == PNG and stored["size"] == 8  # externalized, read back
        ctype, data = read_blob(conn, stored["sha256"])
        assert ctype == "image/png" and len(data) == 8
        assert read_blob_chunk(conn, stored["sha256"], 2, 3)[1:] == (8, data[2:5])
        (usage,) = list_usage_records(conn)
        assert (usage["thread_id"], usage["input_tokens"], usage["output_tokens"]) == (thread.id, 3, 4)
        assert [p["id"] for p in list_bg_processes(conn, thread.id)] == ["bg1"]
        assert get_bg_process(conn, "bg1")["status"] == "running"


def test_an_exit_and_its_waiting_notice_commit_in_one_write(backend) -> None:
    with backend.transaction() as conn:
        thread = create_thread(conn, title="t")
        for pid in ("bg1", "bg2"):
            insert_bg_process(conn, id=pid, thread_id=thread.id, owner="o", pid=12, command="true", cwd=None)
        update_bg_process(conn, "bg2", trigger_status="cancelled")
    with backend.transaction() as conn:
        row = record_bg_exit(conn, "bg1", exit_code=3, ended_at="2026-12-04T00:00:00+00:00", output_tail="x")
        assert (row["status"], row["exit_code"], row["trigger_status"]) == ("exited", 3, "received")
        assert record_bg_exit(conn, "bg2", exit_code=0, ended_at="2026-12-04T00:00:00+00:00",
                              output_tail="")["trigger_status"] == "cancelled"  # no notice: kept
    with backend.read() as conn:  # what a restart would redeliver: the received one only
        assert [r["id"] for r in received_bg_processes(conn)] == ["bg1"]


async def test_the_writer_serves_again_after_a_restart(backend) -> None:
    writer = backend.writer
    for attempt in range(2):  # the supervisor's permanent child: serve, stop, serve again
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.serve)
            thread = await writer.submit(create_thread, title=f"round {attempt}")
            nursery.cancel_scope.cancel()
        with backend.read() as conn:
            assert storage.get_thread(conn, thread.id).title == f"round {attempt}"
    writer.close()


def test_many_tasks_running_on_live_nodes_never_hide_the_queued_ones(backend) -> None:
    _queue(backend, 71)
    with backend.transaction() as conn:
        for _ in range(70):  # another host's node runs 70 tasks (more than one claim looks at)
            assert claim_daemon_task(conn, "elsewhere:1:n", 30.0) is not None
        claimed = claim_daemon_task(conn, "here:2:n", 30.0)
    assert claimed is not None and (claimed[0].id, claimed[2]) == ("task70", False)


def test_a_claim_judges_each_live_owner_of_this_host_once_and_resumes_a_dead_ones_task(backend, monkeypatch) -> None:
    """``roost serve --workers``: every running task's lease is of this host. A claim asks whether
    each owner's process is dead once per owner, not twice per task (inside the write lock), and
    still resumes the task of a dead owner and skips the live ones' (both leases each)."""
    import os

    from roost.storage import leases

    host = leases.hostname()
    live_a, live_b, dead = f"{host}:{os.getpid()}:a", f"{host}:1:b", f"{host}:999999999:c"
    _queue(backend, 7)
    with backend.transaction() as conn:
        for owner in (live_a, live_a, live_b, live_b, live_b, dead):
            task, _lease, _ = claim_daemon_task(conn, owner, 30.0)
            storage.acquire(conn, f"thread:{task.id}", owner, 30.0)
    asked: list[str] = []
    real = leases.owner_is_dead

    def counted(owner):
        asked.append(owner)
        return owner == dead or real(owner)

    monkeypatch.setattr(leases, "owner_is_dead", counted)
    with backend.transaction() as conn:
        claimed = claim_daemon_task(conn, "elsewhere:1:n", 30.0)
    assert claimed is not None and (claimed[0].id, claimed[2]) == ("task5", True)  # the dead one's
    # once each while scanning (the claimed task's own takeover asks again about its dead owner)
    assert (asked.count(live_a), asked.count(live_b), asked[:3]) == (1, 1, [live_a, live_b, dead])


def _age(store, owner: str, seconds: float) -> None:
    """Let ``seconds`` pass for ``owner`` alone: its heartbeat and its leases are that much older
    (as if the node stopped beating and renewing that long ago)."""
    with store.transaction() as conn:
        conn.execute(f"UPDATE nodes SET last_seen = last_seen - {seconds} WHERE owner = '{owner}'")
        conn.execute(f"UPDATE leases SET expires_at = expires_at - {seconds} WHERE owner = '{owner}'")


def test_heartbeats_are_judged_on_the_database_clock_whatever_the_nodes_clock(backend, monkeypatch) -> None:
    import time

    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600)  # test-only: the beating node's clock is behind
    with backend.transaction() as conn:
        seen = beat_node(conn, "elsewhere:1:a", 5.0)
    assert abs(seen - real()) < 60  # the database's time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)  # the judging node's clock is ahead
    with backend.read() as conn:
        (node,) = list_nodes(conn)
        assert (node["alive"], node["state"]) == (True, "alive") and 0 <= node["ageSeconds"] < 5
        assert storage.owner_gone(conn, "elsewhere:1:a") is False


def test_a_dead_node_is_marked_gone_then_pruned_and_its_task_still_resumes(backend) -> None:
    _queue(backend, 2)
    dead, live = "elsewhere:1:dead", "elsewhere:2:live"
    with backend.transaction() as conn:
        beat_node(conn, dead, 1.0)
        beat_node(conn, live, 1.0)
        task, lease, _ = claim_daemon_task(conn, dead, 1.0)
        storage.acquire(conn, f"thread:{task.id}", dead, 1.0)
    _age(backend, dead, 2.0)  # two ttls without a heartbeat (database clock)
    with backend.read() as conn:
        nodes = {n["owner"]: n for n in list_nodes(conn)}
        assert (nodes[dead]["alive"], nodes[dead]["state"]) == (False, "gone")
        assert nodes[live]["state"] == "alive"
        if not isinstance(conn, sqlite3.Connection):  # another host's owner: judged by its heartbeat row
            assert storage.owner_gone(conn, dead) and not storage.owner_gone(conn, live)
    _age(backend, dead, 9.0)  # past the retention (10 ttls): no longer listed, even before a prune
    with backend.read() as conn:
        assert [n["owner"] for n in list_nodes(conn)] == [live]
    with backend.transaction() as conn:
        beat_node(conn, live, 1.0)  # any node's heartbeat deletes the row
        assert conn.execute("SELECT COUNT(*) FROM nodes").fetchone()[0] == 1
        # nothing of the dead node is lost: its running task resumes elsewhere, its queued one waits
        resumed = claim_daemon_task(conn, live, 1.0)
        assert resumed is not None and (resumed[0].id, resumed[1].token, resumed[2]) == (task.id, 2, True)
        assert claim_daemon_task(conn, live, 1.0)[0].id == "task1"
        if not isinstance(conn, sqlite3.Connection):
            assert storage.owner_gone(conn, dead)  # a pruned row still means gone


def test_nodes_show_iso_times_their_tasks_and_a_dead_pid_of_this_host_gone_at_once(backend) -> None:
    import datetime
    import os
    import re
    import socket
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid of this host that no longer runs (exited and reaped)
    dead = f"{socket.gethostname()}:{gone.pid}:dead"
    live = f"{socket.gethostname()}:{os.getpid()}:live"
    _queue(backend, 1)
    with backend.transaction() as conn:
        beat_node(conn, dead, 30.0)
        beat_node(conn, live, 30.0)
        task, _, _ = claim_daemon_task(conn, live, 30.0)
    with backend.read() as conn:
        nodes = {n["owner"]: n for n in list_nodes(conn)}
    # the dead pid's heartbeat is fresh (30 s ttl), yet this host sees the process is gone
    assert (nodes[dead]["alive"], nodes[dead]["state"]) == (False, "gone")
    assert (nodes[live]["alive"], nodes[live]["state"]) == (True, "alive")
    assert nodes[live]["runningTasks"] == [task.id] and nodes[dead]["runningTasks"] == []
    iso = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
    for node in nodes.values():
        assert iso.match(node["startedAt"]) and iso.match(node["lastSeen"]), node
        seen = datetime.datetime.fromisoformat(node["lastSeen"].replace("Z", "+00:00"))
        assert abs((datetime.datetime.now(datetime.UTC) - seen).total_seconds()) < 60
        assert 0 <= node["ageSeconds"] < 30 and node["uptimeSeconds"] >= 0


def test_the_queue_finds_the_owners_of_tasks_running_elsewhere_in_one_query_by_the_database_clock(
    backend, monkeypatch
) -> None:
    """``SharedQueue._owners`` (who to ask to interrupt a task another node runs): the live
    leases of other owners, none of its own, an expired or released one, or a task never claimed;
    read in one query, and on PostgreSQL judged by the database's clock (this host's may be
    ahead)."""
    import time
    import types

    from roost.actors._taskqueue_shared import SharedQueue
    from roost.storage import leases
    from roost.storage._portable import is_sqlite

    _queue(backend, 4)
    with backend.transaction() as conn:
        for owner in ("other:1:a", "me:1:m", "other:1:b"):
            claim_daemon_task(conn, owner, 30.0)
    with backend.transaction() as conn:
        conn.execute("UPDATE leases SET expires_at = expires_at - 60 WHERE owner = 'other:1:b'")
    queue = SharedQueue()
    queue.runtime = types.SimpleNamespace(store=backend, services=types.SimpleNamespace(owner="me:1:m"))
    reads: list[int] = []
    many = leases.held_elsewhere_many
    monkeypatch.setattr(
        leases, "held_elsewhere_many", lambda conn, keys, owner: reads.append(1) or many(conn, keys, owner)
    )
    with backend.read() as conn:
        postgres = not is_sqlite(conn)
    if postgres:
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 3600)  # this host's clock is an hour ahead
    owners = trio.run(queue._owners, ["task0", "task1", "task2", "task3"])
    assert owners == {"task0": "other:1:a"} and reads == [1]


def test_a_claim_reads_the_running_and_queued_tasks_by_index_not_the_whole_history(tmp_path) -> None:
    """A claim's reads of ``daemon_tasks`` search the status index: every task a daemon ever ran
    stays a row, and each claim of every ``--workers`` process runs inside the write lock."""
    store = storage.open_store(tmp_path / "roost.db")
    try:
        _queue(store, 3)
        statements: list[str] = []
        with store.transaction() as conn:
            conn.set_trace_callback(statements.append)
            assert claim_daemon_task(conn, "A", 10.0) is not None
            conn.set_trace_callback(None)
            reads = [s for s in statements if s.lstrip().upper().startswith("SELECT") and "FROM daemon_tasks" in s]
            assert len(reads) >= 2
            for sql in reads:
                plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
                assert not any(step.startswith("SCAN") for step in plan), (sql, plan)
            by_status = [s for s in reads if "status =" in s]
            assert len(by_status) == 2  # the running ones, then the queued ones
            for sql in by_status:
                assert any("daemon_tasks_status" in row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}")), sql
    finally:
        store.close()
