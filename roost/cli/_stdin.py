"""Reading stdin lines from trio without blocking the event loop or the interpreter's exit.

A line is read in a worker thread abandoned on cancellation (Ctrl-C, the daemon going away), so
nothing waits for the user to type. Such a thread may still be blocked in a read when the process
exits. Had it called ``sys.stdin.readline`` (or ``sys.stdin.buffer.readline``) it would hold the
lock of stdin's buffered reader, and the interpreter's shutdown, which flushes and closes
``sys.stdin``, would abort with ``Fatal Python error: _enter_buffered_busy`` (exit 134). So
:class:`StdinLines` reads the file descriptor with :func:`os.read` (no Python-level lock) and
splits lines with the framing's one line reader (:class:`roost.protocol.LineDecoder` in text
mode, limit :func:`roost.protocol.line_limit`): an oversized line is reported on stderr and
never becomes input. The descriptor's mode is left alone (no ``O_NONBLOCK`` on a
terminal).

When ``sys.stdin`` has no file descriptor (replaced by a test harness such as click's
``CliRunner``), it falls back to ``sys.stdin.readline``.
"""

from __future__ import annotations

import collections
import io
import os
import sys
from collections.abc import Callable
from typing import Any

import trio

from roost.protocol import FrameError, LineDecoder, line_limit

__all__ = ["StdinLines"]

#: Bytes asked of one ``os.read``.
_CHUNK = 1 << 16


class StdinLines:
    """Lines of stdin, one :meth:`readline` at a time (one instance per reader of stdin).

    Bytes read ahead of a line's end are kept for the next call, so use one instance for all the
    reads of a command. A read cancelled while its thread blocks loses what that thread reads.
    """

    def __init__(self, stream: Any = None, *, on_error: Callable[[str], None] | None = None) -> None:
        self._stream: Any = sys.stdin if stream is None else stream
        self._fd: int | None
        try:
            self._fd = self._stream.fileno()
        except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
            self._fd = None
        self._limit = line_limit()
        self._decoder = LineDecoder(max_line_bytes=self._limit, parse=False)
        self._lines: collections.deque[str] = collections.deque()
        self._eof = False
        self._on_error = on_error or _report

    async def readline(self) -> str:
        """The next line with its ``\\n`` (the last one maybe without), or ``""`` at end of input.

        A ``\\r\\n`` ends a line like ``\\n``; bytes that are not UTF-8 are replaced (U+FFFD). A
        line over the limit is reported through ``on_error`` (default: one line on stderr) and
        skipped: no part of it becomes input. Cancellation: abandons the worker thread at once (see the module
        docstring).
        """
        if self._fd is None:
            while True:
                if self._eof:
                    return ""
                line = await trio.to_thread.run_sync(self._fallback_readline, abandon_on_cancel=True)
                if not line:
                    self._eof = True
                elif len(line.encode("utf-8", "replace")) > self._limit + 1:
                    self._on_error(f"line exceeds the limit of {self._limit} bytes")
                else:
                    return line
        while not self._lines:
            if self._eof:
                return ""
            chunk = await trio.to_thread.run_sync(_read, self._fd, abandon_on_cancel=True)
            if chunk:
                self._take(self._decoder.feed(chunk), "\n")
            else:
                self._eof = True
                self._take(self._decoder.finish(), "")
        return self._lines.popleft()

    def _take(self, frames: list, end: str) -> None:
        for frame in frames:
            if isinstance(frame, FrameError):
                self._on_error(frame.message)
            else:
                self._lines.append(frame + end)

    def _fallback_readline(self) -> str:
        line = self._stream.readline()
        if isinstance(line, bytes):
            return line.decode("utf-8", "replace")
        return line or ""


def _read(fd: int) -> bytes:
    """One ``os.read`` of ``fd``; end of input on a closed or unusable descriptor."""
    while True:
        try:
            return os.read(fd, _CHUNK)
        except InterruptedError:  # pragma: no cover - PEP 475 retries already
            continue
        except BlockingIOError:  # someone else made it non-blocking: wait until it is readable
            import select

            select.select([fd], [], [])
        except OSError:
            return b""


def _report(message: str) -> None:
    sys.stderr.write(f"roost: input line ignored: {message}\n")
    sys.stderr.flush()
