"""End-to-end: ``roost app-server`` with worker processes (roost.protocol._as_workers, issue 19
"Every core") says exactly what the single process says.

A scripted multi-thread session (three threads, concurrent turns, an approval answered over
reverse RPC, an interrupt, history reads, a fork, a list) runs once with workers off and once with
every thread sent to a worker; after ids and times are replaced by placeholders, the responses
and each thread's notifications are the same lines in the same order. A worker killed with
SIGKILL gives its threads back: its running turn ends ``interrupted`` and the thread takes new
turns in the front process.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from _helpers.appserver import open_app_server, script_env

SCRIPT = """
rules:
  - match: {prompt: "^slow"}
    steps:
      - - {text: "one two three four five six seven eight nine ten", tokens_per_second: 4}
  - match: {prompt: "^gated"}
    steps:
      - - {text: "Writing."}
        - {tool_call: {name: write_file, arguments: {path: "gated.txt", content: "hello"}}}
      - - {text: "Wrote it."}
default: echo
"""

APPROVALS = {"reverse_rpc": {"methods": ["approval/request"]}}
_ID = re.compile(r"\b(thr|turn|item|run|inp|call|fork)_[0-9a-f]{8,}\b")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
_VOLATILE = ("duration_ms", "elapsed_ms", "latency_ms", "pid", "instance_id", "started_at", "updated_at")


def normalized(lines: list[bytes], root: Path) -> tuple[dict, dict]:
    """``(responses by request id, notifications by thread)`` with ids, times and the run's
    folder ``root`` as placeholders. Placeholders are numbered in an order that does not depend
    on how two threads' concurrent turns interleave: the responses in request order, then each
    thread's notifications, threads in the order they were named."""
    import json

    names: dict[str, str] = {}

    def name(match: re.Match) -> str:
        return names.setdefault(match.group(0), f"<{match.group(1)}{len(names)}>")

    def clean(text: str) -> dict:
        message = json.loads(_TIME.sub("<time>", _ID.sub(name, text)).replace(str(root), "<root>"))
        _drop_volatile(message)
        return message

    raw_responses: dict = {}
    raw_threads: dict[str, list[str]] = {}
    for raw in lines:
        text = raw.decode()
        message = json.loads(text)
        if "method" not in message:
            raw_responses[message.get("id")] = text
            continue
        params = message.get("params") or {}
        thread = params.get("thread_id") or (params.get("thread") or {}).get("id") or "session"
        raw_threads.setdefault(thread, []).append(text)
    order = {rid: i for i, rid in enumerate(raw_responses)}
    responses = {rid: clean(raw_responses[rid]) for rid in sorted(raw_responses, key=lambda r: (_request_number(r), order[r]))}
    named = list(names)
    threads = {_ID.sub(name, thread): [clean(text) for text in raw_threads[thread]]
               for thread in sorted(raw_threads, key=lambda t: named.index(t) if t in named else len(named))}
    return responses, threads


def _request_number(rid: object) -> int:
    """The client's request counter in ``rid`` (``t12`` -> 12), or -1."""
    digits = re.sub(r"\D", "", str(rid))
    return int(digits) if digits else -1


def _drop_volatile(value: object) -> None:
    if isinstance(value, dict):
        for key in _VOLATILE:
            value.pop(key, None)
        for inner in value.values():
            _drop_volatile(inner)
    elif isinstance(value, list):
        for inner in value:
            _drop_volatile(inner)


async def scripted_session(env: dict, cwd: Path) -> list[bytes]:
    """The session of the module doc; the lines the server wrote."""
    async with open_app_server(env=env, cwd=cwd) as client:
        await client.initialize(capabilities=APPROVALS, client={"name": "equivalence"})
        tids = []
        for _ in range(3):  # one at a time: the placeholders number them in the same order
            tids.append((await client.request("thread/start", {"cwd": str(cwd)}))["thread"]["id"])
        a, b, c = tids
        for round_ in range(2):  # two threads' turns at once
            start = len(client.lines)
            turns = [(await client.request("turn/start", {"thread_id": tid, "prompt": f"hello {round_} {i}"}))["turn"]
                     for i, tid in enumerate((a, b))]
            for turn in turns:
                await client.wait_terminal(turn["id"], start=start)
        client.approval_handler = lambda params: True
        await client.run_turn(b, "gated write")
        start = len(client.lines)
        turn = (await client.request("turn/start", {"thread_id": c, "prompt": "slow one"}))["turn"]
        await client.wait_for("item/agentMessage/delta", lambda p: p["turn_id"] == turn["id"], start=start)
        await client.request("turn/interrupt", {"thread_id": c, "turn_id": turn["id"]})
        await client.wait_terminal(turn["id"], start=start)
        await client.request("thread/history/read", {"thread_id": a})
        await client.request("thread/fork", {"thread_id": a})
        await client.request("thread/resume", {"thread_id": b})
        await client.request("thread/list", {})
        return list(client.raw)


async def test_workers_give_the_single_process_protocol_lines(tmp_path: Path) -> None:
    results = []
    for label, extra in (("single", {"ROOST_APPSERVER_WORKERS": "0"}),
                         ("workers", {"ROOST_APPSERVER_WORKERS": "2", "ROOST_APPSERVER_SPREAD_AT": "0"})):
        home, cwd = tmp_path / label / "home", tmp_path / label / "work"
        home.mkdir(parents=True)
        cwd.mkdir()
        env = script_env(tmp_path / label, home, SCRIPT, **extra)
        results.append(normalized([line + b"\n" for line in await scripted_session(env, cwd)], tmp_path / label))
    (single_responses, single_threads), (worker_responses, worker_threads) = results
    assert worker_responses == single_responses
    assert worker_threads == single_threads
    # the reverse request went through a worker and kept the single process's id
    assert any(m.get("method") == "approval/request" for t in worker_threads.values() for m in t)


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry))
    return found


async def test_a_killed_worker_gives_its_threads_back(tmp_path: Path, roost_home: Path) -> None:
    env = script_env(tmp_path, roost_home, SCRIPT, ROOST_APPSERVER_WORKERS="1", ROOST_APPSERVER_SPREAD_AT="0")
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        start = len(client.lines)
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "slow one"}))["turn"]
        await client.wait_for("item/agentMessage/delta", lambda p: p["turn_id"] == turn["id"], start=start)
        (worker,) = _children(client.process.pid)
        os.kill(worker, signal.SIGKILL)
        done = await client.wait_terminal(turn["id"], start=start)
        assert done["turn"]["status"] == "interrupted"
        # the thread now executes in the front process
        after = await client.run_turn(tid, "after the crash")
        assert after["turn"]["status"] == "completed"
        snap = await client.request("thread/resume", {"thread_id": tid})
        assert [t["status"] for t in snap["turns"]] == ["interrupted", "completed"]


def test_worker_count_warns_on_a_negative_value_and_caps_at_the_cores_minus_one(monkeypatch, caplog):
    from roost.protocol import _as_workers

    monkeypatch.setattr(_as_workers, "usable_cores", lambda: 2)
    expected = {"abc": _as_workers.DEFAULT_WORKERS, "-1": _as_workers.DEFAULT_WORKERS, "99": 1, "1": 1, "0": 0}
    for raw, count in expected.items():
        caplog.clear()
        monkeypatch.setenv("ROOST_APPSERVER_WORKERS", raw)
        with caplog.at_level("WARNING"):
            assert _as_workers.worker_count() == count, raw
        warned = [r for r in caplog.records if "ROOST_APPSERVER_WORKERS" in r.getMessage()]
        assert len(warned) == (1 if raw in ("abc", "-1", "99") else 0), raw


def test_spread_at_warns_on_a_bad_value_and_uses_the_default(monkeypatch, caplog):
    from roost.protocol import _as_workers

    default = _as_workers.DEFAULT_SPREAD_AT
    expected = {"abc": default, "-3": default, "1.5": default, "0": 0, "7": 7, "": default}
    for raw, value in expected.items():
        caplog.clear()
        monkeypatch.setenv("ROOST_APPSERVER_SPREAD_AT", raw)
        with caplog.at_level("WARNING"):
            assert _as_workers.spread_at() == value, raw
        warned = [r for r in caplog.records if "ROOST_APPSERVER_SPREAD_AT" in r.getMessage()]
        assert len(warned) == (1 if raw in ("abc", "-3", "1.5") else 0), raw
