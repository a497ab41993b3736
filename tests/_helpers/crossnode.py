"""Two app-servers on one store (tests/test_crossnode*.py): the scripted model's tools, a thread
B executes and A follows, and a turn whose tool runs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from _helpers.appserver import AppServerClient, open_app_server, scripted_env

__all__ = ["pair", "start_running_turn", "two_app_servers", "wait_started", "write_script"]


def write_script(path: Path, go: Path) -> Path:
    """``wait-go``: a shell tool that prints ``started`` and waits for the file ``go``; ``ok-tool``:
    one that prints ``ok``; ``hang``: one that waits forever (until interrupted)."""
    wait = f"echo started; while [ ! -e {go} ]; do sleep 0.02; done; echo done"
    hang = "echo started; while true; do sleep 0.02; done"
    rules = [
        {
            "match": {"prompt": "^wait-go"},
            "steps": [[{"tool_call": {"name": "shell", "arguments": {"command": wait}}}], [{"text": "went"}]],
        },
        {
            "match": {"prompt": "^ok-tool"},
            "steps": [[{"tool_call": {"name": "shell", "arguments": {"command": "echo ok"}}}], [{"text": "ran"}]],
        },
        {
            "match": {"prompt": "^hang"},
            "steps": [[{"tool_call": {"name": "shell", "arguments": {"command": hang}}}], [{"text": "never"}]],
        },
    ]
    path.write_text(json.dumps({"rules": rules, "default": "echo"}))
    return path


async def wait_started(client: AppServerClient, start: int) -> None:
    """Wait until a tool's streamed output says ``started`` (the turn runs its tool)."""
    seen: list[str] = []

    def check(line: dict) -> bool:
        if line.get("method") == "item/toolCall/outputDelta":
            seen.append(line["params"]["delta"])
        return "started" in "".join(seen)

    await client.wait_line(check, start=start)


async def pair(a: AppServerClient, b: AppServerClient, cwd: Path) -> tuple[str, str]:
    """Initialize both; a thread started on B and resumed on A (A follows it). Returns (tid, B's node)."""
    await a.initialize()
    node_b = (await b.initialize())["runtime_host"]["instance_id"]
    tid = (await b.request("thread/start", {"cwd": str(cwd), "permission_mode": "unconfined"}))["thread"]["id"]
    await a.request("thread/resume", {"session_id": tid})
    return tid, node_b


async def start_running_turn(client: AppServerClient, thread_id: str, prompt: str) -> dict:
    """Start a turn with ``prompt`` (a :func:`write_script` rule) on ``client`` and wait until its
    tool runs (:func:`wait_started`). Returns the ``turn/start`` answer's turn."""
    start = len(client.lines)
    turn = (await client.request("turn/start", {"thread_id": thread_id, "prompt": prompt}))["turn"]
    await wait_started(client, start)
    return turn


@asynccontextmanager
async def two_app_servers(
    tmp_path: Path, home: Path, **env: str
) -> AsyncIterator[tuple[AppServerClient, AppServerClient]]:
    """Two ``roost app-server`` processes (A, B) on ROOST_HOME ``home`` with the scripted model of
    :func:`write_script` (its ``go`` file is ``tmp_path / "go"``); ``env`` adds variables."""
    script = write_script(tmp_path / "script.json", tmp_path / "go")
    full = scripted_env(home, script, **env)
    async with open_app_server(env=full, cwd=tmp_path) as a, open_app_server(env=full, cwd=tmp_path) as b:
        yield a, b
