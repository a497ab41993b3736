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

Bounds (issue 18, finding 5): an outbox holds at most ``capacity`` lines *and* ``max_bytes``
bytes (a single line larger than that still passes when nothing else waits, so the longest
allowed line can be sent). A burst over ``max_bytes`` is not slowness by itself: one turn with a
large input echoes it in its response and in several notifications at once (a 7 MB prompt makes
about 30 MB of lines in the same instant), so the byte bound trips only when the backlog has stayed
over it for ``over_grace_s`` seconds (the client does not keep up), or at once past
:data:`HARD_BYTES_FACTOR` times ``max_bytes`` (the memory one client may hold). With
``stall_timeout_s`` a writer that makes no progress for that long (the peer reads nothing) also
counts as a slow consumer. Either way :attr:`Outbox.reason` says why,
and ``on_overflow`` is called once. After a backlog of more than :data:`_TRIM_AFTER_BYTES` drains,
freed memory is handed back to the OS (glibc ``malloc_trim``), so one large reply does not leave
the process holding its peak.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import trio

from roost._heap import release_memory
from roost._paths import positive_env
from roost.protocol._coalesce import COALESCE_AFTER

__all__ = [
    "Outbox",
    "DEFAULT_OUTBOX_LINES",
    "DEFAULT_OUTBOX_BYTES",
    "DEFAULT_STALL_TIMEOUT_S",
    "DEFAULT_OVER_GRACE_S",
    "HARD_BYTES_FACTOR",
    "outbox_bytes_from_env",
    "stall_timeout_from_env",
    "release_memory",
]

log = logging.getLogger("roost.protocol")

#: Lines an outbox holds before its client counts as a slow consumer.
DEFAULT_OUTBOX_LINES = 65536
#: Bytes an outbox holds before its client counts as a slow consumer (``ROOST_OUTBOX_BYTES``).
DEFAULT_OUTBOX_BYTES = 16 << 20
#: Seconds a socket client's writer may make no progress before the client is disconnected
#: (``ROOST_OUTBOX_STALL_S``).
DEFAULT_STALL_TIMEOUT_S = 30.0
#: Seconds a backlog may stay over ``max_bytes`` before its client counts as a slow consumer.
DEFAULT_OVER_GRACE_S = 5.0
#: A backlog past this many times ``max_bytes`` makes its client a slow consumer at once.
HARD_BYTES_FACTOR = 8
#: A drained backlog larger than this (bytes) hands freed memory back to the OS.
_TRIM_AFTER_BYTES = 4 << 20
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
        max_bytes: bytes that may wait (default ``ROOST_OUTBOX_BYTES`` or 16 MiB) for longer
            than ``over_grace_s`` seconds, and at most :data:`HARD_BYTES_FACTOR` times that.
        stall_timeout_s: seconds a write may make no progress before the client is a slow
            consumer (None: no limit).
        over_grace_s: seconds the backlog may stay over ``max_bytes`` (module doc).
    """

    def __init__(
        self,
        capacity: int = DEFAULT_OUTBOX_LINES,
        *,
        on_overflow: Callable[[], None] | None = None,
        coalesce: Callable[[list[bytes]], list[bytes]] | None = None,
        lanes: Callable[[bytes], bytes | None] | None = None,
        max_bytes: int | None = None,
        stall_timeout_s: float | None = None,
        over_grace_s: float = DEFAULT_OVER_GRACE_S,
    ):
        self.capacity = capacity
        self._on_overflow = on_overflow
        #: most bytes that may wait (``ROOST_OUTBOX_BYTES`` or 16 MiB when not given)
        self.max_bytes = outbox_bytes_from_env() if max_bytes is None else max_bytes
        #: seconds without write progress before the client is a slow consumer (None: no limit)
        self.stall_timeout_s = stall_timeout_s
        self.over_grace_s = over_grace_s
        #: ``time.monotonic()`` when the backlog went over ``max_bytes`` (None: it is not over)
        self._over_since: float | None = None
        #: bytes queued and not yet taken by the writer
        self.queued_bytes = 0
        #: the largest ``queued_bytes`` since the last trim
        self.peak_bytes = 0
        #: why the outbox gave up on its client ("" while it has not)
        self.reason = ""
        self._coalesce = coalesce
        self._lane_of = lanes
        self._delta_prefixes: tuple[bytes, ...] = getattr(coalesce, "prefixes", ()) if lanes else ()
        self._control: collections.deque[bytes] = collections.deque()
        self._lanes: dict[bytes, list[bytes]] = {}  # insertion order = round-robin order
        self._queued = 0
        self._wake = trio.Event()
        self._writer_waiting = False  # the writer waits on ``_wake`` for a line
        self._drained = trio.Event()  # set after each write (see wait_room)
        #: lines merged away by ``coalesce`` so far
        self.coalesced = 0
        self.overflowed = False
        self.closed = False

    def deliver(self, line: bytes) -> None:
        """Queue ``line`` (bytes ending in ``\\n``) without blocking; drops it if closed/overflowed."""
        if self.closed or self.overflowed:
            return
        if self._queued >= self.capacity:
            self._give_up(f"outbox full ({self.capacity} lines)")
            return
        size = len(line)
        if self.queued_bytes and self.queued_bytes + size > self.max_bytes and self._over_bound(size):
            return
        if self._queued > _TRIM_AFTER:
            # A backlog: keep only the line's bytes (orjson's output buffer is often 4 KiB).
            line = bytes(memoryview(line))
        self._queued += 1
        queued = self.queued_bytes = self.queued_bytes + size
        if queued > self.peak_bytes:
            self.peak_bytes = queued
        prefixes = self._delta_prefixes
        key = None
        if prefixes and line.startswith(prefixes):
            assert self._lane_of is not None
            key = self._lane_of(line)
        if key is not None:  # a delta waits in its thread's lane
            lane = self._lanes.get(key)
            if lane is None:
                self._lanes[key] = [line]
            else:
                lane.append(line)
        else:
            if self._lanes:
                self._make_way(line)
            self._control.append(line)
        if self._writer_waiting:  # a check, not a call, per line
            self._writer_waiting = False
            self._wake.set()

    def _over_bound(self, size: int) -> bool:
        """A line of ``size`` bytes takes the backlog over ``max_bytes``: give up (and return True)
        if it has been over for ``over_grace_s`` seconds, or would pass the hard bound."""
        now = time.monotonic()
        if self._over_since is None:
            self._over_since = now
        if self.queued_bytes + size > self.max_bytes * HARD_BYTES_FACTOR:
            self._give_up(f"outbox over {self.max_bytes * HARD_BYTES_FACTOR} bytes")
            return True
        if now - self._over_since >= self.over_grace_s:
            self._give_up(f"outbox over {self.max_bytes} bytes for {self.over_grace_s:g} s")
            return True
        return False

    def _make_way(self, line: bytes) -> None:
        """Before control ``line`` is queued: move the deltas it must not pass ahead of it."""
        assert self._lane_of is not None
        if not line.startswith(_RESPONSE_PREFIX):
            key = self._lane_of(line)
            if key is None:  # about no one thread: everything waiting goes first
                for waiting in self._lanes.values():
                    self._control.extend(waiting)
                self._lanes.clear()
            else:
                self._control.extend(self._lanes.pop(key, ()))

    def deliver_chunk(self, chunk: bytes) -> None:
        """Queue ``chunk``, whole lines already encoded elsewhere (an app-server worker process's
        output, :mod:`roost.protocol._as_workers`), as one control entry: written in order after
        what waits in the FIFO, never coalesced or split into lanes. Callers bound what waits
        with :meth:`wait_room` (backpressure on the producer), never with the overflow policy."""
        if self.closed or self.overflowed or not chunk:
            return
        self._queued += 1
        queued = self.queued_bytes = self.queued_bytes + len(chunk)
        if queued > self.peak_bytes:
            self.peak_bytes = queued
        self._control.append(_Chunk(chunk))
        if self._writer_waiting:
            self._writer_waiting = False
            self._wake.set()

    async def wait_room(self, max_bytes: int) -> None:
        """Wait until at most ``max_bytes`` bytes wait (returns at once when closed/overflowed).
        Woken after each write of the writer; producers waiting at once share one event."""
        while self.queued_bytes > max_bytes and not (self.closed or self.overflowed):
            if self._drained.is_set():  # a fresh event, shared by every producer waiting now
                self._drained = trio.Event()
            await self._drained.wait()

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
        self._over_since = None
        self._control.clear()
        self._lanes.clear()
        self._queued = 0
        self.queued_bytes = 0
        self._wake.set()
        self._drained.set()
        self._maybe_trim()

    def _maybe_trim(self) -> None:
        if self.peak_bytes > _TRIM_AFTER_BYTES and self.queued_bytes == 0:
            self.peak_bytes = 0
            release_memory()

    def close(self) -> None:
        """No more lines; the writer drains what is queued and returns. Idempotent."""
        self.closed = True
        self._wake.set()
        self._drained.set()

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
        self.queued_bytes = max(0, self.queued_bytes - size)
        if self.queued_bytes <= self.max_bytes:
            self._over_since = None
        return batch

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
        while True:
            if not self._queued:
                if self.closed:
                    return
                self._wake = trio.Event()
                self._writer_waiting = True
                await self._wake.wait()
                continue
            batch = self._take()
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
            self._drained.set()
            self._maybe_trim()


class _Chunk(bytes):
    """Lines encoded elsewhere, queued as one entry (:meth:`Outbox.deliver_chunk`): no line
    prefix matches it, so a coalescer passes it through untouched."""

    def startswith(self, *args: Any, **kwargs: Any) -> bool:
        return False


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def outbox_bytes_from_env() -> int:
    """``ROOST_OUTBOX_BYTES`` (a positive integer) or :data:`DEFAULT_OUTBOX_BYTES`."""
    return int(positive_env("ROOST_OUTBOX_BYTES", DEFAULT_OUTBOX_BYTES, integer=True, unit="bytes"))


def stall_timeout_from_env() -> float:
    """``ROOST_OUTBOX_STALL_S`` (positive seconds) or :data:`DEFAULT_STALL_TIMEOUT_S`."""
    try:
        value = float(os.environ.get("ROOST_OUTBOX_STALL_S") or DEFAULT_STALL_TIMEOUT_S)
    except ValueError:
        return DEFAULT_STALL_TIMEOUT_S
    return value if value > 0 else DEFAULT_STALL_TIMEOUT_S
