"""A client connection's bounded outbox and its coalescing writer.

Every line for a client goes through :meth:`Outbox.deliver`, which never blocks: a full outbox marks
the client a slow consumer and closes it (DESIGN.md section 4, "Events") so that it cannot slow the
turn or other clients. The writer drains every line waiting and sends them in one write (one
syscall for a burst of deltas), never reordering; when that backlog is long it first merges runs of
consecutive deltas of one stream (``coalesce``, see :mod:`roost.protocol._coalesce`).

Bounds (issue 18, finding 5): an outbox holds at most ``capacity`` lines *and* ``max_bytes``
bytes (a single line larger than that still passes when nothing else waits, so the longest
allowed line can be sent); with ``stall_timeout_s`` a writer that makes no progress for that long
(the peer reads nothing) also counts as a slow consumer. Either way :attr:`Outbox.reason` says why,
and ``on_overflow`` is called once. After a backlog of more than :data:`_TRIM_AFTER_BYTES` drains,
freed memory is handed back to the OS (glibc ``malloc_trim``), so one large reply does not leave
the process holding its peak.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
from typing import Callable

import trio

from roost.protocol._coalesce import COALESCE_AFTER

__all__ = ["Outbox", "DEFAULT_OUTBOX_LINES", "DEFAULT_OUTBOX_BYTES", "DEFAULT_STALL_TIMEOUT_S",
           "outbox_bytes_from_env", "stall_timeout_from_env", "release_memory"]

log = logging.getLogger("roost.protocol")

#: Lines an outbox holds before its client counts as a slow consumer.
DEFAULT_OUTBOX_LINES = 65536
#: Bytes an outbox holds before its client counts as a slow consumer (``ROOST_OUTBOX_BYTES``).
DEFAULT_OUTBOX_BYTES = 16 << 20
#: Seconds a socket client's writer may make no progress before the client is disconnected
#: (``ROOST_OUTBOX_STALL_S``).
DEFAULT_STALL_TIMEOUT_S = 30.0
#: A drained backlog larger than this (bytes) hands freed memory back to the OS.
_TRIM_AFTER_BYTES = 4 << 20
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
                 coalesce: Callable[[list[bytes]], list[bytes]] | None = None,
                 max_bytes: int | None = None, stall_timeout_s: float | None = None):
        self._send, self._recv = trio.open_memory_channel[bytes](capacity)
        self._on_overflow = on_overflow
        self.capacity = capacity
        #: most bytes that may wait (``ROOST_OUTBOX_BYTES`` or 16 MiB when not given)
        self.max_bytes = outbox_bytes_from_env() if max_bytes is None else max_bytes
        #: seconds without write progress before the client is a slow consumer (None: no limit)
        self.stall_timeout_s = stall_timeout_s
        #: bytes queued and not yet taken by the writer
        self.queued_bytes = 0
        #: the largest ``queued_bytes`` since the last trim
        self.peak_bytes = 0
        #: why the outbox gave up on its client ("" while it has not)
        self.reason = ""
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
        size = len(line)
        if self.queued_bytes and self.queued_bytes + size > self.max_bytes:
            self._give_up(f"outbox over {self.max_bytes} bytes")
            return
        try:
            self._send.send_nowait(line)
        except trio.WouldBlock:
            self._give_up(f"outbox full ({self.capacity} lines)")
            return
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self.closed = True
            return
        self.queued_bytes += size
        if self.queued_bytes > self.peak_bytes:
            self.peak_bytes = self.queued_bytes

    def _give_up(self, reason: str) -> None:
        if self.overflowed:
            return
        self.overflowed = True
        self.reason = reason
        log.warning("slow consumer: %s; closing the connection", reason)
        # What waits is dropped with the client: free it now, not when the connection ends.
        self._drop_backlog()
        if self._on_overflow is not None:
            self._on_overflow()

    def _drop_backlog(self) -> None:
        while True:
            try:
                self._recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        self.queued_bytes = 0
        self._maybe_trim()

    def _maybe_trim(self) -> None:
        if self.peak_bytes > _TRIM_AFTER_BYTES and self.queued_bytes == 0:
            self.peak_bytes = 0
            release_memory()

    def close(self) -> None:
        """No more lines; the writer drains what is queued and returns. Idempotent."""
        self.closed = True
        self._send.close()

    async def _send_watched(self, stream: trio.abc.SendStream, data: bytes, stall_s: float) -> None:
        """``send_all`` under a watchdog: no progress for ``stall_s`` gives up on the client.

        The send itself is not cancelled (a half-written frame would corrupt the stream): the
        give-up calls ``on_overflow``, whose kick bounds how long the send may still take.
        """
        async def watchdog() -> None:
            await trio.sleep(stall_s)
            self._give_up(f"a write stayed blocked for {stall_s:g} s")

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watchdog)
                await stream.send_all(data)
                nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # Callers catch the transport's own errors (BrokenResourceError...), not a group.
            leaves = _leaves(group)
            if len(leaves) == 1:
                raise leaves[0] from None
            raise

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
            self.queued_bytes = max(0, self.queued_bytes - size)
            if self._coalesce is not None and len(batch) >= COALESCE_AFTER:
                merged = self._coalesce(batch)
                self.coalesced += len(batch) - len(merged)
                batch = merged
            data = b"".join(batch) if len(batch) > 1 else batch[0]
            del batch
            if self.stall_timeout_s is None:
                await stream.send_all(data)
            else:
                await self._send_watched(stream, data, self.stall_timeout_s)
            del data
            self._maybe_trim()


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def outbox_bytes_from_env() -> int:
    """``ROOST_OUTBOX_BYTES`` (a positive integer) or :data:`DEFAULT_OUTBOX_BYTES`."""
    try:
        value = int(os.environ.get("ROOST_OUTBOX_BYTES") or DEFAULT_OUTBOX_BYTES)
    except ValueError:
        return DEFAULT_OUTBOX_BYTES
    return value if value > 0 else DEFAULT_OUTBOX_BYTES


def stall_timeout_from_env() -> float:
    """``ROOST_OUTBOX_STALL_S`` (positive seconds) or :data:`DEFAULT_STALL_TIMEOUT_S`."""
    try:
        value = float(os.environ.get("ROOST_OUTBOX_STALL_S") or DEFAULT_STALL_TIMEOUT_S)
    except ValueError:
        return DEFAULT_STALL_TIMEOUT_S
    return value if value > 0 else DEFAULT_STALL_TIMEOUT_S


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


def release_memory() -> None:
    """Hand freed heap memory back to the OS (glibc ``malloc_trim(0)``; a no-op elsewhere).

    CPython frees a drained backlog's buffers to malloc, which keeps them mapped; trimming returns
    them, so the process's resident size falls back after a large reply.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
