"""Running a command's trio main with the errors a user should see as one line, not a traceback."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

import click
import trio

from roost.cli._res_common import EXIT_SETUP
from roost.errors import RoostError
from roost.protocol import silence_stdout

__all__ = ["run_main", "EXIT_SETUP", "leaf_exception"]


def leaf_exception(exc: BaseException) -> BaseException:
    """The single exception inside (nested) one-item exception groups, or ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def run_main(main: Callable[[], Awaitable[Any]], *, command: str) -> Any:
    """``trio.run(main)``, turning the expected failures into a message and an exit status.

    * :class:`~roost.errors.RoostError` (bad configuration, unusable ROOST_HOME or database):
      ``roost COMMAND: error: ...`` on stderr, exit status :data:`EXIT_SETUP`.
    * ``BrokenPipeError`` (the reader of stdout went away, e.g. ``| head``): quiet exit 0.

    Returns:
        What ``main`` returned.
    """
    try:
        return trio.run(main)
    except BaseException as exc:  # noqa: BLE001 - re-raised unless it is one of the cases above
        leaf = leaf_exception(exc)
        if isinstance(leaf, BrokenPipeError):
            silence_stdout()
            sys.exit(0)
        if isinstance(leaf, RoostError):
            click.echo(f"roost {command}: error: {leaf}", err=True)
            sys.exit(EXIT_SETUP)
        raise
