"""Two app-servers on one store, seen from the one that does not execute the thread (a fresh-user
trial): its client's ``turn/interrupt`` answer comes before the ``turn/completed`` it causes, as in
one process (docs/app-server.md, the ``turn/interrupt`` row), and its ``thread/resume`` and
``thread/list`` report the thread the other process executes as ``running`` with its turn.

Real processes (two ``roost app-server`` on one ROOST_HOME); synchronisation on protocol events,
never on sleeps.
"""

from __future__ import annotations

from _helpers.appserver import AppServerClient
from _helpers.crossnode import pair, start_running_turn, two_app_servers


def index_of(client: AppServerClient, start: int, predicate) -> int:
    """The index in ``client.lines`` of the first line from ``start`` that matches ``predicate``."""
    return next(i for i in range(start, len(client.lines)) if predicate(client.lines[i]))


def is_terminal(turn_id: str):
    return lambda m: m.get("method") == "turn/completed" and m["params"]["turn"]["id"] == turn_id


async def test_a_forwarded_interrupt_is_answered_before_the_turn_completes(tmp_path, roost_home):
    async with two_app_servers(tmp_path, roost_home) as (a, b):
        tid, _ = await pair(a, b, tmp_path)  # B executes, A follows
        for _ in range(2):
            start_b = len(b.lines)
            turn = await start_running_turn(b, tid, "hang")
            start_a = len(a.lines)
            reply = await a.request("turn/interrupt", {"thread_id": tid})
            assert reply["interrupted"] is True
            assert reply["turn"]["id"] == turn["id"] and reply["turn"]["status"] == "interrupting"
            done = await a.wait_terminal(turn["id"], start=start_a)
            assert done["turn"]["status"] == "interrupted"
            answer = index_of(a, start_a, lambda m: "result" in m and m["result"] is reply)
            assert answer < index_of(a, start_a, is_terminal(turn["id"]))
            await b.wait_terminal(turn["id"], start=start_b)
        # Asked again once it ended: the turn as it ended (idempotent), not "interrupting".
        again = await a.request("turn/interrupt", {"thread_id": tid, "turn_id": turn["id"]})
        assert again["interrupted"] is False and again["turn"]["status"] == "interrupted"


async def test_a_thread_another_process_executes_is_reported_running(tmp_path, roost_home):
    go = tmp_path / "go"
    async with two_app_servers(tmp_path, roost_home) as (a, b):
        tid, _ = await pair(a, b, tmp_path)
        start_b = len(b.lines)
        turn = await start_running_turn(b, tid, "wait-go")
        start_a = len(a.lines)
        resumed = await a.request("thread/resume", {"session_id": tid})
        assert (resumed["thread"]["status"], resumed["thread"]["active_turn_id"]) == ("running", turn["id"])
        note = await a.wait_for("thread/resumed", start=start_a)
        assert (note["thread"]["status"], note["thread"]["active_turn_id"]) == ("running", turn["id"])
        listed = {t["id"]: t for t in (await a.request("thread/list", {}))["threads"]}
        assert (listed[tid]["status"], listed[tid]["active_turn_id"]) == ("running", turn["id"])
        assert (await b.request("thread/resume", {"session_id": tid}))["thread"]["status"] == "running"
        go.touch()
        await b.wait_terminal(turn["id"], start=start_b)
        # Ended: idle on A too (its turn row is no longer running).
        listed = {t["id"]: t for t in (await a.request("thread/list", {}))["threads"]}
        assert (listed[tid]["status"], listed[tid]["active_turn_id"]) == ("idle", None)
