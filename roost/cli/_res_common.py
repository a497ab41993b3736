"""Shared plumbing of the ``--json`` resource queries: envelopes on stdout, the store, failures.

A query prints exactly one line on stdout with ``--json`` (wire-protocol.md "Resource queries"):
the items or item envelope, or on failure the error envelope and exit status 1. Diagnostics go to
stderr. Without ``--json`` the output is readable text and failures are one line on stderr: exit
status 1, or 2 (:data:`EXIT_SETUP`, like ``roost status``/``exec``) when ROOST_HOME, the database or
the configuration is unusable (:func:`fail_setup`). A closed stdout is a quiet exit 0 (like
:func:`roost.cli._runner.run_main`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

import click

from roost.protocol import error_envelope, item_envelope, items_envelope, silence_stdout

__all__ = [
    "json_option",
    "emit_items",
    "emit_item",
    "fail",
    "fail_setup",
    "is_setup_error",
    "open_cli_store",
    "write_line",
    "EXIT_SETUP",
]

#: Exit status when Roost cannot work here: ROOST_HOME, the database or the configuration is
#: unusable (every command without ``--json``, :func:`roost.cli._runner.run_main` too; with
#: ``--json`` a resource query exits 1, as wire-protocol.md "Resource queries" fixes it for every
#: failure). Defined here, not in ``_runner``, so that the resource queries need not load trio.
EXIT_SETUP = 2

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one wire-protocol JSON line on stdout (protocolVersion 1)."
)


def write_line(line: bytes) -> None:
    """Write ``line`` to stdout and flush it. When stdout's reader has gone away (a closed pipe,
    ``| head -c 1``) the line is dropped quietly and stdout points at /dev/null from then on: the
    command goes on to its usual exit status (0 for a query that worked, 1 for a failure it
    reports), as :func:`roost.cli._runner.run_main` exits 0 for a closed stdout rather than 1."""
    try:
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()


def emit_items(items: Iterable[Any]) -> None:
    """Print the ``items`` envelope line."""
    write_line(items_envelope(list(items)))


def emit_item(item: Any) -> None:
    """Print the ``item`` envelope line."""
    write_line(item_envelope(item))


def fail(command: str, message: str, *, as_json: bool) -> NoReturn:
    """Report a failure and exit with status 1: the error envelope with ``--json``, else stderr."""
    if as_json:
        write_line(error_envelope(message))
    else:
        click.echo(f"roost {command}: {message}", err=True)
    sys.exit(1)


def fail_setup(command: str, message: str, *, as_json: bool) -> NoReturn:
    """Report that Roost cannot run the command here (ROOST_HOME, the database or the
    configuration is unusable): with ``--json`` the error envelope and exit status 1 (the wire
    protocol's status for every failure), else ``roost COMMAND: error: ...`` on stderr and exit
    status :data:`EXIT_SETUP` (2), the status of ``roost status``, ``exec`` and ``app-server``."""
    if as_json:
        fail(command, message, as_json=True)
    click.echo(f"roost {command}: error: {message}", err=True)
    sys.exit(EXIT_SETUP)


@contextlib.contextmanager
def open_cli_store(command: str | None = None, *, as_json: bool = False) -> Iterator[Any]:
    """Open the configured store for one command (:func:`roost.storage.open_backend`: the
    PostgreSQL database of ``--database-url``/``$ROOST_DATABASE_URL``, else
    ``$ROOST_HOME/roost.db``, created and migrated on first use); blocking.

    Reads use ``store.read()``; a command's writes use ``store.transaction()`` (on SQLite
    ``BEGIN IMMEDIATE``, competing for the write lock like any other process).

    With ``command``, a store that cannot be opened (an unusable ROOST_HOME or database), and a
    :func:`is_setup_error` raised in the block (e.g. a write on a read-only home), are reported by
    :func:`fail_setup` (exit status 2, or 1 with ``as_json``) instead of raised.

    Raises:
        RoostError: (without ``command``) the database cannot be opened or migrated, e.g.
            ConfigError for an unusable ROOST_HOME, StoreError for the database.
    """
    from roost.errors import RoostError
    from roost.storage import open_backend

    try:
        store = open_backend(read_only_ok=True)  # reads work on a read-only home
    except RoostError as exc:
        if command is None:
            raise
        fail_setup(command, str(exc), as_json=as_json)
    try:
        yield store
    except RoostError as exc:
        if command is None or not is_setup_error(exc):
            raise
        fail_setup(command, str(exc), as_json=as_json)
    finally:
        store.close()


def is_setup_error(exc: BaseException) -> bool:
    """Whether ``exc`` says Roost cannot work here rather than that the request failed: an unusable
    ROOST_HOME or configuration (ConfigError), a database setting that cannot be used, a schema
    that cannot be migrated, or a store that refuses writes (a read-only home)."""
    from roost.errors import ConfigError, DatabaseSettingError, MigrationError, StoreReadOnly

    return isinstance(exc, (ConfigError, DatabaseSettingError, MigrationError, StoreReadOnly))
