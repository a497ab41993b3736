"""The node bus: its store operations on both backends, and two NodeBus nodes on one store
(requests, replies, errors, withdrawal, the PostgreSQL NOTIFY wake-up and its polling fallback)."""

from __future__ import annotations

import threading
import time

import pytest
import trio
from _helpers.timing import scaled

from roost.actors import NodeBus
from roost.errors import NodeUnreachable, StaleTurn


def test_messages_are_claimed_once_in_order_and_acknowledged(backend):
    with backend.transaction() as conn:
        backend.register_bus_node(conn, "A", "app-server")
        first = backend.post_message(conn, target="A", sender="B", kind="k", body={"n": 1}, now=100.0)
        second = backend.post_message(conn, target="A", sender="B", kind="k", body={"n": 2}, now=101.0)
        backend.post_message(conn, target="C", sender="B", kind="k", body={"n": 3}, now=100.0)
    with backend.read() as conn:
        assert backend.has_pending_messages(conn, "A", now=102.0)
        assert not backend.has_pending_messages(conn, "A", now=1000.0)  # expired (ttl 60 s)
        assert [n.node_id for n in backend.list_bus_nodes(conn)] == ["A"]
    with backend.transaction() as conn:
        claimed = backend.claim_messages(conn, "A", now=102.0)
        assert [(m.id, m.body, m.status) for m in claimed] == [
            (first, {"n": 1}, "claimed"),
            (second, {"n": 2}, "claimed"),
        ]
        assert backend.claim_messages(conn, "A", now=102.0) == []  # exactly once
        assert not backend.cancel_message(conn, first)  # claimed: too late to withdraw
        assert backend.ack_message(conn, first) and not backend.ack_message(conn, first)
    with backend.read() as conn:
        assert backend.get_message(conn, first).status == "done"
        assert backend.get_message(conn, second).status == "claimed"
        assert not backend.has_pending_messages(conn, "A", now=102.0)


def test_a_withdrawn_message_is_never_claimed_and_old_rows_are_pruned(backend):
    with backend.transaction() as conn:
        mid = backend.post_message(conn, target="A", sender="B", kind="k", body=None, ttl=5, now=100.0)
        assert backend.cancel_message(conn, mid) and not backend.cancel_message(conn, mid)
        assert backend.claim_messages(conn, "A", now=101.0) == []
        late = backend.post_message(conn, target="A", sender="B", kind="k", body=None, ttl=5, now=100.0)
        assert backend.claim_messages(conn, "A", now=106.0) == []  # expired unclaimed
        assert backend.prune_messages(conn, keep=10, now=112.0) == 1  # the cancelled one (posted 12 s ago)
        assert backend.get_message(conn, late) is not None  # expired 6 s ago: kept 10 s
        assert backend.prune_messages(conn, keep=10, now=200.0) == 1


def test_nodes_register_heartbeat_and_leave(backend):
    with backend.transaction() as conn:
        backend.register_bus_node(conn, "A", "app-server", now=100.0)
        assert backend.heartbeat_bus_node(conn, "A", now=105.0)
        assert not backend.heartbeat_bus_node(conn, "nobody", now=105.0)
    with backend.read() as conn:
        node = backend.get_bus_node(conn, "A")
        assert (node.kind, node.started_at, node.heartbeat_at) == ("app-server", 100.0, 105.0)
    with backend.transaction() as conn:
        backend.remove_bus_node(conn, "A")
    with backend.read() as conn:
        assert backend.get_bus_node(conn, "A") is None and backend.list_bus_nodes(conn) == []


def test_two_claimers_of_one_target_never_share_a_row(backend):
    with backend.transaction() as conn:
        for n in range(200):
            backend.post_message(conn, target="A", sender="B", kind="k", body=n)
    got: list[list[int]] = [[], []]

    def claim(slot: int) -> None:
        while True:
            with backend.transaction() as conn:
                batch = backend.claim_messages(conn, "A", limit=7)
            if not batch:
                return
            got[slot].extend(m.body for m in batch)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got[0] + got[1]) == list(range(200))


class _DeafListener:
    """The store, except that each node's LISTEN connection waits for another node's wake-ups."""

    def __init__(self, store) -> None:
        self._store = store

    def bus_listener(self, node_id: str):
        return self._store.bus_listener("deaf")

    def __getattr__(self, name: str):
        return getattr(self._store, name)


async def _two_nodes(store, body):
    """Run nodes A and B of ``store`` (each with its writer) while ``body(a, b)`` runs."""
    a, b = NodeBus(store, "A", "app-server"), NodeBus(store, "B", "app-server")
    async with trio.open_nursery() as outer:
        await outer.start(store.writer.run)
        async with trio.open_nursery() as nursery:  # the nodes stop first, as in the root tree
            await nursery.start(a.serve)
            await nursery.start(b.serve)
            try:
                await body(a, b)
            finally:
                nursery.cancel_scope.cancel()
        outer.cancel_scope.cancel()


async def test_requests_get_their_handlers_answer_or_error_across_nodes(backend):
    async def body(a: NodeBus, b: NodeBus) -> None:
        async def echo(message):
            return {"from": b.node_id, "got": message.body["data"]}

        async def fenced(message):
            raise StaleTurn("expected turn t1, the active turn is t2")

        seen: list = []
        b.on("echo", echo)
        b.on("fenced", fenced)
        b.on("events", lambda m: seen.append(m.body["data"]), inline=True)
        assert await a.request("B", "echo", [1, 2]) == {"from": "B", "got": [1, 2]}
        with pytest.raises(StaleTurn, match="active turn is t2"):
            await a.request("B", "fenced", None)
        for n in range(5):
            await a.send("B", "events", n)
        with trio.fail_after(scaled(10)):
            while len(seen) < 5:
                await trio.sleep(0.02)
        assert seen == [0, 1, 2, 3, 4]  # inline handlers run in order
        assert await a.node_alive("B") and not await a.node_alive("nobody")
        assert {n.node_id for n in await a.nodes()} == {"A", "B"}

    await _two_nodes(backend, body)
    with backend.read() as conn:
        assert backend.list_bus_nodes(conn) == []  # both left on stop


async def test_a_request_nobody_takes_is_withdrawn_and_never_runs(backend):
    async def body(a: NodeBus, b: NodeBus) -> None:
        with pytest.raises(NodeUnreachable) as exc:
            await a.request("ghost", "echo", None, claim_timeout=0.3)
        assert exc.value.delivered is False
        assert a.stats["withdrawn"] == 1

    await _two_nodes(backend, body)
    with backend.read() as conn:
        statuses = [row[0] for row in conn.execute("SELECT status FROM bus_messages WHERE target = 'ghost'")]
    assert statuses == ["cancelled"]


async def test_postgres_notify_wakes_the_node_and_polling_is_the_fallback(pg_url):
    from roost.storage import open_postgres_store

    store = open_postgres_store(pg_url)
    try:
        listener = store.bus_listener("A")
        try:
            assert listener.wait(0.05) is False
            with store.transaction() as conn:
                store.post_message(conn, target="B", sender="x", kind="k", body=None)  # not for A
                store.post_message(conn, target="A", sender="x", kind="k", body=None)
            began = time.monotonic()
            assert listener.wait(10) is True
            assert time.monotonic() - began < 10
        finally:
            listener.close()
            listener.close()  # idempotent
        # A node whose listener misses every notification still gets its messages, by polling.
        deaf = _DeafListener(store)

        async def body(a: NodeBus, b: NodeBus) -> None:
            async def echo(message):
                return message.body["data"]

            b.on("echo", echo)
            for n in range(3):
                assert await a.request("B", "echo", n) == n

        await _two_nodes(deaf, body)
    finally:
        store.close()


# -- node liveness on the database's clock ------------------------------------------------------
# The hook: ``time.time`` is this process's (the node's) own wall clock. The tests set it an hour
# off (test-only monkeypatch); the bus must not care, since heartbeats and ages are the database's.


def _skew(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    real = time.time.__wrapped__ if hasattr(time.time, "__wrapped__") else time.time

    def skewed() -> float:
        return real() + seconds

    skewed.__wrapped__ = real  # type: ignore[attr-defined]
    monkeypatch.setattr(time, "time", skewed)


def test_heartbeats_and_ages_are_on_the_database_clock_whatever_the_nodes_clock(backend, monkeypatch):
    _skew(monkeypatch, -3600)  # the writing node's clock is an hour behind
    with backend.transaction() as conn:
        backend.register_bus_node(conn, "A", "app-server")
        backend.register_bus_node(conn, "B", "app-server")
        assert backend.heartbeat_bus_node(conn, "A")
    _skew(monkeypatch, +3600)  # the judging node's clock is an hour ahead
    with backend.read() as conn:
        a, b = backend.get_bus_node(conn, "A"), backend.get_bus_node(conn, "B")
    assert 0 <= a.age < 5 and 0 <= b.age < 5  # seconds on the database clock, not 7200
    assert abs(a.heartbeat_at - time.time.__wrapped__()) < 60  # the database's time, not the node's
    with backend.transaction() as conn:  # a node silent for 60 s (database clock) is old
        backend.heartbeat_bus_node(conn, "B", now=b.heartbeat_at - 60)
        assert backend.prune_bus_nodes(conn, keep=100) == 0
    with backend.read() as conn:
        assert 60 <= backend.get_bus_node(conn, "B").age < 65
    with backend.transaction() as conn:
        assert backend.prune_bus_nodes(conn, keep=30) == 1  # B's row goes, A's stays
    with backend.read() as conn:
        assert [n.node_id for n in backend.list_bus_nodes(conn)] == ["A"]


async def test_a_node_with_a_skewed_clock_judges_liveness_correctly(backend, monkeypatch):
    _skew(monkeypatch, -3600)  # both nodes register while this host's clock is an hour behind

    async def body(a: NodeBus, b: NodeBus) -> None:
        with trio.fail_after(scaled(10)):
            while len(await a.nodes()) < 2:  # both registered
                await trio.sleep(0.02)
        _skew(monkeypatch, +3600)  # and judge with it an hour ahead
        assert await a.node_alive("B") and await b.node_alive("A")
        with backend.transaction() as conn:  # C beat 60 s ago on the database clock
            backend.register_bus_node(conn, "C", "serve")
            fresh = backend.get_bus_node(conn, "C")
            backend.heartbeat_bus_node(conn, "C", now=fresh.heartbeat_at - 60)
        _skew(monkeypatch, -3600)  # an hour behind, C's old heartbeat would look recent
        assert not await a.node_alive("C")
        assert await a.node_alive("B")

    await _two_nodes(backend, body)
