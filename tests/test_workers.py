"""Worker trees end to end over `roost app-server` (issue: subagents that freeze on interrupt)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest
import trio

from _helpers.appserver import open_app_server, roost_argv, scripted_env
from _helpers.timing import scaled

SCRIPT = r"""
rules:
  - match: {agent: "leaf.*"}
    steps:
      - - {text: "leaf {prompt} done"}
      - - {text: "leaf again"}
  - match: {agent: "mid.*"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: leaf, prompt: "L"}}}
      - - {text: "mid got [{tool_output}]"}
  - match: {agent: "top.*"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: mid, prompt: "M"}}}
      - - {text: "top got [{tool_output}]"}
  - match: {agent: "deepleaf.*"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: toodeep, prompt: "X"}}}
      - - {text: "deepleaf saw [{tool_output}]"}
  - match: {agent: "quick.*"}
    steps:
      - - {text: "quick {prompt} one two three", tokens_per_second: 60}
  - match: {agent: "parent.*"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: slowchild, prompt: "C", run_in_background: true}}}
      - - {text: "parent done"}
  - match: {agent: "slowchild.*"}
    steps:
      - - {text: "child a b c d e f", tokens_per_second: 30}
  - match: {agent: "sleeper.*"}
    steps:
      - - {text: "z1 z2 z3 z4 z5 z6 z7 z8 z9 z10 z11 z12 z13 z14 z15 z16 z17 z18 z19 z20", tokens_per_second: 4}
  - match: {prompt: "^tree"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: top, prompt: "T"}}}
      - - {text: "root got [{tool_output}]"}
  - match: {prompt: "^deep"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: a1, prompt: "go"}}}
      - - {text: "deep done"}
  - match: {prompt: "^many"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: quick1, prompt: "1", run_in_background: true}}}
        - {tool_call: {name: spawn_agent, arguments: {name: quick2, prompt: "2", run_in_background: true}}}
        - {tool_call: {name: spawn_agent, arguments: {name: quick3, prompt: "3", run_in_background: true}}}
        - {tool_call: {name: spawn_agent, arguments: {name: quick4, prompt: "4", run_in_background: true}}}
        - {tool_call: {name: spawn_agent, arguments: {name: quick5, prompt: "5", run_in_background: true}}}
      - - {tool_call: {name: wait_agents, arguments: {}}}
      - - {text: "all done [{tool_output}]"}
  - match: {prompt: "^nest"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: parent, prompt: "P"}}}
      - - {text: "nest got [{tool_output}]"}
  - match: {prompt: "^freeze"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: sleeper1, prompt: "s", run_in_background: true}}}
        - {tool_call: {name: spawn_agent, arguments: {name: sleeper2, prompt: "s", run_in_background: true}}}
        - {tool_call: {name: spawn_agent, arguments: {name: sleeper3, prompt: "s", run_in_background: true}}}
        - {tool_call: {name: spawn_agent, arguments: {name: sleeper4, prompt: "s", run_in_background: true}}}
      - - {tool_call: {name: wait_agents, arguments: {}}}
      - - {text: "never reached"}
  - match: {prompt: "^bgsleep"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: sleeperbg, prompt: "s", run_in_background: true}}}
      - - {text: "started a sleeper"}
  - match: {prompt: "^background"}
    steps:
      - - {tool_call: {name: spawn_agent, arguments: {name: quickbg, prompt: "bg", run_in_background: true}}}
      - - {text: "started a worker"}
default: echo
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "workers.yaml"
    path.write_text(SCRIPT)
    return path


def agent_events(client, method="agent/updated"):
    return [n["params"] for n in client.notifications(method)]


async def start_thread(client, tmp_path):
    await client.initialize()
    return (await client.request("thread/start", {"cwd": str(tmp_path), "permission_mode": "unconfined"}))["thread"]["id"]


async def test_tree_of_depth_three_delivers_up_the_chain(script, tmp_path, roost_home):
    async with open_app_server(env=scripted_env(roost_home, script), cwd=tmp_path) as client:
        tid = await start_thread(client, tmp_path)
        done = await client.run_turn(tid, "tree please")
        assert done["turn"]["status"] == "completed"
        final = done["turn"]["items"][-1]["text"]
        assert "leaf L done" in final and "mid got" in final and "top got" in final
        finished = {a["agent"]["name"]: a["agent"] for a in agent_events(client) if a["agent"]["status"] == "completed"}
        assert {n: a["depth"] for n, a in finished.items()} == {"top": 1, "mid": 2, "leaf": 3}
        assert finished["mid"]["parent_id"] == finished["top"]["id"]
        # the deepest worker had no spawn_agent tool: depth 3 is the default limit
        snapshot = await client.request("thread/resume", {"session_id": tid})
        assert [a["name"] for a in snapshot["agents"]] == ["top", "mid", "leaf"]


async def test_depth_limit_refuses_spawn(script, tmp_path, roost_home):
    env = scripted_env(roost_home, script, ROOST_MAX_DEPTH="1")
    (tmp_path / "s2.yaml").write_text(SCRIPT.replace('match: {agent: "deepleaf.*"}', 'match: {agent: "^a1"}'))
    env["ROOST_SCRIPT"] = str(tmp_path / "s2.yaml")
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await start_thread(client, tmp_path)
        done = await client.run_turn(tid, "deep")
        worker = next(a["agent"] for a in agent_events(client) if a["agent"]["status"] == "completed")
        assert "depth limit" in worker["result"] or "unknown tool" in worker["result"]


async def test_queueing_order_under_max_parallel(script, tmp_path, roost_home):
    async with open_app_server(env=scripted_env(roost_home, script, ROOST_MAX_PARALLEL="2"), cwd=tmp_path) as client:
        tid = await start_thread(client, tmp_path)
        done = await client.run_turn(tid, "many")
        assert done["turn"]["status"] == "completed"
        # every result reaches the root exactly once: steered in as it finished, or claimed by wait_agents
        texts = [i.get("text") or i.get("output") or "" for i in done["turn"]["items"][1:-1]]
        for i in range(1, 6):
            assert sum(f"quick {i} one two three" in t for t in texts) == 1, (i, texts)
        running, max_running, started_order = set(), 0, []
        for event in agent_events(client):
            agent = event["agent"]
            if agent["status"] == "running":
                running.add(agent["id"])
                started_order.append(agent["spawn_order"])
            elif agent["status"] in ("completed", "failed", "cancelled", "interrupted"):
                running.discard(agent["id"])
            max_running = max(max_running, len(running))
        assert max_running == 2
        assert started_order == sorted(started_order) == [1, 2, 3, 4, 5]
        queued = [e["agent"]["name"] for e in agent_events(client) if e["agent"]["status"] == "queued"]
        assert queued == ["quick3", "quick4", "quick5"]
        mailbox = [m["message"]["from_name"] for m in agent_events(client, "agent/mailbox")]
        assert len(mailbox) == len(set(mailbox))


async def test_waiting_children_delivers_after_them(script, tmp_path, roost_home):
    async with open_app_server(env=scripted_env(roost_home, script), cwd=tmp_path) as client:
        tid = await start_thread(client, tmp_path)
        done = await client.run_turn(tid, "nest")
        statuses = [(e["agent"]["name"], e["agent"]["status"]) for e in agent_events(client)]
        assert ("parent", "waiting_children") in statuses
        i_wait = statuses.index(("parent", "waiting_children"))
        i_child = statuses.index(("slowchild", "completed"))
        i_parent = statuses.index(("parent", "completed"))
        assert i_wait < i_child < i_parent
        assert "nest got" in done["turn"]["items"][-1]["text"]
        mailbox = agent_events(client, "agent/mailbox")
        assert [m["message"]["from_name"] for m in mailbox] == ["slowchild"]  # child -> parent, once


async def test_freeze_on_interrupt_and_snapshot_next_turn(script, tmp_path, roost_home):
    async with open_app_server(env=scripted_env(roost_home, script, ROOST_MAX_PARALLEL="3"), cwd=tmp_path) as client:
        tid = await start_thread(client, tmp_path)
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "freeze them"}))["turn"]
        # wait until the three running sleepers streamed something (the fourth is queued)
        await client.wait_for("agent/updated", lambda p: p["agent"]["name"] == "sleeper4" and p["agent"]["status"] == "queued")
        await client.wait_for("item/toolCall/delta", lambda p: True)
        await client.request("turn/interrupt", {"thread_id": tid})
        done = await client.wait_terminal(turn["id"])
        assert done["turn"]["status"] == "interrupted"
        terminal_index = next(i for i, m in enumerate(client.lines)
                              if m.get("method") == "turn/completed" and m["params"]["turn"]["id"] == turn["id"])
        last = {}
        for event in agent_events(client):
            last[event["agent"]["name"]] = event["agent"]
        assert set(last) == {"sleeper1", "sleeper2", "sleeper3", "sleeper4"}
        assert all(a["status"] == "interrupted" for a in last.values()), last
        # no worker event after the root's terminal event, and nothing delivered while frozen
        later = [m for m in client.lines[terminal_index + 1:] if str(m.get("method", "")).startswith("agent/")]
        assert later == []
        assert agent_events(client, "agent/mailbox") == []
        # the next user turn receives the tree snapshot and restarts nothing
        start = len(client.lines)
        nxt = await client.run_turn(tid, "hello again")
        snap = [i for i in nxt["turn"]["items"] if i.get("source_id") == "roost:worker_snapshot"]
        assert len(snap) == 1 and "sleeper1" in snap[0]["text"] and "send_message" in snap[0]["text"]
        assert not [m for m in client.lines[start:] if m.get("method") == "agent/updated"]


async def test_interrupt_idle_thread_with_live_workers_freezes_them(script, tmp_path, roost_home):
    async with open_app_server(env=scripted_env(roost_home, script), cwd=tmp_path) as client:
        tid = await start_thread(client, tmp_path)
        done = await client.run_turn(tid, "bgsleep")
        assert done["turn"]["status"] == "completed"  # a natural end leaves the worker running
        await client.wait_for("agent/updated", lambda p: p["agent"]["name"] == "sleeperbg" and p["agent"]["status"] == "running")
        start = len(client.lines)
        reply = await client.request("turn/interrupt", {"thread_id": tid})
        assert reply["interrupted"] is True and reply["workers_frozen"] == 1
        frozen = await client.wait_for("agent/updated", lambda p: p["agent"]["status"] == "interrupted", start=start)
        assert frozen["agent"]["name"] == "sleeperbg" and frozen["agent"]["partial"] is True
        await client.wait_for("thread/updated", start=start)
        assert agent_events(client, "agent/mailbox") == []


async def test_background_worker_resumes_idle_root(script, tmp_path, roost_home):
    async with open_app_server(env=scripted_env(roost_home, script), cwd=tmp_path) as client:
        tid = await start_thread(client, tmp_path)
        first = await client.run_turn(tid, "background work")
        assert first["turn"]["items"][-1]["text"] == "started a worker"
        mail = await client.wait_for("agent/mailbox")
        assert mail["message"]["kind"] == "agent_result" and mail["message"]["from_name"] == "quickbg"
        internal = await client.wait_for("item/completed", lambda p: p["item"].get("source_id") == "roost:agent_result")
        assert internal["item"]["text"].startswith("[agent_result] quickbg")
        await client.wait_for("turn/completed", lambda p: p["turn"]["id"] == internal["turn_id"])
        assert len(agent_events(client, "agent/mailbox")) == 1


def _worker_turns(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("""SELECT w.name, (SELECT COUNT(*) FROM turns t WHERE t.thread_id = w.thread_id)
                               FROM workers w ORDER BY w.spawn_order""").fetchall()
        return dict(rows)
    finally:
        conn.close()


async def test_restart_reconciles_running_and_claims_queued_once(script, tmp_path, roost_home):
    env = scripted_env(roost_home, script, ROOST_MAX_PARALLEL="1")
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = await start_thread(client, tmp_path)
        await client.request("turn/start", {"thread_id": tid, "prompt": "freeze them"})
        await client.wait_for("agent/updated", lambda p: p["agent"]["name"] == "sleeper4" and p["agent"]["status"] == "queued")
        client.process.send_signal(signal.SIGKILL)
        await client.process.wait()
    # two processes start on the same database at once: each queued spawn is claimed exactly once
    procs = [subprocess.Popen([*roost_argv(), "app-server"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=env, cwd=str(tmp_path)) for _ in range(2)]
    try:
        with trio.fail_after(scaled(60)):
            while True:
                counts = _worker_turns(roost_home / "roost.db")
                conn = sqlite3.connect(roost_home / "roost.db")
                statuses = dict(conn.execute("SELECT name, status FROM workers").fetchall())
                conn.close()
                if all(s in ("completed", "interrupted") for s in statuses.values()):
                    break
                await trio.sleep(0.1)
    finally:
        for proc in procs:
            proc.stdin.close()
        for proc in procs:
            proc.wait(timeout=scaled(30))
    assert statuses["sleeper1"] == "interrupted"  # was running when the process died
    assert [statuses[f"sleeper{i}"] for i in (2, 3, 4)] == ["completed"] * 3
    assert counts == {"sleeper1": 1, "sleeper2": 1, "sleeper3": 1, "sleeper4": 1}
