"""A ``RemoteAgent`` proxy keeps one remote A2A context per run (docs/wire.md, "Remote agents").

A team that talks to the same remote agent (a second `roost serve --a2a` daemon) twice in one run
sends the first answer's ``contextId`` with the second call, so the remote agent's second turn
sees the first (the scripted engine's ``{history}``); the context id is saved in the run's
metadata, so ``roost run --resume`` after the run was stopped mid-way keeps the conversation; a new
run starts a new remote context; a kept context the remote refuses (its previous task outlived
``TimeoutSeconds`` and still runs) gives way to a new one.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from _helpers.appserver import roost_argv
from _helpers.serve_client import open_daemon
from _helpers.timing import scaled
from test_a2a import _messages

TEAM = """
Orchestration:
  Name: Relay
  Agents:
    - Name: Writer
      Instructions: Write the question.
    - Name: Oracle
      RemoteAgent: {Url: "%(url)s", TimeoutSeconds: %(timeout)s}
  Selection: {Type: roundrobin}
  Termination: {Type: maxiterations, MaxIterations: %(turns)s}
"""
REMOTE = {"rules": [], "default": [[{"text": "Oracle saw [{history}] now {prompt}"}]]}
LOCAL = {"rules": [], "default": [[{"text": "Q{prompt}"}]]}


def _env(tmp_path: Path, script: dict) -> dict[str, str]:
    path = tmp_path / f"local-{len(json.dumps(script))}.json"
    path.write_text(json.dumps(script))
    return dict(os.environ, ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(path))


async def _run(tmp_path: Path, env: dict[str, str], *args: str, stdin: bytes | None = None, code: int = 0) -> dict:
    with trio.fail_after(scaled(90)):
        done = await trio.run_process(
            [*roost_argv(), "run", "--json", *args],
            env=env,
            cwd=str(tmp_path),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            stdin=subprocess.DEVNULL if stdin is None else stdin,
        )
    assert done.returncode == code, done.stderr
    return json.loads(done.stdout.decode().splitlines()[-1])


def _oracle(messages: list[dict]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "assistant" and m["agentName"] == "Oracle"]


@asynccontextmanager
async def _remote_team(tmp_path: Path) -> AsyncIterator[Path]:
    """A second daemon hosting the remote agent over A2A, and the team config (4 turns) that
    proxies its Oracle to it."""
    (tmp_path / "remote").mkdir()
    remote = tmp_path / "remote.json"
    remote.write_text(json.dumps(REMOTE))
    async with open_daemon(script=remote, args=["--a2a", "--work-dir", str(tmp_path / "remote")]) as other:
        config = tmp_path / "team.yaml"
        config.write_text(TEAM % {"url": f"http://127.0.0.1:{other.port}/a2a/assistant", "timeout": 60, "turns": 4})
        yield config


async def test_a_run_keeps_its_remote_context(tmp_path: Path) -> None:
    async with _remote_team(tmp_path) as config:
        result = await _run(tmp_path, _env(tmp_path, LOCAL), "-c", str(config), "one")
        assert result["succeeded"] is True and result["turns"] == 4
        first, second = _oracle(await _messages(tmp_path, result["sessionId"]))
        assert first == "Oracle saw [none] now Qone"
        # the second call continues the first call's remote context: the remote model sees it
        assert second == f"Oracle saw [user: Qone / agent: {first}] now Q{first}"

        # another run: a fresh remote context
        again = await _run(tmp_path, _env(tmp_path, LOCAL), "-c", str(config), "two")
        assert _oracle(await _messages(tmp_path, again["sessionId"]))[0] == "Oracle saw [none] now Qtwo"


async def test_a_resumed_run_keeps_its_remote_context(tmp_path: Path) -> None:
    async with _remote_team(tmp_path) as config:
        env = _env(tmp_path, LOCAL)
        # --hitl: go on after the Writer, stop after the Oracle's first answer (130, resumable)
        stopped = await _run(tmp_path, env, "--hitl", "-c", str(config), "one", stdin=b"\n/stop\n", code=130)
        (first,) = _oracle(await _messages(tmp_path, stopped["sessionId"]))
        assert first == "Oracle saw [none] now Qone"

        resumed = await _run(tmp_path, env, "--resume", stopped["sessionId"])
        assert resumed["succeeded"] is True and resumed["sessionId"] == stopped["sessionId"]
        _, second = _oracle(await _messages(tmp_path, stopped["sessionId"]))
        assert second == f"Oracle saw [user: Qone / agent: {first}] now Q{first}"


async def test_a_refused_remote_context_gives_way_to_a_new_one(tmp_path: Path) -> None:
    (tmp_path / "remote").mkdir()
    remote = tmp_path / "remote.json"
    stall = {"match": {"prompt": "^QOracle saw"}, "steps": [[{"delay": 600}]]}
    remote.write_text(json.dumps({**REMOTE, "rules": [stall]}))
    args = ["--a2a", "--max-concurrent", "2", "--work-dir", str(tmp_path / "remote")]  # the stalled one and the next
    async with open_daemon(script=remote, args=args) as other:
        url = f"http://127.0.0.1:{other.port}/a2a/assistant"
        config = tmp_path / "team.yaml"
        config.write_text(TEAM % {"url": url, "timeout": scaled(5), "turns": 6})
        result = await _run(tmp_path, _env(tmp_path, LOCAL), "-c", str(config), "one")
        assert result["succeeded"] is True and result["turns"] == 6
        first, late, third = _oracle(await _messages(tmp_path, result["sessionId"]))
        assert first == "Oracle saw [none] now Qone"
        assert late.startswith(f"[remote agent {url} failed: no answer within")
        # the second call's remote task still runs in the kept context: refused, so a new context
        assert third == f"Oracle saw [none] now Q{late}"
