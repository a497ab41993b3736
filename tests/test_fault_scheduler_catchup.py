"""Issue 18, finding 8: the scheduler's catch-up after a long outage costs the same as after a short one.

Twenty years of an every-minute job (10.5 million missed slots) would take the old walk over every
slot hours on the trio thread; the catch-up must fire the latest slot at once and record only the
most recent missed ones.
"""

from __future__ import annotations

import datetime
import json
import sqlite3
import subprocess
from pathlib import Path

import trio
from _helpers.appserver import roost_argv
from _helpers.serve_client import open_daemon
from _helpers.timing import scaled

from roost.scheduling import parse_cron


def _roost(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*roost_argv(), *args], capture_output=True, text=True, timeout=scaled(60), check=False)


async def test_a_twenty_year_outage_catches_up_at_once(tmp_path: Path, roost_home: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [], "default": "echo"}))
    added = _roost("schedule", "add", "tick", "--cron", "* * * * *", "--task", "caught up",
                   "--work-dir", str(tmp_path))
    assert added.returncode == 0, added.stderr
    long_ago = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=365 * 20))
    db = sqlite3.connect(roost_home / "roost.db")
    with db:
        db.execute("UPDATE schedules SET next_run = ?", (long_ago.strftime("%Y-%m-%dT%H:%M:00.000000Z"),))
    db.close()
    async with open_daemon(script=script, args=["--work-dir", str(tmp_path)]):
        # The catch-up fires as the daemon starts (before a client could attach): watch the store.
        with trio.fail_after(scaled(60)):
            while not _runs(roost_home, "done"):
                await trio.sleep(0.1)
    assert _runs(roost_home, "done") == [("succeeded", 1)]
    [(outcome, skipped)] = _runs(roost_home, "skipped")
    assert outcome == "missed" and 0 < skipped <= 1000   # the most recent missed slots, not ten million


def _runs(home: Path, status: str) -> list[tuple]:
    db = sqlite3.connect(home / "roost.db")
    try:
        return db.execute("SELECT outcome, count(*) FROM schedule_runs WHERE status = ? GROUP BY outcome",
                          (status,)).fetchall()
    finally:
        db.close()


def test_due_slots_walks_back_from_the_end() -> None:
    expr = parse_cron("*/5 * * * *")
    utc = datetime.UTC
    start = datetime.datetime(2000, 1, 1, tzinfo=utc)
    end = datetime.datetime(2026, 1, 1, 0, 7, 30, tzinfo=utc)
    slots, following = expr.due_slots(start, end, limit=3)
    assert slots == [datetime.datetime(2025, 12, 31, 23, 55, tzinfo=utc),
                     datetime.datetime(2026, 1, 1, 0, 0, tzinfo=utc),
                     datetime.datetime(2026, 1, 1, 0, 5, tzinfo=utc)]
    assert following == datetime.datetime(2026, 1, 1, 0, 10, tzinfo=utc)
    assert expr.due_slots(end, end, limit=3) == ([], following)
    exact = datetime.datetime(2026, 1, 1, 0, 5, tzinfo=utc)
    assert expr.due_slots(exact, exact, limit=3)[0] == [exact]
