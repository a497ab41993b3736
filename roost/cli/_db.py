"""``roost db check``: open the configured database, migrate it, and say what it is.

The database is the SQLite file ``$ROOST_HOME/roost.db`` unless ``--database-url`` or
``ROOST_DATABASE_URL`` names a PostgreSQL server (issue 13). A setting that does not work (a wrong
URL, an unreachable server, a missing permission, a schema newer than this Roost) is one line on
stderr naming the setting, exit status 1, never a traceback.
"""

from __future__ import annotations

import click

from roost.errors import RoostError

from ._res_common import fail

__all__ = ["db_group"]

database_url_option = click.option(
    "--database-url",
    "database_url",
    metavar="URL",
    default=None,
    help="postgresql://user:password@host:port/dbname (default: $ROOST_DATABASE_URL; unset: the SQLite file).",
)


@click.group("db", short_help="Show which database is used, and check that it works.")
def db_group() -> None:
    """The database: which one is used, and whether it works."""


@db_group.command("check", short_help="Open the database; print its backend and migrations.")
@database_url_option
def db_check(database_url: str | None) -> None:
    """Open the database (creating and migrating its schema), then print its backend, where it
    is (password hidden), its applied migrations and, for PostgreSQL, the server's clock, the
    queue depth and the owners (nodes) holding live leases.

    Exit status: 0 when it works; 1 with one line on stderr when it does not.
    """
    from roost.storage import (
        PostgresStore,
        iso_from_unix,
        open_backend,
        pg_schema_version,
        redact_url,
        schema_version,
    )

    try:
        with open_backend(database_url) as store:
            if isinstance(store, PostgresStore):
                with store.transaction() as conn:
                    names = pg_schema_version(conn)
                    clock = store.db_now(conn)
                    owners = store.live_lease_owners(conn)
                    queued = len(store.list_daemon_tasks(conn, status="queued"))
                lines = [
                    "backend: postgresql",
                    f"database: {redact_url(store.url)}",
                    f"server clock: {iso_from_unix(clock)}",
                ]
                lines.append(f"queued tasks: {queued}")
                lines.append(f"lease holders: {len(owners)}")
                lines += [f"  {owner}: {count} leases, expiring within {left:.1f}s" for owner, count, left in owners]
            else:
                with store.read() as conn:
                    names = schema_version(conn)
                lines = ["backend: sqlite", f"database: {store.path}"]
    except RoostError as exc:
        fail("db check", str(exc), as_json=False)
    lines.append(f"schema: {len(names)} migrations ({', '.join(names)})")
    click.echo("\n".join(lines))
