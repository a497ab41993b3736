"""Choosing the backend: the SQLite file by default, PostgreSQL when a database URL is set."""

from __future__ import annotations

from pathlib import Path

from ._pg_connect import SETTING, database_url_from_env, is_postgres_url, validate_url
from ._pg_store import PostgresStore, open_postgres_store
from ._store import Store, open_store

__all__ = ["open_backend"]


def open_backend(database_url: str | None = None, *, path: str | Path | None = None) -> Store | PostgresStore:
    """Open the configured store: PostgreSQL for a ``postgresql://`` URL, else the SQLite file.

    The URL comes from ``database_url`` (the ``--database-url`` option), else from
    ``$ROOST_DATABASE_URL``; with neither, the SQLite database at ``path`` (default
    ``$ROOST_HOME/roost.db``) is opened, as before.

    Returns:
        A :class:`PostgresStore` (leases only, for now) or a SQLite :class:`Store`.

    Raises:
        DatabaseUrlInvalid: the URL is set but is not ``postgresql://...``.
        DatabaseUnreachable, DatabasePermissionDenied, SchemaTooNew, MigrationError: see
            :func:`open_postgres_store`; SQLite's errors: see :func:`open_store`.
    """
    url = database_url.strip() if database_url is not None else database_url_from_env()
    if not url:
        return open_store(path)
    if not is_postgres_url(url):
        validate_url(url)  # raises DatabaseUrlInvalid naming the setting
        raise AssertionError(f"{SETTING}: unreachable")
    return open_postgres_store(url)
