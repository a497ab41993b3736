"""PostgreSQL connections (psycopg 3, psycopg-pool) and the translation of their errors.

The database is named by a libpq URL, ``postgresql://user:password@host:port/dbname``
(https://www.postgresql.org/docs/15/libpq-connect.html#LIBPQ-CONNSTRING), given as
``ROOST_DATABASE_URL`` (or ``--database-url``). Connections are sync psycopg connections used from
worker threads, as for SQLite, in autocommit mode: Roost opens every transaction itself
(``conn.transaction()``; nested ones become savepoints).

Errors that come from the setting (a malformed URL, no server at it, a refused login, a missing
privilege) become :class:`~roost.errors.DatabaseSettingError` subclasses whose message names the
setting and never contains the password.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from roost.errors import (
    Conflict,
    DatabasePermissionDenied,
    DatabaseUnreachable,
    DatabaseUrlInvalid,
    StoreBusy,
    StoreDiskFull,
    StoreError,
    StoreReadOnly,
)

__all__ = [
    "DATABASE_URL_ENV",
    "SETTING",
    "is_postgres_url",
    "database_url_from_env",
    "validate_url",
    "redact_url",
    "connect_pg",
    "open_pool",
    "translate_pg_error",
]

#: The environment variable that selects the database (unset: the SQLite file).
DATABASE_URL_ENV = "ROOST_DATABASE_URL"
#: How error messages name the setting.
SETTING = "ROOST_DATABASE_URL (or --database-url)"
_SCHEMES = ("postgresql", "postgres")
#: Seconds to wait for the server when connecting.
CONNECT_TIMEOUT = 5


def database_url_from_env() -> str | None:
    """Return ``$ROOST_DATABASE_URL`` stripped, or ``None`` when unset or empty."""
    url = os.environ.get(DATABASE_URL_ENV, "").strip()
    return url or None


def is_postgres_url(url: str) -> bool:
    """Whether ``url`` has a PostgreSQL scheme (``postgresql://`` or ``postgres://``)."""
    return urlsplit(url).scheme.lower() in _SCHEMES


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (for messages and logs)."""
    return re.sub(r"(://[^/:@]*:)[^@/]*@", r"\1***@", url)


def validate_url(url: str) -> str:
    """Check that ``url`` is a usable PostgreSQL URL and return it.

    Raises:
        DatabaseUrlInvalid: another scheme, no host/socket, a bad port, or libpq rejects it.
    """
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise DatabaseUrlInvalid(f"{SETTING} is not a valid URL ({shown}): {exc}") from exc
    if parts.scheme.lower() not in _SCHEMES:
        raise DatabaseUrlInvalid(
            f"{SETTING} must start with postgresql:// (got {shown}); unset it to use the SQLite file"
        )
    if port == 0:
        raise DatabaseUrlInvalid(f"{SETTING} has port 0 ({shown})")
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise DatabaseUrlInvalid(f"{SETTING} is not a valid PostgreSQL URL ({shown}): {exc}") from exc
    return url


def translate_pg_error(exc: BaseException, url: str | None = None) -> StoreError:
    """Map a psycopg (or pool) error to the most specific Roost error (not raised).

    By SQLSTATE (https://www.postgresql.org/docs/15/errcodes-appendix.html): refused connections
    and logins, a lost connection (class 08, no SQLSTATE, 57P01-57P03 shutdowns, 53300 too many
    connections, the pool's timeout) -> :class:`DatabaseUnreachable`; insufficient privilege ->
    :class:`DatabasePermissionDenied`; unique/foreign-key/check violations -> :class:`Conflict`;
    serialization failures, deadlocks (class 40) and lock timeouts (55P03) -> :class:`StoreBusy`;
    a write in a read-only transaction (25006: a ``read()`` connection, a hot standby, or
    ``default_transaction_read_only``) -> :class:`StoreReadOnly`, as SQLite's SQLITE_READONLY;
    a full disk (53100) -> :class:`StoreDiskFull`; anything else (a cancelled statement...) ->
    :class:`StoreError`. The caller raises it ``from exc``.

    psycopg makes class 40, 53, 55 and 57 errors subclasses of ``OperationalError``, so only the
    SQLSTATEs above count as an unreachable server.
    """
    where = f" ({redact_url(url)})" if url else ""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        return DatabasePermissionDenied(f"the database role of {SETTING}{where} lacks a privilege Roost needs: {first}")
    if isinstance(exc, pg_errors.InvalidCatalogName) or _missing_database(exc):
        return DatabaseUnreachable(_missing_database_message(url, where, first))
    if isinstance(exc, pg_errors.InvalidAuthorizationSpecification):
        return DatabaseUnreachable(f"{SETTING}{where} was refused by the server: {first}")
    state = getattr(exc, "sqlstate", None) or ""
    if state.startswith("40") or isinstance(exc, pg_errors.LockNotAvailable):  # class 40: transaction rollback
        return StoreBusy(f"database stayed locked: {first}")
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        return StoreReadOnly(f"the database of {SETTING}{where} refused a write (read-only): {first}")
    if isinstance(exc, pg_errors.DiskFull):
        return StoreDiskFull(f"the database server of {SETTING}{where} has no space left: {first}")
    if isinstance(exc, PoolTimeout) or (isinstance(exc, psycopg.OperationalError) and _lost_server(exc)):
        if "permission denied" in first.lower():
            return DatabasePermissionDenied(f"the database role of {SETTING}{where} may not connect: {first}")
        return DatabaseUnreachable(f"cannot reach the database server of {SETTING}{where}: {first}")
    if isinstance(exc, psycopg.IntegrityError):
        return Conflict(first)
    return StoreError(f"{type(exc).__name__}: {first}")


def _missing_database(exc: BaseException) -> bool:
    """Whether the server answered that the URL's database does not exist (SQLSTATE 3D000).

    libpq gives no SQLSTATE for an error of the connection's start-up (psycopg's ``sqlstate`` is
    None there), so the server's message, ``FATAL:  database "NAME" does not exist``, tells it.
    """
    return (
        isinstance(exc, psycopg.OperationalError) and re.search(r'database ".*" does not exist', str(exc)) is not None
    )


def _missing_database_message(url: str | None, where: str, first: str) -> str:
    """The one line for a server that has no database of the URL's name: which, and how to make it."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url or "")
    except psycopg.Error:
        params = {}
    name = params.get("dbname")
    shown = f'"{name}" ' if name else ""
    options = " ".join(
        f"{flag} {params[key]}" for flag, key in (("-h", "host"), ("-p", "port"), ("-U", "user")) if params.get(key)
    )
    create = f"createdb {options} {name}".replace("  ", " ") if name else "createdb"
    return (
        f"the database {shown}of {SETTING}{where} does not exist on its server (which answered): create it"
        f" ({create}, as a role that may create databases) or name an existing one: {first}"
    )


def _lost_server(exc: psycopg.OperationalError) -> bool:
    """Whether an OperationalError means no usable server: no SQLSTATE (libpq's own connection
    errors), class 08, a shutdown (57P01-57P03) or too many connections (53300)."""
    state = exc.sqlstate
    return state is None or state.startswith(("08", "57P")) or state == "53300"


def connect_pg(url: str) -> psycopg.Connection:
    """Open one autocommit connection to ``url`` (for migrations and tests).

    Raises:
        DatabaseUrlInvalid, DatabaseUnreachable, DatabasePermissionDenied: see :func:`translate_pg_error`.
    """
    validate_url(url)
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT)
    except psycopg.Error as exc:
        raise translate_pg_error(exc, url) from exc


def open_pool(url: str, *, min_size: int = 1, max_size: int = 8) -> ConnectionPool:
    """Open a pool of autocommit connections to ``url``, waiting for its first connection.

    Args:
        url: a URL already checked by :func:`validate_url`.
        min_size, max_size: connections kept open / at most.

    Raises:
        DatabaseUnreachable: the first connection could not be made within the connect timeout.
    """
    pool = ConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT},
        open=False,
        name="roost",
    )
    try:
        pool.open(wait=True, timeout=CONNECT_TIMEOUT * 2)
    except PoolTimeout as exc:
        pool.close()
        raise translate_pg_error(exc, url) from exc
    return pool
