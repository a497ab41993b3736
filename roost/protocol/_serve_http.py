"""One HTTP port for ``roost serve``: the WebSocket ``/attach`` and the MCP tools at ``/mcp``.

wire-protocol.md, "Daemon events": the daemon exposes ``dispatch_task``, ``get_status`` and
``get_result`` as MCP tools over HTTP, on the same port as ``/attach``.

Why this stack: ``/attach`` stays on trio-websocket (sans-IO wsproto, trio-native, the library the
rest of Roost and its tests use), and the MCP tools are the official ``mcp`` SDK's streamable HTTP
ASGI app, served by Hypercorn's trio worker (Hypercorn is the ASGI server with first-class trio
support; the SDK is anyio-based, so it runs on trio unchanged). One TCP listener owns the port and
reads each connection's HTTP request head: a ``GET /attach`` upgrade is handed to trio-websocket
(``wrap_server_stream``), anything else to Hypercorn's connection handler, each with the bytes
already read replayed in front of the stream. TLS (``--tls-cert``) is terminated by this front
before the split, so both endpoints are served over TLS alike.

MCP requests need the same bearer token as the WebSocket when the daemon has one; a read token is
refused (403: ``dispatch_task`` would mutate), and so is a request with an ``Origin`` header.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

import trio

from roost.protocol._serve_auth import RequireToken, bearer_token

__all__ = ["serve_http", "build_mcp_app", "MAX_HEAD_BYTES"]

log = logging.getLogger("roost.serve")

#: Bytes of HTTP request head read before a request is refused as oversized.
MAX_HEAD_BYTES = 64 * 1024
#: Seconds a client may take to send its request head.
HEAD_TIMEOUT = 10.0


class _Replay(trio.abc.Stream):
    """A stream that first returns ``prefix`` and then reads from ``stream``."""

    def __init__(self, stream: trio.abc.Stream, prefix: bytes, *, websocket: bool = False) -> None:
        self.stream = stream
        self.prefix = prefix
        #: a WebSocket: watch for the 101 upgrade and for a close frame going out
        self.websocket = websocket
        self.upgraded = False
        self.close_sent = False
        self.socket = getattr(stream, "socket", None) or getattr(getattr(stream, "transport_stream", None),
                                                                 "socket", None)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self.prefix:
            data, self.prefix = self.prefix, b""
            await trio.lowlevel.checkpoint()
            return data
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes) -> None:
        if self.websocket:
            start = bytes(data[:12])
            if not self.upgraded and start.startswith(b"HTTP/1.1 101"):
                self.upgraded = True
            elif self.upgraded and start[:1] == b"\x88":
                self.close_sent = True
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        send_eof = getattr(self.stream, "send_eof", None)
        if send_eof is not None:
            await send_eof()

    async def aclose(self) -> None:
        if self.websocket and self.upgraded and not self.close_sent:
            # trio-websocket drops the TCP stream without a close frame when wsproto reports a
            # frame-level protocol error (unmasked or reserved frame, bad UTF-8): send one (RFC 6455
            # section 7.4.1, 1002 protocol error) so the client learns why (issue 18, finding 10).
            self.close_sent = True
            reason = b"protocol error"
            frame = b"\x88" + bytes([2 + len(reason)]) + (1002).to_bytes(2, "big") + reason
            with trio.move_on_after(1) as scope:
                scope.shield = True   # the connection's nursery may be cancelling already
                try:
                    await self.stream.send_all(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    log.debug("serve: could not send the close frame of a broken WebSocket")
        await self.stream.aclose()


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.split(b"\r\n")
    parts = lines[0].decode("latin-1").split(" ")
    method, target = (parts[0], parts[1]) if len(parts) >= 2 else ("", "")
    headers: dict[str, str] = {}
    for raw in lines[1:]:
        name, sep, value = raw.decode("latin-1").partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return method, target, headers


async def _reply(stream: trio.abc.Stream, status: str, body: bytes) -> None:
    try:
        await stream.send_all(b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: text/plain\r\ncontent-length: "
                              + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def serve_http(daemon: Any, host: str, port: int, ssl_context: ssl.SSLContext | None, *,
                     task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Listen on ``host:port`` and serve ``/attach`` and ``/mcp`` until cancelled.

    ``task_status.started(port)`` gives the bound port (useful with port 0).
    """
    from trio_websocket import wrap_server_stream

    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    mcp: dict[str, Any] = {}
    mcp_lock = trio.Lock()

    async def run_mcp_app(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        # Built on the first /mcp request: the SDK takes about a second to build its app, which
        # every daemon start (and every WebSocket-only daemon) would otherwise pay.
        from hypercorn.app_wrappers import ASGIWrapper
        from hypercorn.config import Config
        from hypercorn.trio.tcp_server import TCPServer
        from hypercorn.trio.worker_context import WorkerContext

        app = build_mcp_app(daemon)
        config = Config()
        config.accesslog = None
        wrapped, context = ASGIWrapper(app), WorkerContext(None)
        async with app.router.lifespan_context(app):
            mcp["serve"] = lambda stream: TCPServer(wrapped, config, context, {}, stream).run()
            task_status.started()
            await trio.sleep_forever()

    async def serve_mcp(stream: trio.abc.Stream) -> None:
        async with mcp_lock:
            if "serve" not in mcp:
                await outer.start(run_mcp_app)
        await mcp["serve"](stream)

    async def handle(stream: trio.SocketStream) -> None:
        try:
            await serve_one(stream)
        except Exception:
            # One connection's failure (a TLS error, a peer gone mid-handshake, a bug) must not
            # take the port down.
            log.debug("serve: HTTP connection failed", exc_info=True)
            await trio.aclose_forcefully(stream)

    async def serve_one(stream: trio.SocketStream) -> None:
        conn: trio.abc.Stream = stream
        if ssl_context is not None:
            conn = trio.SSLStream(stream, ssl_context, server_side=True)
        head = b""
        try:
            with trio.fail_after(HEAD_TIMEOUT):
                while b"\r\n\r\n" not in head:
                    data = await conn.receive_some(16384)
                    if not data:
                        await conn.aclose()
                        return
                    head += data
                    if len(head) > MAX_HEAD_BYTES:
                        await _reply(conn, "431 Request Header Fields Too Large", b"request head too large\n")
                        await conn.aclose()
                        return
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
            await trio.aclose_forcefully(conn)
            return
        method, target, headers = _parse_head(head.split(b"\r\n\r\n", 1)[0])
        path = target.split("?", 1)[0]
        replay = _Replay(conn, head, websocket=path == "/attach")
        if path == "/attach":
            async with trio.open_nursery() as nursery:
                request = await wrap_server_stream(nursery, replay, max_message_size=daemon.max_line_bytes)
                await daemon.serve_websocket_request(request)
                nursery.cancel_scope.cancel()
            return
        if path.rstrip("/") == "/mcp":
            if "origin" in headers:
                await _reply(conn, "403 Forbidden", b"refused: a request with an Origin header is not accepted\n")
                await conn.aclose()
                return
            grant = daemon.options.auth.check(bearer_token(headers.get("authorization")))
            if grant is None or grant.read_only:
                if grant is None:
                    await _reply(conn, "401 Unauthorized", b"unauthorized: send Authorization: Bearer <token>\n")
                else:
                    await _reply(conn, "403 Forbidden", b"a read token cannot use the MCP tools\n")
                await conn.aclose()
                return
            await serve_mcp(replay)
            return
        await _reply(conn, "404 Not Found", b"not found: the endpoints are /attach (WebSocket) and /mcp\n")
        await trio.aclose_forcefully(conn)

    async with trio.open_nursery() as outer:
        await outer.start(trio.serve_listeners, handle, listeners)
        task_status.started(bound)


def build_mcp_app(daemon: Any) -> Any:
    """The MCP server (``dispatch_task``, ``get_status``, ``get_result``) as a streamable HTTP ASGI app."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("roost-serve")
    queue = daemon.queue

    @server.tool()
    async def dispatch_task(task: str, config: str | None = None, work_dir: str | None = None) -> dict:
        """Queue a task on the daemon; returns its sessionId and queue position."""
        session_id = await queue.dispatch(task, config=config, work_dir=work_dir, client_id=None, source="mcp")
        return {"sessionId": session_id, "position": queue.position(session_id) or 0}

    @server.tool()
    async def get_status(session_id: str) -> dict:
        """The status of a task: queued (with position), running, or finished."""
        task = await queue.lookup(session_id)
        if task is None:
            return {"sessionId": session_id, "status": "unknown"}
        status = "finished" if task.status in ("finished", "collected") else task.status
        return {"sessionId": session_id, "task": task.task, "status": status, "position": queue.position(session_id)}

    @server.tool()
    async def get_result(session_id: str) -> dict:
        """The result of a finished task (the daemon's ``result`` event), or its status while it is not done."""
        task = await queue.lookup(session_id)
        if task is None:
            return {"sessionId": session_id, "status": "unknown"}
        if task.status not in ("finished", "collected"):
            return {"sessionId": session_id, "status": task.status, "position": queue.position(session_id)}
        return daemon.result_of(task)

    app = server.streamable_http_app(streamable_http_path="/mcp", json_response=True)
    # The head check in serve_http sees only a connection's first request; keep-alive requests
    # after it are checked here, each on its own.
    return RequireToken(app, daemon.options.auth)
