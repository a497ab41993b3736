"""A daemon task dispatched on node A and run on node B (issue 13): its events reach A's client over
the node bus exactly as on one node (same event sequence, the same streamed text), its approval is
asked of A's client and the answer goes back to B; the result reaches A's client. Two real
``roost serve`` daemons on one store: a shared SQLite ``$ROOST_HOME``, and PostgreSQL. A runs with
the hidden ``--no-claim`` (a front door only), so every task runs on B."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _helpers.serve_client import open_daemon
from _helpers.timing import scaled

SCRIPT = {
    "rules": [
        {"match": {"prompt": "^approve"},
         "steps": [[{"text": "let me run it. ", "deltas": 20},
                    {"tool_call": {"name": "shell", "arguments": {"command": "echo approved-run"}}}],
                   [{"text": "tool said: {tool_output}", "deltas": 30}]]},
    ],
    "default": "echo",
}


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(SCRIPT))
    return path


@asynccontextmanager
async def two_nodes(tmp_path: Path, script: Path, env: dict) -> AsyncIterator[tuple[Any, Any]]:
    async with AsyncExitStack() as stack:
        nodes = []
        for name, extra in (("a", ["--no-claim"]), ("b", [])):
            err = stack.enter_context((tmp_path / f"serve-{name}.err").open("wb"))
            nodes.append(await stack.enter_async_context(open_daemon(
                script=script, env=env, stderr=err,
                args=["--work-dir", str(tmp_path), "--reconnect-grace", "60", *extra])))
        yield nodes[0], nodes[1]


async def _run_approved(client: Any) -> tuple[str, list[dict]]:
    """Dispatch the approval task, approve it, wait for its result; return its id and events."""
    start = len(client.events)
    await client.send({"type": "user_input", "text": "approve this please"})
    sid = (await client.wait_for("queued", start=start))["sessionId"]
    request = await client.wait_for("approval_request", lambda e: e["sessionId"] == sid, start=start)
    assert request["kind"] == "shell_command" and request["command"] == "echo approved-run"
    await client.send({"type": "approval_response", "approved": True})
    result = await client.wait_for("result", lambda e: e["sessionId"] == sid, start=start, timeout=scaled(90))
    assert result["succeeded"] is True and "approved-run" in result["lastMessage"]
    return sid, [e for e in client.events[start:] if e.get("sessionId") == sid]


def _shape(events: list[dict]) -> tuple[list[str], str]:
    """The event types with runs of ``token`` collapsed (deltas are coalesced), and the text."""
    types: list[str] = []
    for e in events:
        if not (e["type"] == "token" and types and types[-1] == "token"):
            types.append(e["type"])
    return types, "".join(e["text"] for e in events if e["type"] == "token")


async def _check(tmp_path: Path, script: Path, env: dict, token_of: Any) -> None:
    async with two_nodes(tmp_path, script, env) as (a, b):
        async with a.unix() as on_a, b.unix() as on_b:
            await on_a.wait_for("hello")
            await on_b.wait_for("hello")
            # on one node: B's own client, its task run by B
            _sid_b, local = await _run_approved(on_b)
            # across nodes: A's client, the task run by B (A claims nothing)
            sid, relayed = await _run_approved(on_a)
            assert _shape(relayed) == _shape(local)
            assert _shape(relayed)[0][:3] == ["queued", "agent_starting", "token"]
            assert "let me run it. " in _shape(relayed)[1] and "tool said: approved-run" in _shape(relayed)[1]
            # the stream was coalesced: fewer token lines than the 50 deltas, the same text
            assert len([e for e in relayed if e["type"] == "token"]) < len([e for e in local if e["type"] == "token"])
            # B ran it, A never did (each daemon logs the tasks it starts); claimed once
            assert f"task {sid} started" in (tmp_path / "serve-b.err").read_text(errors="replace")
            assert f"task {sid} started" not in (tmp_path / "serve-a.err").read_text(errors="replace")
            assert token_of(sid) == 1
            assert not [e for e in on_a.events if e.get("type") == "error"]


async def test_task_run_on_b_streams_to_a_and_asks_a_sqlite(tmp_path: Path, script: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()

    def token_of(sid: str) -> str:
        with sqlite3.connect(home / "roost.db") as conn:
            (token,), = conn.execute("SELECT token FROM leases WHERE key = ?", (f"task:{sid}",)).fetchall()
            return token

    await _check(tmp_path, script, {"ROOST_HOME": str(home), "ROOST_TASK_POLL_S": "0.3"}, token_of)


async def test_task_run_on_b_streams_to_a_and_asks_a_postgres(tmp_path: Path, script: Path, pg_url: str) -> None:
    home = tmp_path / "home"
    home.mkdir()

    def token_of(sid: str) -> str:
        with psycopg.connect(pg_url) as conn:
            (token,), = conn.execute("SELECT token FROM leases WHERE key = %s", (f"task:{sid}",)).fetchall()
            return token

    env = {"ROOST_HOME": str(home), "ROOST_DATABASE_URL": pg_url, "ROOST_TASK_POLL_S": "0.3"}
    await _check(tmp_path, script, env, token_of)
