"""Input and control across processes on one store (issue 13 "Cross-node work", issue 15): a
client of app-server A interrupts, steers and queues a turn that app-server B executes; the
answers and the notifications arrive on A; nothing is lost or run twice.

Real processes (two ``roost app-server`` on one ROOST_HOME); synchronisation on protocol events and
on files the tools write, never on sleeps.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

import pytest
import trio
from _helpers.appserver import RemoteError, open_app_server, scripted_env
from _helpers.crossnode import pair, start_running_turn, two_app_servers, wait_started, write_script
from _helpers.timing import scaled


def db_rows(home: Path, sql: str, *args: object) -> list[tuple]:
    with sqlite3.connect(home / "roost.db") as db:
        return [tuple(r) for r in db.execute(sql, args)]


async def test_client_on_a_steers_and_queues_a_turn_running_on_b(tmp_path, roost_home):
    go = tmp_path / "go"
    async with two_app_servers(tmp_path, roost_home) as (a, b):
        tid, node_b = await pair(a, b, tmp_path)
        start_b = len(b.lines)
        turn = await start_running_turn(b, tid, "wait-go")
        assert db_rows(roost_home, "SELECT owner FROM leases WHERE key = ?", f"thread:{tid}") == [(node_b,)]

        start_a = len(a.lines)
        steer = await a.request(
            "turn/steer",
            {"thread_id": tid, "prompt": "steer from a", "client_id": "s-1", "expected_turn_id": turn["id"]},
        )
        assert steer["delivery"] == "active_turn" and steer["turn_id"] == turn["id"]
        pending = await a.wait_for("turn/steered", lambda p: p["input"]["id"] == steer["input"]["id"], start=start_a)
        assert pending["state"] == "pending" and pending["turn_id"] == turn["id"]
        # a retry with the same client_id is the same input (B's dedupe rules), never a second one
        again = await a.request("turn/steer", {"thread_id": tid, "prompt": "steer from a", "client_id": "s-1"})
        assert again["input"]["id"] == steer["input"]["id"]
        # a fenced steer for another turn gets B's error, with its code
        with pytest.raises(RemoteError) as exc:
            await a.request("turn/steer", {"thread_id": tid, "prompt": "late", "expected_turn_id": "turn_nope"})
        assert exc.value.code == "stale_turn"

        queued = (await a.request("turn/queue", {"thread_id": tid, "prompt": "queued from a", "client_id": "q-1"}))[
            "input"
        ]
        assert queued["held"] is False
        note = await a.wait_for("turn/queued", lambda p: p["input"]["id"] == queued["id"], start=start_a)
        assert note["state"] == "queued"
        retry = (await a.request("turn/queue", {"thread_id": tid, "prompt": "queued from a", "client_id": "q-1"}))[
            "input"
        ]
        assert retry["id"] == queued["id"]
        await b.wait_for("turn/queued", lambda p: p["input"]["id"] == queued["id"], start=start_b)

        go.touch()
        admitted = await a.wait_for("turn/steered", lambda p: p["state"] == "admitted", start=start_a)
        assert admitted["input"]["id"] == steer["input"]["id"]
        done = await a.wait_terminal(turn["id"], start=start_a)  # relayed from B
        assert done["turn"]["status"] == "completed"
        dispatched = await a.wait_for("turn/dequeued", lambda p: p["input"]["id"] == queued["id"], start=start_a)
        assert dispatched["state"] == "dispatched"
        second = await a.wait_for("turn/started", lambda p: p["turn"]["id"] != turn["id"], start=start_a)
        second_done = await a.wait_terminal(second["turn"]["id"], start=start_a)
        assert second_done["turn"]["status"] == "completed"

    # Exactly once each, executed by B; every bus message handled.
    users = db_rows(
        roost_home,
        "SELECT json_extract(payload, '$.source_id') FROM items "
        "WHERE thread_id = ? AND type = 'user_message' ORDER BY seq",
        tid,
    )
    assert users == [(None,), ("s-1",), ("q-1",)]
    assert db_rows(roost_home, "SELECT count(*) FROM held_input WHERE thread_id = ?", tid) == [(0,)]
    statuses = {s for (s,) in db_rows(roost_home, "SELECT status FROM bus_messages")}
    assert statuses <= {"done"}, statuses


async def test_client_on_a_interrupts_a_turn_running_on_b(tmp_path, roost_home):
    async with two_app_servers(tmp_path, roost_home) as (a, b):
        tid, _ = await pair(a, b, tmp_path)
        start_b = len(b.lines)
        turn = await start_running_turn(b, tid, "hang")
        start_a = len(a.lines)
        reply = await a.request("turn/interrupt", {"thread_id": tid, "turn_id": turn["id"]})
        assert reply["interrupted"] is True and reply["turn"]["id"] == turn["id"]
        done = await a.wait_terminal(turn["id"], start=start_a)
        assert done["turn"]["status"] == "interrupted"
        assert (await b.wait_terminal(turn["id"], start=start_b))["turn"]["status"] == "interrupted"
        # Asked again once it ended: the turn as it is (idempotent), answered locally now.
        again = await a.request("turn/interrupt", {"thread_id": tid, "turn_id": turn["id"]})
        assert again["interrupted"] is False
        # The thread is free: A may run a turn of its own on it.
        assert (await a.run_turn(tid, "after"))["turn"]["status"] == "completed"
    assert db_rows(roost_home, "SELECT status FROM turns WHERE thread_id = ? ORDER BY started_at", tid) == [
        ("interrupted",),
        ("completed",),
    ]


async def test_input_for_an_owner_off_the_bus_is_held_not_lost(tmp_path, roost_home):
    """A live lease of an owner that is not a node (no bus): nothing is forwarded; the local rules hold it."""
    env = scripted_env(roost_home, write_script(tmp_path / "script.json", tmp_path / "go"))
    async with open_app_server(env=env, cwd=tmp_path) as a:
        await a.initialize()
        tid = (await a.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        with sqlite3.connect(roost_home / "roost.db") as db:
            db.execute(
                "INSERT INTO leases (key, owner, token, expires_at) VALUES (?, 'elsewhere:1:x', 3, ?)",
                (f"thread:{tid}", time.time() + 600),
            )
        start = len(a.lines)
        queued = (await a.request("turn/queue", {"thread_id": tid, "prompt": "hold me"}))["input"]
        held = await a.wait_for("turn/held", lambda p: p["input"]["id"] == queued["id"], start=start)
        assert held["reason"] == "executing_elsewhere"
        with pytest.raises(RemoteError) as exc:
            await a.request("turn/interrupt", {"thread_id": tid})
        assert exc.value.code == "thread_busy"
    assert db_rows(roost_home, "SELECT count(*) FROM bus_messages") == [(0,)]


async def test_client_on_a_interrupts_a_run_owned_by_b(tmp_path, roost_home):
    async with two_app_servers(tmp_path, roost_home) as (a, b):
        tid, node_b = await pair(a, b, tmp_path)
        start_b = len(b.lines)
        run = (await b.request("run/start", {"thread_id": tid, "prompt": "hang"}))["run"]
        await wait_started(b, start_b)
        assert db_rows(roost_home, "SELECT owner FROM runs WHERE id = ?", run["id"]) == [(node_b,)]
        stopped = (await a.request("run/interrupt", {"run_id": run["id"]}))["run"]
        assert stopped["id"] == run["id"] and stopped["status"] == "interrupted"
        updated = await b.wait_for("run/updated", lambda p: p["run"]["id"] == run["id"], start=start_b)
        assert updated["run"]["status"] == "interrupted"  # B's client sees its run end
        again = (await a.request("run/interrupt", {"run_id": run["id"]}))["run"]
        assert again["status"] == "interrupted"  # terminal now: the stored run, as it is


async def test_approvals_of_input_queued_from_a_are_asked_of_the_client_on_a(tmp_path, roost_home):
    go = tmp_path / "go"
    caps = {"capabilities": {"reverse_rpc": {"methods": ["approval/request"]}}}
    async with two_app_servers(tmp_path, roost_home) as (a, b):
        asked_a: list[dict] = []
        asked_b: list[dict] = []
        a.approval_handler = lambda p: asked_a.append(p) or True
        b.approval_handler = lambda p: asked_b.append(p) or True
        await a.initialize(**caps)
        await b.initialize(**caps)
        tid = (await b.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]  # standard: asks
        await a.request("thread/resume", {"session_id": tid})
        turn = await start_running_turn(b, tid, "wait-go")
        start_a = len(a.lines)
        queued = (await a.request("turn/queue", {"thread_id": tid, "prompt": "ok-tool"}))["input"]
        go.touch()
        assert (await a.wait_terminal(turn["id"], start=start_a))["turn"]["status"] == "completed"
        second = await a.wait_for("turn/started", lambda p: p["turn"]["id"] != turn["id"], start=start_a)
        done = await a.wait_terminal(second["turn"]["id"], start=start_a)
        assert done["turn"]["status"] == "completed"
        assert done["turn"]["items"][0]["text"] == queued["prompt"]
        tools = [i for i in done["turn"]["items"] if i["type"] == "tool_call"]
        assert [t["status"] for t in tools] == ["completed"], tools  # approved by A's client: it ran
    # B's client approved its own turn's tool; the turn A's input started asked A's client.
    assert [p["turn_id"] for p in asked_b] == [turn["id"]]
    assert [p["turn_id"] for p in asked_a] == [second["turn"]["id"]]
    assert asked_a[0]["kind"] == "shell_command" and asked_a[0]["command"] == "echo ok"


async def test_client_on_a_edits_and_withdraws_input_pending_on_b(tmp_path, roost_home):
    go = tmp_path / "go"
    async with two_app_servers(tmp_path, roost_home) as (a, b):
        tid, _ = await pair(a, b, tmp_path)
        turn = await start_running_turn(b, tid, "wait-go")  # the tool runs: steers wait for the next model step
        start_a = len(a.lines)
        queued = (await a.request("turn/queue", {"thread_id": tid, "prompt": "first", "client_id": "q"}))["input"]
        edited = await a.request("turn/update-queued", {"thread_id": tid, "input_id": queued["id"], "prompt": "second"})
        assert edited["input"]["prompt"] == "second"
        note = await a.wait_for("turn/queued", lambda p: p["state"] == "updated", start=start_a)
        assert note["input"]["prompt"] == "second"
        gone = await a.request("turn/dequeue", {"thread_id": tid, "input_id": queued["id"]})
        assert gone["input"]["id"] == queued["id"]
        withdrawn = await a.wait_for("turn/dequeued", lambda p: p["input"]["id"] == queued["id"], start=start_a)
        assert withdrawn["state"] == "withdrawn"
        steer = await a.request("turn/steer", {"thread_id": tid, "prompt": "never mind", "client_id": "s"})
        assert steer["delivery"] == "active_turn"
        unsteered = await a.request("turn/unsteer", {"thread_id": tid, "input_id": steer["input"]["id"]})
        assert unsteered["input"]["id"] == steer["input"]["id"]
        await a.wait_for("turn/unsteered", lambda p: p["input"]["id"] == steer["input"]["id"], start=start_a)
        # the fence of a withdrawn client_id holds across processes too
        with pytest.raises(RemoteError) as exc:
            await a.request("turn/queue", {"thread_id": tid, "prompt": "first", "client_id": "q"})
        assert exc.value.code == "invalid_params"
        go.touch()
        assert (await a.wait_terminal(turn["id"], start=start_a))["turn"]["status"] == "completed"
    users = db_rows(roost_home, "SELECT text FROM items WHERE thread_id = ? AND type = 'user_message'", tid)
    assert users == [("wait-go",)]  # nothing withdrawn ran
    assert db_rows(roost_home, "SELECT count(*) FROM turns WHERE thread_id = ?", tid) == [(1,)]


async def test_input_for_a_dead_owner_follows_the_local_rules(tmp_path, roost_home):
    """B is killed mid-turn: its lease is a dead process's, so A's input is not forwarded; it is
    admitted here by the ordinary rules (the abandoned turn is settled first) and runs once."""
    async with two_app_servers(tmp_path, roost_home) as (a, b):
        tid, _ = await pair(a, b, tmp_path)
        turn = await start_running_turn(b, tid, "hang")
        b.process.kill()
        await b.process.wait()
        try:  # its stdin is a broken pipe now: close it here, so the harness does not write to it
            await b.process.stdin.aclose()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        start_a = len(a.lines)
        sent = await a.request("turn/steer", {"thread_id": tid, "prompt": "after b died", "client_id": "d-1"})
        assert sent["delivery"] == "queued" and "turn" in sent  # an idle thread here: it starts a turn
        done = await a.wait_terminal(sent["turn"]["id"], start=start_a)
        assert done["turn"]["status"] == "completed"
    rows = db_rows(roost_home, "SELECT id, status FROM turns WHERE thread_id = ? ORDER BY started_at", tid)
    assert rows == [(turn["id"], "interrupted"), (sent["turn"]["id"], "completed")]


async def test_a_paused_owner_never_applies_input_it_did_not_take_in_time(tmp_path, roost_home):
    """B is paused (SIGSTOP) with a live lease: A's queue is withdrawn unclaimed after the claim
    timeout and held here visibly; once B resumes it never applies it, and answers again."""
    async with two_app_servers(tmp_path, roost_home) as (a, b):
        tid, _ = await pair(a, b, tmp_path)
        turn = await start_running_turn(b, tid, "hang")
        b.process.send_signal(signal.SIGSTOP)
        try:
            queued = (
                await a.request(
                    "turn/queue", {"thread_id": tid, "prompt": "while paused", "client_id": "p-1"}, timeout=scaled(60)
                )
            )["input"]
        finally:
            b.process.send_signal(signal.SIGCONT)
        assert queued["held"] is True
        start_a = len(a.lines)
        reply = await a.request("turn/interrupt", {"thread_id": tid})  # B answers again
        assert reply["interrupted"] is True
        assert (await a.wait_terminal(turn["id"], start=start_a))["turn"]["status"] == "interrupted"
    assert db_rows(roost_home, "SELECT held, client_id FROM held_input WHERE thread_id = ?", tid) == [(1, "p-1")]
    assert db_rows(
        roost_home, "SELECT count(*) FROM bus_messages WHERE kind = 'thread.input' AND status = 'cancelled'"
    ) == [(1,)]
    assert not [m for m in b.notifications("turn/queued") if m["params"]["input"]["id"] == queued["id"]]


async def test_a_client_following_a_thread_b_executes_sees_its_turn_end(tmp_path, roost_home):
    """No input from A at all: subscribing on A to a thread B runs relays B's notifications of it."""
    go = tmp_path / "go"
    async with two_app_servers(tmp_path, roost_home) as (a, b):
        await a.initialize()
        await b.initialize()
        tid = (await b.request("thread/start", {"cwd": str(tmp_path), "permission_mode": "unconfined"}))["thread"]["id"]
        turn = await start_running_turn(b, tid, "wait-go")
        start_a = len(a.lines)
        await a.request("thread/resume", {"session_id": tid})  # follows the thread from now on
        with trio.fail_after(scaled(20)):  # the relay is set up once B claims the follow request
            while not db_rows(
                roost_home, "SELECT 1 FROM bus_messages WHERE kind = 'thread.follow' AND status = 'done'"
            ):
                await trio.sleep(0.05)
        go.touch()
        done = await a.wait_terminal(turn["id"], start=start_a)
        assert done["turn"]["status"] == "completed"
        assert [i["type"] for i in done["turn"]["items"]] == ["user_message", "tool_call", "agent_message"]
