"""One HTTP port for ``roost serve``: the WebSocket ``/attach`` and the MCP tools at ``/mcp``.

wire-protocol.md, "Daemon events": the daemon exposes ``dispatch_task``, ``get_status`` and
``get_result`` as MCP tools over HTTP, on the same port as ``/attach``.

Why this stack: ``/attach`` is a WebSocket on a stream Roost owns, through wsproto's public API
(:mod:`roost.protocol._websocket`; frames encoded once for every client), run as a child of the
daemon's ``connections`` supervisor, so a restart of this listener leaves attached clients alone.
The MCP tools are the official ``mcp`` SDK's streamable HTTP ASGI app, served by Hypercorn's trio
worker (Hypercorn is the ASGI server with first-class trio support; the SDK is anyio-based, so it
runs on trio unchanged). One TCP listener owns the port and reads each connection's HTTP request
head: a ``GET /attach`` upgrade goes to :meth:`ServeDaemon.serve_attach`, anything else to
Hypercorn's per-connection server, with the bytes already read replayed in front of the stream.
With ``roost serve --a2a``, ``/a2a/<agent>/`` and ``/.well-known/agent*.json`` go to the A2A
endpoint (:mod:`roost.protocol._a2a_app`) the same way. TLS (``--tls-cert``) is terminated by
this front before the split, so every endpoint is served over TLS alike.

Hypercorn has no public API to serve one connection Roost accepted, so :func:`_hypercorn_server`
uses its internal ``TCPServer`` / ``WorkerContext`` / ``ASGIWrapper``: fenced by the upper bound in
``pyproject.toml`` (``hypercorn<0.19``) and by ``tests/test_private_api_fences.py``, which fails
loudly when those names or signatures change. Without the ``mcp`` SDK, ``/mcp`` answers 404.

MCP requests need the same bearer token as the WebSocket when the daemon has one; a read token is
refused (403: ``dispatch_task`` would mutate), and so is a request with an ``Origin`` header.
"""

from __future__ import annotations

import functools
import logging
import ssl
from typing import Any

import trio

from roost.protocol._serve_auth import RequireToken, bearer_token
from roost.protocol._serve_listeners import ACCEPT_TRANSIENT

__all__ = ["serve_http", "build_mcp_app", "MAX_HEAD_BYTES"]

log = logging.getLogger("roost.serve")

#: Bytes of HTTP request head read before a request is refused as oversized.
MAX_HEAD_BYTES = 64 * 1024
#: Seconds a client may take to send its request head.
HEAD_TIMEOUT = 10.0


class _Replay(trio.abc.Stream):
    """A stream that first returns ``prefix`` and then reads from ``stream``."""

    def __init__(self, stream: trio.abc.Stream, prefix: bytes) -> None:
        self.stream = stream
        self.prefix = prefix
        self.socket = getattr(stream, "socket", None) or getattr(
            getattr(stream, "transport_stream", None), "socket", None
        )

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self.prefix:
            data, self.prefix = self.prefix, b""
            await trio.lowlevel.checkpoint()
            return data
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        send_eof = getattr(self.stream, "send_eof", None)
        if send_eof is not None:
            await send_eof()

    async def aclose(self) -> None:
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
        await stream.send_all(
            b"HTTP/1.1 "
            + status.encode()
            + b"\r\ncontent-type: text/plain\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\nconnection: close\r\n\r\n"
            + body
        )
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def serve_http(
    daemon: Any,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    *,
    task_status: Any = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``host:port`` and serve ``/attach`` and ``/mcp`` until cancelled.

    ``task_status.started(port)`` gives the bound port (useful with port 0).
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]
    mcp: dict[str, Any] = {}
    mcp_lock = trio.Lock()

    async def run_mcp_app(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        # Built on the first /mcp request: the SDK takes about a second to build its app, which
        # every daemon start (and every WebSocket-only daemon) would otherwise pay.
        app = build_mcp_app(daemon)
        async with app.router.lifespan_context(app):
            mcp["serve"] = _hypercorn_server(app)
            task_status.started()
            await trio.sleep_forever()

    async def serve_mcp(stream: trio.abc.Stream) -> None:
        async with mcp_lock:
            if "serve" not in mcp:
                await outer.start(run_mcp_app)
        await mcp["serve"](stream)

    async def serve_one(stream: trio.SocketStream) -> None:
        conn: trio.abc.Stream = stream
        if ssl_context is not None:
            conn = trio.SSLStream(stream, ssl_context, server_side=True)
        head = await _read_head(conn)
        if head is None:
            return
        method, target, headers = _parse_head(head.split(b"\r\n\r\n", 1)[0])
        path = target.split("?", 1)[0]
        replay = _Replay(conn, head)
        if path == "/attach":
            # handed over: the connection is a child of the daemon's connections supervisor
            daemon.start_connection(functools.partial(daemon.serve_attach, conn, head), conn)
            return
        if path.rstrip("/") == "/mcp" and not _mcp_available():
            await _reply(conn, "404 Not Found", b"not found: /mcp needs the mcp package installed\n")
            await conn.aclose()
            return
        if path == "/metrics":  # Prometheus (roost.protocol._serve_metrics), same token rules
            from roost.protocol._serve_metrics import serve_metrics

            await serve_metrics(daemon, conn, method, headers)
            return
        if path.rstrip("/") == "/mcp":
            if not await _mcp_allowed(daemon, conn, headers):
                return
            try:
                await serve_mcp(replay)
            finally:
                await trio.aclose_forcefully(conn)
            return
        if getattr(daemon, "a2a", None) is not None and path.startswith(("/a2a/", "/.well-known/agent")):
            try:
                await daemon.a2a.serve(replay)  # roost serve --a2a (roost.protocol._a2a_host)
            finally:
                await trio.aclose_forcefully(conn)
            return
        await _reply(conn, "404 Not Found", b"not found: the endpoints are /attach (WebSocket), /mcp and /metrics\n")
        await trio.aclose_forcefully(conn)

    async with trio.open_nursery() as outer:
        for listener in listeners:
            outer.start_soon(_accept_loop, listener, functools.partial(_guarded, serve_one), outer)
        task_status.started(bound)


async def _guarded(serve_one: Any, stream: trio.SocketStream) -> None:
    """``await serve_one(stream)``; one connection's failure (a TLS error, a peer gone
    mid-handshake, a bug) is logged and closes that stream, never the port."""
    try:
        await serve_one(stream)
    except BaseException as exc:
        if not isinstance(exc, Exception):
            await trio.aclose_forcefully(stream)
            raise
        log.debug("serve: HTTP connection failed", exc_info=True)
        await trio.aclose_forcefully(stream)


async def _read_head(conn: trio.abc.Stream) -> bytes | None:
    """Read one request head (up to the blank line, within ``HEAD_TIMEOUT`` seconds and
    ``MAX_HEAD_BYTES``); None when the peer left, was too slow or sent too much (``conn`` is
    then answered, if it can be, and closed)."""
    head = b""
    try:
        with trio.fail_after(HEAD_TIMEOUT):
            while b"\r\n\r\n" not in head:
                data = await conn.receive_some(16384)
                if not data:
                    await conn.aclose()
                    return None
                head += data
                if len(head) > MAX_HEAD_BYTES:
                    await _reply(conn, "431 Request Header Fields Too Large", b"request head too large\n")
                    await conn.aclose()
                    return None
    except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
        await trio.aclose_forcefully(conn)
        return None
    return head


async def _mcp_allowed(daemon: Any, conn: trio.abc.Stream, headers: dict) -> bool:
    """Whether an ``/mcp`` request may go on: no Origin header, and a token that is not read-only
    (else it is answered 403/401 and ``conn`` is closed)."""
    if "origin" in headers:
        await _reply(conn, "403 Forbidden", b"refused: a request with an Origin header is not accepted\n")
        await conn.aclose()
        return False
    grant = daemon.options.auth.check(bearer_token(headers.get("authorization")))
    if grant is None or grant.read_only:
        if grant is None:
            await _reply(conn, "401 Unauthorized", b"unauthorized: send Authorization: Bearer <token>\n")
        else:
            await _reply(conn, "403 Forbidden", b"a read token cannot use the MCP tools\n")
        await conn.aclose()
        return False
    return True


async def _accept_loop(listener: trio.SocketListener, handle: Any, nursery: trio.Nursery) -> None:
    """Accept connections until cancelled; each request head is read in ``handle`` (which closes
    the stream unless it hands it over)."""
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_TRANSIENT:
                    raise
                log.error("serve: HTTP accept failed (%s); retrying", exc)
                await trio.sleep(0.1)
                continue
            nursery.start_soon(handle, stream)


def _mcp_available() -> bool:
    try:
        import mcp.server.mcpserver  # noqa: F401
    except ImportError:
        return False
    return True


def _hypercorn_server(app: Any) -> Any:
    """``serve(stream)``: run Hypercorn's per-connection HTTP server for ``app`` on ``stream``.

    Private Hypercorn API (``hypercorn.trio.tcp_server.TCPServer(app, config, context, state,
    stream)``, ``hypercorn.trio.worker_context.WorkerContext(max_requests)``,
    ``hypercorn.app_wrappers.ASGIWrapper(app)``), pinned to ``hypercorn<0.19`` and guarded by
    ``tests/test_private_api_fences.py``.
    """
    from hypercorn.app_wrappers import ASGIWrapper
    from hypercorn.config import Config
    from hypercorn.trio.tcp_server import TCPServer
    from hypercorn.trio.worker_context import WorkerContext

    config = Config()
    config.accesslog = None
    wrapped, context = ASGIWrapper(app), WorkerContext(None)
    return lambda stream: TCPServer(wrapped, config, context, {}, stream).run()


def build_mcp_app(daemon: Any) -> Any:
    """The MCP server (``dispatch_task``, ``get_status``, ``get_result``) as a streamable HTTP ASGI
    app (built by :func:`roost.protocol._serve_mcp.build_mcp_app`, imported on first use)."""
    from roost.protocol._serve_mcp import build_mcp_app as build

    # The head check in serve_http sees only a connection's first request; keep-alive requests
    # after it are checked by RequireToken, each on its own (issue 18, finding 1).
    return RequireToken(build(daemon), daemon.options.auth)
