"""Click parameter types shared by the commands.

`PROCESS_COUNT` is a count of processes: a whole number >= 1 or ``auto`` (one per usable core).

`SECONDS` is a duration option's type: a finite number of seconds, zero or more. `click.FloatRange(0)`
alone lets ``nan`` through (every comparison with NaN is false) and ``inf``, which trio would take as
"wait forever" without the user ever having asked for that.
"""

from __future__ import annotations

import math
from typing import NoReturn

import click
from click.core import ParameterSource

from roost._paths import usable_cores


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


#: Most processes per usable core a process count may ask for (more only contend for the cores).
PROCESSES_PER_CORE = 4
#: The bound on a process count is never below this many, so small machines can still test with a few.
MIN_PROCESS_BOUND = 8


def max_processes() -> int:
    """The most processes a count may ask for: :data:`PROCESSES_PER_CORE` per usable core, at
    least :data:`MIN_PROCESS_BOUND`."""
    return max(MIN_PROCESS_BOUND, PROCESSES_PER_CORE * usable_cores())


class ProcessCount(click.ParamType):
    """A number of processes: a whole number from 1 to :func:`max_processes`, or ``auto`` for one
    per usable core (:func:`usable_cores`).

    Raises:
        click.BadParameter: through ``self.fail``, for anything else (exit status 2); the message
            names the accepted values (a process count past the bound would start thousands of
            processes and fail on open files, after the daemon had reported itself listening).
    """

    name = "N|auto"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Return ``value`` as a count of processes, ``auto`` resolved to the usable cores."""
        bound = max_processes()
        accepted = f"a whole number of processes from 1 to {bound} ({usable_cores()} usable cores here), or 'auto'"
        if isinstance(value, int) and not isinstance(value, bool):
            count = value
        elif str(value).strip().lower() == "auto":
            return usable_cores()
        else:
            try:
                count = int(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not {accepted}", param, ctx)
        if not 1 <= count <= bound:
            self.fail(f"{value!r} is not {accepted}", param, ctx)
        return count

    def fail(self, message: str, param: click.Parameter | None = None, ctx: click.Context | None = None) -> NoReturn:
        """:meth:`click.ParamType.fail`, naming the environment variable when the value came from it."""
        envvar = getattr(param, "envvar", None)
        if (
            ctx is not None
            and param is not None
            and param.name
            and isinstance(envvar, str)
            and ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT
        ):
            message = f"{message} (from {envvar})"
        super().fail(message, param, ctx)


PROCESS_COUNT = ProcessCount()
