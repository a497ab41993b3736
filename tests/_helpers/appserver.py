"""A test client for ``roost app-server``: runs the real command as a subprocess and speaks JSONL.

Usage (inside a trio test)::

    async with open_app_server(env=...) as client:
        await client.initialize()
        thread = (await client.request("thread/start", {}))["thread"]
        turn = (await client.request("turn/start", {"thread_id": thread["id"], "prompt": "hi"}))["turn"]
        done = await client.wait_for("turn/completed", lambda p: p["turn"]["id"] == turn["id"])

Every line the server writes is parsed and kept in ``client.lines`` (in order), so tests can assert
on the whole stream, e.g. that exactly one terminal event was sent for a turn. Synchronisation is on
events, never on sleeps; every wait has a deadline (``trio.fail_after``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import trio

from _helpers.timing import scaled

ROOT = Path(__file__).resolve().parents[2]
#: Seconds a wait may take before the test fails (times ``ROOST_TEST_TIMEOUT_SCALE``).
DEFAULT_TIMEOUT = 20.0


def roost_argv() -> list[str]:
    exe = Path(sys.executable).with_name("roost")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "roost"]


class RemoteError(Exception):
    """The server answered a request with an error ``{code, message}``."""

    def __init__(self, error: dict) -> None:
        super().__init__(f"{error.get('code')}: {error.get('message')}")
        self.code = error.get("code")
        self.error = error


class AppServerClient:
    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.lines: list[dict] = []
        self.raw: list[bytes] = []
        self._changed = trio.Event()
        self._next_id = 0
        self.eof = False
        self.approval_handler: Callable[[dict], Any] | None = None

    async def _reader(self) -> None:
        assert self.process.stdout is not None
        async for line in iter_lines(self.process.stdout):
            self.raw.append(line)
            msg = json.loads(line)
            self.lines.append(msg)
            if msg.get("method") == "approval/request" and "id" in msg and self.approval_handler:
                answer = self.approval_handler(msg["params"])
                if answer is not None:
                    await self.send({"id": msg["id"], "result": {"approved": bool(answer)}})
            self._wake()
        self.eof = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def send(self, obj: Any) -> None:
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode() + b"\n"
        assert self.process.stdin is not None
        await self.process.stdin.send_all(data)

    async def close_stdin(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.aclose()

    async def request_raw(self, method: str, params: Any = None, *, timeout: float = DEFAULT_TIMEOUT) -> dict:
        """Send a request; return the whole response envelope (result or error)."""
        self._next_id += 1
        rid = f"t{self._next_id}"
        msg: dict = {"id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        await self.send(msg)
        return await self.wait_line(lambda m: m.get("id") == rid and ("result" in m or "error" in m), timeout=timeout)

    async def request(self, method: str, params: Any = None, *, timeout: float = DEFAULT_TIMEOUT) -> Any:
        """Send a request; return its result or raise :class:`RemoteError`."""
        reply = await self.request_raw(method, params, timeout=timeout)
        if "error" in reply:
            raise RemoteError(reply["error"])
        return reply["result"]

    async def initialize(self, **params: Any) -> dict:
        return await self.request("initialize", {"protocol_version": "wuu-app-server/v0.1", **params})

    async def wait_line(self, predicate: Callable[[dict], bool], *, start: int = 0,
                        timeout: float = DEFAULT_TIMEOUT) -> dict:
        """The first line (from index ``start``) matching ``predicate``; waits for it."""
        index = start
        with trio.fail_after(scaled(timeout)):
            while True:
                while index < len(self.lines):
                    line = self.lines[index]
                    index += 1
                    if predicate(line):
                        return line
                if self.eof:
                    raise AssertionError("server closed stdout before the expected line")
                await self._changed.wait()

    async def wait_for(self, method: str, predicate: Callable[[dict], bool] = lambda p: True, *,
                       start: int = 0, timeout: float = DEFAULT_TIMEOUT) -> dict:
        """The params of the first notification ``method`` matching ``predicate``."""
        line = await self.wait_line(lambda m: m.get("method") == method and "id" not in m
                                    and predicate(m.get("params") or {}), start=start, timeout=timeout)
        return line["params"]

    def notifications(self, method: str | None = None) -> list[dict]:
        return [m for m in self.lines if "method" in m and "id" not in m and (method is None or m["method"] == method)]

    async def run_turn(self, thread_id: str, prompt: str, **extra: Any) -> dict:
        """Start a turn and wait for its terminal event; return the terminal params."""
        start = len(self.lines)
        turn = (await self.request("turn/start", {"thread_id": thread_id, "prompt": prompt, **extra}))["turn"]
        return await self.wait_terminal(turn["id"], start=start)

    async def wait_terminal(self, turn_id: str, *, start: int = 0, timeout: float = DEFAULT_TIMEOUT) -> dict:
        line = await self.wait_line(
            lambda m: m.get("method") in ("turn/completed", "turn/error") and m["params"]["turn"]["id"] == turn_id,
            start=start, timeout=timeout)
        return line["params"]


async def iter_lines(stream: trio.abc.ReceiveStream) -> AsyncIterator[bytes]:
    """The newline-terminated lines of ``stream`` (without the newline), until end of file."""
    buf = b""
    while True:
        data = await stream.receive_some(1 << 16)
        if not data:
            return
        buf += data
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line


def script_env(tmp_path: Path, home: Path, script_text: str, **extra: str) -> dict[str, str]:
    """Write ``script_text`` as ``tmp_path/script.yaml`` and return :func:`scripted_env` for it."""
    script = tmp_path / "script.yaml"
    script.write_text(script_text)
    return scripted_env(home, script, **extra)


def scripted_env(home: Path, script: Path | str | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(ROOST_HOME=str(home), ROOST_PROVIDER="scripted")
    if script is not None:
        env["ROOST_SCRIPT"] = str(script)
    env.update(extra)
    return env


@asynccontextmanager
async def open_app_server(*, env: dict[str, str], cwd: Path | None = None, args: tuple[str, ...] = (),
                          stderr: Any = None) -> AsyncIterator[AppServerClient]:
    """Start ``roost app-server``; close stdin and wait for a clean exit when the block ends."""
    process = await trio.lowlevel.open_process(
        [*roost_argv(), "app-server", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=stderr if stderr is not None else subprocess.DEVNULL, env=env, cwd=str(cwd or ROOT),
    )
    client = AppServerClient(process)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client._reader)
        try:
            yield client
        finally:
            with trio.move_on_after(scaled(20)) as scope:
                try:
                    await client.close_stdin()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                await process.wait()
            if scope.cancelled_caught:
                process.kill()
                await process.wait()
            nursery.cancel_scope.cancel()


async def expect_error(client: AppServerClient, method: str, params: dict, code: str, *,
                       contains: str | None = None) -> dict:
    """Send a request that must fail with ``code`` (and a message containing ``contains``)."""
    try:
        await client.request(method, params)
    except RemoteError as exc:
        assert exc.code == code, exc.error
        if contains is not None:
            assert contains in exc.error["message"], exc.error
        return exc.error
    raise AssertionError(f"{method} succeeded; expected error {code}")
