"""Fault-injection points for crash tests and the soak suite (``ROOST_FAULTS``).

``ROOST_FAULTS`` is a comma-separated list of ``point=action``; unset (the normal case), every
:func:`point` call is one dictionary lookup that does nothing. Actions:

* ``kill``: the process sends itself SIGKILL at the point (a crash exactly there);
* ``stall``: the calling thread blocks for an hour at the point (a process frozen there, e.g.
  while something else it started runs on);
* ``raise``: the first time the point is reached, it raises :class:`InjectedFault` (a bug
  there: e.g. an actor crash); later passes do nothing.

Points (the place in the code names the moment):

* ``tool.spawned``: a shell tool's ``sh`` was just forked, before anything else happens;
* ``run.accepted``: a ``run/start`` run row was just committed as ``accepted``;
* ``thread.<Message>``: a thread actor is about to handle a message of that class (e.g.
  ``thread.StartTurn``).

This is how a test makes "a kill lands just after X" deterministic (issue 18, findings 2 and 3)
instead of hoping a random kill lands there.
"""

from __future__ import annotations

import functools
import os
import signal
import time

__all__ = ["InjectedFault", "point"]


class InjectedFault(RuntimeError):
    """Raised at a point whose action is ``raise`` (deliberately not a RoostError: a crash)."""


_raised: set[str] = set()


@functools.lru_cache(maxsize=1)
def _actions() -> dict[str, str]:
    spec = os.environ.get("ROOST_FAULTS", "")
    actions: dict[str, str] = {}
    for part in spec.split(","):
        name, sep, action = part.strip().partition("=")
        if sep and name:
            actions[name.strip()] = action.strip()
    return actions


def point(name: str) -> None:
    """Apply the action ``ROOST_FAULTS`` gives for point ``name`` (usually: nothing)."""
    action = _actions().get(name)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # SIGKILL is delivered asynchronously; never run past the point
    elif action == "stall":
        time.sleep(3600)
    elif action == "raise" and name not in _raised:
        _raised.add(name)
        raise InjectedFault(f"fault injected at {name}")
