"""``roost.cli._stdin.StdinLines``: stdin lines for trio, read with os.read in abandonable threads."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import trio

from roost.cli._stdin import StdinLines
from _helpers.timing import scaled

ABANDON = textwrap.dedent("""
    import sys, trio
    from roost.cli._stdin import StdinLines

    async def main():
        stdin = StdinLines()
        first = await stdin.readline()
        print("got", repr(first), flush=True)
        with trio.move_on_after(0.3):       # nothing more comes: the read is abandoned, still blocked
            await stdin.readline()
        return 1
    sys.exit(trio.run(main))
""")


def test_an_abandoned_blocked_read_does_not_abort_the_exit() -> None:
    # stdin stays open (the writer keeps it) while the process exits with a reader thread blocked
    # in it: a clean exit 1, never "Fatal Python error: _enter_buffered_busy" (exit 134)
    process = subprocess.Popen([sys.executable, "-c", ABANDON], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        process.stdin.write(b"hello\n")
        process.stdin.flush()
        code = process.wait(timeout=scaled(30))
        out, err = process.stdout.read(), process.stderr.read()
    finally:
        process.stdin.close()
        if process.poll() is None:
            process.kill()
    assert code == 1, err.decode()
    assert out == b"got 'hello\\n'\n" and b"Fatal Python error" not in err


async def test_lines_split_from_chunks_and_end_of_input() -> None:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, "one\ntwo\r\nthré".encode() + b"\xff\n" + b"tail")
    os.close(write_fd)
    try:
        stdin = StdinLines(os.fdopen(read_fd, "rb", closefd=False))
        lines = [await stdin.readline() for _ in range(6)]
    finally:
        os.close(read_fd)
    assert lines == ["one\n", "two\n", "thré\ufffd\n", "tail", "", ""]


async def test_an_oversized_line_is_reported_and_never_becomes_input(monkeypatch) -> None:
    monkeypatch.setenv("ROOST_MAX_LINE_BYTES", "8")
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"short\n" + b"x" * 30 + b"\n" + b"after\n")
    os.close(write_fd)
    errors: list[str] = []
    try:
        stdin = StdinLines(os.fdopen(read_fd, "rb", closefd=False), on_error=errors.append)
        lines = [await stdin.readline() for _ in range(3)]
    finally:
        os.close(read_fd)
    assert lines == ["short\n", "after\n", ""]
    assert errors == ["line exceeds the limit of 8 bytes"]


async def test_a_stream_without_a_descriptor_is_read_with_readline() -> None:
    # e.g. click's CliRunner replaces sys.stdin with an in-memory stream
    stdin = StdinLines(io.StringIO("a\nb"))
    assert [await stdin.readline() for _ in range(3)] == ["a\n", "b", ""]
    stdin = StdinLines(io.BytesIO(b"x\n"))
    assert [await stdin.readline() for _ in range(2)] == ["x\n", ""]
