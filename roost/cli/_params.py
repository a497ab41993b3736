"""Click parameter types shared by the commands.

`PROCESS_COUNT` is a count of processes: a whole number >= 1 or ``auto`` (one per usable core).

`SECONDS` is a duration option's type: a finite number of seconds, zero or more. `click.FloatRange(0)`
alone lets ``nan`` through (every comparison with NaN is false) and ``inf``, which trio would take as
"wait forever" without the user ever having asked for that.
"""

from __future__ import annotations

import math
import os

import click


class Seconds(click.ParamType):
    """A finite, non-negative number of seconds (float).

    Raises:
        click.BadParameter: through ``self.fail``, for text that is not a number, NaN, infinity or a
            negative value; click prints it as a usage error (exit status 2).
    """

    name = "seconds"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """Return ``value`` as a float, or fail with a message that names the accepted range."""
        if isinstance(value, float | int) and not isinstance(value, bool):
            number = float(value)
        else:
            try:
                number = float(str(value))
            except ValueError:
                self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(number) or number < 0:
            self.fail(f"{value!r} is not a finite number of seconds >= 0", param, ctx)
        return number


SECONDS = Seconds()


def usable_cores() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``, else ``os.cpu_count()``), >= 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class ProcessCount(click.ParamType):
    """A number of processes: an integer >= 1, or ``auto`` for one per usable core
    (:func:`usable_cores`).

    Raises:
        click.BadParameter: through ``self.fail``, for anything else (exit status 2).
    """

    name = "N|auto"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Return ``value`` as a count of processes, ``auto`` resolved to the usable cores."""
        if isinstance(value, int) and not isinstance(value, bool):
            count = value
        elif str(value).strip().lower() == "auto":
            return usable_cores()
        else:
            try:
                count = int(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not a whole number of processes (>= 1) or 'auto'", param, ctx)
        if count < 1:
            self.fail(f"{value!r} is not a whole number of processes >= 1 (or 'auto')", param, ctx)
        return count


PROCESS_COUNT = ProcessCount()
