"""End-to-end: ``usage/overview`` and ``settings/usage`` over the real ``roost app-server``."""

from __future__ import annotations

from pathlib import Path

import pytest
from _helpers.appserver import expect_error, open_app_server, scripted_env

from roost.storage import create_thread, create_turn, open_store, update_turn

ZERO = {"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0, "total_tokens": 0, "turns": 0,
        "sessions": 0, "agents": 0}


async def test_empty_store_then_real_turns(tmp_path: Path, roost_home: Path) -> None:
    async with open_app_server(env=scripted_env(roost_home), cwd=tmp_path) as client:
        await client.initialize()
        empty = await client.request("usage/overview", {})
        assert empty == {"timezone": "UTC", "total_sessions": 0, "metrics": {**ZERO, "active_days": 0}, "days": []}
        await expect_error(client, "usage/overview", {"timezone": "Mars/Olympus_Mons"}, "invalid_params",
                           contains="IANA")
        await expect_error(client, "settings/usage", {"timezone": "../etc/passwd"}, "invalid_params")
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        first = (await client.run_turn(tid, "hello"))["turn"]
        second = (await client.run_turn(tid, "again"))["turn"]
        assert first["usage"]["input_tokens"] > 0
        overview = await client.request("usage/overview", {"timezone": "America/Los_Angeles"})
        metrics = overview["metrics"]
        assert overview["timezone"] == "America/Los_Angeles" and overview["total_sessions"] == 1
        for key in ("input_tokens", "output_tokens"):
            assert metrics[key] == first["usage"][key] + second["usage"][key]
        assert metrics["turns"] == 2 and metrics["active_days"] == len(overview["days"]) >= 1
        assert sum(day["turns"] for day in overview["days"]) == 2
        snapshot = await client.request("settings/usage", {})
        assert snapshot["metrics"]["input_tokens"] == metrics["input_tokens"]
        (breakdown,) = snapshot["engine_breakdowns"]
        assert breakdown["engine_id"] == "roost" and breakdown["in_wuu"]["turns"] == 2
        assert "outside" not in breakdown


def _seed(home: Path) -> None:
    store = open_store(home / "roost.db")
    try:
        with store.transaction() as conn:
            one = create_thread(conn, title="one").id
            two = create_thread(conn, title="two").id
            worker = create_thread(conn, kind="worker", parent_thread_id=one).id
            for thread, started, tokens in [(one, "2026-01-10T05:00:00Z", 10), (one, "2026-01-10T12:00:00Z", 20),
                                            (worker, "2026-01-10T13:00:00Z", 40), (two, "2026-01-12T00:00:00Z", 80),
                                            (two, "2026-01-12T01:00:00Z", 0)]:
                turn = create_turn(conn, thread, status="completed").id
                update_turn(conn, turn, started_at=started,
                            usage={"input_tokens": tokens, "output_tokens": tokens // 10, "cached_tokens": 0})
    finally:
        store.close()


@pytest.mark.parametrize("zone, expected", [
    (None, [("2026-01-10", 70, 3, 1, 1), ("2026-01-12", 80, 1, 1, 0)]),
    ("America/Los_Angeles", [("2026-01-09", 10, 1, 1, 0), ("2026-01-10", 60, 2, 1, 1), ("2026-01-11", 80, 1, 1, 0)]),
])
async def test_days_follow_the_timezone(tmp_path: Path, roost_home: Path, zone, expected) -> None:
    _seed(roost_home)
    async with open_app_server(env=scripted_env(roost_home), cwd=tmp_path) as client:
        await client.initialize()
        params = {} if zone is None else {"timezone": zone}
        overview = await client.request("usage/overview", params)
        got = [(d["date"], d["input_tokens"], d["turns"], d["sessions"], d["agents"]) for d in overview["days"]]
        assert got == expected
        metrics = overview["metrics"]
        assert (metrics["input_tokens"], metrics["output_tokens"], metrics["turns"]) == (150, 15, 4)
        assert (metrics["sessions"], metrics["agents"], metrics["active_days"]) == (2, 1, len(expected))
        assert overview["total_sessions"] == 2
        assert (await client.request("settings/usage", params))["days"] == overview["days"]
