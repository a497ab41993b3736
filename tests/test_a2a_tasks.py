"""A2A tasks of `roost serve --a2a` (docs/wire.md, "A2A"): ``tasks/cancel`` of a task another node
of the PostgreSQL cluster runs, tasks scoped to the token that sent them, and the request checks
(a missing ``id``, params that are not an object, non-boolean ``blocking``, a repeated
``messageId``, ``historyLength: 0``, JSON-RPC bodies of the 401/403 refusals)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _helpers.serve_client import open_daemon
from _helpers.timing import scaled
from a2a.client.errors import A2AClientJSONRPCError
from a2a.types import TaskIdParams, TaskQueryParams, TaskState
from test_a2a import SCRIPT, _rpc, _text, a2a_client, send, until_state
from test_pg_cluster import _rows, _runner_pid, _wait_rows

FULL, OTHER, READ = "tasks-full", "tasks-other", "tasks-read"


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    return script


async def test_cancel_on_a_stops_an_a2a_task_running_on_b(tmp_path: Path, pg_url: str) -> None:
    """A (``--a2a``) and B (no A2A) on one database, one runner each: A runs the first slow task,
    B claims the second; ``tasks/cancel`` on A interrupts it on B (the node bus) and answers
    ``canceled`` once it ended."""
    script = _script(tmp_path)
    async with contextlib.AsyncExitStack() as stack:
        daemons = []
        for name, extra in (("a", ["--a2a"]), ("b", [])):
            home = tmp_path / f"home-{name}"
            home.mkdir()
            env = {"ROOST_HOME": str(home), "ROOST_DATABASE_URL": pg_url, "ROOST_TASK_POLL_S": "0.3"}
            args = [*extra, "--max-concurrent", "1", "--work-dir", str(tmp_path)]
            daemons.append(await stack.enter_async_context(open_daemon(script=script, env=env, args=args)))
        a, b = daemons
        async with a2a_client(a.port, None, polling=True) as client:
            ((first, _),) = await send(client, "slow first")
            await _wait_rows(pg_url, "SELECT 1 FROM turns WHERE thread_id = %s AND status = 'running'", (first.id,), bool)
            ((second, _),) = await send(client, "slow second")
            await _wait_rows(
                pg_url, "SELECT 1 FROM turns WHERE thread_id = %s AND status = 'running'", (second.id,), bool
            )
            runners = {_runner_pid(pg_url, t.id): t for t in (first, second)}
            assert set(runners) == {a.process.pid, b.process.pid}
            on_a, on_b = runners[a.process.pid], runners[b.process.pid]
            with trio.fail_after(scaled(20)):
                answer = await client.cancel_task(TaskIdParams(id=on_b.id))
            assert answer.status.state == TaskState.canceled, answer
            assert _rows(pg_url, "SELECT status FROM turns WHERE thread_id = %s", (on_b.id,)) == [("interrupted",)]
            assert (await client.get_task(TaskQueryParams(id=on_a.id))).status.state == TaskState.working
            assert (await client.cancel_task(TaskIdParams(id=on_a.id))).status.state == TaskState.canceled
