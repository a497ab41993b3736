"""Choosing the backend: the SQLite file by default, PostgreSQL when a database URL is set."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from ._store import open_store

__all__ = ["open_backend", "configured_database_url", "database_label"]
__all__ = ["open_backend", "EarlyStore"]

#: ``_pg_connect.DATABASE_URL_ENV``, named here so a SQLite process never imports psycopg.
_URL_ENV = "ROOST_DATABASE_URL"


def open_backend(database_url: str | None = None, *, path: str | Path | None = None, read_only_ok: bool = False) -> Any:
    """Open the configured store: PostgreSQL for a ``postgresql://`` URL, else the SQLite file.

    The URL comes from ``database_url`` (the ``--database-url`` option), else from
    ``$ROOST_DATABASE_URL``; with neither, the SQLite database at ``path`` (default
    ``$ROOST_HOME/roost.db``) is opened, as before; ``read_only_ok`` is :func:`open_store`'s (a
    reading command on a read-only home gets a read-only store; PostgreSQL ignores it).

    Returns:
        A :class:`PostgresStore` or a SQLite :class:`Store` (both implement
        :class:`StoreBackend`; typed ``Any`` because their connection types differ).

    Raises:
        DatabaseUrlInvalid: the URL is set but is not ``postgresql://...``.
        DatabaseUnreachable, DatabasePermissionDenied, SchemaTooNew, MigrationError: see
            :func:`open_postgres_store`; SQLite's errors: see :func:`open_store`.
    """
    url = configured_database_url(database_url) or ""
    if not url:
        return open_store(path, read_only_ok=read_only_ok)
    from ._pg_connect import SETTING, is_postgres_url, validate_url
    from ._pg_store import open_postgres_store

    if not is_postgres_url(url):
        validate_url(url)  # raises DatabaseUrlInvalid naming the setting
        raise AssertionError(f"{SETTING}: unreachable")
    return open_postgres_store(url)


def configured_database_url(database_url: str | None = None) -> str | None:
    """The database URL :func:`open_backend` uses: ``database_url`` (``--database-url``), else
    ``$ROOST_DATABASE_URL``, stripped; None when neither is set (the SQLite file)."""
    url = (database_url if database_url is not None else os.environ.get(_URL_ENV, "")).strip()
    return url or None


def database_label(home: Path, database_url: str | None = None) -> str:
    """How the database :func:`open_backend` would use is named to a user: the URL with its
    password hidden (:func:`roost.storage.redact_url`), else the SQLite file ``home/roost.db``."""
    url = configured_database_url(database_url)
    if url is None:
        return str(home / "roost.db")
    from ._pg_connect import redact_url

    return redact_url(url)


class EarlyStore:
    """An :func:`open_backend` begun in a daemon thread at construction, so that opening (and, on a
    fresh home, migrating) the store overlaps the rest of a command's start-up: SQLite and fsync
    release the GIL while the main thread goes on importing (issue 19, start-up).

    Calling the instance (blocking: run it in a worker thread from trio) waits for the opening and
    returns the store, or raises what :func:`open_backend` raised; it is meant to be called once
    (``open_runtime(open_store=early)``). A store nobody collects is closed with the process.

    Args:
        database_url, path: as for :func:`open_backend`.
    """

    def __init__(self, database_url: str | None = None, *, path: str | Path | None = None) -> None:
        self._done = threading.Event()
        self._store: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._open, args=(database_url, path), name="roost-open-store", daemon=True
        )
        self._thread.start()

    def _open(self, database_url: str | None, path: str | Path | None) -> None:
        try:
            self._store = open_backend(database_url, path=path)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller of __call__
            self._error = exc
        finally:
            self._done.set()

    def opened(self) -> bool:
        """Wait for the opening; True when it succeeded (calling the instance then returns the store)."""
        self._done.wait()
        return self._error is None

    def __call__(self) -> Any:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._store
