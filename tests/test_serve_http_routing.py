"""One keep-alive connection of ``roost serve --http-port``: every request is routed by its own
path (roost/protocol/_serve_http.py, ``_Dispatch``) and checked by its own endpoint's token rules.

A client with a connection pool (one ``httpx.Client`` reused) asks ``/a2a/NAME/`` for a card, then
``/metrics``, then ``/mcp``: each answer comes from its endpoint (was: every request after the
first went to the first one's app, so ``/metrics`` after a card was Starlette's 404). The tests
assert that one connection carried them all (the local address of each response's stream).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import trio
from _helpers.serve_client import open_daemon
from _helpers.timing import scaled

FULL, READ = "routing-full", "routing-read"
CARD = "/a2a/assistant/.well-known/agent-card.json"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"rules": [], "default": [[{"text": "reply to: {prompt}"}]]}))
    return script


class _Pool:
    """One ``httpx.AsyncClient`` (one pooled connection at most) that records, for every response,
    the local address of the connection it came on (httpx's ``network_stream`` extension)."""

    def __init__(self, port: int) -> None:
        self.addresses: list[Any] = []
        self.http = httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            timeout=scaled(60),
            limits=httpx.Limits(max_connections=1),
            event_hooks={"response": [self._seen]},
        )

    async def _seen(self, response: httpx.Response) -> None:
        self.addresses.append(response.extensions["network_stream"].get_extra_info("client_addr"))

    async def get(self, path: str, token: str | None = None, **headers: str) -> httpx.Response:
        if token:
            headers["authorization"] = f"Bearer {token}"
        return await self.http.get(path, headers=headers)

    async def mcp(self, token: str | None = None, **headers: str) -> httpx.Response:
        if token:
            headers["authorization"] = f"Bearer {token}"
        return await self.http.post("/mcp", content=json.dumps(INITIALIZE), headers={**MCP_HEADERS, **headers})


def _is_card(answer: httpx.Response) -> bool:
    return answer.status_code == 200 and answer.json()["name"] == "assistant"


def _is_metrics(answer: httpx.Response) -> bool:
    return answer.status_code == 200 and "roost_tasks_running" in answer.text


def _is_initialized(answer: httpx.Response) -> bool:
    return answer.status_code == 200 and "serverInfo" in answer.json()["result"]


async def test_one_connection_with_tokens_each_request_routed_and_checked_alone(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"full {FULL}\nread {READ}\n")
    args = ["--a2a", "--tokens-file", str(tokens), "--work-dir", str(tmp_path)]
    async with open_daemon(script=_script(tmp_path), args=args) as daemon:
        pool = _Pool(daemon.port)
        async with pool.http:
            assert _is_card(await pool.get(CARD, FULL))
            assert _is_metrics(await pool.get("/metrics", FULL))
            assert _is_initialized(await pool.mcp(FULL))
            assert _is_card(await pool.get(CARD, FULL))
            # a wrong token is refused by the endpoint it asked, and authorises nothing after it
            assert (await pool.get("/metrics", "nope")).status_code == 401
            assert (await pool.get(CARD)).status_code == 401
            assert (await pool.get(CARD, "nope")).json()["error"]["code"] == -32600
            assert (await pool.mcp("nope")).status_code == 401
            send = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {}}
            assert (
                await pool.http.post("/a2a/assistant/", json=send, headers={"authorization": "Bearer no"})
            ).status_code == 401
            assert (
                await pool.http.post("/a2a/assistant/", json=send, headers={"authorization": f"Bearer {READ}"})
            ).status_code == 403
            assert (await pool.mcp()).status_code == 401
            assert _is_metrics(await pool.get("/metrics", READ))  # a read token reads metrics ...
            assert (await pool.mcp(READ)).status_code == 403  # ... not the MCP tools
            assert _is_card(await pool.get(CARD, READ))  # ... and A2A cards
            assert (await pool.get("/metrics", FULL, origin="http://evil")).status_code == 403
            assert _is_initialized(await pool.mcp(FULL))
            assert _is_card(await pool.get("/.well-known/agent-card.json", FULL))
            assert (await pool.get("/nowhere", FULL)).status_code == 404
            assert _is_metrics(await pool.get("/metrics", FULL))
        assert len(pool.addresses) == 19 and len(set(pool.addresses)) == 1, [
            i for i, a in enumerate(pool.addresses) if a != pool.addresses[0]
        ]


async def test_one_connection_without_tokens(tmp_path: Path) -> None:
    async with open_daemon(script=_script(tmp_path), args=["--a2a", "--work-dir", str(tmp_path)]) as daemon:
        pool = _Pool(daemon.port)
        async with pool.http:
            assert _is_card(await pool.get(CARD))
            assert _is_metrics(await pool.get("/metrics"))
            assert (await pool.mcp(origin="http://evil")).status_code == 403
            assert _is_initialized(await pool.mcp())
            assert _is_card(await pool.get(CARD))
            head = await pool.http.head("/metrics")
            assert head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) > 0
            assert (await pool.http.post("/metrics")).status_code == 405
            assert _is_metrics(await pool.get("/metrics"))
        assert len(pool.addresses) == 8 and len(set(pool.addresses)) == 1, pool.addresses


async def test_a_websocket_upgrade_after_another_request_is_refused_alone(tmp_path: Path) -> None:
    """/attach is served on a connection of its own (the WebSocket fast path): an upgrade that is
    not a connection's first request gets a 400 that says so, and a WebSocket client that opens
    a connection for its handshake (as every one does) attaches."""
    async with open_daemon(script=_script(tmp_path), args=["--work-dir", str(tmp_path)]) as daemon:
        stream = await trio.open_tcp_stream("127.0.0.1", daemon.port)
        async with stream:
            host = f"Host: 127.0.0.1:{daemon.port}\r\n"
            upgrade = (
                "GET /attach HTTP/1.1\r\n" + host + "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            answers = []
            with trio.fail_after(scaled(30)):
                for request in ("GET /metrics HTTP/1.1\r\n" + host + "\r\n", upgrade):
                    await stream.send_all(request.encode())
                    answers.append(await _read_response(stream))
        (first, _), (refused, body) = answers
        assert first.startswith(b"HTTP/1.1 200"), answers
        assert refused.startswith(b"HTTP/1.1 400") and b"first request of its connection" in body, answers
        async with daemon.ws() as client:
            await client.send({"type": "user_input", "text": "hi"})
            assert (await client.wait_for("result"))["succeeded"] is True


async def _read_response(stream: trio.SocketStream) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        assert chunk, f"the daemon closed the connection after {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":")[1]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length")
    )
    while len(body) < length:
        chunk = await stream.receive_some(65536)
        assert chunk, "the daemon closed the connection mid-body"
        body += chunk
    return head, body
