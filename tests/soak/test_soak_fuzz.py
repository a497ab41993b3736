"""Soak: a protocol fuzzer (hypothesis strategies) over the stdin and socket dialects.

Lines are drawn from hypothesis strategies: valid-looking requests with wrong fields, random JSON values,
broken JSON and raw bytes. Dialects: ``roost app-server``, ``roost repl --vscode`` and ``roost run
--bridge`` (stdin; the last two through tests/_helpers/fuzz.py) and ``roost serve`` (Unix socket
and WebSocket). Counted: lines sent, crashes (the process exited, or the connection dropped), and
unanswered lines (app-server: a request with an id that got no response; the bridge: a line short
of its error event; the others: a sentinel sent after each batch that got no answer).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import trio
from _helpers.appserver import AppServerClient, roost_argv, script_env, scripted_env
from _helpers.fuzz import BRIDGE, VSCODE, fuzz_bridge, fuzz_vscode
from _helpers.serve_client import open_daemon
from hypothesis import strategies as st

from soak._soak import ITERATIONS
from _helpers.timing import scaled

pytestmark = [pytest.mark.soak, pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")]

LINES_PER_ITERATION = 200
METHODS = ["initialize", "thread/start", "turn/start", "turn/interrupt", "thread/list", "run/start",
           "turn/steer", "thread/resume", "no/such", "", "shutdown-not"]
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


def _app_line(draw_id: int) -> st.SearchStrategy[bytes]:
    request = st.fixed_dictionaries({"id": st.just(f"f{draw_id}"), "method": st.sampled_from(METHODS)},
                                    optional={"params": JSON}).map(lambda d: json.dumps(d).encode())
    return request


NOISE = st.one_of(JSON.map(lambda v: json.dumps(v).encode()),
                  st.binary(max_size=60).map(lambda b: b.replace(b"\n", b" ")),
                  st.text(max_size=60).map(lambda t: t.replace("\n", " ").encode()))
WIRE = st.one_of(NOISE, st.fixed_dictionaries({"type": st.sampled_from(["user_input", "interrupt", "approval_response",
                                                                          "question_response", "nope"])},
                                              optional={"text": JSON}).map(lambda d: json.dumps(d).encode()))


async def _fuzz_app_server(env: dict, cwd: Path, lines: list[bytes], ids: list[str]) -> tuple[int, int]:
    process = await trio.lowlevel.open_process([*roost_argv(), "app-server"], stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=str(cwd))
    client = AppServerClient(process)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client._reader)
        for line in lines:
            await client.send(line + b"\n")
        await client.send({"id": "sentinel", "method": "thread/list", "params": {}})
        try:
            await client.wait_line(lambda m: m.get("id") == "sentinel", timeout=scaled(60))
            for rid in ids:   # ordering keys may delay some: wait for each
                await client.wait_line(lambda m, rid=rid: m.get("id") == rid, timeout=scaled(30))
        except (AssertionError, trio.TooSlowError):
            pass
        answered = {m.get("id") for m in client.lines}
        unanswered = sum(rid not in answered for rid in ids) + ("sentinel" not in answered)
        await client.close_stdin()
        with trio.move_on_after(scaled(30)):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
        crashed = int(process.returncode not in (0,))
        nursery.cancel_scope.cancel()
    return crashed, unanswered


async def test_soak_protocol_fuzz(tmp_path: Path, roost_home: Path, soak_report) -> None:
    env = scripted_env(roost_home, ROOST_MAX_LINE_BYTES=str(1 << 16))
    sent = crashes = unanswered = 0
    for iteration in range(ITERATIONS):
        ids, lines = [], []
        for n in range(LINES_PER_ITERATION):
            if n % 3 == 0:
                ids.append(f"f{iteration}.{n}")
                lines.append(_app_line(0).example().replace(b'"f0"', f'"{ids[-1]}"'.encode()))
            else:
                lines.append(NOISE.example())
        crashed, missing = await _fuzz_app_server(env, tmp_path, lines, ids)
        sent += len(lines)
        crashes += crashed
        unanswered += missing

    stdin_env = script_env(tmp_path, roost_home, "default: echo\n")
    for _ in range(ITERATIONS):
        for strategy, fuzz in ((VSCODE, fuzz_vscode), (BRIDGE, fuzz_bridge)):
            lines = [strategy.example() for _ in range(LINES_PER_ITERATION // 2)]
            crashed, missing = await fuzz(stdin_env, tmp_path, lines)
            sent += len(lines)
            crashes += crashed
            unanswered += missing

    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [], "default": "echo"}))
    async with open_daemon(script=script) as daemon:
        for _ in range(ITERATIONS):
            for kind in ("unix", "ws"):
                conn = daemon.unix() if kind == "unix" else daemon.ws(client_id=None)
                async with conn as client:
                    await client.wait_for("hello")
                    batch = [WIRE.example() for _ in range(LINES_PER_ITERATION // 2)]
                    for line in batch:
                        if kind == "unix":
                            await client.stream.send_all(line + b"\n")
                        else:
                            await client.ws.send_message(line.decode("utf-8", "replace"))
                    sent += len(batch)
                    start = len(client.events)
                    # The sentinel: always answered with this error (an interrupt is not: a fuzzed
                    # user_input may have started a task it would interrupt).
                    await client.send({"type": "question_response", "answer": "sentinel"})
                    try:
                        await client.wait_for("error", lambda e: "no question is pending" in e.get("text", ""),
                                              start=start, timeout=scaled(60))
                    except (AssertionError, trio.TooSlowError):
                        unanswered += 1
                    crashes += client.closed is not None
        crashes += daemon.process.returncode is not None
    soak_report("protocol_fuzz", fuzz_lines=sent, crashes=crashes, unanswered_lines=unanswered)
    assert crashes == 0 and unanswered == 0
