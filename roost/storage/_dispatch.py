"""The room's public data functions on either backend: each runs the SQLite function for a
``sqlite3.Connection`` and the PostgreSQL one (same name, same arguments) for a psycopg one.

The rest of Roost calls ``roost.storage.get_thread(conn, ...)`` (or submits ``update_thread`` to
the store's writer) on a connection lent by whichever backend is open (:func:`open_backend`), so
one code path serves both. The SQLite functions stay the default and pay one ``isinstance``; the
PostgreSQL modules load on the first psycopg connection (a SQLite-only process never imports
psycopg). Lease functions (:mod:`roost.storage.leases`), reconciliation and the portable modules
(:mod:`roost.storage._portable`) choose for themselves.
"""

from __future__ import annotations

import functools
import importlib
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["by_connection", "PG_MODULES"]

F = TypeVar("F", bound=Callable[..., Any])

#: Where the PostgreSQL function of each name lives (searched in this order).
PG_MODULES = (
    "roost.storage._pg_threads",
    "roost.storage._pg_items",
    "roost.storage._pg_memory",
    "roost.storage._pg_workers",
    "roost.storage._pg_schedules",
    "roost.storage._pg_objectives",
)


def _pg_function(name: str) -> Callable[..., Any]:
    for module_name in PG_MODULES:
        fn = getattr(importlib.import_module(module_name), name, None)
        if fn is not None:
            return cast(Callable[..., Any], fn)
    raise AttributeError(f"no PostgreSQL implementation of roost.storage.{name}")


def by_connection(sqlite_fn: F) -> F:
    """Return ``sqlite_fn`` made backend-generic: called with a psycopg connection, it runs the
    PostgreSQL function of the same name (:data:`PG_MODULES`). ``__wrapped__`` is ``sqlite_fn``.

    Raises (when called):
        AttributeError: no PostgreSQL module defines that name (a programming error).
    """
    pg_fn: Callable[..., Any] | None = None

    @functools.wraps(sqlite_fn)
    def op(conn: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal pg_fn
        if isinstance(conn, sqlite3.Connection):
            return sqlite_fn(conn, *args, **kwargs)
        if pg_fn is None:
            pg_fn = _pg_function(sqlite_fn.__name__)
        return pg_fn(conn, *args, **kwargs)

    return cast(F, op)
