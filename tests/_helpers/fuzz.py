"""Protocol fuzzing of the stdin dialects ``roost repl --vscode`` and ``roost run --bridge``.

Lines come from hypothesis strategies (random JSON values, broken JSON, raw bytes, and frames of
each dialect with wrong fields). Each driver runs the real command, writes the lines to its stdin,
then a sentinel line that is always answered with a known ``error`` event, and counts:

* ``crashed``: the process exited before its input ended, or ended with an unexpected status;
* ``unanswered``: ``repl --vscode``: 1 when the sentinel got no answer; ``run --bridge``: every
  fuzzed line that is not blank owes exactly one ``error`` event (the run asks no approval), so
  the lines short of their error, plus the sentinel.

Used by the soak fuzzer (tests/soak/test_soak_fuzz.py, many lines) and by the default suite's short
variant (tests/test_stdin_fuzz.py).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import trio
from _helpers.appserver import roost_argv
from _helpers.timing import scaled
from hypothesis import strategies as st

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
NOISE = st.one_of(JSON.map(lambda v: json.dumps(v).encode()),
                  st.binary(max_size=60).map(lambda b: b.replace(b"\n", b" ")),
                  st.text(max_size=60).map(lambda t: t.replace("\n", " ").encode()))


def _safe_text(value: Any) -> Any:
    # A "!..." user_input runs a shell command: never let the fuzzer run random ones.
    return "?" + value[1:] if isinstance(value, str) and value.lstrip().startswith("!") else value


VSCODE_FRAME = st.fixed_dictionaries(
    {"type": st.sampled_from(["user_input", "interrupt", "approval_response", "question_response", "nope", ""])},
    optional={"text": JSON.map(_safe_text), "images": JSON, "approved": JSON, "answer": JSON, "id": JSON},
).map(lambda d: json.dumps(d).encode())
#: ``repl --vscode`` lines: noise and frames of its dialect.
VSCODE = st.one_of(NOISE, VSCODE_FRAME)

#: ``run --bridge`` lines: noise and frames of its dialect except ``interrupt`` (which ends the run).
BRIDGE = st.one_of(
    NOISE.filter(lambda line: b'"interrupt"' not in line),
    st.fixed_dictionaries({"type": st.sampled_from(["approval_response", "question_response", "nope", "",
                                                    "Interrupt"])},
                          optional={"approved": JSON, "text": JSON, "id": JSON}).map(lambda d: json.dumps(d).encode()),
)

_SENTINEL_VSCODE = {"type": "question_response", "answer": "sentinel"}
_SENTINEL_BRIDGE = {"type": "fuzz-sentinel"}


class _Lines:
    """Every JSON line a process writes to stdout, in order (undecodable ones kept as None)."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.events: list[Any] = []
        self.eof = False
        self._changed = trio.Event()

    async def read(self) -> None:
        assert self.process.stdout is not None
        tail = b""
        while data := await self.process.stdout.receive_some(1 << 16):
            *lines, tail = (tail + data).split(b"\n")
            for line in lines:
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    self.events.append(None)
            self._changed.set()
            self._changed = trio.Event()
        self.eof = True
        self._changed.set()

    async def wait(self, predicate: Any, timeout: float) -> bool:
        """Whether an event matching ``predicate`` arrives within ``timeout`` (scaled) seconds."""
        with trio.move_on_after(scaled(timeout)):
            index = 0
            while True:
                while index < len(self.events):
                    if predicate(self.events[index]):
                        return True
                    index += 1
                if self.eof:
                    return False
                await self._changed.wait()
        return False


async def _open(argv: list[str], env: dict, cwd: Path) -> trio.Process:
    return await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL, env=env, cwd=str(cwd))


async def _finish(process: trio.Process, grace: float = 30) -> int | None:
    """Close stdin, wait for the exit (bounded), kill a process that does not end; its status."""
    assert process.stdin is not None
    try:
        await process.stdin.aclose()
    except trio.BrokenResourceError:
        pass
    with trio.move_on_after(scaled(grace)):
        await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()
        return None
    return process.returncode


async def _send_all(process: trio.Process, lines: list[bytes]) -> bool:
    """Write the lines; False when the process stopped reading (it died)."""
    assert process.stdin is not None
    try:
        for line in lines:
            await process.stdin.send_all(line + b"\n")
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
    return True


async def fuzz_vscode(env: dict, cwd: Path, lines: list[bytes]) -> tuple[int, int]:
    """Fuzz one ``roost repl --vscode`` process with ``lines``; return ``(crashed, unanswered)``."""
    process = await _open([*roost_argv(), "repl", "--vscode", "--no-banner"], env, cwd)
    out = _Lines(process)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(out.read)
        ready = await out.wait(lambda e: isinstance(e, dict) and e.get("type") == "ready", 60)
        alive = ready and await _send_all(process, [*lines, json.dumps(_SENTINEL_VSCODE).encode()])
        answered = alive and await out.wait(
            lambda e: isinstance(e, dict) and e.get("type") == "error"
            and "no question is pending" in str(e.get("text")),
            60)
        crashed = int(not alive or process.returncode is not None)
        code = await _finish(process)
        crashed = crashed or int(code != 0)
        nursery.cancel_scope.cancel()
    return crashed, int(not answered)


BRIDGE_TEAM = """
Orchestration:
  Name: Fuzz
  Agents:
    - {Name: Solo, Instructions: "You talk slowly."}
  Selection: {Type: sequential}
  Termination: {Type: maxiterations, MaxIterations: 1}
"""
#: The bridge's one agent streams slowly, so the run is still going while the lines arrive.
BRIDGE_SCRIPT = json.dumps({"rules": [{"match": {"agent": "Solo"},
                                        "steps": [[{"text": "slow " * 400, "deltas": 400, "tokens_per_second": 20}]]}],
                             "default": "echo"})


async def fuzz_bridge(env: dict, cwd: Path, lines: list[bytes]) -> tuple[int, int]:
    """Fuzz one ``roost run --bridge`` run with ``lines``; return ``(crashed, unanswered)``.

    The run is interrupted once the sentinel is answered, so a healthy bridge ends with its
    ``result`` (exit status 130, or 0 had the run already completed); anything else is a crash.
    """
    team, script = cwd / "fuzz-team.yaml", cwd / "fuzz-script.json"
    team.write_text(BRIDGE_TEAM)
    script.write_text(BRIDGE_SCRIPT)
    env = {**env, "ROOST_PROVIDER": "scripted", "ROOST_SCRIPT": str(script)}
    process = await _open([*roost_argv(), "run", "--bridge", "-c", str(team), "fuzz"], env, cwd)
    out = _Lines(process)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(out.read)
        ready = await out.wait(lambda e: isinstance(e, dict) and e.get("type") == "ready", 60)
        alive = ready and await _send_all(process, [*lines, json.dumps(_SENTINEL_BRIDGE).encode()])
        answered = alive and await out.wait(
            lambda e: isinstance(e, dict) and e.get("type") == "error" and "fuzz-sentinel" in str(e.get("text")), 60)
        errors = sum(1 for e in out.events if isinstance(e, dict) and e.get("type") == "error")
        owed = sum(1 for line in lines if line.strip()) + 1  # a blank line is skipped, unanswered
        unanswered = max(0, owed - errors)
        if alive:
            await _send_all(process, [b'{"type": "interrupt"}'])
        ended = await out.wait(lambda e: isinstance(e, dict) and e.get("type") == "result", 60)
        code = await _finish(process)
        crashed = int(not (alive and answered and ended) or code not in (0, 130))
        nursery.cancel_scope.cancel()
    return crashed, unanswered
