"""Bounded slices for streams, so control work stays ahead of data when the runtime is saturated.

DESIGN.md section 4, "Control before data": no stream may hold the event loop for more than a
bounded slice. An engine's event stream often hands over many events without a checkpoint (an
HTTP chunk holds hundreds of SSE events; the scripted engine's reply has none between its
deltas), and trio runs every runnable task once per scheduler batch before it polls for I/O
again. With 100 turns streaming, one batch held 100 replies' worth of work, and every hop of an
interrupt (request read, the thread's handler, the turn's clean-up, the settle write, the
terminal line) waited a whole batch: hundreds of milliseconds (issue 19).

:class:`FairEvents` wraps a stream. After each :data:`SLICE_S` of work it yields, and while
streams are queued or the batch's data budget (:data:`BUDGET_S`) is spent it parks in one FIFO
shared by every stream of the trio run; a pump (a system task that runs once per batch) admits
:data:`ADMIT` parked streams per batch. A batch therefore does at most about ``BUDGET_S`` of
streaming work, the rest of it is control (which is never gated), and streams take turns in
arrival order. A stream's first event is never queued (a new turn's first delta is admission,
not bulk data), and time spent waiting for the network is not work. Cancellation (an
interrupt) reaches a parked stream at once.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import Generic, TypeVar

import trio

__all__ = ["ADMIT", "BUDGET_S", "SLICE_S", "FairEvents"]

T = TypeVar("T")

#: Seconds of work a stream does before it yields.
SLICE_S = 0.00025
#: Seconds of streaming work per scheduler batch before further streams park.
BUDGET_S = 0.0005
#: Parked streams the pump admits per scheduler batch.
ADMIT = 2
#: A wait for the next event longer than this (seconds) was a real wait (I/O), not work.
_WAITED_S = 0.0001
_clock = time.perf_counter


class _Gate:
    """One trio run's FIFO of parked streams and the data budget of the current batch."""

    def __init__(self) -> None:
        self.lot = trio.lowlevel.ParkingLot()
        self.spent = 0.0
        self._wake = trio.Event()
        self._pumping = False

    def congested(self) -> bool:
        return bool(self.lot) or self.spent >= BUDGET_S

    async def turn(self, used: float) -> None:
        """Account ``used`` seconds of work, then yield: a plain checkpoint when nothing is
        queued and the budget holds, else park until the pump admits this stream (FIFO).

        Cancellation: a checkpoint; a parked stream leaves the queue when cancelled.
        """
        self.spent += used
        if not self.congested():
            await trio.lowlevel.checkpoint()
            return
        if not self._pumping:
            self._pumping = True
            trio.lowlevel.spawn_system_task(self._pump, name="roost.fair-pump")
        self._wake.set()
        await self.lot.park()

    async def _pump(self) -> None:
        """Once per scheduler batch: reset the budget, admit :data:`ADMIT` parked streams."""
        while True:
            if not self.lot:
                self.spent = 0.0
                self._wake = trio.Event()
                await self._wake.wait()
            self.spent = 0.0
            self.lot.unpark(count=ADMIT)
            await trio.lowlevel.checkpoint()


_GATE: trio.lowlevel.RunVar[_Gate] = trio.lowlevel.RunVar("roost_fair_gate")


def _gate() -> _Gate:
    try:
        return _GATE.get()
    except LookupError:
        gate = _Gate()
        _GATE.set(gate)
        return gate


class FairEvents(Generic[T]):
    """An async iterator over ``events`` that yields the event loop in bounded slices.

    Args:
        events: the stream (e.g. an engine's event stream); it is not closed by this wrapper
            (close it where it was opened).

    Iterating is a checkpoint whenever the wrapped stream's ``__anext__`` is, and at least every
    :data:`SLICE_S` seconds of the consumer's and the stream's combined work.
    """

    __slots__ = ("_events", "_start")

    def __init__(self, events: AsyncIterable[T]) -> None:
        self._events: AsyncIterator[T] = events.__aiter__()
        #: when the current slice began (after the last yield or wait); None before the first event
        self._start: float | None = None

    def __aiter__(self) -> FairEvents[T]:
        return self

    async def __anext__(self) -> T:
        # A slice's work is the clock since it began (the consumer's handling of each event and
        # the stream's own): a wait starts a fresh slice, so no wait is counted as work.
        now = _clock()
        start = self._start
        first = start is None
        if start is None:
            start = now
        elif now - start >= SLICE_S:
            await _gate().turn(now - start)
            now = start = _clock()
        event = await self._events.__anext__()
        got = _clock()
        if got - now > _WAITED_S:
            # It waited (the network): the loop ran others meanwhile; a fresh slice, in turn.
            if not first:
                gate = _gate()
                if gate.congested():
                    await gate.turn(0.0)
                    got = _clock()
            start = got
        self._start = start
        return event
