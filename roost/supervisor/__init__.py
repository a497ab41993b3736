"""Supervision: child specs, restart strategies and intensity, ordered start and stop."""

from __future__ import annotations

from roost.supervisor._spec import ChildSpec as ChildSpec
from roost.supervisor._spec import Restart as Restart
from roost.supervisor._spec import StartFn as StartFn
from roost.supervisor._spec import Strategy as Strategy
from roost.supervisor._supervisor import ChildInfo as ChildInfo
from roost.supervisor._supervisor import Supervisor as Supervisor

__all__ = ["ChildSpec", "ChildInfo", "Restart", "StartFn", "Strategy", "Supervisor"]

for _name in __all__:
    globals()[_name].__module__ = __name__
