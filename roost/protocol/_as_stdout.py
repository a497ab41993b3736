"""``roost app-server``'s stdout as a stream that knows where a cancellation cut a line, so that a
slow client's disconnect ends at a line boundary (docs/app-server.md: exit status 3)."""

from __future__ import annotations

import errno
import os

import trio

__all__ = ["LineEndingFdStream", "FINISH_LINE_S"]

#: Seconds a dropped client's stdout is given to take the rest of the line it was cut in.
FINISH_LINE_S = 5.0


class LineEndingFdStream(trio.abc.SendStream):
    """A :class:`trio.lowlevel.FdStream` (stdout) whose :meth:`send_all` remembers where a
    cancellation cut it, so that a slow client's disconnect can end at a line boundary.

    ``send_all`` writes as ``FdStream.send_all`` does (a checkpoint, then ``os.write`` until done,
    waiting for the descriptor to be writable), counting the bytes written; cancelled part-way
    through a line, the rest of that line is kept as :attr:`cut_tail` and :meth:`finish_line`
    later tries to write it. Args: ``stream``, the stream to write (its descriptor is used; it
    stays the owner: :meth:`aclose` closes it).

    Raises (``send_all``): trio.ClosedResourceError: the descriptor is closed (EBADF);
    trio.BrokenResourceError: any other write error (EPIPE: the reader went away).
    """

    def __init__(self, stream: trio.lowlevel.FdStream) -> None:
        self._stream = stream
        self._fd = stream.fileno()
        #: the unwritten rest of the line a cancelled :meth:`send_all` stopped in (b"": none)
        self.cut_tail = b""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        sent, length = 0, len(data)
        with memoryview(data) as view:
            try:
                while sent < length:
                    try:
                        sent += os.write(self._fd, view[sent:])
                    except BlockingIOError:
                        await trio.lowlevel.wait_writable(self._fd)
            except trio.Cancelled:
                if sent and view[sent - 1] != 0x0A:  # cut inside a line
                    end = bytes(view[sent:]).find(b"\n")
                    self.cut_tail = bytes(view[sent : length if end < 0 else sent + end + 1])
                raise
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    raise trio.ClosedResourceError("stdout was already closed") from None
                raise trio.BrokenResourceError from exc

    async def finish_line(self, timeout: float = FINISH_LINE_S) -> bool:
        """Write :attr:`cut_tail` (the rest of a line a cancellation cut), waiting at most
        ``timeout`` seconds for the reader to make room. Returns whether stdout now ends at a line
        boundary. Never raises for a reader that went away (False). Cancellation: at most the
        tail's remainder stays unwritten."""
        tail, self.cut_tail = self.cut_tail, b""
        if not tail:
            return True
        with trio.move_on_after(timeout):
            try:
                await self.send_all(tail)
                return True
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return False
        return False

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self._stream.aclose()
