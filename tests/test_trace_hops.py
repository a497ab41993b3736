"""``ROOST_TRACE_HOPS``: an interrupt's hops, timestamped on the clock a client shares (roost/_trace.py).

The real ``roost app-server`` on the scripted engine: a slow turn is interrupted once it streams,
and the trace file then holds that turn's hops, in the order an interrupt takes them, each
between the client's write of ``turn/interrupt`` and its read of the terminal notification.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from _helpers.appserver import open_app_server, script_env

SCRIPT = """
rules:
  - match: {prompt: "^slow"}
    steps:
      - - {text: "one two three four five six seven eight nine ten", tokens_per_second: 4}
"""

HOPS = ["interrupt_read", "turn_cancelled", "turn_unwound", "settle_begin", "settle_end", "terminal_emitted"]


async def test_an_interrupt_leaves_its_hops_in_order_between_the_clients_write_and_read(
    tmp_path: Path, roost_home: Path
) -> None:
    trace = tmp_path / "hops.jsonl"
    env = script_env(tmp_path, roost_home, SCRIPT, ROOST_TRACE_HOPS=str(trace))
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "slow one"}))["turn"]
        await client.wait_for("item/agentMessage/delta", lambda p: p["turn_id"] == turn["id"])
        sent = time.monotonic()
        await client.request("turn/interrupt", {"thread_id": tid, "turn_id": turn["id"]})
        done = (await client.wait_terminal(turn["id"]))["turn"]
        read = time.monotonic()
        assert done["status"] == "interrupted"
        # a turn that completes leaves no hops
        other = (await client.request("turn/start", {"thread_id": tid, "prompt": "hello"}))["turn"]
        assert (await client.wait_terminal(other["id"]))["turn"]["status"] == "completed"
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert [line["hop"] for line in lines] == HOPS
    assert all(line["turn"] == turn["id"] for line in lines)
    times = [line["t"] for line in lines]
    assert times == sorted(times) and sent <= times[0] and times[-1] <= read


async def test_an_unwritable_trace_file_turns_tracing_off_and_the_server_keeps_serving(
    tmp_path: Path, roost_home: Path
) -> None:
    env = script_env(tmp_path, roost_home, SCRIPT, ROOST_TRACE_HOPS=str(tmp_path / "missing" / "hops.jsonl"))
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        for _ in range(2):
            turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "slow one"}))["turn"]
            await client.wait_for("item/agentMessage/delta", lambda p: p["turn_id"] == turn["id"])
            await client.request("turn/interrupt", {"thread_id": tid, "turn_id": turn["id"]})
            assert (await client.wait_terminal(turn["id"]))["turn"]["status"] == "interrupted"
    assert not (tmp_path / "missing").exists()
