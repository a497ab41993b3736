"""Memory given back after a large reply (issue 18, finding 5): the store writer keeps no
reference to a write once its caller has the answer, and a write that bound large values is
followed by a fresh connection (SQLite keeps a cached statement's last bindings).

The figure (RSS held after one 30 MiB reply) is measured by ``benchmarks/bench_large_reply.py``;
these tests check the mechanism with weak references and connection identity, not with RSS.
"""

from __future__ import annotations

import gc
import sqlite3
import weakref
from pathlib import Path

import attrs
import trio
from _helpers.timing import scaled

from roost import _heap
from roost.storage import open_store


@attrs.define(eq=False, weakref_slot=True)
class Big:
    text: str


def _echo(conn: sqlite3.Connection, value: Big) -> Big:
    conn.execute("SELECT length(?)", (value.text,)).fetchone()
    return value


def _connection(conn: sqlite3.Connection, *_: object) -> sqlite3.Connection:
    return conn


async def test_the_writer_lets_go_of_a_write_once_it_is_answered(tmp_path: Path) -> None:
    store = open_store(tmp_path / "roost.db")
    with trio.fail_after(scaled(30)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            answered = await store.writer.submit(_echo, Big("x" * 1000))
            ref = weakref.ref(answered)
            del answered
            store.writer.submit_nowait(_echo, Big("y" * 1000))  # fire and forget: nobody reads the result
            await store.writer.submit(_connection)  # the fire-and-forget write has run
            gc.collect()
            # The writer is idle, waiting for the next write: neither write is reachable any more.
            assert ref() is None
            assert not [o for o in gc.get_objects() if isinstance(o, Big)]
            nursery.cancel_scope.cancel()
    store.close()


async def test_a_write_binding_a_large_value_is_followed_by_a_fresh_connection(tmp_path: Path) -> None:
    store = open_store(tmp_path / "roost.db")
    with trio.fail_after(scaled(30)):
        async with trio.open_nursery() as nursery:
            await nursery.start(store.writer.run)
            first = await store.writer.submit(_connection)
            await store.writer.submit(_echo, Big("small"))
            assert await store.writer.submit(_connection) is first  # small writes keep the connection
            await store.writer.submit(_echo, Big("z" * (2 << 20)))
            fresh = await store.writer.submit(_connection)
            assert fresh is not first
            try:
                first.execute("SELECT 1")
            except sqlite3.ProgrammingError:
                pass  # closed: its statements (and their bound 2 MiB copy) are freed
            else:
                raise AssertionError("the old write connection is still open")
            nursery.cancel_scope.cancel()
    store.close()


def test_a_large_output_trims_the_heap_and_a_small_one_does_not(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(_heap, "release_memory", lambda: calls.append(1))
    assert _heap.note_large_output(100) is False
    assert _heap.note_large_output(_heap.LARGE_OUTPUT_BYTES) is True
    assert calls == [1]
    monkeypatch.undo()
    _heap.release_memory()  # glibc malloc_trim(0) on Linux, a no-op elsewhere: never raises
