"""Issue 18, finding 1: every HTTP request to ``roost serve`` is authenticated on its own.

A keep-alive connection whose first request carried the bearer token must not carry later
requests without it: an MCP session id is never a credential.
"""

from __future__ import annotations

import json
import sqlite3
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


class _Http:
    """HTTP/1.1 over ONE TCP connection (keep-alive), so every request rides the same stream."""

    def __init__(self, stream: trio.SocketStream, port: int) -> None:
        self.stream, self.port, self.buffer = stream, port, b""

    async def post(self, body: dict, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        data = json.dumps(body).encode()
        head = ["POST /mcp HTTP/1.1", f"Host: 127.0.0.1:{self.port}", "Content-Type: application/json",
                "Accept: application/json, text/event-stream", f"Content-Length: {len(data)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        await self.stream.send_all(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        while b"\r\n\r\n" not in self.buffer:
            chunk = await self.stream.receive_some(65536)
            assert chunk, "the daemon closed the connection"
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(fields.get("content-length", "0"))
        while len(self.buffer) < length:
            chunk = await self.stream.receive_some(65536)
            assert chunk, "the daemon closed the connection mid-body"
            self.buffer += chunk
        payload, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, fields, payload


async def test_a_request_without_token_after_an_authorised_one_is_refused(script: Path, roost_home: Path) -> None:
    async with open_daemon(script=script, token="sekrit") as daemon:
        stream = await trio.open_tcp_stream("127.0.0.1", daemon.port)
        async with stream:
            http = _Http(stream, daemon.port)
            with trio.fail_after(scaled(30)):
                status, fields, _ = await http.post(
                    {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                     "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "t", "version": "0"}}},
                    {"Authorization": "Bearer sekrit"})
                assert status == 200
                session = {"Mcp-Session-Id": fields["mcp-session-id"]} if "mcp-session-id" in fields else {}
                status, _, _ = await http.post({"jsonrpc": "2.0", "method": "notifications/initialized"},
                                               {"Authorization": "Bearer sekrit", **session})
                assert status in (200, 202)
                # Same connection, same session, no token: refused, and nothing is queued.
                call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                        "params": {"name": "dispatch_task", "arguments": {"task": "sneaky"}}}
                status, _, body = await http.post(call, session)
                assert status == 401, body
                status, _, body = await http.post(call, {"Authorization": "Bearer wrong", **session})
                assert status == 401, body
                status, _, body = await http.post(call, {"Authorization": "Bearer sekrit", "Origin": "http://x",
                                                         **session})
                assert status == 403, body
                # The authorised request on the same connection still works.
                status, _, body = await http.post(call, {"Authorization": "Bearer sekrit", **session})
                assert status == 200, body
    db = sqlite3.connect(roost_home / "roost.db")
    try:
        tasks = [json.loads(row[0])["task"] for row in db.execute("SELECT payload FROM daemon_tasks")]
    finally:
        db.close()
    assert tasks == ["sneaky"]  # only the authorised call queued it
