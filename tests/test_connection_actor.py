"""ConnectionActor is a real actor (issue 12, Build 1): a bounded mailbox of input frames handled
in order, backpressure on the transport when it is full, a crash that ends only that connection
(with its transport closed) and a stop that closes with code 1001."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from roost.actors import Actor, ActorState, ConnectionActor
from roost.actors._connection import CLOSE_GOING_AWAY, CLOSE_POLICY
from roost.protocol._outbox import Outbox
from _helpers.timing import scaled


class _Transport:
    """Input frames from a memory channel, output into a memory stream, closes recorded."""

    def __init__(self) -> None:
        self.send_frames, self._frames = trio.open_memory_channel[Any](0)
        self.read = 0
        self.out_send, self.out_receive = trio.testing.memory_stream_pair()
        self.closes: list[tuple[int, str]] = []

    async def frames(self) -> AsyncIterator[Any]:
        async for frame in self._frames:
            self.read += 1
            yield frame

    async def close(self, code: int, reason: str) -> None:
        self.closes.append((code, reason))


def _actor(t: _Transport, handle: Any, *, mailbox_size: int = 4) -> ConnectionActor:
    return ConnectionActor(
        frames=t.frames(),
        stream=t.out_send,
        outbox=Outbox(100),
        handle_line=handle,
        close=t.close,
        mailbox_size=mailbox_size,
    )


async def test_frames_are_handled_in_order_and_a_full_mailbox_stops_the_reader() -> None:
    t = _Transport()
    handled: list[Any] = []
    gate = trio.Event()

    async def handle(conn: ConnectionActor, frame: Any) -> None:
        await gate.wait()
        handled.append(frame)
        conn.send({"echo": frame})

    conn = _actor(t, handle, mailbox_size=4)
    assert isinstance(conn, Actor) and conn.ref.name == f"connection:{conn.id}"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        for n in range(6):  # one in the handler, four in the mailbox, one in the waiting reader
            await t.send_frames.send(n)
        with trio.move_on_after(scaled(0.2)):
            await t.send_frames.send(6)  # the reader waits: the mailbox is full
            pytest.fail("the reader took a frame while the mailbox was full")
        assert t.read == 6 and conn.ref.queued == 4
        gate.set()
        for n in range(6, 8):
            await t.send_frames.send(n)
        await t.send_frames.aclose()  # the client's input ends: the actor stops
    assert handled == list(range(8)) and conn.state is ActorState.STOPPED
    assert t.closes and conn.alive is False


async def test_frames_read_together_enter_the_mailbox_without_a_checkpoint_each() -> None:
    """A chunk's frames (read in one go) are queued in one step of the reader while there is room:
    under saturation each checkpoint costs a scheduler batch, and a turn/interrupt read behind a
    burst of requests waited one batch per frame before it (issue 19, control before data)."""
    ticks = 0
    others_ran: list[int] = []
    gate = trio.Event()
    handled: list[Any] = []

    async def frames() -> AsyncIterator[Any]:
        await trio.lowlevel.checkpoint()
        before = ticks
        for n in range(10):
            yield n
        others_ran.append(ticks - before)
        await trio.sleep_forever()

    async def handle(conn: ConnectionActor, frame: Any) -> None:
        handled.append(frame)
        await gate.wait()

    async def other() -> None:
        nonlocal ticks
        while True:
            await trio.lowlevel.checkpoint()
            ticks += 1

    t = _Transport()
    conn = ConnectionActor(
        frames=frames(), stream=t.out_send, outbox=Outbox(100), handle_line=handle, close=t.close, mailbox_size=16
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)
        nursery.start_soon(conn.run)
        with trio.fail_after(scaled(5)):
            while not others_ran:
                await trio.sleep(0.01)
        assert others_ran == [0]  # nothing else ran while the ten frames were queued
        assert conn.ref.queued + len(handled) == 10
        nursery.cancel_scope.cancel()


async def test_a_crashing_handler_ends_only_this_connection_and_closes_it() -> None:
    t = _Transport()

    async def handle(conn: ConnectionActor, frame: Any) -> None:
        raise RuntimeError("bug in the front door")

    conn = _actor(t, handle)
    with pytest.raises(BaseExceptionGroup) as crash:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            await t.send_frames.send("boom")
    assert crash.group_contains(RuntimeError, match="bug in the front door", depth=None)
    assert conn.state is ActorState.STOPPED
    assert t.closes == [(CLOSE_GOING_AWAY, "the daemon is stopping")]


async def test_kick_flushes_what_was_queued_then_closes_with_its_reason() -> None:
    t = _Transport()
    handled: list[Any] = []

    async def handle(conn: ConnectionActor, frame: Any) -> None:
        handled.append(frame)
        conn.send({"seen": frame})
        if frame == "kick me":
            conn.kick("slow consumer: test")

    conn = _actor(t, handle)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await t.send_frames.send("kick me")
        with trio.fail_after(scaled(5)):
            data = await t.out_receive.receive_some()
            while not t.closes:
                await trio.sleep(0.01)
    assert b"kick me" in data
    assert t.closes == [(CLOSE_POLICY, "slow consumer: test")] and handled == ["kick me"]


async def test_a_stop_from_outside_closes_with_going_away() -> None:
    t = _Transport()

    async def handle(conn: ConnectionActor, frame: Any) -> None:
        return None

    conn = _actor(t, handle)
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        nursery.cancel_scope.cancel()
    assert t.closes == [(CLOSE_GOING_AWAY, "the daemon is stopping")]


async def test_waiting_frames_are_bounded_in_bytes_too() -> None:
    """Beyond one waiting frame of any size, waiting frames hold at most max_waiting_bytes."""
    t = _Transport()
    gate = trio.Event()

    async def handle(conn: ConnectionActor, frame: Any) -> None:
        await gate.wait()

    conn = ConnectionActor(
        frames=t.frames(),
        stream=t.out_send,
        outbox=Outbox(100),
        handle_line=handle,
        close=t.close,
        max_waiting_bytes=1000,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(conn.run)
        await t.send_frames.send("x" * 5000)  # taken by the handler
        await t.send_frames.send("y" * 5000)  # waits in the mailbox (one frame of any size)
        await t.send_frames.send("z" * 10)  # read, but held by the reader: the budget is used up
        with trio.move_on_after(scaled(0.2)):
            await t.send_frames.send("w")
            pytest.fail("the reader took a frame beyond the byte budget")
        assert conn.ref.queued == 1
        gate.set()
        await t.send_frames.send("w")
        await t.send_frames.aclose()
    assert conn.state is ActorState.STOPPED


async def test_the_app_servers_stdio_client_is_a_supervised_connection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``roost app-server``'s one client is the actor StdioConnection, the temporary child
    ``connection:stdio`` of the root's ``connections`` supervisor: it answers requests there, and a
    crash of that child ends the session (logged, not restarted, StdioConnectionCrashed raised)."""
    import json
    import logging

    from roost.engines import ProviderSettings
    from roost.protocol._appserver import AppServerSession
    from roost.protocol._engines import EngineCatalog
    from roost.protocol._serve_appserver import StdioConnectionCrashed, serve_connection
    from roost.supervisor import open_runtime
    from roost.tools import builtin_tools

    caplog.set_level(logging.INFO, logger="roost.supervisor")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"default": "echo"}))
    engines = EngineCatalog(ProviderSettings(provider="scripted", script=str(script), source="flag"))
    client, server = trio.testing.memory_stream_pair()
    async with open_runtime(engine_for=engines.engine_for, tools=builtin_tools(), db_path=tmp_path / "r.db") as rt:
        session = AppServerSession(rt, engines=engines)
        crashed: list[Exception] = []

        async def serve() -> None:
            try:
                await serve_connection(rt, session, server, server)
            except StdioConnectionCrashed as exc:
                crashed.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            await client.send_all(b'{"id": 1, "method": "initialize", "params": {}}\n')
            with trio.fail_after(scaled(10)):
                reply = b""
                while b"\n" not in reply:
                    reply += await client.receive_some()
            assert json.loads(reply.split(b"\n")[0])["result"]["status"] == "ready"
            connections = {c.id: c for c in rt.root.which_children()}["connections"].value
            kids = {c.id: c for c in connections.which_children()}
            assert kids["connection:stdio"].state == "running"
            assert kids["connection:stdio"].value.name == "connection:stdio"  # the actor's Ref
            rt.root.inject_fault("connections/connection:stdio")
        assert "stopped by its supervisor" in str(crashed[0])
        assert "connections" not in {c.id for c in rt.root.which_children()}
    await engines.aclose()
    ended = [r.getMessage() for r in caplog.records if "connection:stdio" in r.getMessage()]
    assert any("not restarted" in m for m in ended), ended
