"""Cron semantics and slot math for schedules (pure; may import storage, never actors).

See :mod:`roost.scheduling._cron` for the rules (5 fields, UTC only, vixie day-of-month /
day-of-week combination).
"""

from __future__ import annotations

from roost.scheduling._clock import Clock as Clock
from roost.scheduling._clock import ManualClock as ManualClock
from roost.scheduling._clock import SystemClock as SystemClock
from roost.scheduling._cron import CronExpr as CronExpr
from roost.scheduling._cron import InvalidCron as InvalidCron
from roost.scheduling._cron import NeverFires as NeverFires
from roost.scheduling._cron import format_slot as format_slot
from roost.scheduling._cron import parse_cron as parse_cron
from roost.scheduling._cron import parse_slot as parse_slot

__all__ = ["Clock", "ManualClock", "SystemClock", "CronExpr", "InvalidCron", "NeverFires", "parse_cron", "format_slot", "parse_slot"]

for _name in __all__:
    globals()[_name].__module__ = __name__
