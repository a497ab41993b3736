"""Tests for the shell tool: streaming, exit codes, output cap, timeout, process-group clean-up."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import trio

from roost.tools import ToolContext, builtin_tools, run_tool, stop_process_group
from _helpers.timing import scaled

SHELL = builtin_tools()["shell"]


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie awaiting its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def _ctx(tmp_path: Path, **kw) -> ToolContext:
    kw.setdefault("permission_mode", "unconfined")
    return ToolContext(cwd=tmp_path, **kw)


class _Lines:
    """Collects streamed output and sets an event once ``want`` complete lines arrived."""

    def __init__(self, want: int) -> None:
        self.text = ""
        self.want = want
        self.ready = trio.Event()

    def __call__(self, chunk: str) -> None:
        self.text += chunk
        if self.text.count("\n") >= self.want:
            self.ready.set()

    def ints(self) -> list[int]:
        return [int(x) for x in self.text.split()[: self.want]]


async def test_output_exit_code_and_cwd(tmp_path):
    (tmp_path / "marker").write_text("marker\n")
    with trio.fail_after(scaled(10)):
        result = await run_tool(SHELL, {"command": "cat marker; echo oops >&2; exit 3"}, _ctx(tmp_path))
    assert result.is_error
    assert result.metadata["exit_code"] == 3
    assert result.metadata["timed_out"] is False
    assert result.output.startswith("marker\noops\n")
    assert "[exit code 3]" in result.output


async def test_success_is_not_an_error(tmp_path):
    with trio.fail_after(scaled(10)):
        result = await run_tool(SHELL, {"command": "printf 'h\\303\\251llo'"}, _ctx(tmp_path))
    assert not result.is_error
    assert result.output == "héllo"
    assert result.metadata["exit_code"] == 0


async def test_streaming_order_and_chunks_arrive_before_exit(tmp_path):
    lines = _Lines(want=2)
    script = "echo one; echo two >&2; while [ ! -e go ]; do sleep 0.01; done; echo three"
    ctx = _ctx(tmp_path, on_output=lines)
    results = []
    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:

            async def call():
                results.append(await run_tool(SHELL, {"command": script}, ctx))

            nursery.start_soon(call)
            await lines.ready.wait()
            # Streamed while the command is still running: it waits for the file "go".
            assert lines.text == "one\ntwo\n"
            assert not results
            (tmp_path / "go").write_text("")
    assert lines.text == "one\ntwo\nthree\n"
    assert results[0].output == "one\ntwo\nthree\n"


async def test_utf8_split_across_reads_is_streamed_intact(tmp_path):
    chunks: list[str] = []
    # Two separate writes split the two bytes of "é".
    script = "printf '\\303'; sleep 0.05; printf '\\251\\n'"
    with trio.fail_after(scaled(10)):
        result = await run_tool(SHELL, {"command": script}, _ctx(tmp_path, on_output=chunks.append))
    assert "".join(chunks) == "é\n"
    assert "\ufffd" not in "".join(chunks)
    assert result.output == "é\n"


async def test_output_cap_keeps_head_and_tail(tmp_path):
    streamed: list[str] = []
    ctx = _ctx(tmp_path, output_cap_bytes=1000, on_output=streamed.append)
    script = "echo START; head -c 100000 /dev/zero | tr '\\0' a; echo; echo END"
    with trio.fail_after(scaled(20)):
        result = await run_tool(SHELL, {"command": script}, ctx)
    assert result.metadata["truncated"] is True
    assert result.metadata["output_bytes"] == len("START\n") + 100000 + len("\nEND\n")
    assert result.output.startswith("START\naaa")
    assert result.output.rstrip().endswith("END")
    assert "output truncated" in result.output
    assert len(result.output.encode()) < 1200
    # The stream is not capped: the client sees everything.
    assert len("".join(streamed)) == result.metadata["output_bytes"]


async def test_timeout_kills_the_command(tmp_path):
    with trio.fail_after(scaled(20)):
        result = await run_tool(SHELL, {"command": "sleep 100", "timeout_s": 0.2}, _ctx(tmp_path))
    assert result.is_error
    assert result.metadata["timed_out"] is True
    assert result.metadata["exit_code"] < 0
    assert "timed out" in result.output


async def test_timeout_kills_background_grandchild(tmp_path):
    lines = _Lines(want=1)
    ctx = _ctx(tmp_path, on_output=lines, kill_grace_s=0.5)
    with trio.fail_after(scaled(20)):
        result = await run_tool(
            SHELL, {"command": "sleep 100 & echo $!; wait", "timeout_s": 1}, ctx
        )
    assert result.metadata["timed_out"] is True
    (grandchild,) = lines.ints()
    assert not _alive(grandchild)


async def _cancel_when_ready(tmp_path: Path, script: str, lines: _Lines, grace: float) -> list:
    """Run ``script``, cancel the call once ``lines`` is ready; return what the call raised."""
    raised: list = []
    ctx = _ctx(tmp_path, on_output=lines, kill_grace_s=grace)
    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def call():
                with scope:
                    try:
                        await run_tool(SHELL, {"command": script}, ctx)
                    except BaseException as exc:
                        raised.append(exc)
                        raise
                    raised.append("returned")

            nursery.start_soon(call)
            await lines.ready.wait()
            scope.cancel()
    return raised


async def test_cancellation_kills_process_group_including_grandchild(tmp_path):
    lines = _Lines(want=3)
    script = "sleep 100 & echo $!; sleep 100 & echo $!; echo $$; wait"
    raised = await _cancel_when_ready(tmp_path, script, lines, grace=2.0)
    assert len(raised) == 1 and isinstance(raised[0], trio.Cancelled)
    pids = lines.ints()
    assert len(set(pids)) == 3
    for pid in pids:
        assert not _alive(pid), pid


async def test_cancellation_escalates_to_sigkill_when_term_is_ignored(tmp_path):
    lines = _Lines(want=2)
    # Ignored signals stay ignored across exec, so the sleeps ignore SIGTERM too.
    script = "trap '' TERM; sleep 100 & echo $!; echo $$; wait"
    raised = await _cancel_when_ready(tmp_path, script, lines, grace=0.3)
    assert len(raised) == 1 and isinstance(raised[0], trio.Cancelled)
    for pid in lines.ints():
        assert not _alive(pid), pid


async def test_stop_process_group_sends_sigkill_after_grace(tmp_path):
    process = await trio.lowlevel.open_process(
        ["/bin/sh", "-c", "trap '' TERM; echo ready; sleep 100"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        with trio.fail_after(scaled(20)):
            assert (await process.stdout.receive_some(100)).startswith(b"ready")
            await stop_process_group(process, grace_s=0.2)
        assert process.returncode == -signal.SIGKILL
    finally:
        await process.stdout.aclose()


async def test_stop_process_group_sigterm_suffices(tmp_path):
    process = await trio.lowlevel.open_process(
        ["/bin/sh", "-c", "echo ready; sleep 100"], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        with trio.fail_after(scaled(20)):
            assert (await process.stdout.receive_some(100)).startswith(b"ready")
            await stop_process_group(process, grace_s=10)
        assert process.returncode == -signal.SIGTERM
    finally:
        await process.stdout.aclose()


async def test_background_job_does_not_hold_the_result(tmp_path):
    lines = _Lines(want=1)
    with trio.fail_after(scaled(20)):
        result = await run_tool(
            SHELL, {"command": "sleep 100 & echo $!"}, _ctx(tmp_path, on_output=lines)
        )
    assert result.metadata["exit_code"] == 0
    (pid,) = lines.ints()
    os.kill(pid, signal.SIGKILL)  # left running by design; clean up after the test


async def test_missing_cwd_is_an_error_result(tmp_path):
    with trio.fail_after(scaled(10)):
        result = await run_tool(SHELL, {"command": "true"}, _ctx(tmp_path / "nope"))
    assert result.is_error
    assert "does not exist" in result.output


@pytest.mark.parametrize(
    "args, field",
    [({}, "command"), ({"command": 1}, "command"), ({"command": "x", "timeout_s": "1"}, "timeout_s")],
)
async def test_bad_arguments(tmp_path, args, field):
    result = await run_tool(SHELL, args, _ctx(tmp_path))
    assert result.is_error
    assert result.metadata["invalid_field"] == field
    assert field in result.output


async def test_background_without_an_owner_is_a_clear_tool_error(tmp_path):
    result = await run_tool(SHELL, {"command": "echo hi", "background": True}, _ctx(tmp_path))
    assert result.is_error and "background processes are not available here" in result.output


async def test_background_hands_the_command_to_its_owner(tmp_path):
    started: list[tuple[str, Path]] = []

    async def start(command: str, cwd: Path) -> dict:
        started.append((command, cwd))
        return {"id": "proc_1", "pid": 4242}

    result = await run_tool(SHELL, {"command": "sleep 5", "background": True}, _ctx(tmp_path, start_background=start))
    assert started == [("sleep 5", tmp_path)] and not result.is_error
    assert result.metadata == {"process_id": "proc_1", "background": True} and "proc_1" in result.output
