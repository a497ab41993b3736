"""Test clients for ``roost serve``: run the real daemon as a subprocess, attach over its Unix
socket (raw JSONL) or its WebSocket (trio-websocket), and wait on events.

Usage (inside a trio test)::

    async with open_daemon(script=path, args=[...]) as daemon:
        async with daemon.ws(client_id="a") as a, daemon.unix() as b:
            await a.send({"type": "user_input", "text": "hi"})
            result = await a.wait_for("result")

Every event a client receives is kept in ``client.events`` in order; waits have deadlines.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import tempfile
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import trio
from trio_websocket import ConnectionClosed, open_websocket

from _helpers.appserver import roost_argv
from _helpers.timing import scaled

DEFAULT_TIMEOUT = 30.0


def write_resume_script(path: Path) -> Path:
    """Write a scripted model to ``path`` (returned): ``slow...`` streams ``working`` then waits
    120 s; the resume prompt after a restart (``while you were working on``) answers ``resumed and
    done``; anything else is echoed."""
    script = {
        "rules": [
            {"match": {"prompt": "while you were working on"}, "steps": [[{"text": "resumed and done"}]]},
            {"match": {"prompt": "^slow"},
             "steps": [[{"text": "working", "deltas": 1}, {"delay": 120}, {"text": "never"}]]},
        ],
        "default": "echo",
    }
    path.write_text(json.dumps(script))
    return path


class Client:
    """One attached client; ``events`` holds every event received, in order."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.closed: Any = None          # the close reason (WebSocket) or True (socket EOF)
        self._changed = trio.Event()

    def _add(self, event: dict) -> None:
        self.events.append(event)
        self._changed.set()
        self._changed = trio.Event()

    def _close(self, reason: Any) -> None:
        self.closed = reason if reason is not None else True
        self._changed.set()
        self._changed = trio.Event()

    def of_type(self, kind: str) -> list[dict]:
        return [e for e in self.events if e.get("type") == kind]

    async def wait_for(self, kind: str, pred: Callable[[dict], bool] | None = None, *,
                       timeout: float = DEFAULT_TIMEOUT, start: int = 0) -> dict:
        """The first event of type ``kind`` (matching ``pred``) at index >= ``start``; waits for it."""
        with trio.fail_after(scaled(timeout)):
            index = start
            while True:
                while index < len(self.events):
                    event = self.events[index]
                    index += 1
                    if event.get("type") == kind and (pred is None or pred(event)):
                        return event
                if self.closed is not None:
                    raise AssertionError(f"connection closed ({self.closed}) before {kind!r}; got {self.types()}")
                await self._changed.wait()

    async def wait_closed(self, *, timeout: float = DEFAULT_TIMEOUT) -> Any:
        with trio.fail_after(scaled(timeout)):
            while self.closed is None:
                await self._changed.wait()
        return self.closed

    def types(self) -> list[str]:
        return [e.get("type") for e in self.events if e.get("type") != "token"]


class WsClient(Client):
    def __init__(self, ws: Any) -> None:
        super().__init__()
        self.ws = ws

    async def send(self, value: Any) -> None:
        await self.ws.send_message(value if isinstance(value, str) else json.dumps(value))

    async def reader(self) -> None:
        try:
            while True:
                self._add(json.loads(await self.ws.get_message()))
        except ConnectionClosed as exc:
            self._close(exc.reason)


class UnixClient(Client):
    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__()
        self.stream = stream

    async def send(self, value: Any) -> None:
        line = value if isinstance(value, str) else json.dumps(value)
        await self.stream.send_all(line.encode() + b"\n")

    async def reader(self) -> None:
        buffer = b""
        try:
            while True:
                data = await self.stream.receive_some(1 << 16)
                if not data:
                    break
                buffer += data
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._add(json.loads(line))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self._close(True)


class Daemon:
    def __init__(self, process: trio.Process, info: dict, nursery: trio.Nursery, token: str | None) -> None:
        self.process = process
        self.info = info
        self.socket = info["socket"]
        self.port = info["httpPort"]
        self.nursery = nursery
        self.token = token

    @asynccontextmanager
    async def ws(self, *, client_id: str | None = None, token: Any = "default",
                 extra_headers: list | None = None) -> AsyncIterator[WsClient]:
        token = self.token if token == "default" else token
        headers = list(extra_headers or [])
        if token:
            headers.append(("Authorization", f"Bearer {token}"))
        if client_id:
            headers.append(("Fuseraft-Client-Id", client_id))
        async with open_websocket("127.0.0.1", self.port, "/attach", use_ssl=False,
                                  extra_headers=headers, max_message_size=64 << 20) as ws:
            client = WsClient(ws)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.reader)
                yield client
                nursery.cancel_scope.cancel()

    @asynccontextmanager
    async def unix(self) -> AsyncIterator[UnixClient]:
        stream = await trio.open_unix_socket(self.socket)
        client = UnixClient(stream)
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(client.reader)
            yield client
            nursery.cancel_scope.cancel()

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)


def short_socket_path() -> str:
    """A socket path short enough for AF_UNIX (108 bytes), in a fresh private directory
    (removed when the test process exits)."""
    directory = tempfile.mkdtemp(prefix="rs-", dir="/tmp")
    atexit.register(shutil.rmtree, directory, True)
    return os.path.join(directory, "d.sock")


async def start_daemon(nursery: trio.Nursery, *, script: Path, args: list[str] = (), socket: str | None = None,
                       token: str | None = None, env: dict | None = None, stderr: Any = None) -> Daemon:
    """Start ``roost serve`` and wait for its ``listening`` line (``stderr``: a file for its stderr)."""
    environ = dict(os.environ)
    environ.pop("FUSERAFT_SERVE_TOKEN", None)
    environ.pop("ROOST_SERVE_TOKEN", None)
    if token:
        environ["FUSERAFT_SERVE_TOKEN"] = token
    environ.update(env or {})
    argv = [*roost_argv(), "serve", "--provider", "scripted", "--script", str(script),
            "--socket", socket or short_socket_path(), "--http-port", "0", *args]
    process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, env=environ, stderr=stderr)
    buffer = b""
    with trio.fail_after(scaled(DEFAULT_TIMEOUT)):
        while b"\n" not in buffer:
            data = await process.stdout.receive_some(4096)
            if not data:
                raise AssertionError(f"roost serve exited ({await process.wait()}) before listening")
            buffer += data
    return Daemon(process, json.loads(buffer.split(b"\n")[0]), nursery, token)


@asynccontextmanager
async def open_daemon(**kwargs: Any) -> AsyncIterator[Daemon]:
    async with trio.open_nursery() as nursery:
        daemon = await start_daemon(nursery, **kwargs)
        try:
            yield daemon
        finally:
            with trio.CancelScope(shield=True):
                if daemon.process.returncode is None:
                    daemon.process.send_signal(signal.SIGTERM)
                    with trio.move_on_after(scaled(15)):
                        await daemon.process.wait()
                    if daemon.process.returncode is None:
                        daemon.process.kill()
                        await daemon.process.wait()
