"""Fences around the private third-party APIs Roost still relies on (issue 12, item 6).

Each test fails loudly, naming the dependency, when a private name or signature Roost calls has
changed, so an upgrade cannot silently break a guarantee. The public APIs used instead (wsproto for
``/attach``) are checked too, since the frame-encoding-once design depends on them.
"""

from __future__ import annotations

import inspect
import re
import tomllib
from importlib import metadata
from pathlib import Path

import trio
from wsproto import ConnectionType
from wsproto.connection import Connection
from wsproto.events import TextMessage
from _helpers.timing import scaled

ROOT = Path(__file__).resolve().parent.parent


def _pinned_upper(name: str) -> tuple[int, ...]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.lower().startswith(name))
    match = re.search(r"<\s*([\d.]+)", spec)
    assert match, f"{name} must have an upper bound in pyproject.toml (private API in use): {spec!r}"
    return tuple(int(p) for p in match.group(1).split("."))


def test_hypercorn_internal_per_connection_server_is_unchanged() -> None:
    """roost.protocol._serve_http._hypercorn_server: TCPServer(app, config, context, state, stream)."""
    version = tuple(int(p) for p in metadata.version("hypercorn").split(".")[:2])
    assert version < _pinned_upper("hypercorn"), "installed Hypercorn is past the pinned bound"
    from hypercorn.app_wrappers import ASGIWrapper
    from hypercorn.config import Config
    from hypercorn.trio.tcp_server import TCPServer
    from hypercorn.trio.worker_context import WorkerContext

    params = list(inspect.signature(TCPServer.__init__).parameters)
    assert params == ["self", "app", "config", "context", "state", "stream"], (
        f"Hypercorn changed its internal TCPServer signature: {params}; update _hypercorn_server")
    assert inspect.iscoroutinefunction(TCPServer.run), "Hypercorn TCPServer.run is no longer a coroutine"
    assert list(inspect.signature(WorkerContext.__init__).parameters) == ["self", "max_requests"], (
        "Hypercorn changed WorkerContext(max_requests)")
    assert list(inspect.signature(ASGIWrapper.__init__).parameters)[:2] == ["self", "app"]
    assert hasattr(Config(), "accesslog")


async def test_hypercorn_server_serves_one_accepted_connection() -> None:
    """The fenced private path works end to end: one request on a stream Roost owns."""
    from roost.protocol._serve_http import _hypercorn_server

    async def app(scope, receive, send):  # a minimal ASGI app
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    serve = _hypercorn_server(app)
    left, right = trio.socket.socketpair()
    client, server = trio.SocketStream(left), trio.SocketStream(right)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve, server)
        await client.send_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        data = b""
        with trio.fail_after(scaled(10)):
            while b"ok" not in data:
                chunk = await client.receive_some(4096)
                if not chunk:
                    break
                data += chunk
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"ok"), data
        nursery.cancel_scope.cancel()


def test_wsproto_public_frame_encoder_is_shared_and_unmasked() -> None:
    """/attach frames come from one wsproto Connection (documented low-level API); server frames
    are unmasked and identical for every client (RFC 6455 section 5.1)."""
    from roost.protocol._websocket import text_frame

    frame = Connection(ConnectionType.SERVER).send(TextMessage(data="héllo"))
    assert frame == text_frame("héllo".encode()) == b"\x81\x06h\xc3\xa9llo"
    big = text_frame(b"x" * 70_000)
    assert big[:2] == b"\x81\x7f" and len(big) == 70_000 + 10
