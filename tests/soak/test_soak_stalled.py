"""Soak: stalled WebSocket clients of ``roost serve`` while a large reply streams.

Each iteration attaches ``STALLED`` clients that read nothing (tiny receive buffers) and one that
reads, streams a 4 MB reply, and measures: how long until each stalled client is disconnected
(from the dispatch), the daemon's resident memory at rest, at its peak and after the reply, hence
the memory held per stalled client, and whether the reading client lost anything.
"""

from __future__ import annotations

import json
import os
import socket as stdsocket
import time
from pathlib import Path

import pytest
import trio
from _helpers.serve_client import WsClient, open_daemon
from _helpers.timing import scaled
from trio_websocket import wrap_client_stream

from soak._soak import ITERATIONS, linux_only, rss_bytes

pytestmark = [pytest.mark.soak, linux_only]

BIG = "abcd" * 1_000_000
STALLED = 8
STALL_S = 2.0
SCRIPT = {"rules": [{"match": {"prompt": "^big"},
                     "steps": [[{"text": BIG, "deltas": 2000, "tokens_per_second": 8000}]]}],
          "default": "echo"}


async def _attach_stalled(daemon, nursery, index: int) -> WsClient:
    sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
    sock.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", daemon.port))
    ws = await wrap_client_stream(nursery, trio.SocketStream(sock), "127.0.0.1", "/attach",
                                  extra_headers=[("Fuseraft-Client-Id", f"stalled{index}")])
    client = WsClient(ws)
    client.port = sock.getsockname()[1]  # the daemon sees this as the connection's remote port
    return client


def _peer_ports(pid: int) -> set[int]:
    """Remote ports of ``pid``'s open TCP sockets (its fds' socket inodes in /proc/net/tcp*): a
    client's connection is gone from the daemon once its local port is not among them. Counting
    all fds would not do: the store opens and closes database files meanwhile."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[2].rsplit(":", 1)[1], 16))
    return ports


async def test_soak_stalled_clients(tmp_path: Path, soak_report) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    disconnect_s: list[float] = []
    per_client: list[float] = []
    after_mib: list[float] = []
    lost = 0
    async with open_daemon(script=script, args=["--kick-grace", "1"],
                           env={"ROOST_OUTBOX_STALL_S": str(STALL_S)}) as daemon:
        pid = daemon.process.pid
        async with daemon.ws(client_id="reader") as reader:
            await reader.wait_for("hello")
            for _ in range(ITERATIONS):
                base = rss_bytes(pid)
                peak = base
                async with trio.open_nursery() as nursery:
                    stalled = [await _attach_stalled(daemon, nursery, i) for i in range(STALLED)]
                    ports = {c.port for c in stalled}
                    with trio.fail_after(scaled(30)):
                        while not ports <= _peer_ports(pid):   # every stalled client is accepted
                            await trio.sleep(0.02)
                    start = len(reader.events)
                    began = time.monotonic()
                    await reader.send({"type": "user_input", "text": "big reply"})
                    sid = (await reader.wait_for("queued", start=start))["sessionId"]
                    # A client that reads nothing never sees the FIN (it is queued behind data its
                    # full window refuses), so the disconnect is seen on the daemon's side: its
                    # connections to these clients' ports closing (a bounded wait: never a hang).
                    closed_at: list[float] = []
                    deadline = time.monotonic() + scaled(120)
                    while len(closed_at) < STALLED and time.monotonic() < deadline:
                        peak = max(peak, rss_bytes(pid))
                        gone = len(ports - _peer_ports(pid))
                        while len(closed_at) < min(gone, STALLED):
                            closed_at.append(time.monotonic() - began)
                        await trio.sleep(0.05)
                    await reader.wait_for("result", lambda e, sid=sid: e["sessionId"] == sid, timeout=scaled(120))
                    text = "".join(e["text"] for e in reader.events[start:]
                                   if e.get("type") == "token" and e.get("sessionId") == sid)
                    lost += text != BIG
                    disconnect_s.extend(closed_at)
                    del stalled
                    nursery.cancel_scope.cancel()
                after = rss_bytes(pid)
                per_client.append((peak - base) / STALLED / (1 << 20))
                after_mib.append((after - base) / (1 << 20))
    soak_report("stalled_client", stalled_clients=STALLED, stall_timeout_s=STALL_S,
           disconnect_s_max=round(max(disconnect_s), 2), disconnect_s_median=round(sorted(disconnect_s)[len(disconnect_s) // 2], 2),
           memory_per_stalled_client_mib=round(max(per_client), 2),
           rss_held_after_reply_mib=round(max(after_mib), 2), reader_replies_damaged=lost)
    assert lost == 0
    assert len(disconnect_s) == STALLED * ITERATIONS   # every stalled client was disconnected
