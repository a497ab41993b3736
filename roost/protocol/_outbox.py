"""A client connection's bounded outbox and its coalescing writer.

Every line for a client goes through :meth:`Outbox.deliver`, which never blocks: a full outbox marks
the client a slow consumer and closes it (DESIGN.md section 4, "Events") so that it cannot slow the
turn or other clients. The writer drains every line waiting and sends them in one write (one
syscall for a burst of deltas), never reordering; when that backlog is long it first merges runs of
consecutive deltas of one stream (``coalesce``, see :mod:`roost.protocol._coalesce`).

Control before data (DESIGN.md section 4; issue 19): with ``lanes`` (a function naming the thread
of a line), a streamed delta waits in its thread's lane while every other line goes to one FIFO
that is written first, and the lanes are written round-robin in the order they filled. Order is
kept where it means something: lines that are not deltas never pass each other; a notification
of thread T first moves T's waiting deltas ahead of it (one without a thread moves all of them);
only a response (``{"id":...``) may pass waiting deltas. So under a backlog an interrupt's answer
and a turn's terminal notification are not queued behind other threads' text, and a new turn's
first delta waits for one round of the lanes, not for the whole backlog.
"""

from __future__ import annotations

import collections
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
#: Bytes of queued lines taken for one write at most (before a backlog's deltas are merged).
_WRITE_CHUNK = 1 << 20
#: How a response (or a server-initiated request) line starts: it may pass waiting deltas.
_RESPONSE_PREFIX = b'{"id":'


class Outbox:
    """Bounded queue of encoded lines for one client, drained by :meth:`run_writer`.

    Args:
        capacity: lines that may wait (bounded).
        on_overflow: called once when a line does not fit (the slow-consumer policy).
        coalesce: merges a backlog's deltas (``lines -> lines``, order kept), applied to a batch
            of at least :data:`~roost.protocol._coalesce.COALESCE_AFTER` waiting lines; None
            writes every line as it is.
        lanes: ``line -> thread key or None`` for the lines ``coalesce`` would merge (its
            ``prefixes``); given, deltas wait in per-thread lanes behind control (module doc).
    """

    def __init__(self, capacity: int = DEFAULT_OUTBOX_LINES, *, on_overflow: Callable[[], None] | None = None,
                 coalesce: Callable[[list[bytes]], list[bytes]] | None = None,
                 lanes: Callable[[bytes], bytes | None] | None = None):
        self.capacity = capacity
        self._on_overflow = on_overflow
        self._coalesce = coalesce
        self._lane_of = lanes
        self._delta_prefixes: tuple[bytes, ...] = getattr(coalesce, "prefixes", ()) if lanes else ()
        self._control: collections.deque[bytes] = collections.deque()
        self._lanes: dict[bytes, list[bytes]] = {}  # insertion order = round-robin order
        self._queued = 0
        self._wake = trio.Event()
        #: lines merged away by ``coalesce`` so far
        self.coalesced = 0
        self.overflowed = False
        self.closed = False

    def deliver(self, line: bytes) -> None:
        """Queue ``line`` (bytes ending in ``\\n``) without blocking; drops it if closed/overflowed."""
        if self.closed or self.overflowed:
            return
        if self._queued >= self.capacity:
            self.overflowed = True
            log.warning("slow consumer: outbox full; closing the connection")
            if self._on_overflow is not None:
                self._on_overflow()
            return
        if self._queued > _TRIM_AFTER:
            # A backlog: keep only the line's bytes (orjson's output buffer is often 4 KiB).
            line = bytes(memoryview(line))
        self._queued += 1
        if self._delta_prefixes and self._lanes_take(line):
            pass
        else:
            self._control.append(line)
        self._wake.set()

    def _lanes_take(self, line: bytes) -> bool:
        """Put a delta in its thread's lane (True), or make way for a control line (False)."""
        assert self._lane_of is not None
        if line.startswith(self._delta_prefixes):
            key = self._lane_of(line)
            if key is not None:
                lane = self._lanes.get(key)
                if lane is None:
                    self._lanes[key] = [line]
                else:
                    lane.append(line)
                return True
        if self._lanes and not line.startswith(_RESPONSE_PREFIX):
            key = self._lane_of(line)
            if key is None:  # about no one thread: everything waiting goes first
                for waiting in self._lanes.values():
                    self._control.extend(waiting)
                self._lanes.clear()
            else:
                self._control.extend(self._lanes.pop(key, ()))
        return False

    def close(self) -> None:
        """No more lines; the writer drains what is queued and returns. Idempotent."""
        self.closed = True
        self._wake.set()

    def _take(self) -> list[bytes]:
        """Up to :data:`_WRITE_CHUNK` bytes: control lines first, then whole lanes round-robin."""
        batch: list[bytes] = []
        size = 0
        control = self._control
        while control and size < _WRITE_CHUNK:
            line = control.popleft()
            batch.append(line)
            size += len(line)
        lanes = self._lanes
        while lanes and size < _WRITE_CHUNK:
            key = next(iter(lanes))
            lane = lanes.pop(key)
            batch.extend(lane)
            size += sum(map(len, lane))
        self._queued -= len(batch)
        return batch

    async def run_writer(self, stream: trio.abc.SendStream) -> None:
        """Send queued lines to ``stream`` until :meth:`close`, coalescing bursts into one write.

        Raises:
            trio.BrokenResourceError: the peer went away.
        """
        while True:
            if not self._queued:
                if self.closed:
                    return
                self._wake = trio.Event()
                await self._wake.wait()
                continue
            batch = self._take()
            if self._coalesce is not None and len(batch) >= COALESCE_AFTER:
                merged = self._coalesce(batch)
                self.coalesced += len(batch) - len(merged)
                batch = merged
            await stream.send_all(b"".join(batch) if len(batch) > 1 else batch[0])
