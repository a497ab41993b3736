"""Shared plumbing of the ``--json`` resource queries: envelopes on stdout, the store, failures.

A query prints exactly one line on stdout with ``--json`` (wire-protocol.md "Resource queries"):
the items or item envelope, or on failure the error envelope and exit status 1. Diagnostics go to
stderr. Without ``--json`` the output is readable text and failures are one line on stderr.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

import click

from roost.protocol import error_envelope, item_envelope, items_envelope

__all__ = ["json_option", "emit_items", "emit_item", "fail", "open_cli_store"]

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one wire-protocol JSON line on stdout (protocolVersion 1)."
)


def _write(line: bytes) -> None:
    sys.stdout.buffer.write(line)
    sys.stdout.flush()


def emit_items(items: Iterable[Any]) -> None:
    """Print the ``items`` envelope line."""
    _write(items_envelope(list(items)))


def emit_item(item: Any) -> None:
    """Print the ``item`` envelope line."""
    _write(item_envelope(item))


def fail(command: str, message: str, *, as_json: bool) -> NoReturn:
    """Report a failure and exit with status 1: the error envelope with ``--json``, else stderr."""
    if as_json:
        _write(error_envelope(message))
    else:
        click.echo(f"roost {command}: {message}", err=True)
    sys.exit(1)


@contextlib.contextmanager
def open_cli_store() -> Iterator[Any]:
    """Open the configured store for one command (:func:`roost.storage.open_backend`: the
    PostgreSQL database of ``--database-url``/``$ROOST_DATABASE_URL``, else
    ``$ROOST_HOME/roost.db``, created and migrated on first use); blocking.

    Reads use ``store.read()``; a command's writes use ``store.transaction()`` (on SQLite
    ``BEGIN IMMEDIATE``, competing for the write lock like any other process).

    Raises:
        StoreError: the database cannot be opened or migrated.
    """
    from roost.storage import open_backend

    store = open_backend(read_only_ok=True)  # reads work on a read-only home
    try:
        yield store
    finally:
        store.close()
