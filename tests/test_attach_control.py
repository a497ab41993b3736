"""`roost attach` control (issue 17): /commands vs tasks, /interrupt and Ctrl-C, detaching without
a traceback, and reconnecting with the client id after a daemon restart."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import trio

from _helpers.serve_client import open_daemon, short_socket_path, start_daemon
from test_attach import TIMEOUT, _run

SCRIPT = {
    "rules": [
        {"match": {"prompt": "^sleepy"},
         "steps": [[{"text": "a slow reply of many many words indeed and more words", "tokens_per_second": 3}]]},
        {"match": {"prompt": "while you were working on"}, "steps": [[{"text": "resumed and done"}]]},
    ],
    "default": "echo",
}


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps(SCRIPT))
    return path


async def test_commands_are_not_tasks(script: Path) -> None:
    async with open_daemon(script=script) as daemon, trio.open_nursery() as nursery:
        attach = await _run(nursery, [daemon.socket])
        await attach.wait_text("attached to")
        await attach.send("/help")
        await attach.wait_text("/interrupt   interrupt your running task")
        await attach.send("/bogus")
        await attach.wait_text("unknown command /bogus; /help lists the commands")
        await attach.send("/status")
        await attach.wait_text("running 0, queued 0, clients 1")
        await attach.send("//slash task")
        await attach.wait_text("result: succeeded ('/slash task')")
        assert await attach.finish() == 0
    assert "queued" in attach.out and attach.out.count("result:") == 1   # only //slash task was a task
    assert "Traceback" not in attach.err


async def test_interrupt_command_and_ctrl_c(script: Path) -> None:
    async with open_daemon(script=script) as daemon, trio.open_nursery() as nursery:
        attach = await _run(nursery, [daemon.socket])
        await attach.send("sleepy one")
        await attach.wait_text("] assistant: a ")
        await attach.send("/interrupt")
        await attach.wait_text("result: interrupted ('sleepy one')\n  interrupted by the client\n")
        assert "failed" not in attach.out and "error:" not in attach.out
        # Ctrl-C while a task runs interrupts it; the attach stays
        await attach.send("sleepy two")
        await attach.wait_text("] assistant: a ", count=2)
        attach.process.send_signal(signal.SIGINT)
        await attach.wait_text("result: interrupted ('sleepy two')")
        assert "Ctrl-C again to detach" in attach.out
        # Ctrl-C with nothing running detaches at once, exit 0, one line, no traceback
        attach.process.send_signal(signal.SIGINT)
        with trio.fail_after(TIMEOUT):
            code = await attach.process.wait()
        assert code == 0 and "detached" in attach.out
        assert "Traceback" not in attach.err and "KeyboardInterrupt" not in attach.err
        await attach.process.stdin.aclose()


async def test_quit_with_a_task_outstanding_exits_130(script: Path) -> None:
    async with open_daemon(script=script) as daemon, trio.open_nursery() as nursery:
        attach = await _run(nursery, [daemon.socket])
        await attach.send("sleepy three")
        await attach.wait_text("] assistant: a ")
        attach.process.send_signal(signal.SIGINT)   # first: interrupt sent
        await attach.wait_text("interrupting your running task")
        attach.process.send_signal(signal.SIGINT)   # second: detach now
        with trio.fail_after(TIMEOUT):
            code = await attach.process.wait()
        assert code in (0, 130) and "detached" in attach.out
        assert "Traceback" not in attach.err
        await attach.process.stdin.aclose()


async def test_reconnects_with_its_client_id_after_a_daemon_restart(script: Path) -> None:
    sock = short_socket_path()
    async with trio.open_nursery() as nursery:
        first = await start_daemon(nursery, script=script, socket=sock)
        port = first.port
        url = f"ws://127.0.0.1:{port}/attach"
        attach = await _run(nursery, [url, "--client-id", "alice"])
        await attach.wait_text("client id alice")
        await attach.send("sleepy restart")
        await attach.wait_text("] assistant: a ")
        first.process.send_signal(signal.SIGTERM)
        with trio.fail_after(TIMEOUT):
            await first.process.wait()
        await attach.wait_text("reconnecting for up to 60 s")
        second = await start_daemon(nursery, script=script, socket=sock, args=["--http-port", str(port)])
        try:
            await attach.wait_text(f"reconnected to {url}")
            # the resumed task's result comes to the same client id
            await attach.wait_text("result: succeeded ('sleepy restart')")
            assert await attach.finish() == 0
        finally:
            second.process.send_signal(signal.SIGTERM)
            with trio.fail_after(TIMEOUT):
                await second.process.wait()
    assert "Traceback" not in attach.err
