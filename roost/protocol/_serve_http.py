"""One HTTP port for ``roost serve``: the WebSocket ``/attach``, ``/mcp``, ``/metrics`` and A2A.

wire-protocol.md, "Daemon events": the daemon exposes ``dispatch_task``, ``get_status`` and
``get_result`` as MCP tools over HTTP, on the same port as ``/attach``.

Why this stack: ``/attach`` is a WebSocket on a stream Roost owns, through wsproto's public API
(:mod:`roost.protocol._websocket`; frames encoded once for every client), run as a child of the
daemon's ``connections`` supervisor, so a restart of this listener leaves attached clients alone.
Every other request is HTTP served by Hypercorn's trio worker (Hypercorn is the ASGI server with
first-class trio support; the ``mcp`` and ``a2a`` SDKs are anyio-based Starlette apps, so they run
on trio unchanged). One TCP listener owns the port and reads each connection's first request
head: a ``/attach`` request (the WebSocket upgrade) hands the connection to
:meth:`ServeDaemon.serve_attach`; any other connection goes to Hypercorn's per-connection server,
the bytes already read replayed in front of the stream, with one ASGI app, :class:`_Dispatch`,
that routes *each* request of the connection by its own path (a keep-alive connection may ask
``/a2a/NAME/``, then ``/metrics``, then ``/mcp``):

===================================== =========================================================
``/mcp``                              the MCP streamable HTTP app behind :class:`RequireToken`
``/metrics``                          Prometheus text (:func:`roost.protocol._serve_metrics.metrics_app`)
``/a2a/...``, ``/.well-known/agent*`` with ``roost serve --a2a``: the A2A app (:mod:`roost.protocol._a2a_app`)
anything else                         404
===================================== =========================================================

Each endpoint applies its own token rules to every request (module docs of the apps above), so
a request with a wrong token is refused alone and authorises nothing after it. A WebSocket
upgrade that is not the first request of its connection is refused with 400 (the ``/attach``
fast path owns whole connections; a WebSocket client opens a connection for its handshake).
TLS (``--tls-cert``) is terminated by this front before the split, so every endpoint is served
over TLS alike.

Hypercorn has no public API to serve one connection Roost accepted, so :func:`_hypercorn_server`
uses its internal ``TCPServer`` / ``WorkerContext`` / ``ASGIWrapper``: fenced by the upper bound in
``pyproject.toml`` (``hypercorn<0.19``) and by ``tests/test_private_api_fences.py``, which fails
loudly when those names or signatures change. Without the ``mcp`` SDK, ``/mcp`` answers 404.
"""

from __future__ import annotations

import functools
import logging
import ssl
from typing import Any

import trio

from roost.protocol._serve_auth import RequireToken, drain_body
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
    """Listen on ``host:port`` and serve ``/attach``, ``/mcp``, ``/metrics`` (and A2A) until cancelled.

    ``task_status.started(port)`` gives the bound port (useful with port 0).
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()[1]

    async with trio.open_nursery() as outer:
        serve = _hypercorn_server(_Dispatch(daemon, outer))

        async def serve_one(stream: trio.SocketStream) -> None:
            conn: trio.abc.Stream = stream
            if ssl_context is not None:
                conn = trio.SSLStream(stream, ssl_context, server_side=True)
            head = await _read_head(conn)
            if head is None:
                return
            _, target, _ = _parse_head(head.split(b"\r\n\r\n", 1)[0])
            if target.split("?", 1)[0] == "/attach":
                # handed over: the connection is a child of the daemon's connections supervisor
                daemon.start_connection(functools.partial(daemon.serve_attach, conn, head), conn)
                return
            try:
                await serve(_Replay(conn, head))  # every request of it routed by _Dispatch
            finally:
                await trio.aclose_forcefully(conn)

        for listener in listeners:
            outer.start_soon(_accept_loop, listener, functools.partial(_guarded, serve_one), outer)
        task_status.started(bound)


class _Dispatch:
    """The ASGI app of every HTTP request on the port but a connection's first ``/attach``: each
    request is routed by its own path (see the module doc), so one keep-alive connection may
    carry requests to every endpoint. The MCP app (about a second to build) and the A2A app (its
    SDK import) are built on their first request; the MCP app's lifespan (its session manager)
    then runs in ``nursery`` until the listener stops.

    Args:
        daemon: the ServeDaemon (``options.auth``, ``metrics``, ``a2a``).
        nursery: the listener's nursery.
    """

    def __init__(self, daemon: Any, nursery: trio.Nursery) -> None:
        self.daemon = daemon
        self.nursery = nursery
        self.mcp: Any = None
        self.mcp_lock = trio.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path") or ""
        if scope.get("type") == "websocket":
            status, body = (400, _WS_NOT_FIRST) if path == "/attach" else (404, _NOT_FOUND)
            await _refuse_websocket(scope, send, status, body)
            return
        if scope.get("type") != "http":
            return  # Hypercorn's per-connection server sends no lifespan; nothing else exists
        if (answer := self._own_answer(path)) is not None:
            await drain_body(scope, receive)  # keep-alive: the connection serves the next request
            await _respond(send, *answer)
            return
        if path == "/metrics":  # Prometheus (roost.protocol._serve_metrics), same token rules
            from roost.protocol._serve_metrics import metrics_app

            await metrics_app(self.daemon, scope, receive, send)
        elif path.rstrip("/") == "/mcp":
            await (await self._mcp_app())(scope, receive, send)
        else:  # roost serve --a2a (roost.protocol._a2a_host)
            await self.daemon.a2a.asgi_app()(scope, receive, send)

    def _own_answer(self, path: str) -> tuple[int, bytes] | None:
        """``(status, body)`` of a request no endpoint serves (None: an endpoint's app serves it)."""
        if path == "/metrics":
            return None
        if path.rstrip("/") == "/mcp":
            return None if _mcp_available() else (404, b"not found: /mcp needs the mcp package installed\n")
        if getattr(self.daemon, "a2a", None) is not None and path.startswith(("/a2a/", "/.well-known/agent")):
            return None
        if path == "/attach":
            return 400, b"bad request: expected a WebSocket handshake\n"
        return 404, _NOT_FOUND

    async def _mcp_app(self) -> Any:
        async with self.mcp_lock:
            if self.mcp is None:
                self.mcp = await self.nursery.start(self._run_mcp_app)
        return self.mcp

    async def _run_mcp_app(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        app = build_mcp_app(self.daemon)
        async with app.router.lifespan_context(app):
            task_status.started(app)
            await trio.sleep_forever()


_NOT_FOUND = b"not found: the endpoints are /attach (WebSocket), /mcp and /metrics\n"
_WS_NOT_FIRST = b"bad request: the WebSocket /attach must be the first request of its connection\n"


async def _respond(send: Any, status: int, body: bytes) -> None:
    """Send a complete ``text/plain`` ASGI response."""
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _refuse_websocket(scope: dict[str, Any], send: Any, status: int, body: bytes) -> None:
    """Refuse a WebSocket handshake with ``status`` and ``body`` (the ASGI WebSocket Denial
    Response extension, which Hypercorn offers; without it a plain close, answered 403)."""
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close"})
        return
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


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
    config.h11_max_incomplete_size = MAX_HEAD_BYTES  # each request head, as the first one's bound
    wrapped, context = ASGIWrapper(app), WorkerContext(None)
    return lambda stream: TCPServer(wrapped, config, context, {}, stream).run()


def build_mcp_app(daemon: Any) -> Any:
    """The MCP server (``dispatch_task``, ``get_status``, ``get_result``) as a streamable HTTP ASGI
    app (built by :func:`roost.protocol._serve_mcp.build_mcp_app`, imported on first use)."""
    from roost.protocol._serve_mcp import build_mcp_app as build

    # Every request of a keep-alive connection is checked by RequireToken on its own (issue 18,
    # finding 1): the token, a read token (403), an Origin header (403).
    return RequireToken(build(daemon), daemon.options.auth)
