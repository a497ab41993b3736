"""Soak: ``kill -9`` at random points of ``roost app-server`` and ``roost serve``.

App-server iterations: a persistent thread gets a burst of ``turn/start`` inputs (some run a shell
tool that leaves a background job), the process is SIGKILLed after a random delay, restarted, and
the figures are counted: accepted inputs (answered with a turn), lost ones (an accepted turn whose
user message is not in the thread after the restart), stuck threads (a turn still ``running`` or
``queued`` after restart, or a thread that refuses a new turn) and orphan processes (tool commands
still running after the restart's reconciliation). Daemon iterations: tasks dispatched over the
Unix socket, SIGKILL, restart: an accepted (``queued``) task missing from the store is lost.
"""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
from pathlib import Path

import pytest
import trio
from _helpers.appserver import AppServerClient, RemoteError, roost_argv, scripted_env
from _helpers.serve_client import open_daemon, start_daemon

from soak._soak import ITERATIONS, linux_only, marked_processes
from _helpers.timing import scaled

pytestmark = [pytest.mark.soak, linux_only]

SCRIPT = {"rules": [{"match": {"prompt": "^tool"},
                     "steps": [[{"tool_call": {"name": "shell", "arguments": {"command": "sleep 60 & sleep 0.2; echo ok"}}}],
                               [{"text": "tool done", "deltas": 20, "tokens_per_second": 200}]]}],
          "default": "echo"}


async def _start(env: dict, cwd: Path) -> tuple[trio.Process, AppServerClient]:
    process = await trio.lowlevel.open_process([*roost_argv(), "app-server"], stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                               env=env, cwd=str(cwd))
    return process, AppServerClient(process)


async def _orphans(tag: str) -> int:
    """Tool processes of this run still running once SIGKILL had 5 s to be delivered."""
    with trio.move_on_after(scaled(5)):
        while marked_processes(tag):
            await trio.sleep(0.1)
    return len(marked_processes(tag))


async def test_soak_kill9_app_server_and_daemon(tmp_path: Path, roost_home: Path, soak_report) -> None:
    rng = random.Random(18)
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    tag = f"kill{rng.randrange(1 << 30)}"
    env = {**scripted_env(roost_home, script), "SOAK_TAG": tag}
    accepted: dict[str, str] = {}         # turn id -> prompt
    tid = None
    stuck = orphans = 0
    for iteration in range(ITERATIONS):
        process, client = await _start(env, tmp_path)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._reader)
            await client.initialize()
            if tid is None:
                tid = (await client.request("thread/start", {"cwd": str(tmp_path),
                                                             "permission_mode": "unconfined"}))["thread"]["id"]
            else:
                turns = (await client.request("thread/resume", {"session_id": tid}))["turns"]
                stuck += sum(t["status"] in ("running", "queued") for t in turns)
            for n in range(rng.randrange(1, 5)):
                prompt = f"{'tool' if rng.random() < 0.5 else 'echo'} {iteration}.{n}"
                try:
                    reply = await client.request("turn/queue" if n else "turn/start",
                                                 {"thread_id": tid, "prompt": prompt}, timeout=scaled(30))
                except RemoteError:
                    continue
                turn = reply.get("turn") or {}
                if turn.get("id"):
                    accepted[turn["id"]] = prompt
                elif reply.get("input", {}).get("id"):
                    accepted[reply["input"]["id"]] = prompt
            await trio.sleep(rng.random() * 0.5)
            process.kill()
            await process.wait()
            nursery.cancel_scope.cancel()
    process, client = await _start(env, tmp_path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client._reader)
        await client.initialize()                      # reconciliation has run
        orphans = await _orphans(tag)
        snap = await client.request("thread/resume", {"session_id": tid})
        stuck += sum(t["status"] in ("running", "queued") for t in snap["turns"])
        try:
            done = await client.run_turn(tid, "still alive?")
            stuck += done["turn"]["status"] != "completed"
        except RemoteError:
            stuck += 1
        await client.close_stdin()
        await process.wait()
        nursery.cancel_scope.cancel()
    db = sqlite3.connect(roost_home / "roost.db")
    try:
        prompts = {row[0] for row in db.execute("SELECT coalesce(text, '') || coalesce(payload, '') FROM items WHERE type = 'user_message'")}
        held = {row[0] for row in db.execute("SELECT payload FROM held_input")}
    finally:
        db.close()
    blob = "\n".join(str(p) for p in prompts | held)
    lost = sum(prompt not in blob for prompt in accepted.values())

    # The daemon: accepted tasks survive a kill -9.
    d_accepted, d_lost = 0, 0
    socket_path = str(tmp_path / "d.sock") if len(str(tmp_path)) < 80 else None
    for _ in range(ITERATIONS):
        async with trio.open_nursery() as nursery:
            daemon = await start_daemon(nursery, script=script, socket=socket_path)
            ids = []
            async with daemon.unix() as c:
                await c.wait_for("hello")
                for n in range(rng.randrange(1, 4)):
                    start = len(c.events)
                    await c.send({"type": "user_input", "text": f"task {n}"})
                    ids.append((await c.wait_for("queued", start=start))["sessionId"])
                await trio.sleep(rng.random() * 0.3)
                daemon.kill9()
                await daemon.process.wait()
            d_accepted += len(ids)
            db = sqlite3.connect(roost_home / "roost.db")
            try:
                known = {row[0] for row in db.execute("SELECT id FROM daemon_tasks")}
            finally:
                db.close()
            d_lost += sum(i not in known for i in ids)
    async with open_daemon(script=script, socket=socket_path):
        pass
    d_orphans = await _orphans(tag)
    soak_report("kill9", app_server_accepted=len(accepted), app_server_lost=lost, stuck_threads=stuck,
                orphan_processes=orphans + d_orphans, daemon_accepted=d_accepted, daemon_lost=d_lost)
    assert lost == 0 and d_lost == 0 and stuck == 0 and orphans + d_orphans == 0
