"""Issue 18, finding 10: a WebSocket protocol error closes with a close frame and a code (RFC 6455 7.4.1).

A frame-level violation (unmasked client frame, reserved opcode) gets 1002 (protocol error); text
that is not UTF-8 gets 1007 (invalid frame payload data), as wsproto reports each.
"""

from __future__ import annotations

import base64
import json
import os
import struct
from pathlib import Path

import pytest
import trio
from _helpers.serve_client import open_daemon
from _helpers.timing import scaled


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"rules": [], "default": "echo"}))
    return path


async def _handshake(port: int) -> tuple[trio.SocketStream, bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    await stream.send_all((f"GET /attach HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           ).encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = await stream.receive_some(65536)
        assert chunk, "closed during the handshake"
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    assert b" 101 " in head.split(b"\r\n")[0], head
    return stream, rest


def _frame(opcode: int, payload: bytes, *, masked: bool) -> bytes:
    first = bytes([0x80 | opcode])
    length = len(payload)
    assert length < 126
    if not masked:
        return first + bytes([length]) + payload
    mask = os.urandom(4)
    return first + bytes([0x80 | length]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def _close_code(stream: trio.SocketStream, pending: bytes) -> int | None:
    """Read server frames until a close frame; return its code (None: the TCP stream just ended)."""
    buf = pending
    with trio.fail_after(scaled(20)):
        while True:
            while len(buf) >= 2:
                opcode, length = buf[0] & 0x0F, buf[1] & 0x7F
                offset = 2
                if length == 126:
                    if len(buf) < 4:
                        break
                    length, offset = struct.unpack(">H", buf[2:4])[0], 4
                elif length == 127:
                    if len(buf) < 10:
                        break
                    length, offset = struct.unpack(">Q", buf[2:10])[0], 10
                if len(buf) < offset + length:
                    break
                payload, buf = buf[offset:offset + length], buf[offset + length:]
                if opcode == 0x8:
                    return struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else 1005
            chunk = await stream.receive_some(65536)
            if not chunk:
                return None
            buf += chunk


@pytest.mark.parametrize(("frame", "code"), [
    (_frame(0x1, b'{"type":"user_input","text":"x"}', masked=False), 1002),   # unmasked client frame
    (_frame(0x1, b"\xff\xfe not utf-8", masked=True), 1007),                   # invalid UTF-8 text (RFC 6455 7.4.1)
    (_frame(0x3, b"reserved opcode", masked=True), 1002),                       # reserved opcode
])
async def test_a_protocol_error_gets_a_close_frame_with_a_code(script: Path, frame: bytes, code: int) -> None:
    async with open_daemon(script=script) as daemon:
        stream, pending = await _handshake(daemon.port)
        async with stream:
            await stream.send_all(frame)
            assert await _close_code(stream, pending) == code
        # The daemon keeps serving others.
        async with daemon.ws(client_id="after") as client:
            await client.wait_for("hello")
