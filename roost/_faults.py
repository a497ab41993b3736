"""Fault injection for crash tests (test-only): named fault points that raise on demand.

A fault point is a one-line call, ``fault_point("turn")``, placed where a component may crash
safely for a test (between two units of its work). It costs one dict lookup when nothing is armed.
Arm points with :func:`arm_fault` (the test API) or, for a real ``roost`` process, with the
test-only environment variable ``ROOST_FAULT_INJECT``: a comma-separated list of ``point`` or
``point@N`` (crash at the N-th hit of ``point``; default the first), read by
:func:`load_fault_env` at start-up. Each armed point fires once, raising :class:`InjectedFault`.

Known points: ``turn`` (a turn's streamed engine event), ``store_writer`` (between two commit
groups), ``lease_keeper`` (before a renewal), ``scheduler`` (before a due slot is claimed),
``task_queue`` (before a queued task starts), ``connection`` (before a client's input line is
handled; an app-server ``initialize`` answered before the event loop counts as its first line).
Supervised children can also be crashed by path with :meth:`roost.supervisor.Supervisor.inject_fault`.

Never set ``ROOST_FAULT_INJECT`` in production: it exists so end-to-end tests can crash parts of
a real process deterministically.

A second, process-level form serves the crash tests of the soak suite: ``ROOST_FAULTS`` (also
test-only) is a comma-separated list of ``point=action`` applied by :func:`point`, with the actions
``kill`` (the process SIGKILLs itself exactly there), ``stall`` (the calling thread blocks for an
hour: a process frozen there) and ``raise`` (the first pass raises :class:`InjectedFault`). Its
points: ``runtime.opened`` (a runtime's store just opened, before anything else starts),
``tool.spawned`` (a shell tool's ``sh`` was just forked), ``process.spawned`` (a background
process's ``sh`` was just forked, before its row), ``task.running`` (a daemon task was just
committed as ``running``), ``run.accepted`` (a ``run/start`` run row was just committed as
``accepted``), ``schedule.claimed`` (a schedule run was just claimed, before its dispatch),
``schedule.running`` (a schedule run was just recorded ``running`` with its task) and
``thread.<Message>`` (a thread actor is about to handle a message of that class, e.g.
``thread.StartTurn``). This makes "a kill lands just after X" deterministic (issue 18, findings 2
and 3) instead of hoping a random kill lands there.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time

__all__ = [
    "FAULT_ENV",
    "InjectedFault",
    "arm_fault",
    "armed_faults",
    "disarm_faults",
    "fault_point",
    "load_fault_env",
    "point",
]

#: The test-only environment variable naming fault points to arm at start-up.
FAULT_ENV = "ROOST_FAULT_INJECT"

log = logging.getLogger("roost.supervisor")

#: point -> hits left before it fires (1 = the next hit)
_armed: dict[str, int] = {}


class InjectedFault(RuntimeError):
    """The crash raised by an armed fault point or :meth:`Supervisor.inject_fault` (tests only)."""


def arm_fault(point: str, *, after: int = 1) -> None:
    """Arm ``point`` to raise :class:`InjectedFault` at its ``after``-th hit from now (once).

    Raises:
        ValueError: ``after`` is below 1 or ``point`` is empty.
    """
    if after < 1 or not point:
        raise ValueError("a fault point needs a name and after >= 1")
    _armed[point] = after


def armed_faults() -> frozenset[str]:
    """The fault points armed and not fired yet."""
    return frozenset(_armed)


def disarm_faults() -> None:
    """Disarm every fault point."""
    _armed.clear()


def fault_point(point: str) -> None:
    """Raise :class:`InjectedFault` if ``point`` is armed and its count is reached (then disarm it)."""
    if not _armed:
        return
    left = _armed.get(point)
    if left is None:
        return
    if left > 1:
        _armed[point] = left - 1
        return
    del _armed[point]
    log.warning("fault injection: crashing at point %s", point)
    raise InjectedFault(f"injected fault at {point}")


def load_fault_env(environ: dict[str, str] | None = None) -> list[str]:
    """Arm the points named by ``$ROOST_FAULT_INJECT`` (``point[@N],...``); return their names.

    Malformed entries are logged and skipped (a test helper must never stop a process).
    """
    raw = (os.environ if environ is None else environ).get(FAULT_ENV, "")
    armed = []
    for entry in filter(None, (part.strip() for part in raw.split(","))):
        point, _, count = entry.partition("@")
        try:
            arm_fault(point, after=int(count) if count else 1)
        except ValueError:
            log.warning("%s: ignored malformed entry %r", FAULT_ENV, entry)
            continue
        armed.append(point)
    return armed


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
