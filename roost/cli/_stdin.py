"""Reading stdin lines from trio without blocking the event loop or the interpreter's exit.

A line is read in a worker thread abandoned on cancellation (Ctrl-C, the daemon going away), so
nothing waits for the user to type. Such a thread may still be blocked in a read when the process
exits. Had it called ``sys.stdin.readline`` (or ``sys.stdin.buffer.readline``) it would hold the
lock of stdin's buffered reader, and the interpreter's shutdown, which flushes and closes
``sys.stdin``, would abort with ``Fatal Python error: _enter_buffered_busy`` (exit 134). So
:class:`StdinLines` reads the file descriptor with :func:`os.read` (no Python-level lock) and
splits lines itself. The descriptor's mode is left alone (no ``O_NONBLOCK`` on a terminal).

When ``sys.stdin`` has no file descriptor (replaced by a test harness such as click's
``CliRunner``), it falls back to ``sys.stdin.readline``.
"""

from __future__ import annotations

import io
import os
import sys
from typing import Any

import trio

__all__ = ["StdinLines"]

#: Bytes asked of one ``os.read``.
_CHUNK = 1 << 16


class StdinLines:
    """Lines of stdin, one :meth:`readline` at a time (one instance per reader of stdin).

    Bytes read ahead of a line's end are kept for the next call, so use one instance for all the
    reads of a command. A read cancelled while its thread blocks loses what that thread reads.
    """

    def __init__(self, stream: Any = None) -> None:
        self._stream: Any = sys.stdin if stream is None else stream
        self._fd: int | None
        try:
            self._fd = self._stream.fileno()
        except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
            self._fd = None
        self._buffer = bytearray()
        self._eof = False

    async def readline(self) -> str:
        """The next line with its ``\\n`` (the last one maybe without), or ``""`` at end of input.

        Bytes that are not UTF-8 are replaced (U+FFFD). Cancellation: abandons the worker thread
        at once (see the module docstring).
        """
        if self._fd is None:
            if self._eof:
                return ""
            line = await trio.to_thread.run_sync(self._fallback_readline, abandon_on_cancel=True)
            if not line:
                self._eof = True
            return line
        while True:
            index = self._buffer.find(b"\n")
            if index >= 0:
                data = bytes(self._buffer[: index + 1])
                del self._buffer[: index + 1]
                return data.decode("utf-8", "replace")
            if self._eof:
                data = bytes(self._buffer)
                self._buffer.clear()
                return data.decode("utf-8", "replace")
            chunk = await trio.to_thread.run_sync(_read, self._fd, abandon_on_cancel=True)
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True

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
