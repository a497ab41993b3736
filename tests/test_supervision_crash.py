"""Crash each child kind of the real root tree of ``roost serve`` (issue 12, "Tests must show").

The daemon runs in-process exactly as ``roost serve`` composes it (``open_runtime`` + ServeDaemon +
the Scheduler), with real Unix-socket clients. Each scenario has a turn streaming, two clients
attached and a schedule slot due, then crashes one part through the fault hook
(:meth:`Supervisor.inject_fault` by path, or an armed fault point) and checks that the runtime
keeps serving, the other client sees nothing but the crashed part's own end, no accepted input is
lost (every queued task gets its result), no schedule slot fires twice and leases keep being
renewed.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from _helpers.serve_client import UnixClient, WsClient, short_socket_path
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from trio_websocket import open_websocket_url

from roost._faults import arm_fault, armed_faults, disarm_faults
from roost.cli._serve import _start_objectives, _start_scheduler
from roost.engines import ProviderSettings
from roost.protocol._engines import EngineCatalog
from roost.protocol._serve_daemon import ServeDaemon, ServeOptions
from roost.scheduling import format_slot
from roost.storage import _schedules2 as db
from roost.storage import list_daemon_tasks
from roost.supervisor._root import open_runtime
from roost.tools import builtin_tools
from _helpers.timing import scaled

SCRIPT = {
    "rules": [
        {"match": {"prompt": "^slow"}, "steps": [[{"text": "tick " * 40, "deltas": 40, "tokens_per_second": 20}]]},
        {"match": {"agent": "w[12]"}, "steps": [[{"text": "w " * 30, "deltas": 30, "tokens_per_second": 15}]]},
        {"match": {"prompt": "^team"}, "steps": [
            [{"tool_call": {"name": "spawn_agent", "arguments": {"name": "w1", "prompt": "a", "run_in_background": True}}},
             {"tool_call": {"name": "spawn_agent", "arguments": {"name": "w2", "prompt": "b", "run_in_background": True}}}],
            [{"tool_call": {"name": "wait_agents", "arguments": {}}}],
            [{"text": "team done [{tool_output}]"}]]},
        {"match": {"prompt": "^scheduled"}, "steps": [[{"text": "tock " * 60, "deltas": 60, "tokens_per_second": 10}]]},
    ],
    "default": "echo",
}
TIMEOUT = scaled(60)


@asynccontextmanager
async def serving(tmp_path: Path, *, db_path: Path | None = None) -> AsyncIterator[tuple[Any, ServeDaemon]]:
    """The real serve tree, with a schedule whose slot (one minute ago) is due at start."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    engines = EngineCatalog(ProviderSettings(provider="scripted", script=str(script), source="flag"))
    options = ServeOptions(socket_path=Path(short_socket_path()), work_dir=tmp_path, max_concurrent=4,
                           unattended_policy="allow", http_port=0)
    async with open_runtime(engine_for=engines.engine_for, tools=builtin_tools(), lease_ttl=0.9,
                            db_path=db_path) as runtime:
        slot = datetime.datetime.now(datetime.UTC).replace(second=0, microsecond=0) - datetime.timedelta(minutes=1)
        with runtime.store.transaction() as conn:
            db.add_job(conn, name="due", cron="* * * * *", task="scheduled slow task", next_run=format_slot(slot))
        daemon = ServeDaemon(runtime, options, provider="scripted", model=None, engines=engines)
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            await _start_scheduler(runtime, daemon)
            await _start_objectives(runtime, daemon, ())
            try:
                yield runtime, daemon
            finally:
                nursery.cancel_scope.cancel()
    await engines.aclose()


@asynccontextmanager
async def client(nursery: trio.Nursery, daemon: ServeDaemon) -> AsyncIterator[UnixClient]:
    stream = await trio.open_unix_socket(str(daemon.options.socket_path))
    conn = UnixClient(stream)
    nursery.start_soon(conn.reader)
    await conn.wait_for("hello")
    try:
        yield conn
    finally:
        await stream.aclose()


async def dispatch(conn: UnixClient, text: str) -> str:
    start = len(conn.events)
    await conn.send({"type": "user_input", "text": text})
    return (await conn.wait_for("queued", start=start))["sessionId"]


def schedule_runs(runtime: Any) -> list[Any]:
    with runtime.store.read() as conn:
        return db.list_job_runs(conn, db.get_job(conn, "due").id)


def tasks(runtime: Any) -> dict[str, Any]:
    with runtime.store.read() as conn:
        return {t.id: t for t in list_daemon_tasks(conn)}


async def renewed(runtime: Any) -> None:
    """Wait until some held lease is renewed (after now)."""
    with trio.fail_after(TIMEOUT):
        while True:
            held = list(runtime.services.keeper.executions)
            if held:
                before = {e: e.renewals for e in held}
                with trio.move_on_after(scaled(1.0)):
                    await held[0].renewed.wait()
                if any(e.renewals > n for e, n in before.items()):
                    return
            else:
                await trio.sleep(0.05)


async def wait_streaming(runtime: Any, count: int) -> None:
    """Wait until ``count`` executions (turns) hold a lease."""
    with trio.fail_after(TIMEOUT):
        while len(runtime.services.keeper.executions) < count:
            await trio.sleep(0.02)
            assert not [t for t in tasks(runtime).values() if t.status == "finished"], tasks(runtime)


def connection_ids(daemon: ServeDaemon) -> list[str]:
    assert daemon.connection_supervisor is not None
    return [c.id for c in daemon.connection_supervisor.which_children()]


KINDS = ["store_writer", "lease_keeper", "threads", "thread", "turn", "scheduler", "task_queue",
         "listener:unix", "listener:http", "connections", "connection", "objectives"]


async def crash_scenario(tmp_path: Path, kind: str) -> None:
    async with serving(tmp_path) as (runtime, daemon), trio.open_nursery() as nursery:
        async with client(nursery, daemon) as a, \
                open_websocket_url(f"ws://127.0.0.1:{daemon.http_port}/attach") as ws:
            a_conn = connection_ids(daemon)[0]
            w = WsClient(ws)   # a WebSocket client attached too: listener crashes leave it alone
            nursery.start_soon(w.reader)
            await w.wait_for("hello")
            async with client(nursery, daemon) as b:
                streaming = await dispatch(a, "slow streaming task")
                await a.wait_for("token", lambda e: e.get("sessionId") == streaming)
                await wait_streaming(runtime, 2)   # a's turn and the scheduled one
                b_mark = len(b.events)
                await inject(runtime, daemon, kind, streaming, a_conn)
                await restarted(runtime, kind)
                async with client(nursery, daemon) as c:
                    # After "connections" crashed, every client of it saw its connection end.
                    survivor = c if kind == "connections" else b
                    await after_crash(runtime, survivor)
                    if kind != "connection" and a.closed is None:
                        done = await a.wait_for("result", lambda e: e.get("sessionId") == streaming,
                                                timeout=TIMEOUT)
                        if kind != "turn":   # the armed turn fault hits a's turn or the scheduled one
                            assert done["succeeded"] is (kind not in ("threads", "thread")), done
                    # b saw nothing but its own events and the broadcasts: no error, no close.
                    if kind != "connections":
                        assert b.closed is None and w.closed is None
                        assert w.of_type("token"), "the WebSocket client got the broadcasts"
                        assert not [e for e in b.events[b_mark:] if e.get("type") == "error"], b.events[b_mark:]
                        assert (a.closed is not None) is (kind == "connection")
                    else:
                        assert (await a.wait_closed()) and (await b.wait_closed())
        # No accepted input is lost: every queued task reaches a result in the store.
        with trio.fail_after(TIMEOUT):
            while any(t.status in ("queued", "running") for t in tasks(runtime).values()):
                await trio.sleep(0.05)
        # No schedule slot fires twice.
        fired = [r for r in schedule_runs(runtime) if r.session_id]
        assert fired and len({r.slot for r in fired}) == len(fired), fired
        scheduled = {t.id for t in tasks(runtime).values() if (t.payload or {}).get("source") == "schedule"}
        assert scheduled == {r.session_id for r in fired}, (scheduled, fired)
        if kind == "turn":
            assert any("injected fault" in str((t.payload or {}).get("result")) for t in tasks(runtime).values())
        assert "root" in runtime.render_tree()
        nursery.cancel_scope.cancel()


async def restarted(runtime: Any, kind: str) -> None:
    """Wait until an armed fault fired and a crashed root child runs again."""
    with trio.fail_after(TIMEOUT):
        while armed_faults():
            await trio.sleep(0.01)
        kids = {c.id: c for c in runtime.root.which_children()}
        while kind in kids and not (kids[kind].restarts and kids[kind].state == "running"):
            await trio.sleep(0.01)
            kids = {c.id: c for c in runtime.root.which_children()}


async def after_crash(runtime: Any, survivor: UnixClient) -> None:
    """The runtime keeps serving ``survivor``, and leases keep being renewed."""
    quick = await dispatch(survivor, "hello after the crash")
    result = await survivor.wait_for("result", lambda e: e.get("sessionId") == quick, timeout=TIMEOUT)
    assert result["succeeded"] is True, result
    later = await dispatch(survivor, "slow after the crash")
    await survivor.wait_for("token", lambda e: e.get("sessionId") == later, timeout=TIMEOUT)
    await renewed(runtime)
    done = await survivor.wait_for("result", lambda e: e.get("sessionId") == later, timeout=TIMEOUT)
    assert done["succeeded"] is True, done


async def inject(runtime: Any, daemon: ServeDaemon, kind: str, thread_id: str, conn_id: str) -> None:
    root = runtime.root
    if kind == "turn":
        arm_fault("turn")
        return
    if kind == "store_writer":
        arm_fault("store_writer")
        return
    path = {"thread": f"threads/thread:{thread_id}", "connection": f"connections/{conn_id}"}.get(kind, kind)
    root.inject_fault(path)


@pytest.mark.parametrize("kind", KINDS)
async def test_crash_each_child_kind_keeps_serving(tmp_path: Path, roost_home: Path, kind: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="roost.supervisor")
    try:
        await crash_scenario(tmp_path, kind)
    finally:
        disarm_faults()
    if kind == "connection":  # a temporary child: its end is logged, it is not restarted
        assert any("connections: child connection:" in r.getMessage() and "not restarted" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
    if kind not in ("turn", "connection"):
        restarted = kind.split("/")[-1]
        assert any("restarted" in r.getMessage() and restarted in r.getMessage() for r in caplog.records), \
            [r.getMessage() for r in caplog.records]


async def test_crash_one_worker_of_a_tree(tmp_path: Path, roost_home: Path) -> None:
    """A worker tree is a supervisor of its workers: crash one worker's driver; it settles
    interrupted, its sibling completes, the root turn completes, the other client is untouched."""
    async with serving(tmp_path) as (runtime, daemon), trio.open_nursery() as nursery:
        async with client(nursery, daemon) as a, client(nursery, daemon) as b:
            team = await dispatch(a, "team of two")
            with trio.fail_after(TIMEOUT):
                while True:
                    actor = runtime.registry.actors.get(team)
                    tree = getattr(actor, "tree", None)
                    if tree is not None and tree.supervisor is not None and len(tree.running) == 2:
                        break
                    await trio.sleep(0.02)
            drivers = [c.id for c in tree.supervisor.which_children()]
            assert len(drivers) == 2, drivers
            b_mark = len(b.events)
            tree.supervisor.inject_fault(drivers[0])
            done = await a.wait_for("result", lambda e: e.get("sessionId") == team, timeout=TIMEOUT)
            assert done["succeeded"] is True, done
            statuses = sorted(w.status for w in tree.workers.values())
            assert statuses == ["completed", "interrupted"], statuses
            await after_crash(runtime, b)
            assert b.closed is None and not [e for e in b.events[b_mark:] if e.get("type") == "error"]
        await settled_without_loss(runtime)
        nursery.cancel_scope.cancel()


async def settled_without_loss(runtime: Any) -> None:
    """No accepted input is lost (every queued task reaches a result) and no slot fired twice."""
    with trio.fail_after(TIMEOUT):
        while any(t.status in ("queued", "running") for t in tasks(runtime).values()):
            await trio.sleep(0.05)
    fired = [r for r in schedule_runs(runtime) if r.session_id]
    assert fired and len({r.slot for r in fired}) == len(fired), fired
    scheduled = {t.id for t in tasks(runtime).values() if (t.payload or {}).get("source") == "schedule"}
    assert scheduled == {r.session_id for r in fired}, (scheduled, fired)


async def test_a_crash_in_one_connections_handler_ends_only_that_connection(
    tmp_path: Path, roost_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The ConnectionActor's own handler raises (an armed fault in the front door's line handler,
    as a bug would): that actor crashes and its connection closes; the connections supervisor
    logs the temporary child's end; the other client, the streaming turn and the due schedule go
    on; a fresh client is served."""
    caplog.set_level(logging.INFO, logger="roost.supervisor")
    async with serving(tmp_path) as (runtime, daemon), trio.open_nursery() as nursery:
        async with client(nursery, daemon) as a, client(nursery, daemon) as b:
            streaming = await dispatch(b, "slow streaming task")
            await b.wait_for("token", lambda e: e.get("sessionId") == streaming)
            b_mark = len(b.events)
            try:
                arm_fault("connection")
                await a.send({"type": "status"})
                assert await a.wait_closed()
            finally:
                disarm_faults()
            async with client(nursery, daemon) as c:
                await after_crash(runtime, c)
            done = await b.wait_for("result", lambda e: e.get("sessionId") == streaming, timeout=TIMEOUT)
            assert done["succeeded"] is True, done
            assert b.closed is None and not [e for e in b.events[b_mark:] if e.get("type") == "error"]
        await settled_without_loss(runtime)
        nursery.cancel_scope.cancel()
    ended = [r.getMessage() for r in caplog.records if "connections: child connection:" in r.getMessage()]
    assert any("injected fault at connection" in m and "not restarted" in m for m in ended), ended


# -- property: random crash sequences of the real root tree ---------------------------------------

ROOT_KINDS = ["store_writer", "lease_keeper", "threads", "thread_unloader", "scheduler", "task_queue",
              "listener:unix", "listener:http", "connections", "objectives"]
#: ... and one connection of the connections supervisor (a temporary child: it ends, it is not restarted)
CRASH_KINDS = [*ROOT_KINDS, "connection"]


async def crash_one_connection(nursery: trio.Nursery, daemon: ServeDaemon) -> None:
    """Attach a client, crash its ConnectionActor's child, and see only that client go."""
    async with client(nursery, daemon) as victim:
        newest = connection_ids(daemon)[-1]
        daemon.connection_supervisor.inject_fault(newest)  # type: ignore[union-attr]
        assert await victim.wait_closed()
        with trio.fail_after(TIMEOUT):
            while newest in connection_ids(daemon):
                await trio.sleep(0.01)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(crashes=st.lists(st.tuples(st.sampled_from(CRASH_KINDS), st.booleans()), min_size=1, max_size=3))
@example(crashes=[("connection", True), ("connections", True), ("listener:unix", False)])
@example(crashes=[("objectives", True), ("thread_unloader", False), ("lease_keeper", True)])
def test_random_crash_sequences_of_the_root_tree(tmp_path_factory: pytest.TempPathFactory, roost_home: Path,
                                                crashes: list[tuple[str, bool]]) -> None:
    """Up to three crashes (within the root's intensity): after each, the tree is whole again and
    serves a new client; every accepted task reaches its result; no slot fires twice."""
    tmp = tmp_path_factory.mktemp("crashes")

    async def main() -> None:
        async with serving(tmp, db_path=tmp / "roost.db") as (runtime, daemon), trio.open_nursery() as nursery:
            ids = [c.id for c in runtime.root.which_children()]
            assert set(ids) == set(ROOT_KINDS), ids   # every child of the real root tree can be crashed
            accepted: list[str] = []
            for kind, busy in crashes:
                if busy:
                    async with client(nursery, daemon) as sender:
                        accepted.append(await dispatch(sender, "slow before a crash"))
                before = {c.id: c.restarts for c in runtime.root.which_children()}
                if kind == "connection":
                    await crash_one_connection(nursery, daemon)
                else:
                    runtime.root.inject_fault(kind)
                with trio.fail_after(TIMEOUT):
                    while kind != "connection":
                        kids = {c.id: c for c in runtime.root.which_children()}
                        if kids[kind].restarts > before[kind] and kids[kind].state == "running":
                            break
                        await trio.sleep(0.01)
                # the same children, in the same order, all running
                assert [c.id for c in runtime.root.which_children()] == ids
                assert all(c.state == "running" for c in runtime.root.which_children())
                async with client(nursery, daemon) as fresh:
                    quick = await dispatch(fresh, "hello after a crash")
                    accepted.append(quick)
                    done = await fresh.wait_for("result", lambda e, q=quick: e.get("sessionId") == q,
                                                timeout=TIMEOUT)
                    assert done["succeeded"] is True, done
            with trio.fail_after(TIMEOUT):
                while any(tasks(runtime)[t].status in ("queued", "running") for t in accepted):
                    await trio.sleep(0.05)
            fired = [r for r in schedule_runs(runtime) if r.session_id]
            assert len({r.slot for r in fired}) == len(fired), fired
            scheduled = {t.id for t in tasks(runtime).values() if (t.payload or {}).get("source") == "schedule"}
            assert scheduled == {r.session_id for r in fired}
            nursery.cancel_scope.cancel()

    trio.run(main)


# -- the test-only environment variable, through the real `roost` command --------------------------

async def test_fault_env_crashes_a_turn_of_the_real_app_server(tmp_path: Path, roost_home: Path) -> None:
    """``ROOST_FAULT_INJECT=turn@2``: the first turn crashes at its second streamed event and ends
    failed; the thread and the server go on serving the next turn."""
    from _helpers.appserver import open_app_server, script_env

    env = script_env(tmp_path, roost_home, json.dumps({"default": "echo"}), ROOST_FAULT_INJECT="turn@2")
    async with open_app_server(env=env) as app:
        await app.initialize()
        thread = (await app.request("thread/start", {"cwd": str(tmp_path)}))["thread"]
        crashed = await app.run_turn(thread["id"], "one two three four")
        assert crashed["turn"]["status"] == "failed", crashed
        assert "injected fault at turn" in json.dumps(crashed["turn"].get("error"))
        again = await app.run_turn(thread["id"], "after the crash")
        assert again["turn"]["status"] == "completed", again


async def test_fault_env_crashes_the_task_queue_of_the_real_daemon(tmp_path: Path) -> None:
    """``ROOST_FAULT_INJECT=task_queue``: the queue crashes before its first task, is restarted
    from the store, and the accepted task still runs to its result."""
    from _helpers.serve_client import open_daemon

    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    async with open_daemon(script=script, env={"ROOST_FAULT_INJECT": "task_queue"}) as daemon, \
            daemon.unix() as conn:
        await conn.wait_for("hello")
        task = await dispatch(conn, "survives the queue crash")
        result = await conn.wait_for("result", lambda e: e.get("sessionId") == task)
        assert result["succeeded"] is True, result
