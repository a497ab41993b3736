"""A server WebSocket on a stream Roost owns, through wsproto's public API (RFC 6455).

``roost serve`` accepts TCP (or TLS) connections itself and reads each request head (see
:mod:`roost.protocol._serve_http`); a ``GET /attach`` upgrade is handed to
:func:`accept_websocket`, which runs the opening handshake with :class:`wsproto.WSConnection`
(``ConnectionType.SERVER``) and returns a :class:`ServerWebSocket`, or answers the HTTP refusal.

Frames are encoded by wsproto: text frames through one module-level
:class:`wsproto.connection.Connection` (wsproto's documented low-level, post-handshake
connection), whose bytes are the same for every client (server frames are never masked, RFC 6455
section 5.1, and no extension is negotiated), so a line broadcast to many clients is encoded once
(:func:`text_frame`, cached). Control frames (pong, close) go through each connection's own
``WSConnection``. Every write to the stream holds the connection's own send lock, so frames are
never interleaved.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Iterable

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import Connection, ConnectionState
from wsproto.events import (
    AcceptConnection,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import RemoteProtocolError

__all__ = [
    "CLOSE_TOO_BIG",
    "ServerWebSocket",
    "accept_websocket",
    "read_request",
    "reject_websocket",
    "text_frame",
]

log = logging.getLogger("roost.serve")

#: Close code for a message over the size limit (RFC 6455 section 7.4.1).
CLOSE_TOO_BIG = 1009
_CLOSE_PROTOCOL = 1002
_RECEIVE = 1 << 16

#: The shared encoder of server text frames (never masked, no extensions: one encoding for all).
_ENCODER = Connection(ConnectionType.SERVER)


@functools.lru_cache(maxsize=512)
def text_frame(payload: bytes) -> bytes:
    """One final, unmasked text frame carrying ``payload`` (UTF-8), encoded by wsproto.

    Cached: the same line broadcast to many clients is encoded once.
    """
    return _ENCODER.send(TextMessage(data=payload.decode("utf-8", "replace")))


def read_request(head: bytes) -> tuple[WSConnection, Request | None]:
    """Feed a request head (and any bytes after it) to a fresh server ``WSConnection``.

    Returns:
        The connection and its :class:`wsproto.events.Request`, or None when ``head`` is not a
        WebSocket opening handshake (the caller answers 400).
    """
    ws = WSConnection(ConnectionType.SERVER)
    try:
        ws.receive_data(head)
        for event in ws.events():
            if isinstance(event, Request):
                return ws, event
    except RemoteProtocolError:
        pass
    return ws, None


async def reject_websocket(
    stream: trio.abc.Stream, ws: WSConnection, status: int, body: bytes, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    """Refuse the handshake with HTTP ``status`` and a text ``body``, then close ``stream``."""
    try:
        if ws.state is ConnectionState.CONNECTING:
            data = ws.send(
                RejectConnection(
                    status_code=status, has_body=True, headers=[(b"content-type", b"text/plain"), *headers]
                )
            )
            data += ws.send(RejectData(data=body))
        else:
            data = (
                f"HTTP/1.1 {status} Bad Request\r\ncontent-type: text/plain\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
            ).encode() + body
        await stream.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, RemoteProtocolError):
        pass
    await trio.aclose_forcefully(stream)


async def accept_websocket(stream: trio.abc.Stream, ws: WSConnection, *, max_message_bytes: int) -> ServerWebSocket:
    """Accept the handshake read by :func:`read_request`; return the open WebSocket.

    Raises:
        trio.BrokenResourceError: the peer went away during the handshake.
    """
    await stream.send_all(ws.send(AcceptConnection()))
    return ServerWebSocket(stream, ws, max_message_bytes=max_message_bytes)


class ServerWebSocket:
    """An open server WebSocket: :meth:`messages` in, :meth:`send_lines` out, :meth:`aclose`.

    Args:
        stream: the transport (TCP or TLS stream), owned by this object from now on.
        ws: its wsproto connection, past the handshake.
        max_message_bytes: the largest message accepted; a larger one closes with 1009.
    """

    def __init__(self, stream: trio.abc.Stream, ws: WSConnection, *, max_message_bytes: int) -> None:
        self.stream = stream
        self.ws = ws
        self.max_message_bytes = max_message_bytes
        self.close_code: int | None = None
        self._lock = trio.Lock()

    @property
    def open(self) -> bool:
        """Whether frames may still be sent."""
        return self.ws.state is ConnectionState.OPEN

    async def messages(self) -> AsyncIterator[bytes]:
        """Yield each complete message's payload (text as UTF-8 bytes) until the close handshake
        or end of stream; answers pings and the peer's close."""
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                data = await self.stream.receive_some(_RECEIVE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            try:
                self.ws.receive_data(bytes(data) if data else None)
                events = list(self.ws.events())
            except RemoteProtocolError:
                await self.aclose(_CLOSE_PROTOCOL, "protocol error")
                return
            for event in events:
                if isinstance(event, Message):
                    chunk = event.data.encode("utf-8") if isinstance(event, TextMessage) else bytes(event.data)
                    size += len(chunk)
                    if size > self.max_message_bytes:
                        await self.aclose(CLOSE_TOO_BIG, "message too big")
                        return
                    parts.append(chunk)
                    if event.message_finished:
                        yield b"".join(parts)
                        parts, size = [], 0
                elif isinstance(event, Ping):
                    await self._send_raw(self.ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    self.close_code = event.code
                    if self.ws.state in (ConnectionState.REMOTE_CLOSING, ConnectionState.OPEN):
                        # REMOTE_CLOSING: answer the peer's close. OPEN: wsproto found a protocol
                        # error in the peer's frames (unmasked, reserved opcode, bad UTF-8) and
                        # reports the close we owe with its code (1002/1007, RFC 6455 section 7.4.1).
                        await self._send_raw(self.ws.send(event.response()))
                    return
            if not data:
                return

    async def send_lines(self, lines: Iterable[bytes]) -> None:
        """Send each line as one text message, in one write (frames from :func:`text_frame`).

        Raises:
            trio.BrokenResourceError: the WebSocket is closing or closed.
        """
        payload = b"".join(text_frame(bytes(line)) for line in lines)
        async with self._lock:
            if not self.open:
                raise trio.BrokenResourceError("the WebSocket is closed")
            await self.stream.send_all(payload)

    async def aclose(self, code: int = 1000, reason: str = "") -> None:
        """Start the close handshake (when open) and close the stream."""
        try:
            if self.open:
                await self._send_raw(self.ws.send(CloseConnection(code=code, reason=reason[:120])))
        except (trio.BrokenResourceError, trio.ClosedResourceError, RemoteProtocolError):
            pass
        await trio.aclose_forcefully(self.stream)

    async def _send_raw(self, data: bytes) -> None:
        async with self._lock:
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
