"""A tiny raw-socket HTTP/1.1 server on trio that writes exact bytes in chosen network chunks.

Tests queue :class:`Reply` objects (or a function of the request returning one); each request gets
the next reply. The body is written chunk by chunk (HTTP chunked encoding by default, one
``send_all`` per chunk), so SSE framing split across network reads, mid-stream disconnects and
hanging streams are all reproducible. The server records every request and notices when the client
closes a connection while a reply hangs.
"""

from __future__ import annotations

import functools
from collections import deque
from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable, Union

import attrs
import trio

from _helpers.timing import scaled

Chunk = Union[bytes, Callable[[], Awaitable[None]]]


@attrs.define
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@attrs.define
class Reply:
    """What to send for one request.

    Attributes:
        status: HTTP status.
        chunks: body pieces, each written with its own ``send_all``; an async callable in the list
            is awaited at that point instead (for synchronising with the test).
        headers: response headers (content-type defaults to text/event-stream).
        end: ``"complete"`` ends the body properly; ``"abort"`` closes the socket mid-body;
            ``"drop"`` closes the connection before any response bytes (the request never got an
            answer);
            ``"hang"`` keeps the connection open until the client closes it.
        chunked: use chunked transfer encoding (else Content-Length, which needs ``end="complete"``).
    """

    status: int = 200
    chunks: list[Chunk] = attrs.field(factory=list)
    headers: dict[str, str] = attrs.field(factory=lambda: {"content-type": "text/event-stream"})
    end: str = "complete"
    chunked: bool = True


def sse(*events: bytes | str) -> list[bytes]:
    """Return each argument as bytes (str encoded as UTF-8), for ``Reply.chunks``."""
    return [e.encode() if isinstance(e, str) else e for e in events]


def json_reply(status: int, body: bytes, headers: dict[str, str] | None = None) -> Reply:
    """A non-streaming JSON reply (error bodies, model lists)."""
    return Reply(status, [body], {"content-type": "application/json", **(headers or {})}, "complete", False)


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 429: "Too Many Requests", 500: "Internal Server Error",
            503: "Service Unavailable", 529: "Overloaded"}


class SSEServer:
    """The running server; ``base_url`` is ``http://127.0.0.1:PORT``."""

    def __init__(self) -> None:
        self.replies: deque[Reply | Callable[[Request], Reply]] = deque()
        self.requests: list[Request] = []
        self.client_closed = trio.Event()
        self.hanging = trio.Event()
        self.port = 0
        #: TCP connections accepted so far
        self.connections = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, *replies: Reply | Callable[[Request], Reply]) -> None:
        self.replies.extend(replies)

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        buf = bytearray()
        try:
            while True:
                request = await _read_request(stream, buf)
                if request is None:
                    return
                self.requests.append(request)
                spec = self.replies.popleft() if self.replies else Reply(500, [b"no reply queued"], {}, "complete", False)
                reply = spec(request) if callable(spec) else spec
                if not await self._write(stream, reply):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.client_closed.set()
        finally:
            await trio.aclose_forcefully(stream)

    async def _write(self, stream: trio.SocketStream, reply: Reply) -> bool:
        if reply.end == "drop":
            return False
        head = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Status')}"]
        head += [f"{k}: {v}" for k, v in reply.headers.items()]
        if reply.chunked:
            head.append("transfer-encoding: chunked")
        else:
            head.append(f"content-length: {sum(len(c) for c in reply.chunks if isinstance(c, bytes))}")
        await stream.send_all(("\r\n".join(head) + "\r\n\r\n").encode())
        for chunk in reply.chunks:
            if not isinstance(chunk, bytes):
                await chunk()
                continue
            if not chunk:
                continue
            data = b"%x\r\n%s\r\n" % (len(chunk), chunk) if reply.chunked else chunk
            await stream.send_all(data)
        if reply.end == "abort":
            return False
        if reply.end == "hang":
            self.hanging.set()
            while await stream.receive_some(65536):
                pass
            self.client_closed.set()
            return False
        if reply.chunked:
            await stream.send_all(b"0\r\n\r\n")
        return True


async def _read_request(stream: trio.SocketStream, buf: bytearray) -> Request | None:
    while b"\r\n\r\n" not in buf:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buf += data
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    body = bytearray(rest)
    while len(body) < length:
        data = await stream.receive_some(65536)
        if not data:
            return None
        body += data
    buf[:] = body[length:]
    return Request(method, path, headers, bytes(body[:length]))


@asynccontextmanager
async def open_sse_server() -> AsyncIterator[SSEServer]:
    """Serve on 127.0.0.1 (port 0) for the duration of the block."""
    server = SSEServer()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, server._handle, 0, host="127.0.0.1"))
        server.port = listeners[0].socket.getsockname()[1]
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()


async def collect(engine, request, *, deadline: float = 10.0):
    """Run one stream to the end under a deadline; return ``(events, failure_or_None)``."""
    from roost.errors import EngineFailure

    events = []
    with trio.fail_after(scaled(deadline)):
        try:
            async with engine.stream(request) as stream:
                async for event in stream:
                    events.append(event)
        except EngineFailure as failure:
            return events, failure
    return events, None


async def no_sleep(seconds: float) -> None:
    """A zero-sleep for RetryPolicy.sleep (records nothing, still a checkpoint)."""
    await trio.lowlevel.checkpoint()
