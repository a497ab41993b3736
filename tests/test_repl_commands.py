"""End-to-end: `roost repl --vscode` shell escapes (`!command`) and `/copy` (wire-protocol.md, "Turn events (stdio)").

Each test runs the real command as a subprocess on the scripted engine (see test_repl.py) and waits
on events, each under a deadline.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import trio

from _helpers.appserver import script_env
from test_repl import SCRIPT, TIMEOUT, ReplClient, open_repl


@pytest.fixture
def env(tmp_path: Path, roost_home: Path) -> dict:
    return script_env(tmp_path, roost_home, SCRIPT)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


def _group_alive(pgid: int) -> bool:
    """True while some member of process group ``pgid`` is running (zombies do not count)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _shell_text(repl: ReplClient, start: int, end: int) -> str:
    return "".join(e["text"] for e in repl.events[start:end] if e["type"] == "shell_output")


async def _pgid_of(repl: ReplClient, start: int) -> int:
    """The process group of the running `!echo pgid $$; ...` (echo writes its line at once)."""
    output = await repl.wait("shell_output", lambda e: "pgid" in e["text"], start=start)
    return int(re.search(r"pgid (\d+)", output["text"]).group(1))


async def test_shell_escape_streams_merged_output_and_exit_code(env, work):
    async with open_repl(env, work) as repl:
        ready = await repl.wait("ready")
        assert ready["midTurnCommands"] == ["/help", "/status", "/title"]
        start = await repl.say("!echo hi; echo err >&2; pwd; exit 3")
        end = await repl.wait("message_end", start=start)
        assert end["toolCalls"] == [] and end["turnIndex"] == -1   # no turn yet: a command takes no index
        kinds = repl.types(start, end["_index"])
        assert kinds[0] == "shell_start" and kinds[-1] == "shell_end"
        assert set(kinds[1:-1]) == {"shell_output"}
        assert repl.events[start]["command"] == "echo hi; echo err >&2; pwd; exit 3"
        output = _shell_text(repl, start, end["_index"])
        assert output.splitlines() == ["hi", "err", str(work)]  # merged, in the chat's directory
        shell_end = repl.events[end["_index"] - 1]
        assert shell_end == {**shell_end, "exitCode": 3, "truncated": False, "interrupted": False}
        # no approval was asked: it is the user's own action
        assert "approval_request" not in repl.types(start)
        # a bare "!" is a usage error; the chat goes on
        start = await repl.say("!  ")
        assert "usage" in (await repl.wait("error", start=start))["text"]
        # the output is capped at 100,000 characters, and says so
        start = await repl.say("!head -c 150000 /dev/zero | tr '\\0' x")
        end = await repl.wait("message_end", start=start)
        output = _shell_text(repl, start, end["_index"])
        assert output.startswith("x" * 100_000) and "truncated" in output[100_000:]
        assert output.count("x") == 100_000
        shell_end = await repl.wait("shell_end", start=start)
        assert shell_end["exitCode"] == 0 and shell_end["truncated"] is True
        # /help lists the new commands
        start = await repl.say("/help")
        text = (await repl.wait("text", start=start))["text"]
        assert "/copy" in text and "!<command>" in text
        assert await repl.close() == 0


async def test_interrupt_stops_the_shell_escape_and_its_process_group(env, work):
    async with open_repl(env, work) as repl:
        await repl.wait("ready")
        start = await repl.say("!echo pgid $$; sleep 30 & sleep 30")
        pgid = await _pgid_of(repl, start)
        assert _group_alive(pgid)
        # other input is refused while it runs
        at = await repl.say("hello")
        assert "interrupt" in (await repl.wait("error", start=at))["text"]
        at = await repl.say("/status")
        await repl.wait("error", start=at)
        with trio.fail_after(5):  # well under the 30 s the command would take
            await repl.send({"type": "interrupt"})
            shell_end = await repl.wait("shell_end", start=start)
            cancelled = await repl.wait("cancelled", start=start)
        assert shell_end["interrupted"] is True and shell_end["exitCode"] < 0
        assert shell_end["_index"] < cancelled["_index"]
        assert "message_end" not in repl.types(start)
        assert not _group_alive(pgid)
        # the chat goes on: a turn, then the next shell escape
        start = await repl.say("hello again")
        await repl.wait("message_end", start=start)
        start = await repl.say("!echo after")
        await repl.wait("message_end", start=start)
        assert _shell_text(repl, start, len(repl.events)) == "after\n"
        assert await repl.close() == 0


async def test_end_of_input_stops_a_running_shell_escape(env, work):
    async with open_repl(env, work) as repl:
        await repl.wait("ready")
        start = await repl.say("!echo pgid $$; sleep 30")
        pgid = await _pgid_of(repl, start)
        with trio.fail_after(10):
            assert await repl.close() == 0
        assert repl.types(start)[-2:] == ["shell_end", "session_end"]
        assert not _group_alive(pgid)


async def test_shell_escape_is_refused_while_a_reply_streams(env, work):
    async with open_repl(env, work) as repl:
        await repl.wait("ready")
        start = await repl.say("slow reply")
        await repl.wait("token", start=start)
        at = await repl.say("!echo nope")
        error = await repl.wait("error", start=at)
        assert "while a reply is streaming" in error["text"]
        at = await repl.say("/copy")
        assert "while a reply is streaming" in (await repl.wait("error", start=at))["text"]
        await repl.send({"type": "interrupt"})
        await repl.wait("cancelled", start=start)
        assert "shell_start" not in repl.types(start)
        assert await repl.close() == 0


async def test_a_shell_escape_that_cannot_start_is_an_error(env, work):
    chat_dir = work / "gone"
    chat_dir.mkdir()
    async with open_repl(env, work, "--cwd", str(chat_dir)) as repl:
        await repl.wait("ready")
        chat_dir.rmdir()
        start = await repl.say("!echo hi")
        error = await repl.wait("error", start=start)
        assert "could not run" in error["text"] and "does not exist" in error["text"]
        assert "shell_start" not in repl.types(start)
        assert await repl.close() == 0
    async with open_repl(env, work) as repl:  # a NUL cannot be passed to sh
        await repl.wait("ready")
        start = await repl.say("!echo a\u0000b")
        assert "could not run" in (await repl.wait("error", start=start))["text"]
        start = await repl.say("!echo still here")
        await repl.wait("message_end", start=start)
        assert await repl.close() == 0


async def test_copy_sends_the_last_or_nth_last_reply(env, work):
    async with open_repl(env, work) as repl:
        await repl.wait("ready")
        start = await repl.say("/copy")
        assert "no reply yet" in (await repl.wait("error", start=start))["text"]
        assert "message_end" not in repl.types(start)
        start = await repl.say("hello there")
        await repl.wait("message_end", start=start)
        start = await repl.say("/copy")
        copy = await repl.wait("copy", start=start)
        assert copy["text"] == "hello there"
        await repl.wait("message_end", lambda e: e["toolCalls"] == [], start=copy["_index"])
        start = await repl.say("list it")
        await repl.wait("message_end", start=start)
        start = await repl.say("/copy")
        assert (await repl.wait("copy", start=start))["text"] == "Listed."
        start = await repl.say("/copy 2")
        assert (await repl.wait("copy", start=start))["text"] == "hello there"
        start = await repl.say("/copy 3")
        assert "only 2 replies" in (await repl.wait("error", start=start))["text"]
        start = await repl.say("/copy last")
        assert "usage" in (await repl.wait("error", start=start))["text"]
        assert await repl.close() == 0


async def test_text_mode_runs_shell_escapes_and_shows_copies(env, work):
    from _helpers.appserver import roost_argv

    typed = b"hello text\n!echo shelled; exit 2\n/copy\n"
    with trio.fail_after(TIMEOUT):
        proc = await trio.run_process([*roost_argv(), "repl"], stdin=typed, capture_stdout=True,
                                      capture_stderr=True, env=env, cwd=str(work), check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    after = lines[lines.index("! echo shelled; exit 2") + 1:]
    after = [line for line in after if not line.startswith("(title: ")]  # the auto title may come any time
    assert after[:2] == ["shelled", "(exit code 2)"]
    assert lines[lines.index("(to copy)") + 1] == "hello text"


async def test_shell_escape_cancelled_from_outside_stops_its_group(work):
    from roost.protocol._repl_shell import ShellEscape

    events: list[dict] = []
    escape = ShellEscape("echo pgid $$; sleep 30", cwd=work, emit=events.append)
    with trio.move_on_after(TIMEOUT) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(escape.run)
            while not any("pgid" in e.get("text", "") for e in events):
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught and escape.done.is_set()
    pgid = int(re.search(r"pgid (\d+)", events[1]["text"]).group(1))
    assert [e["type"] for e in events] == ["shell_start", "shell_output"]  # no shell_end
    assert not _group_alive(pgid)
