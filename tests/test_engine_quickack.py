"""Streamed replies on pooled connections acknowledge each read at once (``TCP_QUICKACK``).

Without it, a server that writes a reply in several small writes with Nagle's algorithm on (as
Python's ``http.server`` does) stalls about 40 ms per write on a reused connection, waiting for the
client's delayed ACK. ``benchmarks/bench_provider_path.py`` and the peers harness show the effect;
this test checks the mechanism: the option is set on the response's own socket.
"""

from __future__ import annotations

import socket

import httpx
import pytest
import trio

from roost.engines._body import quickack as _quickack

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux-only")


async def _serve_once(listener: trio.SocketListener) -> None:
    stream = await listener.accept()
    async with stream:
        await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 11\r\n\r\n")
        await stream.send_all(b"data: 1\r\n\r\n")
        while await stream.receive_some(65536):  # the rest of the request, then the client's close
            pass


async def test_quickack_is_set_on_the_response_socket() -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve_once, listeners[0])
        async with httpx.AsyncClient() as client:
            async with client.stream("POST", f"http://127.0.0.1:{port}/", content=b"{}") as response:
                sock = response.extensions["network_stream"].get_extra_info("socket")
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)  # pingpong mode, as on reuse
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 0
                _quickack(response)()
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1
                assert await response.aread() == b"data: 1\r\n\r\n"
            await client.aclose()


async def test_quickack_without_a_socket_does_nothing() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=b"data: 1\n\n"))
    async with httpx.AsyncClient(transport=transport) as client:
        response = await client.get("http://test/")
        _quickack(response)()  # no network_stream extension: a no-op, no error
