"""``roost attach``'s connection to the daemon: a Unix socket or a ``ws://``/``wss://`` WebSocket."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio

from roost.errors import RoostError
from roost.protocol import FrameError, LineDecoder

__all__ = ["DaemonUnreachable", "open_link", "MAX_LINE_BYTES"]

#: Longest line accepted from the daemon (bytes), as the JSONL framing (DESIGN.md section 5).
MAX_LINE_BYTES = 64 << 20


class DaemonUnreachable(RoostError):
    """The daemon could not be reached at the target (socket path or URL)."""


# -- transports ---------------------------------------------------------------------------------------


class _Link(abc.ABC):
    """One connection to the daemon: ``send`` a line, iterate received lines, ``close_reason``."""

    close_reason: str | None = None

    @abc.abstractmethod
    async def send(self, line: str) -> None:
        """Send one line (without its newline)."""

    @abc.abstractmethod
    def lines(self) -> AsyncIterator[str]:
        """The daemon's lines until the connection ends (then ``close_reason`` says why)."""


class _UnixLink(_Link):
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream

    async def send(self, line: str) -> None:
        await self.stream.send_all(line.encode("utf-8") + b"\n")

    async def lines(self) -> AsyncIterator[str]:
        decoder = LineDecoder(max_line_bytes=MAX_LINE_BYTES, parse=False)
        while True:
            try:
                data = await self.stream.receive_some(1 << 16)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.close_reason = f"connection lost ({exc})"
                return
            frames = decoder.feed(data) if data else decoder.finish()
            for frame in frames:
                if not isinstance(frame, FrameError):  # an oversized daemon line is dropped
                    yield frame
            if not data:
                self.close_reason = "the daemon closed the connection"
                return


class _WsLink(_Link):
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self._decoder = LineDecoder(max_line_bytes=MAX_LINE_BYTES, parse=False)

    async def send(self, line: str) -> None:
        from trio_websocket import ConnectionClosed

        try:
            await self.ws.send_message(line)
        except ConnectionClosed as exc:
            raise trio.BrokenResourceError(f"the WebSocket is closed ({exc.reason})") from None

    async def lines(self) -> AsyncIterator[str]:
        from trio_websocket import ConnectionClosed

        while True:
            try:
                message = await self.ws.get_message()
            except ConnectionClosed as exc:
                reason = exc.reason
                text = f" {reason.reason}" if reason is not None and reason.reason else ""
                code = f" (code {reason.code})" if reason is not None else ""
                self.close_reason = f"the daemon closed the connection{code}{text}"
                return
            data = message.encode("utf-8") if isinstance(message, str) else message
            for frame in self._decoder.feed(data + b"\n"):  # a message ends its last line
                if not isinstance(frame, FrameError):
                    yield frame


@asynccontextmanager
async def open_link(
    target: str, *, token: str | None, client_id: str | None, work_dir_socket: bool = False
) -> AsyncIterator[_Link]:
    """Connect to the daemon at ``target`` (a Unix socket path or a ``ws://``/``wss://`` URL).

    Args:
        target: socket path, or ``ws://host:port/attach`` URL.
        token: bearer token sent as ``Authorization: Bearer`` (WebSocket only).
        client_id: sent as ``Fuseraft-Client-Id`` (WebSocket only).
        work_dir_socket: ``target`` is the current directory's socket ``roost attach`` chose (no
            TARGET given): a failure asks whether ``roost serve`` runs for this directory. For a
            socket path the user gave, a missing file is said as such, with no such guess.

    Raises:
        DaemonUnreachable: connect refused, socket missing, or the WebSocket handshake failed.

    Cancellation: cancelling while connecting leaves nothing open; on exit the connection is closed.
    """
    async with AsyncExitStack() as stack:
        if target.startswith(("ws://", "wss://")):
            from trio_websocket import open_websocket_url

            headers: list[tuple[bytes, bytes]] = []
            if token:
                headers.append((b"Authorization", f"Bearer {token}".encode("latin-1")))
            if client_id:
                headers.append((b"Fuseraft-Client-Id", client_id.encode("ascii")))
            context = None
            if target.startswith("wss://"):
                import ssl

                context = ssl.create_default_context()
            try:
                ws = await stack.enter_async_context(
                    open_websocket_url(
                        target,
                        context,
                        extra_headers=headers,
                        max_message_size=MAX_LINE_BYTES,
                        connect_timeout=30,
                        disconnect_timeout=5,
                    )
                )
            except Exception as exc:  # HandshakeError, ConnectionRejected, OSError, internal errors
                raise DaemonUnreachable(f"cannot attach to the daemon at {target}: {_describe(exc)}") from exc
            link: _Link = _WsLink(ws)
        else:
            try:
                stream = await trio.open_unix_socket(target)
            except OSError as exc:
                raise DaemonUnreachable(_socket_failure(target, exc, work_dir_socket=work_dir_socket)) from exc
            await stack.enter_async_context(stream)
            link = _UnixLink(stream)
        yield link


def _socket_failure(target: str, exc: OSError, *, work_dir_socket: bool) -> str:
    """The one line for a Unix socket ``target`` that did not connect."""
    what = f"cannot connect to the daemon at {target}"
    if work_dir_socket:
        return f"{what}: {exc.strerror or exc} (is `roost serve` running for this directory?)"
    if isinstance(exc, FileNotFoundError):
        return f"{what}: the socket does not exist"
    return f"{what}: {exc.strerror or exc}"


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    if status is not None:
        body = getattr(exc, "body", None) or b""
        detail = body.decode("utf-8", "replace").strip() if isinstance(body, bytes) else str(body)
        return f"HTTP {status}" + (f": {detail}" if detail else "")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if str(exc):
        return str(exc)
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc:  # trio-websocket's HandshakeError wraps the OSError
        return _describe(cause)
    return type(exc).__name__


async def _wait_connectable(target: str, *, token: str | None, client_id: str | None, within: float) -> bool:
    """Wait (probing every 0.5 s) until ``target`` accepts a connection; False after ``within`` s."""
    with trio.move_on_after(within):
        while True:
            try:
                if target.startswith(("ws://", "wss://")):
                    host_port = target.split("://", 1)[1].split("/", 1)[0]
                    host, _, port = host_port.rpartition(":")
                    stream = await trio.open_tcp_stream(host.strip("[]") or "127.0.0.1", int(port or 80))
                else:
                    stream = await trio.open_unix_socket(target)
                await stream.aclose()
                return True
            except (OSError, ValueError):
                await trio.sleep(0.5)
    return False
