"""Crash the parts of ``roost app-server``'s root tree (issue 12, "Tests must show").

The stdio client is the actor ``StdioConnection``, the temporary child ``connection:stdio`` of the
``connections`` supervisor. A crash of any other root child (store writer, lease keeper, thread
supervisor, idle unloader, node bus) is restarted and the same client goes on being served. A crash
of the connection (or of ``connections``) cannot be repaired, as stdin cannot be re-opened: the
running turn is interrupted and persisted, the end is logged with its reason, and the session
ends (``serve_connection`` raises ``StdioConnectionCrashed``; the real process exits 1).
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing
from _helpers.appserver import AppServerClient, open_app_server, roost_argv, script_env
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from roost._faults import arm_fault, disarm_faults
from roost.engines import ProviderSettings
from roost.protocol._appserver import AppServerSession
from roost.protocol._engines import EngineCatalog
from roost.protocol._serve_appserver import StdioConnectionCrashed, serve_connection
from roost.supervisor import open_runtime
from roost.tools import builtin_tools
from _helpers.timing import scaled

SCRIPT = {
    "rules": [{"match": {"prompt": "^slow"}, "steps": [[{"text": "tick " * 60, "deltas": 60, "tokens_per_second": 20}]]}],
    "default": "echo",
}
TIMEOUT = scaled(60)
#: The root's children in the app-server (a node of the bus), before ``connections``.
RESTARTABLE = ["store_writer", "lease_keeper", "threads", "thread_unloader", "node_bus"]


@asynccontextmanager
async def app_server(tmp_path: Path) -> AsyncIterator[tuple[Any, AppServerClient, dict]]:
    """A runtime as the app-server opens it, its stdio connection on a memory stream, initialized."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    engines = EngineCatalog(ProviderSettings(provider="scripted", script=str(script), source="flag"))
    near, far = trio.testing.memory_stream_pair()
    outcome: dict[str, Any] = {}
    async with open_runtime(engine_for=engines.engine_for, tools=builtin_tools(), db_path=tmp_path / "r.db",
                            lease_ttl=0.9, node_kind="app-server") as runtime:
        session = AppServerSession(runtime, engines=engines)

        async def serve() -> None:
            try:
                await serve_connection(runtime, session, far, far)
            except StdioConnectionCrashed as exc:
                outcome["crashed"] = exc
            else:
                outcome["ended"] = True

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            client = AppServerClient(SimpleNamespace(stdin=near.send_stream, stdout=near.receive_stream))  # type: ignore[arg-type]
            nursery.start_soon(client._reader)
            await client.initialize()
            yield runtime, client, outcome
            nursery.cancel_scope.cancel()
    await engines.aclose()


async def streaming_turn(client: AppServerClient, tmp_path: Path) -> tuple[str, str]:
    """Start a slow turn and wait for its first delta; return (thread id, turn id)."""
    tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
    start = len(client.lines)
    turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "slow reply"}))["turn"]
    await client.wait_line(lambda m: m.get("method") == "item/agentMessage/delta", start=start)
    return tid, turn["id"]


def stored_turn_status(runtime: Any, tid: str, turn_id: str) -> str:
    from roost.storage import list_turns

    with runtime.store.read() as conn:
        return next(t.status for t in list_turns(conn, tid) if t.id == turn_id)


async def session_ended(outcome: dict) -> None:
    with trio.fail_after(TIMEOUT):
        while not outcome:
            await trio.sleep(0.01)


@pytest.mark.parametrize("how", ["connection", "connections", "handler"])
async def test_a_crashed_stdio_connection_ends_the_session_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """Crash the connection (by path, through its supervisor, or a bug in its handler) while a
    turn streams: the turn is interrupted and persisted, the supervisor logs the temporary child's
    end (not restarted), the session ends with the reason logged, the rest of the tree still runs."""
    caplog.set_level(logging.INFO)
    async with app_server(tmp_path) as (runtime, client, outcome):
        tid, turn_id = await streaming_turn(client, tmp_path)
        if how == "connection":
            runtime.root.inject_fault("connections/connection:stdio")
        elif how == "connections":
            runtime.root.inject_fault("connections")
        else:
            try:
                arm_fault("connection")
                await client.send({"id": "x", "method": "thread/list", "params": {}})
                await session_ended(outcome)
            finally:
                disarm_faults()
        await session_ended(outcome)
        assert "crashed" in outcome, outcome
        assert stored_turn_status(runtime, tid, turn_id) == "interrupted"
        kids = {c.id: c.state for c in runtime.root.which_children()}
        assert "connections" not in kids and all(kids[k] == "running" for k in RESTARTABLE), kids
    messages = [r.getMessage() for r in caplog.records]
    assert any("connection:stdio" in m and "not restarted" in m for m in messages) or how == "connections", messages
    assert any("the stdio connection crashed" in m for m in messages), messages
    if how == "handler":
        assert "injected fault at connection" in str(outcome["crashed"])


async def test_end_of_input_is_a_normal_end(tmp_path: Path) -> None:
    """Closing stdin while a turn streams: the turn is interrupted and persisted, its terminal
    event is still written, and the session ends normally (nothing raised)."""
    async with app_server(tmp_path) as (runtime, client, outcome):
        tid, turn_id = await streaming_turn(client, tmp_path)
        await client.close_stdin()
        done = await client.wait_terminal(turn_id)
        assert done["turn"]["status"] == "interrupted"
        await session_ended(outcome)
        assert outcome == {"ended": True}
        assert stored_turn_status(runtime, tid, turn_id) == "interrupted"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(crashes=st.lists(st.sampled_from(RESTARTABLE), min_size=0, max_size=3),
       last=st.sampled_from(["connection:stdio", "connections", "end of input"]))
@example(crashes=["node_bus", "store_writer"], last="connection:stdio")
@example(crashes=["threads"], last="end of input")
def test_random_crash_sequences_of_the_app_server_tree(tmp_path_factory: pytest.TempPathFactory,
                                                      crashes: list[str], last: str) -> None:
    """Up to three crashes of restartable root children while a turn streams: each is restarted
    and the same client is served again (a new turn completes). Then the session ends by a crash
    of the connection or of ``connections`` (logged, ``StdioConnectionCrashed``) or by end of
    input (normal); either way every turn is settled in the store, none left running."""
    tmp = tmp_path_factory.mktemp("appserver-crashes")

    async def main() -> None:
        async with app_server(tmp) as (runtime, client, outcome):
            turns = [await streaming_turn(client, tmp)]
            for kind in crashes:
                before = {c.id: c.restarts for c in runtime.root.which_children()}
                runtime.root.inject_fault(kind)
                with trio.fail_after(TIMEOUT):
                    while True:
                        kids = {c.id: c for c in runtime.root.which_children()}
                        if kids[kind].restarts > before[kind] and kids[kind].state == "running":
                            break
                        await trio.sleep(0.01)
                tid = (await client.request("thread/start", {"cwd": str(tmp)}))["thread"]["id"]
                done = await client.run_turn(tid, "hello after a crash")
                assert done["turn"]["status"] == "completed", done
            assert {c.id for c in runtime.root.which_children()} == {*RESTARTABLE, "connections"}
            turns.append(await streaming_turn(client, tmp))
            if last == "end of input":
                await client.close_stdin()
            else:
                runtime.root.inject_fault("connections/connection:stdio" if last == "connection:stdio" else last)
            await session_ended(outcome)
            assert ("crashed" in outcome) is (last != "end of input"), outcome
            for tid, turn_id in turns:
                assert stored_turn_status(runtime, tid, turn_id) in ("completed", "interrupted", "failed")

    trio.run(main)


async def test_fault_env_crash_of_the_real_app_servers_connection_exits_1_and_keeps_the_turn(
    tmp_path: Path, roost_home: Path
) -> None:
    """``ROOST_FAULT_INJECT=connection@4``: the fourth request line crashes the connection while a
    turn streams. The process exits 1 with the reason on stderr; a new app-server on the same home
    finds the turn interrupted, its streamed prefix kept."""
    env = script_env(tmp_path, roost_home, json.dumps(SCRIPT), ROOST_FAULT_INJECT="connection@4")
    async with open_app_server(env=env, stderr=subprocess.PIPE) as app:
        await app.initialize()
        tid = (await app.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        start = len(app.lines)
        turn = (await app.request("turn/start", {"thread_id": tid, "prompt": "slow reply"}))["turn"]
        await app.wait_line(lambda m: m.get("method") == "item/agentMessage/delta", start=start)
        await app.send({"id": "crash", "method": "thread/list", "params": {}})
        with trio.fail_after(TIMEOUT):
            assert await app.process.wait() == 1
        assert app.process.stderr is not None
        stderr = (await app.process.stderr.receive_some(1 << 16)).decode()
        assert "the stdio connection crashed" in stderr and "injected fault at connection" in stderr, stderr
    env.pop("ROOST_FAULT_INJECT")
    async with open_app_server(env=env) as app:
        await app.initialize()
        snap = await app.request("thread/resume", {"session_id": tid})
        stored = next(t for t in snap["turns"] if t["id"] == turn["id"])
        assert stored["status"] == "interrupted", stored
        assert roost_argv()  # the same entry point both times


class _BlockedSession:
    """Just enough of AppServerSession for StdioConnection: its handler waits for ``gate``."""

    def __init__(self) -> None:
        from roost.protocol._outbox import Outbox

        self.outbox = Outbox()
        self.closed = trio.Event()
        self.gate = trio.Event()
        self.shutdown_requested = False
        self.handled: list[Any] = []

    def serve_in(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery

    async def handle_frame(self, frame: Any) -> None:
        await self.gate.wait()
        self.handled.append(frame)

    def input_ended(self) -> None:
        pass

    async def wait_idle(self) -> None:
        pass

    async def interrupt_all(self) -> None:
        self.closed.set()


async def test_the_stdio_mailbox_is_bounded_in_request_bytes() -> None:
    """Request lines of 300 KiB while the handler is blocked: the reader stops taking them once
    1 MiB of them wait (beyond one), however few frames that is; all are handled once released."""
    from roost.protocol._as_connection import StdioConnection

    near, far = trio.testing.memory_stream_pair()
    session = _BlockedSession()
    conn = StdioConnection(session, far, far)
    line = json.dumps({"id": 1, "method": "x", "params": {"pad": "p" * 300_000}}).encode() + b"\n"
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)

        async def send_all() -> None:
            for _ in range(10):
                await near.send_all(line)
            await near.send_stream.aclose()

        nursery.start_soon(send_all)
        await trio.testing.wait_all_tasks_blocked()
        # one frame in the handler, at most 1 MiB (3 lines) plus one beyond it waiting
        assert 1 <= conn.ref.queued <= 4, conn.ref.queued
        session.gate.set()
        with trio.fail_after(TIMEOUT):
            while conn.ended_normally is False:
                await trio.sleep(0.01)
    assert len(session.handled) == 10 and conn.end_reason == "end of input"
