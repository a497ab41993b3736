"""Clocks for the scheduler: wall-clock UTC (real) and a manual clock for tests and benchmarks.

A clock has ``now() -> datetime`` (aware UTC) and ``async sleep_until(when)``. The scheduler only
reads time through its clock, so a test advances a :class:`ManualClock` and never sleeps for real.
"""

from __future__ import annotations

import datetime
from typing import Protocol

import trio

from roost.errors import UsageError

__all__ = ["Clock", "SystemClock", "ManualClock"]

UTC = datetime.UTC


class Clock(Protocol):
    """What the scheduler needs from time."""

    def now(self) -> datetime.datetime:
        """The current time, aware UTC."""
        ...

    async def sleep_until(self, when: datetime.datetime) -> None:
        """Return at (or after) ``when``; a checkpoint. Cancellation: just stops waiting."""
        ...


class SystemClock:
    """The host's wall clock in UTC.

    Args:
        max_sleep: longest single trio sleep, in seconds. ``sleep_until`` sleeps in steps of at
            most this and re-reads the wall clock, so a wall-clock jump (suspend, NTP step) delays
            a slot by at most ``max_sleep``. This bounds drift; it is not a polling tick (the
            scheduler does no work until the slot).
        offset: seconds added to the wall clock (benchmarks shift time to a minute boundary).
    """

    def __init__(self, *, max_sleep: float = 300.0, offset: float = 0.0) -> None:
        if not max_sleep > 0:
            raise UsageError("max_sleep must be > 0 seconds")
        self.max_sleep = max_sleep
        self.offset = datetime.timedelta(seconds=offset)

    def now(self) -> datetime.datetime:
        return datetime.datetime.now(UTC) + self.offset

    async def sleep_until(self, when: datetime.datetime) -> None:
        while True:
            remaining = (when - self.now()).total_seconds()
            if remaining <= 0:
                await trio.lowlevel.checkpoint()
                return
            await trio.sleep(min(remaining, self.max_sleep))


class ManualClock:
    """A clock that moves only when told (:meth:`advance_to`); sleepers wake when passed.

    Args:
        start: the initial time (aware).
    """

    def __init__(self, start: datetime.datetime) -> None:
        if start.tzinfo is None:
            raise UsageError("ManualClock needs an aware start time")
        self._now = start.astimezone(UTC)
        self._sleepers: dict[trio.Event, datetime.datetime] = {}

    def now(self) -> datetime.datetime:
        return self._now

    @property
    def sleepers(self) -> list[datetime.datetime]:
        """The wake times of the tasks sleeping now, earliest first."""
        return sorted(self._sleepers.values())

    async def sleep_until(self, when: datetime.datetime) -> None:
        if when <= self._now:
            await trio.lowlevel.checkpoint()
            return
        event = trio.Event()
        self._sleepers[event] = when
        try:
            await event.wait()
        finally:
            self._sleepers.pop(event, None)

    def advance_to(self, when: datetime.datetime) -> None:
        """Set the time (never backwards) and wake every sleeper whose time has come."""
        if when < self._now:
            raise UsageError("ManualClock cannot go backwards")
        self._now = when.astimezone(UTC)
        for event, at in list(self._sleepers.items()):
            if at <= self._now:
                event.set()

    def advance(self, **delta: float) -> None:
        """Advance by ``datetime.timedelta(**delta)`` (e.g. ``minutes=1``)."""
        self.advance_to(self._now + datetime.timedelta(**delta))
