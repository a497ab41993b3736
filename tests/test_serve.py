"""End-to-end tests of ``roost serve`` over its real Unix socket and WebSocket."""

from __future__ import annotations

import json
import os
import stat
import socket as stdsocket
import subprocess
from pathlib import Path

import pytest
import trio
from trio_websocket import ConnectionRejected, wrap_client_stream

from _helpers.appserver import roost_argv
from _helpers.serve_client import WsClient, open_daemon, short_socket_path, start_daemon
from _helpers.timing import scaled

#: 8 MB of streamed text in 4,000 deltas of 2 KB (more than the kernel buffers of a stalled socket)
BIG = "abc " * 2_000_000
SCRIPT = {
    "rules": [
        {"match": {"prompt": "while you were working on"},
         "steps": [[{"tool_call": {"name": "shell", "arguments": {"command": "echo resumed"}}}],
                   [{"text": "resumed: {tool_output}"}]]},
        {"match": {"prompt": "^approve"},
         "steps": [[{"tool_call": {"name": "shell", "arguments": {"command": "echo approved-run"}}}],
                   [{"text": "tool said: {tool_output}"}]]},
        {"match": {"prompt": "^slow"}, "steps": [[{"text": "working"}, {"delay": 120}, {"text": "never"}]]},
        {"match": {"prompt": "^big"}, "steps": [[{"text": BIG, "deltas": 4000, "tokens_per_second": 4000}]]},
    ],
    "default": "echo",
}


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(SCRIPT))
    return path


async def _dispatch(client, text: str) -> str:
    start = len(client.events)
    await client.send({"type": "user_input", "text": text})
    return (await client.wait_for("queued", start=start))["sessionId"]


async def test_broadcast_approval_routing_and_result(script: Path) -> None:
    async with open_daemon(script=script, token="s3cret") as daemon:
        async with daemon.ws(client_id="alice") as a, daemon.ws(client_id="bob") as b, daemon.unix() as c:
            for client in (a, b, c):
                hello = await client.wait_for("hello")
                assert hello["protocolVersion"] == 1 and hello["inFlight"] is None and hello["pendingResults"] == []
            assert a.events[0]["clientId"] == "alice" and c.events[0]["clientId"] is None
            sid = await _dispatch(a, "approve this please")
            for client in (a, b, c):
                await client.wait_for("agent_starting", lambda e: e["sessionId"] == sid)
                call = await client.wait_for("tool_calling", lambda e: e["sessionId"] == sid)
                assert call["tool"] == "shell" and call["argsSummary"] == "echo approved-run"
            request = await a.wait_for("approval_request")
            assert request["kind"] == "shell_command" and request["command"] == "echo approved-run"
            await a.send({"type": "approval_response", "approved": True})
            result = await a.wait_for("result")
            assert result["sessionId"] == sid and result["succeeded"] is True
            assert "approved-run" in result["lastMessage"] and result["errorMessage"] is None
            # a plain text line dispatches a task too; bystanders' own results mark the end for them
            await c.send("plain text task")
            await c.wait_for("result", lambda e: e["task"] == "plain text task")
            sid_b = await _dispatch(b, "bob's task")
            await b.wait_for("result", lambda e: e["sessionId"] == sid_b)
            for bystander in (b, c):
                assert not bystander.of_type("approval_request")
                assert all(r["sessionId"] != sid for r in bystander.of_type("result"))
                assert all(q["sessionId"] != sid for q in bystander.of_type("queued"))
            assert not [r for r in a.of_type("result") if r["sessionId"] != sid]


async def test_fifo_positions_and_overload(script: Path) -> None:
    async with open_daemon(script=script, args=["--max-concurrent", "1", "--max-queued", "2"]) as daemon:
        async with daemon.unix() as a:
            await a.wait_for("hello")
            first = await _dispatch(a, "approve first")
            await a.wait_for("approval_request")          # the only runner is busy now
            second = await _dispatch(a, "second")
            third = await _dispatch(a, "third")
            positions = {q["sessionId"]: q["position"] for q in a.of_type("queued")}
            assert positions == {first: 0, second: 0, third: 1}
            start = len(a.events)
            await a.send({"type": "user_input", "text": "fourth"})
            error = await a.wait_for("error", start=start)
            assert error["code"] == "server_overloaded"
            await a.send({"type": "approval_response", "approved": False})
            results = [await a.wait_for("result", lambda e, s=s: e["sessionId"] == s) for s in (first, second, third)]
            order = [e["sessionId"] for e in a.of_type("result")]
            assert order == [first, second, third]
            assert results[0]["succeeded"] is True and "denied" in results[0]["lastMessage"].lower()


async def test_auth_read_token_origin_and_client_id(script: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# tokens\nfull fulltoken\nread readtoken\n")
    async with open_daemon(script=script, args=["--tokens-file", str(tokens)]) as daemon:
        for token, status in ((None, 401), ("wrong", 401)):
            with pytest.raises(ConnectionRejected) as info:
                async with daemon.ws(token=token):
                    pass
            assert info.value.status_code == status
        with pytest.raises(ConnectionRejected) as info:
            async with daemon.ws(token="fulltoken", extra_headers=[("Origin", "https://evil.example")]):
                pass
        assert info.value.status_code == 403
        with pytest.raises(ConnectionRejected) as info:
            async with daemon.ws(token="fulltoken", client_id="bad id!"):
                pass
        assert info.value.status_code == 400
        async with daemon.ws(token="readtoken", client_id="viewer") as r, \
                daemon.ws(token="fulltoken", client_id="viewer") as f:
            hello = await r.wait_for("hello")
            assert hello["readOnly"] is True and hello["clientId"] == "viewer"
            assert (await f.wait_for("hello"))["readOnly"] is False   # same id, other token: other client
            await r.send({"type": "user_input", "text": "not allowed"})
            error = await r.wait_for("error")
            assert error["code"] == "read_only"
            sid = await _dispatch(f, "allowed")
            await f.wait_for("result", lambda e: e["sessionId"] == sid)
            await r.wait_for("agent_starting", lambda e: e["sessionId"] == sid)   # read clients see progress
            assert r.closed is None and not r.of_type("queued")


async def test_reconnect_grace_reasks_approval_and_lists_pending_results(script: Path) -> None:
    async with open_daemon(script=script, token="t", args=["--reconnect-grace", "60"]) as daemon:
        async with daemon.ws(client_id="other") as other:
            await other.wait_for("hello")
            async with daemon.ws(client_id="alice") as a:
                await a.wait_for("hello")
                sid = await _dispatch(a, "approve after reconnect")
                # queued behind another client's approval, answered only once alice is away (with
                # one runner, her second task cannot end while a connection of hers is still open)
                blocker = await _dispatch(other, "approve the blocker")
                later = await _dispatch(a, "finishes while away")
                await a.wait_for("approval_request")
            # alice is gone mid-approval; a newer connection with her id is asked again
            async with daemon.ws(client_id="alice") as a2:
                hello = await a2.wait_for("hello")
                assert hello["inFlight"]["sessionId"] == sid and hello["inFlight"]["status"] == "running"
                assert hello["pendingResults"] == []
                request = await a2.wait_for("approval_request")
                assert request["sessionId"] == sid
                # a third connection with the id closes the second one
                async with daemon.ws(client_id="alice") as a3:
                    await a3.wait_for("hello")
                    assert (await a2.wait_closed()) is not None
                    await a3.wait_for("approval_request")
                    await a3.send({"type": "approval_response", "approved": True})
                    assert (await a3.wait_for("result", lambda e: e["sessionId"] == sid))["succeeded"]
            # alice is away while her second task runs; another client's task after it marks the end
            await other.wait_for("approval_request", lambda e: e["sessionId"] == blocker)
            await other.send({"type": "approval_response", "approved": True})
            marker = await _dispatch(other, "marker")
            await other.wait_for("result", lambda e: e["sessionId"] == marker)
            async with daemon.ws(client_id="alice") as a4:
                hello = await a4.wait_for("hello")
                assert hello["pendingResults"] == [later] and hello["inFlight"] is None
                result = await a4.wait_for("result")
                assert result["sessionId"] == later and result["lastMessage"] == "finishes while away"
                assert a4.types()[:2] == ["hello", "result"]
            async with daemon.ws(client_id="alice") as a5:      # collected: not listed again
                assert (await a5.wait_for("hello"))["pendingResults"] == []


async def test_unattended_policy_after_grace(script: Path) -> None:
    async with open_daemon(script=script, args=["--reconnect-grace", "0.2"]) as daemon:
        async with daemon.ws(client_id="watcher") as w:
            await w.wait_for("hello")
            async with daemon.ws(client_id="gone") as g:
                await g.wait_for("hello")
                sid = await _dispatch(g, "approve nobody")
                await g.wait_for("approval_request")
            marker = await _dispatch(w, "marker")
            await w.wait_for("result", lambda e: e["sessionId"] == marker)
            async with daemon.ws(client_id="gone") as g2:
                hello = await g2.wait_for("hello")
                assert hello["pendingResults"] == [sid]
                result = await g2.wait_for("result")
                assert "unattended" in result["lastMessage"]
                assert not g2.of_type("approval_request")


async def test_slow_consumer_is_disconnected_others_unaffected(script: Path) -> None:
    async with open_daemon(script=script, args=["--outbox-lines", "64", "--kick-grace", "60"]) as daemon:
        # the slow client: a tiny receive buffer, and it does not read until the task is over
        sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
        sock.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_RCVBUF, 4096)
        await sock.connect(("127.0.0.1", daemon.port))
        async with trio.open_nursery() as nursery:
            ws = await wrap_client_stream(nursery, trio.SocketStream(sock), "127.0.0.1", "/attach",
                                          extra_headers=[("Fuseraft-Client-Id", "slow")])
            slow = WsClient(ws)
            async with daemon.ws(client_id="fast") as fast, daemon.unix() as other:
                await fast.wait_for("hello")
                await other.wait_for("hello")
                sid = await _dispatch(fast, "big output")
                result = await fast.wait_for("result", lambda e: e["sessionId"] == sid, timeout=scaled(60))
                assert result["succeeded"] is True
                await other.wait_for("agent_starting", lambda e: e["sessionId"] == sid)
                tokens = [e for e in other.events if e["type"] == "token" and e["sessionId"] == sid]
                assert "".join(t["text"] for t in tokens) == BIG
                nursery.start_soon(slow.reader)
                reason = await slow.wait_closed(timeout=scaled(60))
                assert reason.code == 1008 and "slow consumer" in reason.reason
                assert len(slow.events) < 4000
                # the daemon keeps serving, and the slow client can come back with its id
                again = await _dispatch(fast, "still fine")
                await fast.wait_for("result", lambda e: e["sessionId"] == again)
                async with daemon.ws(client_id="slow") as back:
                    assert (await back.wait_for("hello"))["clientId"] == "slow"
            nursery.cancel_scope.cancel()


async def test_single_daemon_and_kill9_restart_resumes(script: Path) -> None:
    socket_path = short_socket_path()
    async with trio.open_nursery() as nursery:
        first = await start_daemon(nursery, script=script, socket=socket_path, token="tok")
        try:
            # a second daemon on the same socket exits non-zero and never displaces the live one
            second = await trio.run_process([*roost_argv(), "serve", "--provider", "scripted", "--script",
                                             str(script), "--socket", socket_path], capture_stdout=True,
                                            capture_stderr=True, check=False)
            assert second.returncode == 1 and b"already running" in second.stderr
            assert stat.S_IMODE(os.stat(socket_path).st_mode) == 0o600
            async with first.ws(client_id="owner") as a:
                await a.wait_for("hello")
                sid = await _dispatch(a, "slow job")
                queued = await _dispatch(a, "queued job")
                await a.wait_for("agent_starting", lambda e: e["sessionId"] == sid)
                first.kill9()
                await first.process.wait()
            assert Path(socket_path).exists()        # left behind by the dead daemon
            restarted = await start_daemon(nursery, script=script, socket=socket_path, token="tok")
            try:
                async with restarted.ws(client_id="owner") as a:
                    hello = await a.wait_for("hello")
                    assert hello["inFlight"]["sessionId"] == sid
                    resumed = await a.wait_for("task_resumed")
                    assert resumed == {"type": "task_resumed", "sessionId": sid, "task": "slow job"}
                    request = await a.wait_for("approval_request")
                    assert request["sessionId"] == sid and request["command"] == "echo resumed"
                    await a.send({"type": "approval_response", "approved": True})
                    result = await a.wait_for("result", lambda e: e["sessionId"] == sid)
                    assert result["succeeded"] is True and "resumed" in result["lastMessage"]
                    # the resumed turn's prompt: the killed process of this daemon, the new one
                    import sqlite3

                    with sqlite3.connect(Path(os.environ["ROOST_HOME"]) / "roost.db") as db:
                        prompts = [t for (t,) in db.execute("SELECT text FROM items WHERE thread_id = ? AND "
                                                            "type = 'user_message' ORDER BY seq", (sid,))]
                    node = f"{stdsocket.gethostname()}:{os.environ['ROOST_HOME']}"
                    assert prompts[1].startswith(f"Process {stdsocket.gethostname()}:{first.process.pid}:")
                    assert (f" of this daemon (node {node}) died (its process is gone) while you were working "
                            f"on this task; process {stdsocket.gethostname()}:{restarted.process.pid}:") in prompts[1], prompts[1]
                    after = await a.wait_for("result", lambda e: e["sessionId"] == queued)
                    assert after["lastMessage"] == "queued job"
            finally:
                restarted.process.send_signal(15)
                await restarted.process.wait()
        finally:
            if first.process.returncode is None:
                first.kill9()
                await first.process.wait()


async def test_mcp_tools_on_the_attach_port(script: Path) -> None:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    def payload(result) -> dict:
        assert not result.is_error, result
        return json.loads(result.content[0].text)

    async with open_daemon(script=script, token="mcptok") as daemon:
        url = f"http://127.0.0.1:{daemon.port}/mcp"
        async with httpx2.AsyncClient() as http:
            refused = await http.post(url, json={})
            assert refused.status_code == 401
        async with daemon.ws(client_id="watcher") as w:
            await w.wait_for("hello")
            headers = {"Authorization": "Bearer mcptok"}
            async with httpx2.AsyncClient(headers=headers) as http, \
                    streamable_http_client(url, http_client=http) as streams, \
                    ClientSession(streams[0], streams[1]) as client:
                await client.initialize()
                names = {t.name for t in (await client.list_tools()).tools}
                assert {"dispatch_task", "get_status", "get_result"} <= names
                queued = payload(await client.call_tool("dispatch_task", {"task": "via mcp"}))
                sid = queued["sessionId"]
                assert queued["position"] == 0
                await w.wait_for("agent_starting", lambda e: e["sessionId"] == sid)   # broadcast to attached clients
                while True:   # synchronised on the task's own stream: its last token, then poll the result
                    result = payload(await client.call_tool("get_result", {"session_id": sid}))
                    if result.get("type") == "result":
                        break
                    await w.wait_for("token", lambda e: e["sessionId"] == sid, start=len(w.events) - 1)
                assert result["succeeded"] is True and result["lastMessage"] == "via mcp"
                status = payload(await client.call_tool("get_status", {"session_id": sid}))
                assert status["status"] == "finished"
                assert payload(await client.call_tool("get_status", {"session_id": "nope"}))["status"] == "unknown"


async def test_wss_with_tls_cert(script: Path, tmp_path: Path) -> None:
    import ssl

    from trio_websocket import open_websocket

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    async with open_daemon(script=script, args=["--tls-cert", str(cert), "--tls-key", str(key)]) as daemon:
        context = ssl.create_default_context(cafile=str(cert))
        async with open_websocket("127.0.0.1", daemon.port, "/attach", use_ssl=context) as ws:
            hello = json.loads(await ws.get_message())
            assert hello["type"] == "hello" and hello["protocolVersion"] == 1
            await ws.send_message("over tls \u2713 \u00e9")
            events = []
            while not events or events[-1]["type"] != "result":
                events.append(json.loads(await ws.get_message()))
            assert events[0]["type"] == "queued" and events[-1]["lastMessage"] == "over tls \u2713 \u00e9"


async def test_interrupt_cancels_the_clients_running_task(script: Path) -> None:
    async with open_daemon(script=script) as daemon:
        async with daemon.unix() as a, daemon.unix() as b:
            await a.wait_for("hello")
            await b.wait_for("hello")
            sid = await _dispatch(a, "slow to interrupt")
            await a.wait_for("token", lambda e: e["sessionId"] == sid)      # the turn is streaming
            await b.send({"type": "interrupt"})                             # a bystander has nothing running
            assert (await b.wait_for("error"))["code"] == "invalid_request"
            await a.send({"type": "interrupt"})
            result = await a.wait_for("result")
            assert result["sessionId"] == sid and result["succeeded"] is False and result["errorMessage"]


def test_serve_refuses_a_missing_or_broken_script_at_start(tmp_path: Path) -> None:
    # the scripted provider with an unusable script: like `roost exec`, the daemon fails at start
    # (exit 2, the same message) instead of listening and failing every task
    broken = tmp_path / "broken.yaml"
    broken.write_text("not: [valid\n")
    typo = tmp_path / "typo.yaml"           # an unknown top-level key is refused, not ignored
    typo.write_text("rule:\n  - steps: [[{text: hi}]]\n")
    for path, how in ((tmp_path / "nope.yaml", "--script"), (broken, "--script"), (tmp_path / "nope.yaml", "env"),
                      (typo, "--script")):
        flags = ["--script", str(path)] if how == "--script" else []
        env = {**os.environ, "ROOST_HOME": str(tmp_path / "home"), "ROOST_PROVIDER": "scripted"}
        if how == "env":
            env["ROOST_SCRIPT"] = str(path)
        done = subprocess.run([*roost_argv(), "serve", *flags, "--socket", short_socket_path()],
                              capture_output=True, text=True, timeout=scaled(60), env=env, stdin=subprocess.DEVNULL)
        assert done.returncode == 2, done.stderr
        assert done.stdout == ""                              # it never listened
        execd = subprocess.run([*roost_argv(), "exec", *flags, "hi"], capture_output=True, text=True, timeout=scaled(60),
                               env=env, stdin=subprocess.DEVNULL)
        assert execd.returncode == 2
        reason = execd.stderr.removeprefix("roost exec: error: ")
        assert reason.startswith("the scripted engine's script is unusable: ") and path.name in reason
        assert done.stderr == "roost serve: error: " + reason
        if path == typo:
            assert "unknown top-level key 'rule'" in reason


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "names no token"),
        ("# tokens\n\n", "names no token"),
        ("read\n", "a role needs its token"),
        ("fulltoken\n", "expected 'full <token>' or 'read <token>'"),
        ("full same\nread same\n", "both a full and a read token"),
    ],
)
def test_a_tokens_file_that_would_leave_the_daemon_open_or_is_ambiguous_is_refused(
    script: Path, tmp_path: Path, text: str, message: str
) -> None:
    """``--tokens-file`` sets the tokens every HTTP endpoint requires: a file naming none (which
    would serve openly), a role without its token, a bare word, or one token in both roles stops
    the daemon at start, one line, exit status 2 (a configuration error)."""
    tokens = tmp_path / "tokens"
    tokens.write_text(text)
    done = subprocess.run(
        [*roost_argv(), "serve", "--provider", "scripted", "--script", str(script), "--http-port", "0",
         "--socket", short_socket_path(), "--tokens-file", str(tokens)],
        capture_output=True, text=True, timeout=scaled(60),
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in done.stderr
