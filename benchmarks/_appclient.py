"""A lean asynchronous JSONL client for ``roost app-server``, built for benchmarks.

It runs the real server as a subprocess and keeps its own cost per line low, so the figures
measure the server rather than the client: every line is decoded once (orjson) and dispatched to
the waiter of its response id, turn id or thread id; an ``item/agentMessage/delta`` line's text
is appended to its turn's text (what a user receives: the server merges deltas for a client that
runs behind, so lines undercount it), and the arrival of each turn's first delta is kept.

Arrival times are taken when the chunk holding a line is read (``time.perf_counter``, seconds),
before any line of it is decoded, so a latency is request-written to line-read.

Usage (inside ``trio.run``)::

    async with open_app_client(argv, env=env, cwd=tmp) as client:
        await client.request("initialize", {"protocol_version": "wuu-app-server/v0.1"})
        thread = (await client.request("thread/start", {}))["thread"]
        sent, turn = await client.start_turn(thread["id"], "hello")
        params, arrived = await client.wait_terminal(turn["id"])
"""

from __future__ import annotations

import math
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import orjson
import trio

__all__ = ["AppClient", "RemoteError", "open_app_client", "TERMINAL_METHODS"]

#: Notifications that end a turn (app-server-protocol.md, "Turns and execution runs").
TERMINAL_METHODS = frozenset({"turn/completed", "turn/error"})
#: The hub encodes ``{"method": ..., "params": ...}`` in that key order (orjson keeps insertion order).
_DELTA_PREFIX = b'{"method":"item/agentMessage/delta"'
_READ_BYTES = 1 << 18


class RemoteError(Exception):
    """The server answered a request with ``{"error": {code, message}}``."""

    def __init__(self, method: str, error: dict) -> None:
        super().__init__(f"{method}: {error.get('code')}: {error.get('message')}")
        self.code = error.get("code")
        self.error = error


class _Slot:
    """One awaited value with the time it arrived."""

    __slots__ = ("event", "value", "arrived")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.value: Any = None
        self.arrived = math.nan

    def fill(self, value: Any, arrived: float) -> None:
        if not self.event.is_set():
            self.value, self.arrived = value, arrived
            self.event.set()


class AppClient:
    """The client side of one ``roost app-server`` process.

    Attributes:
        process: the server process (``process.pid`` for /proc readings).
        deltas: ``item/agentMessage/delta`` lines received so far.
        text_chars: characters of agent-message text they carried.
        lines: lines received so far (all kinds).
        bytes_received: stdout bytes received so far.
        eof: the server closed its stdout.
    """

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.deltas = 0
        self.lines = 0
        self.bytes_received = 0
        #: characters of agent-message text received so far (all turns)
        self.text_chars = 0
        self.eof = False
        self._texts: dict[str, list[str]] = {}
        self._first_delta: dict[str, float] = {}
        self._first_waits: dict[str, _Slot] = {}
        self._next_id = 0
        self._send_lock = trio.StrictFIFOLock()
        self._responses: dict[str, _Slot] = {}
        self._terminals: dict[str, _Slot] = {}
        # (method, thread_id) -> (slot, predicate): filled by the next such notification that matches
        self._watches: dict[tuple[str, str], tuple[_Slot, Callable[[dict], bool]]] = {}
        self._closed = trio.Event()

    # -- reading --------------------------------------------------------------------------------

    async def _reader(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        tail = b""
        loads = orjson.loads
        prefix = _DELTA_PREFIX
        clock = time.perf_counter
        while True:
            data = await stdout.receive_some(_READ_BYTES)
            arrived = clock()
            if not data:
                break
            self.bytes_received += len(data)
            parts = (tail + data).split(b"\n") if tail else data.split(b"\n")
            tail = parts.pop()
            self.lines += len(parts)
            for line in parts:
                if line.startswith(prefix):
                    self.deltas += 1
                    params = loads(line)["params"]
                    text, turn_id = params["delta"], params["turn_id"]
                    self.text_chars += len(text)
                    pieces = self._texts.get(turn_id)
                    if pieces is None:
                        self._texts[turn_id] = [text]
                        self._first_delta[turn_id] = arrived
                        waiter = self._first_waits.pop(turn_id, None)
                        if waiter is not None:
                            waiter.fill(params, arrived)
                    else:
                        pieces.append(text)
                    continue
                self._dispatch(loads(line), arrived)
        self.eof = True
        self._closed.set()
        watches = [slot for slot, _ in self._watches.values()]
        for slot in [*self._responses.values(), *self._terminals.values(), *watches, *self._first_waits.values()]:
            slot.fill(None, math.nan)

    def _dispatch(self, msg: dict, arrived: float) -> None:
        method = msg.get("method")
        if method is None or "id" in msg:
            if method is None:
                slot = self._responses.pop(str(msg.get("id")), None)
                if slot is not None:
                    slot.fill(msg, arrived)
            return
        params = msg.get("params") or {}
        if method in TERMINAL_METHODS:
            turn_id = params["turn"]["id"]
            slot = self._terminals.get(turn_id)
            if slot is None:
                slot = self._terminals[turn_id] = _Slot()
            slot.fill(params, arrived)
        if self._watches:
            key = (method, params.get("thread_id", ""))
            watch = self._watches.get(key)
            if watch is not None and watch[1](params):
                del self._watches[key]
                watch[0].fill(params, arrived)

    # -- writing --------------------------------------------------------------------------------

    async def send_raw(self, data: bytes) -> float:
        """Write pre-encoded line(s); return the ``perf_counter`` time just before the write."""
        stdin = self.process.stdin
        assert stdin is not None
        async with self._send_lock:
            sent = time.perf_counter()
            await stdin.send_all(data)
        return sent

    async def request_timed(
        self, method: str, params: Any = None, *, timeout: float = 60.0
    ) -> tuple[float, Any, float]:
        """Send a request and wait for its response.

        Returns:
            ``(sent, result, arrived)``: ``perf_counter`` seconds when the request was written, the
            result, and when the response was read.

        Raises:
            RemoteError: the response is an error. trio.TooSlowError: no response in ``timeout`` s.
            EOFError: the server closed its stdout first.
        """
        self._next_id += 1
        rid = f"b{self._next_id}"
        slot = self._responses[rid] = _Slot()
        msg: dict[str, Any] = {"id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        sent = await self.send_raw(orjson.dumps(msg, option=orjson.OPT_APPEND_NEWLINE))
        with trio.fail_after(timeout):
            await slot.event.wait()
        if slot.value is None:
            raise EOFError(f"server closed stdout before answering {method}")
        if "error" in slot.value:
            raise RemoteError(method, slot.value["error"])
        return sent, slot.value.get("result"), slot.arrived

    async def request(self, method: str, params: Any = None, *, timeout: float = 60.0) -> Any:
        """Send a request; return its result (see :meth:`request_timed` for errors)."""
        return (await self.request_timed(method, params, timeout=timeout))[1]

    async def start_turn(self, thread_id: str, prompt: str, **extra: Any) -> tuple[float, dict]:
        """``turn/start``; return ``(sent, turn)`` with ``sent`` the request's write time."""
        sent, result, _ = await self.request_timed("turn/start", {"thread_id": thread_id, "prompt": prompt, **extra})
        turn = result["turn"]
        slot = self._terminals.get(turn["id"])
        if slot is None:
            self._terminals[turn["id"]] = _Slot()
        return sent, turn

    async def wait_terminal(self, turn_id: str, *, timeout: float = 60.0) -> tuple[dict, float]:
        """Wait for ``turn/completed`` or ``turn/error`` of ``turn_id``; return ``(params, arrived)``.

        The slot is forgotten once returned (benchmarks run many thousands of turns).

        Raises:
            trio.TooSlowError: not within ``timeout`` seconds. EOFError: the server closed stdout.
        """
        slot = self._terminals.get(turn_id)
        if slot is None:
            slot = self._terminals[turn_id] = _Slot()
        with trio.fail_after(timeout):
            await slot.event.wait()
        self._terminals.pop(turn_id, None)
        if slot.value is None:
            raise EOFError(f"server closed stdout before turn {turn_id} ended")
        return slot.value, slot.arrived

    async def wait_first_delta(self, turn_id: str, *, timeout: float = 60.0) -> float:
        """Wait for the first text delta of ``turn_id``; return when it was read (``perf_counter``).

        Raises:
            trio.TooSlowError: not within ``timeout`` seconds. EOFError: the server closed stdout.
        """
        arrived = self._first_delta.get(turn_id)
        if arrived is not None:
            return arrived
        slot = self._first_waits[turn_id] = _Slot()
        with trio.fail_after(timeout):
            await slot.event.wait()
        if slot.value is None:
            raise EOFError(f"server closed stdout before turn {turn_id} streamed")
        return slot.arrived

    def take_text(self, turn_id: str) -> tuple[str, float]:
        """Forget and return ``(text, first_delta_arrived)`` of ``turn_id``: its agent-message text
        as received (``""`` and NaN when no delta came)."""
        pieces = self._texts.pop(turn_id, None)
        return "".join(pieces or ()), self._first_delta.pop(turn_id, math.nan)

    def watch(self, method: str, thread_id: str, predicate: Callable[[dict], bool] = lambda p: True) -> _Slot:
        """Arm a one-shot watch for the next notification ``method`` of ``thread_id`` whose params
        match ``predicate`` (one watch per method and thread; a new one replaces the old).

        Await ``slot.event.wait()``; then ``slot.value`` holds the params (None at EOF) and
        ``slot.arrived`` the time it was read.
        """
        slot = _Slot()
        self._watches[(method, thread_id)] = (slot, predicate)
        return slot

    async def close(self, *, timeout: float = 30.0) -> int | None:
        """Close the server's stdin (a clean shutdown) and wait for it to exit; kill it if it hangs.

        Returns:
            The exit code (None if it had to be killed).
        """
        stdin = self.process.stdin
        assert stdin is not None
        with trio.move_on_after(timeout) as scope:
            try:
                async with self._send_lock:
                    await stdin.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            return await self.process.wait()
        if scope.cancelled_caught:
            self.process.kill()
            await self.process.wait()
        return None


@asynccontextmanager
async def open_app_client(
    argv: Sequence[str], *, env: dict[str, str], cwd: str, stderr: Any = subprocess.DEVNULL
) -> AsyncIterator[AppClient]:
    """Start ``argv`` (a ``roost app-server`` command line) and yield its :class:`AppClient`.

    On exit the server's stdin is closed and the process awaited (killed after 30 s).
    """
    process = await trio.lowlevel.open_process(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env=env,
        cwd=cwd,
    )
    client = AppClient(process)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client._reader)
        try:
            yield client
        finally:
            with trio.CancelScope(shield=True):
                await client.close()
            nursery.cancel_scope.cancel()
