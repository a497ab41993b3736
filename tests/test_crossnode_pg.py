"""Cross-node input on PostgreSQL (issue 13): two ``roost app-server`` processes on one database
(``ROOST_DATABASE_URL``), woken by ``LISTEN/NOTIFY``: a client on node A steers and interrupts a
turn running on node B; the answers and notifications arrive on A; checked in the database."""

from __future__ import annotations

from _helpers.crossnode import pair, start_running_turn, two_app_servers


def pg_rows(url: str, sql: str, *args: object) -> list[tuple]:
    import psycopg

    with psycopg.connect(url) as conn:
        return [tuple(r) for r in conn.execute(sql, args).fetchall()]


async def test_client_on_a_steers_and_interrupts_a_turn_running_on_b_on_postgres(tmp_path, roost_home, pg_url):
    go = tmp_path / "go"
    async with two_app_servers(tmp_path, roost_home, ROOST_DATABASE_URL=pg_url) as (a, b):
        tid, node_b = await pair(a, b, tmp_path)
        assert pg_rows(pg_url, "SELECT count(*) FROM threads WHERE id = %s", tid) == [(1,)]  # on PostgreSQL
        turn = await start_running_turn(b, tid, "wait-go")
        assert pg_rows(pg_url, "SELECT owner FROM leases WHERE key = %s", f"thread:{tid}") == [(node_b,)]
        start_a = len(a.lines)
        steer = await a.request(
            "turn/steer",
            {"thread_id": tid, "prompt": "steer from a", "client_id": "s-1", "expected_turn_id": turn["id"]},
        )
        assert steer["delivery"] == "active_turn" and steer["turn_id"] == turn["id"]
        await a.wait_for("turn/steered", lambda p: p["state"] == "pending", start=start_a)
        go.touch()
        await a.wait_for("turn/steered", lambda p: p["state"] == "admitted", start=start_a)
        assert (await a.wait_terminal(turn["id"], start=start_a))["turn"]["status"] == "completed"

        hang = await start_running_turn(b, tid, "hang")
        start_a = len(a.lines)
        reply = await a.request("turn/interrupt", {"thread_id": tid, "turn_id": hang["id"]})
        assert reply["interrupted"] is True
        assert (await a.wait_terminal(hang["id"], start=start_a))["turn"]["status"] == "interrupted"
    turns = pg_rows(pg_url, "SELECT id, status FROM turns WHERE thread_id = %s ORDER BY started_at", tid)
    assert turns == [(turn["id"], "completed"), (hang["id"], "interrupted")]
    users = pg_rows(
        pg_url,
        "SELECT payload::json ->> 'source_id' FROM items WHERE thread_id = %s AND type = 'user_message' ORDER BY seq",
        tid,
    )
    assert users == [(None,), ("s-1",), (None,)]  # the steer once, nothing run twice
    assert {s for (s,) in pg_rows(pg_url, "SELECT status FROM bus_messages")} <= {"done"}
