"""Supervision: child specs, restart strategies and intensity, ordered start and stop.

``open_runtime`` (the root tree) composes the domain actors, some of which are supervisors
themselves (the thread registry), so it is imported on first use: ``import roost.supervisor``
gives the kernel without importing ``roost.actors``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from roost.supervisor._spec import ChildSpec as ChildSpec
from roost.supervisor._spec import Restart as Restart
from roost.supervisor._spec import StartFn as StartFn
from roost.supervisor._spec import Strategy as Strategy
from roost.supervisor._supervisor import ChildInfo as ChildInfo
from roost.supervisor._supervisor import Supervisor as Supervisor

if TYPE_CHECKING:
    from roost.supervisor._root import open_runtime as open_runtime

__all__ = ["ChildSpec", "ChildInfo", "Restart", "StartFn", "Strategy", "Supervisor", "open_runtime"]

for _name in __all__[:-1]:
    globals()[_name].__module__ = __name__


def __getattr__(name: str) -> Any:
    """Import the root tree (``open_runtime``) on first use; see the module docstring."""
    if name == "open_runtime":
        from roost.supervisor._root import open_runtime

        return open_runtime
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
