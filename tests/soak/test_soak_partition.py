"""Soak: SIGSTOP partitions of one ``roost app-server`` past its lease TTL while a second one takes over.

Each iteration: process A runs a turn whose shell tool waits; A is SIGSTOPped for three lease TTLs;
process B starts a turn on the same thread (the lease expired: B acquires it, new fencing token)
and completes it; A gets SIGCONT. A stale write is any row A's turn wrote after B's turn began
(items of A's turn with a later rowid than B's first item, or A's turn row settled by A after
that): the fencing token must refuse them all.
"""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

import pytest
import trio
from _helpers.appserver import open_app_server, scripted_env
from test_appserver_leases import start_thread, wait_output, write_script

from soak._soak import ITERATIONS, linux_only
from _helpers.timing import scaled

pytestmark = [pytest.mark.soak, linux_only]

TTL = 0.5


async def test_soak_sigstop_partitions(tmp_path: Path, roost_home: Path, soak_report) -> None:
    stale = 0
    for iteration in range(ITERATIONS):
        go = tmp_path / f"go{iteration}"
        env = scripted_env(roost_home, write_script(tmp_path / f"script{iteration}.json", go),
                           ROOST_LEASE_TTL=str(TTL))
        async with open_app_server(env=env, cwd=tmp_path) as a, open_app_server(env=env, cwd=tmp_path) as b:
            await a.initialize()
            await b.initialize()
            tid = await start_thread(a, tmp_path)
            start = len(a.lines)
            a_turn = (await a.request("turn/start", {"thread_id": tid, "prompt": "wait-go"}))["turn"]["id"]
            await wait_output(a, "started", start=start)
            a.process.send_signal(signal.SIGSTOP)
            try:
                await trio.sleep(TTL * 3)              # the partition: A's lease expires meanwhile
                done = await b.run_turn(tid, "hello from b")
                assert done["turn"]["status"] == "completed"
                b_turn = done["turn"]["id"]
                go.touch()
            finally:
                a.process.send_signal(signal.SIGCONT)
            await a.wait_terminal(a_turn, start=start, timeout=scaled(60))
        db = sqlite3.connect(roost_home / "roost.db")
        try:
            first_b = db.execute("SELECT min(rowid) FROM items WHERE turn_id = ?", (b_turn,)).fetchone()[0]
            stale += db.execute("SELECT count(*) FROM items WHERE turn_id = ? AND rowid > ?",
                                (a_turn, first_b)).fetchone()[0]
            status = db.execute("SELECT status FROM turns WHERE id = ?", (a_turn,)).fetchone()[0]
            stale += status in ("completed", "failed")   # A settling its own turn after the takeover
        finally:
            db.close()
    soak_report("sigstop_partition", partitions=ITERATIONS, stale_writes=stale)
    assert stale == 0
