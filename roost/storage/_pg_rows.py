"""Row <-> attrs mapping on PostgreSQL: :class:`~roost.storage._rows.TableSpec` with psycopg's
placeholders (``%s``, ``%(name)s``) and dict rows.

Each write runs in its own savepoint (``conn.transaction()`` nested in the caller's transaction),
so a refused write (:class:`Conflict`) leaves the caller's transaction usable, as on SQLite.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import attrs
import psycopg
from psycopg.rows import dict_row

from roost.errors import Conflict, NotFound, UsageError

from ._rows import TableSpec, utc_now

__all__ = ["PgTableSpec"]

T = TypeVar("T", bound=attrs.AttrsInstance)


class PgTableSpec(TableSpec[T]):
    """A :class:`TableSpec` whose operations take a ``psycopg.Connection``.

    ``where`` expressions of :meth:`select` use ``%s`` marks. Ordering ties are broken by the
    caller's ``order`` (PostgreSQL has no ``rowid``; callers add ``id``).
    """

    @property
    def _columns(self) -> str:
        """The attrs fields only (a PostgreSQL table may have more, e.g. ``items.text_search``)."""
        return ", ".join(self.columns)

    def _rows(self, conn: psycopg.Connection, sql: str, params: Any = ()) -> list[dict[str, Any]]:
        with conn.cursor(row_factory=dict_row) as cur:
            cur.execute(sql, params)  # SQL built from our own column names
            return cur.fetchall()

    def _write(self, conn: psycopg.Connection, sql: str, params: Any) -> int:
        try:
            with conn.transaction():
                return conn.execute(sql, params).rowcount  # our own SQL
        except psycopg.IntegrityError as exc:
            raise Conflict(str(exc).strip().splitlines()[0]) from exc

    def insert(self, conn: psycopg.Connection, obj: T) -> T:  # type: ignore[override]
        """INSERT ``obj`` as a new row; return it. Raises Conflict (a constraint refused it)."""
        values = self.encode(attrs.asdict(obj, recurse=False))
        marks = ", ".join(f"%({c})s" for c in values)
        self._write(conn, f"INSERT INTO {self.table} ({', '.join(values)}) VALUES ({marks})", values)
        return obj

    def get(self, conn: psycopg.Connection, key: Any) -> T:  # type: ignore[override]
        """Return the row with this primary key. Raises NotFound."""
        rows = self._rows(conn, f"SELECT {self._columns} FROM {self.table} WHERE {self.key} = %s", (key,))
        if not rows:
            raise NotFound(f"no {self.table} row with {self.key}={key!r}")
        return self.decode(rows[0])  # type: ignore[arg-type]  # a dict row has .keys() and [name]

    def select(  # type: ignore[override]
        self,
        conn: psycopg.Connection,
        where: str = "TRUE",
        params: Iterable[Any] = (),
        *,
        order: str,
        limit: int | None = None,
    ) -> list[T]:
        """Return the rows matching ``where`` (``%s`` marks), in ``order``."""
        sql = f"SELECT {self._columns} FROM {self.table} WHERE {where} ORDER BY {order}"
        args = tuple(params)
        if limit is not None:
            sql += " LIMIT %s"
            args += (int(limit),)
        return [self.decode(r) for r in self._rows(conn, sql, args)]  # type: ignore[arg-type]

    def update(self, conn: psycopg.Connection, key: Any, changes: Mapping[str, Any]) -> T:  # type: ignore[override]
        """UPDATE the named columns of one row; return it as stored. Raises NotFound, UsageError."""
        unknown = set(changes) - set(self.columns) | ({self.key} & set(changes))
        if unknown:
            raise UsageError(f"cannot update {self.table} column(s) {sorted(unknown)}")
        values = self.encode(changes)
        if self.touch and self.touch not in values:
            values[self.touch] = utc_now()
        if values:
            sets = ", ".join(f"{c} = %({c})s" for c in values)
            count = self._write(
                conn, f"UPDATE {self.table} SET {sets} WHERE {self.key} = %(_key)s", {**values, "_key": key}
            )
            if count == 0:
                raise NotFound(f"no {self.table} row with {self.key}={key!r}")
        return self.get(conn, key)

    def delete(self, conn: psycopg.Connection, key: Any) -> None:  # type: ignore[override]
        """DELETE one row. Raises NotFound."""
        if self._write(conn, f"DELETE FROM {self.table} WHERE {self.key} = %s", (key,)) == 0:
            raise NotFound(f"no {self.table} row with {self.key}={key!r}")
