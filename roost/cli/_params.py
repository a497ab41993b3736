"""Click parameter types shared by the commands.

`SECONDS` is a duration option's type: a finite number of seconds, zero or more. `click.FloatRange(0)`
alone lets ``nan`` through (every comparison with NaN is false) and ``inf``, which trio would take as
"wait forever" without the user ever having asked for that.
"""

from __future__ import annotations

import math

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
