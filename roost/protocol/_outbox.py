"""A client connection's bounded outbox and its coalescing writer.

Every line for a client goes through :meth:`Outbox.deliver`, which never blocks: a full outbox marks
the client a slow consumer and closes it (DESIGN.md section 4, "Events") so that it cannot slow the
turn or other clients. The writer drains every line waiting and sends them in one write (one
syscall for a burst of deltas), never reordering; when that backlog is long it first merges runs of
consecutive deltas of one stream (``coalesce``, see :mod:`roost.protocol._coalesce`).
"""

from __future__ import annotations

import logging
from typing import Callable

import trio

from roost.protocol._coalesce import COALESCE_AFTER

__all__ = ["Outbox", "DEFAULT_OUTBOX_LINES"]

log = logging.getLogger("roost.protocol")

#: Lines an outbox holds before its client counts as a slow consumer.
DEFAULT_OUTBOX_LINES = 65536
#: Lines waiting before queued lines are copied down to their exact size.
_TRIM_AFTER = 256
#: Bytes joined into one write at most.
_WRITE_CHUNK = 1 << 20


class Outbox:
    """Bounded queue of encoded lines for one client, drained by :meth:`run_writer`.

    Args:
        capacity: lines that may wait (bounded).
        on_overflow: called once when a line does not fit (the slow-consumer policy).
        coalesce: merges a backlog's deltas (``lines -> lines``, order kept), applied to a batch
            of at least :data:`~roost.protocol._coalesce.COALESCE_AFTER` waiting lines; None
            writes every line as it is.
    """

    def __init__(self, capacity: int = DEFAULT_OUTBOX_LINES, *, on_overflow: Callable[[], None] | None = None,
                 coalesce: Callable[[list[bytes]], list[bytes]] | None = None):
        self._send, self._recv = trio.open_memory_channel[bytes](capacity)
        self._on_overflow = on_overflow
        self._coalesce = coalesce
        #: lines merged away by ``coalesce`` so far
        self.coalesced = 0
        self.overflowed = False
        self.closed = False

    def deliver(self, line: bytes) -> None:
        """Queue ``line`` (bytes ending in ``\\n``) without blocking; drops it if closed/overflowed."""
        if self.closed or self.overflowed:
            return
        if self._send.statistics().current_buffer_used > _TRIM_AFTER:
            # A backlog: keep only the line's bytes (orjson's output buffer is often 4 KiB).
            line = bytes(memoryview(line))
        try:
            self._send.send_nowait(line)
        except trio.WouldBlock:
            self.overflowed = True
            log.warning("slow consumer: outbox full; closing the connection")
            if self._on_overflow is not None:
                self._on_overflow()
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self.closed = True

    def close(self) -> None:
        """No more lines; the writer drains what is queued and returns. Idempotent."""
        self.closed = True
        self._send.close()

    async def run_writer(self, stream: trio.abc.SendStream) -> None:
        """Send queued lines to ``stream`` until :meth:`close`, coalescing bursts into one write.

        Raises:
            trio.BrokenResourceError: the peer went away.
        """
        recv = self._recv
        while True:
            try:
                first = await recv.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return
            batch = [first]
            size = len(first)
            while size < _WRITE_CHUNK:
                try:
                    line = recv.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
                batch.append(line)
                size += len(line)
            if self._coalesce is not None and len(batch) >= COALESCE_AFTER:
                merged = self._coalesce(batch)
                self.coalesced += len(batch) - len(merged)
                batch = merged
            await stream.send_all(b"".join(batch) if len(batch) > 1 else batch[0])
