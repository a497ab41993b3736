"""An idle node is woken by a dispatch on another node (issue 13: "Nodes tell each other with
PostgreSQL LISTEN/NOTIFY ... with a bounded polling fallback"): two real ``roost serve`` daemons
on one PostgreSQL database, both polling the shared queue only once an hour
(``ROOST_TASK_POLL_S=3600``), so only the ``NOTIFY roost_tasks`` of the dispatch can make the idle
node claim the task. Node A is full (its one runner busy with a slow task) when it queues a second
task: idle node B starts it and A's client gets its result."""

from __future__ import annotations

import json
import signal
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import psycopg
import trio
from _helpers.serve_client import open_daemon
from _helpers.timing import scaled

SCRIPT = {
    "rules": [
        {"match": {"prompt": "^slow"}, "steps": [[{"text": "working", "deltas": 1}, {"delay": 120},
                                                  {"text": "never"}]]},
    ],
    "default": "echo",
}


def _rows(url: str, sql: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


async def _a_busy_and_b_idle(stack: AsyncExitStack, tmp_path: Path, pg_url: str) -> tuple[Any, Any, Any, str]:
    """Node A (one runner) running the slow task, then node B started idle; both poll the queue
    once an hour. Returns ``(node_a, client of a, client of b, the slow task's id)``; the nodes'
    logs are ``serve-a.err`` and ``serve-b.err`` in ``tmp_path``."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))

    def env(name: str) -> dict[str, str]:
        (tmp_path / f"home-{name}").mkdir()
        return {"ROOST_HOME": str(tmp_path / f"home-{name}"), "ROOST_DATABASE_URL": pg_url,
                "ROOST_TASK_POLL_S": "3600"}

    logs = {n: stack.enter_context((tmp_path / f"serve-{n}.err").open("wb")) for n in "ab"}
    args = ["--work-dir", str(tmp_path), "--max-concurrent", "1"]
    node_a = await stack.enter_async_context(open_daemon(script=script, env=env("a"), stderr=logs["a"], args=args))
    on_a = await stack.enter_async_context(node_a.unix())
    await on_a.wait_for("hello")
    # A's only runner takes the slow task (A queued it: it wakes its own runner at once)
    await on_a.send({"type": "user_input", "text": "slow job"})
    slow = (await on_a.wait_for("queued"))["sessionId"]
    await on_a.wait_for("agent_starting", lambda e: e["sessionId"] == slow)
    # B starts afterwards: its first look finds nothing claimable, then it waits (an hour)
    node_b = await stack.enter_async_context(open_daemon(script=script, env=env("b"), stderr=logs["b"], args=args))
    on_b = await stack.enter_async_context(node_b.unix())
    await on_b.wait_for("hello")
    return node_a, on_a, on_b, slow


async def test_a_task_queued_on_a_full_node_wakes_an_idle_node(tmp_path: Path, pg_url: str) -> None:
    async with AsyncExitStack() as stack:
        _, on_a, on_b, slow = await _a_busy_and_b_idle(stack, tmp_path, pg_url)
        start = len(on_a.events)
        await on_a.send({"type": "user_input", "text": "quick one"})
        quick = (await on_a.wait_for("queued", start=start))["sessionId"]
        # B claims it (woken by A's NOTIFY), runs it, and A's client gets the result
        await on_b.wait_for("agent_starting", lambda e: e["sessionId"] == quick, timeout=scaled(60))
        result = await on_a.wait_for("result", lambda e: e["sessionId"] == quick, start=start, timeout=scaled(60))
        assert result["succeeded"] is True and result["lastMessage"] == "quick one"
        assert not [e for e in on_a.events if e["type"] == "result" and e["sessionId"] == slow]
        # claimed once, by B; A still runs the slow task
        assert _rows(pg_url, "SELECT token FROM leases WHERE key = %s", (f"task:{quick}",)) == [(1,)]
        with trio.fail_after(scaled(30)):
            while f"task {quick} started" not in (tmp_path / "serve-b.err").read_text(errors="replace"):
                await trio.sleep(0.05)
        assert f"task {quick} started" not in (tmp_path / "serve-a.err").read_text(errors="replace")
        assert _rows(pg_url, "SELECT status FROM daemon_tasks WHERE id = %s", (slow,)) == [("running",)]


async def test_a_node_that_stops_cleanly_mid_task_wakes_an_idle_node_to_resume_it(tmp_path: Path,
                                                                                  pg_url: str) -> None:
    """A clean stop releases the running task's lease and sends ``NOTIFY roost_tasks``: the idle
    node (polling once an hour) resumes the task at once, not at its next poll."""
    async with AsyncExitStack() as stack:
        node_a, _, _, slow = await _a_busy_and_b_idle(stack, tmp_path, pg_url)
        node_a.process.send_signal(signal.SIGTERM)  # a clean stop, mid-task
        with trio.fail_after(scaled(30)):
            await node_a.process.wait()
        assert node_a.process.returncode == 0
        with trio.fail_after(scaled(30)):  # B resumes it now (woken), not in an hour
            while f"task {slow} started (resumed)" not in (tmp_path / "serve-b.err").read_text(errors="replace"):
                await trio.sleep(0.05)
        lease = _rows(pg_url, "SELECT owner, token FROM leases WHERE key = %s", (f"task:{slow}",))
        assert len(lease) == 1 and lease[0][1] == 2  # claimed again once: by B
