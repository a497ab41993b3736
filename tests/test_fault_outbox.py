"""Issue 18, finding 5: outboxes are bounded in bytes, and a stalled client is cut off in bounded time.

Through the real ``roost serve``: a WebSocket client that reads nothing (tiny receive buffer) is
disconnected with a close reason, while the other clients get the whole reply.
"""

from __future__ import annotations

import json
import socket as stdsocket
from pathlib import Path

import pytest
import trio
from _helpers.serve_client import WsClient, open_daemon
from trio_websocket import wrap_client_stream

from roost.protocol._outbox import Outbox
from _helpers.timing import scaled

#: 4 MB of streamed text in 2,000 deltas of 2 KB.
BIG = "abcd" * 1_000_000
SCRIPT = {"rules": [{"match": {"prompt": "^big"},
                     "steps": [[{"text": BIG, "deltas": 2000, "tokens_per_second": 4000}]]}],
          "default": "echo"}


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(SCRIPT))
    return path


async def _stalled_then_reason(daemon, fast) -> object:
    """Attach a client that reads nothing, stream BIG to everyone, return the stalled one's close reason."""
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    sock.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", daemon.port))
    async with trio.open_nursery() as nursery:
        ws = await wrap_client_stream(nursery, trio.SocketStream(sock), "127.0.0.1", "/attach",
                                      extra_headers=[("Fuseraft-Client-Id", "stalled")])
        stalled = WsClient(ws)
        start = len(fast.events)
        await fast.send({"type": "user_input", "text": "big reply"})
        sid = (await fast.wait_for("queued", start=start))["sessionId"]
        result = await fast.wait_for("result", lambda e: e["sessionId"] == sid, timeout=scaled(60))
        assert result["succeeded"] is True
        tokens = [e["text"] for e in fast.events if e.get("type") == "token" and e.get("sessionId") == sid]
        assert "".join(tokens) == BIG          # the fast client lost nothing
        nursery.start_soon(stalled.reader)
        reason = await stalled.wait_closed(timeout=scaled(60))
        nursery.cancel_scope.cancel()
    return reason


async def test_an_outbox_over_its_byte_bound_disconnects_the_client(script: Path) -> None:
    # Plenty of lines allowed, few bytes: only the byte bound can trip.
    async with open_daemon(script=script, args=["--outbox-lines", "1000000", "--kick-grace", "60"],
                           env={"ROOST_OUTBOX_BYTES": str(256 * 1024), "ROOST_OUTBOX_STALL_S": "600"}) as daemon:
        async with daemon.ws(client_id="fast") as fast:
            await fast.wait_for("hello")
            reason = await _stalled_then_reason(daemon, fast)
    assert reason.code == 1008 and "slow consumer" in reason.reason and "bytes" in reason.reason, reason


async def test_a_client_that_reads_nothing_is_disconnected_after_the_stall_timeout(script: Path) -> None:
    # Neither bound trips (lines and bytes are ample): only the stall timeout can.
    async with open_daemon(script=script, args=["--outbox-lines", "1000000", "--kick-grace", "60"],
                           env={"ROOST_OUTBOX_BYTES": str(1 << 30), "ROOST_OUTBOX_STALL_S": "1"}) as daemon:
        async with daemon.ws(client_id="fast") as fast:
            await fast.wait_for("hello")
            reason = await _stalled_then_reason(daemon, fast)
    assert reason.code == 1008 and "stayed blocked" in reason.reason, reason


def test_the_byte_bound_lets_one_long_line_through_and_drops_the_backlog_on_give_up() -> None:
    gave_up = []
    box = Outbox(100, max_bytes=1000, on_overflow=lambda: gave_up.append(True), over_grace_s=0)
    box.deliver(b"x" * 5000 + b"\n")          # alone: the longest line must still be sendable
    assert box.queued_bytes == 5001 and not gave_up
    box.deliver(b"y\n")                       # over the bound with something waiting (no grace)
    assert gave_up == [True] and box.reason == "outbox over 1000 bytes for 0 s"
    assert box.queued_bytes == 0              # the backlog is dropped with the client
    box.deliver(b"z\n")
    assert box.queued_bytes == 0


async def test_a_broken_stream_under_the_stall_watchdog_raises_the_plain_error() -> None:
    class Broken(trio.abc.SendStream):
        async def send_all(self, data) -> None:
            await trio.lowlevel.checkpoint()
            raise trio.BrokenResourceError("gone")

        async def wait_send_all_might_not_block(self) -> None:
            await trio.lowlevel.checkpoint()

        async def aclose(self) -> None:
            await trio.lowlevel.checkpoint()

    box = Outbox(10, stall_timeout_s=30)
    box.deliver(b"x\n")
    with pytest.raises(trio.BrokenResourceError):   # not an ExceptionGroup: the connection catches it
        await box.run_writer(Broken())


def test_a_burst_over_the_byte_bound_waits_out_the_grace_and_the_hard_bound_trips_at_once() -> None:
    gave_up = []
    box = Outbox(100, max_bytes=1000, on_overflow=lambda: gave_up.append(True), over_grace_s=60)
    for _ in range(7):                        # one turn's echoes of a large input: 7x the bound
        box.deliver(b"x" * 999 + b"\n")
    assert not gave_up and box.queued_bytes == 7000
    box._take()                               # the writer takes it: under the bound again
    assert box.queued_bytes == 0
    for _ in range(8):
        box.deliver(b"x" * 999 + b"\n")
    assert not gave_up
    box.deliver(b"y\n")                       # past 8x the bound: a slow consumer at once
    assert gave_up == [True] and box.reason == "outbox over 8000 bytes"


async def test_a_turn_with_a_large_input_reaches_a_client_that_reads(tmp_path: Path) -> None:
    # A 6 MiB prompt: the turn/start response, turn/started, the user item's notifications and
    # turn/completed each carry it, about 30 MB delivered at once, over the 16 MiB default bound.
    from _helpers.appserver import open_app_server, script_env

    prompt = "large input " * (1 << 19)
    env = script_env(tmp_path, tmp_path / "home", 'rules: [{match: {prompt: "^large"}, steps: [[{text: "read it"}]]}]')
    err = tmp_path / "err.txt"
    with err.open("wb") as stderr:
        async with open_app_server(env=env, cwd=tmp_path, stderr=stderr) as client:
            await client.initialize()
            thread = (await client.request("thread/start", {"ephemeral": True}))["thread"]
            start = len(client.lines)
            turn = (await client.request("turn/start", {"thread_id": thread["id"], "prompt": prompt}))
            done = await client.wait_terminal(turn["turn"]["id"], start=start)
            assert done["turn"]["status"] == "completed"
            assert done["turn"]["items"][0]["text"] == prompt and done["turn"]["items"][-1]["text"] == "read it"
        assert client.process.returncode == 0
    assert "slow consumer" not in err.read_text()
