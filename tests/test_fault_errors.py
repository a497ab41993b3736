"""Issue 18, finding 10: errors mean the same everywhere; integer ids of any size are echoed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _helpers.appserver import open_app_server, scripted_env

from roost.errors import (
    Conflict,
    MailboxClosed,
    NotFound,
    StoreBusy,
    StoreCorrupt,
    StoreDiskFull,
    StoreReadOnly,
    ThreadBusy,
)
from roost.protocol._errors import error_code, to_protocol_error


@pytest.mark.parametrize(("exc", "code"), [
    (NotFound("x", kind="threads"), "thread_not_found"),
    (NotFound("x", kind="turns"), "turn_not_found"),
    (NotFound("x", kind="runs"), "run_not_found"),
    (NotFound("x", kind="workers"), "not_found"),
    (NotFound("no memory 'k'"), "not_found"),
    (StoreBusy("locked"), "server_overloaded"),
    (MailboxClosed("gone"), "server_overloaded"),
    (StoreDiskFull("full"), "storage_full"),
    (StoreReadOnly("ro"), "storage_read_only"),
    (StoreCorrupt("bad"), "storage_corrupt"),
    (Conflict("dup"), "conflict"),
    (ThreadBusy("busy"), "thread_busy"),
    (RuntimeError("bug"), "internal_error"),
])
def test_one_table_maps_internal_errors_to_codes(exc: BaseException, code: str) -> None:
    assert error_code(exc) == code
    assert to_protocol_error(exc).to_wire()["code"] == code


def test_the_daemon_and_the_app_server_use_the_same_table() -> None:
    # Both front doors import the one mapping; neither keeps a table of its own.
    root = Path(__file__).resolve().parent.parent / "roost" / "protocol"
    for name in ("_appserver.py", "_serve_input.py"):  # the daemon dispatches in _serve_input
        text = (root / name).read_text()
        assert "from roost.protocol._errors import" in text, name
        assert '"internal_error")' not in text, name


@pytest.mark.parametrize("rid", [2**70, -(2**70), 2**63 - 1, -(2**63), 0])
async def test_integer_request_ids_of_any_size_are_echoed(tmp_path: Path, roost_home: Path, rid: int) -> None:
    async with open_app_server(env=scripted_env(roost_home), cwd=tmp_path) as client:
        await client.send(json.dumps({"id": rid, "method": "initialize",
                                      "params": {"protocol_version": "wuu-app-server/v0.1"}}).encode() + b"\n")
        await client.send(json.dumps({"id": rid + 1, "method": "no/such"}).encode() + b"\n")
        await client.wait_line(lambda m: "error" in m and m.get("id") is not None)
        raw = [json.loads(line) for line in client.raw]   # the stdlib keeps big integers exact
        assert any(m.get("id") == rid and "result" in m for m in raw), raw
        assert any(m.get("id") == rid + 1 and m["error"]["code"] == "method_not_found" for m in raw), raw
