"""Cron semantics and slot math for schedules (pure; may import storage, never actors).

See :mod:`roost.scheduling._cron` for the rules (5 fields, UTC only, vixie day-of-month /
day-of-week combination).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roost._lazy import attach as _attach
from roost._lazy import publish as _publish
from roost.scheduling._clock import Clock as Clock
from roost.scheduling._clock import ManualClock as ManualClock
from roost.scheduling._clock import SystemClock as SystemClock

if TYPE_CHECKING:
    from roost.scheduling._cron import CronExpr as CronExpr
    from roost.scheduling._cron import InvalidCron as InvalidCron
    from roost.scheduling._cron import NeverFires as NeverFires
    from roost.scheduling._cron import format_slot as format_slot
    from roost.scheduling._cron import parse_cron as parse_cron
    from roost.scheduling._cron import parse_slot as parse_slot

#: The cron exports import croniter (and dateutil): loaded on first access (PEP 562), so a runtime
#: that never parses a schedule (the app-server) does not pay for them at start-up (issue 19).
_LAZY = {
    name: "roost.scheduling._cron"
    for name in ("CronExpr", "InvalidCron", "NeverFires", "format_slot", "parse_cron", "parse_slot")
}

__all__ = [
    "Clock",
    "ManualClock",
    "SystemClock",
    "CronExpr",
    "InvalidCron",
    "NeverFires",
    "parse_cron",
    "format_slot",
    "parse_slot",
]


def _fix_module_metadata(names: list[str]) -> None:
    _publish(globals(), names)


__getattr__, __dir__ = _attach(globals(), _LAZY, on_load=_fix_module_metadata)
_fix_module_metadata(["Clock", "ManualClock", "SystemClock"])
