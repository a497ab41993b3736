"""Row <-> attrs mapping shared by the data modules: ids, timestamps, JSON and boolean columns."""

from __future__ import annotations

import datetime
import sqlite3
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar

import attrs

from roost._json import dumps, loads
from roost.errors import NotFound, UsageError

__all__ = ["utc_now", "iso_from_unix", "new_id", "TableSpec"]

T = TypeVar("T", bound=attrs.AttrsInstance)


def utc_now() -> str:
    """Return the current time as ISO 8601 UTC text with microseconds: ``2026-01-31T12:00:00.000000Z``."""
    now = datetime.datetime.now(datetime.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def iso_from_unix(seconds: float) -> str:
    """Return unix ``seconds`` as ISO 8601 UTC text with milliseconds: ``2026-12-02T15:26:43.419Z``
    (wire-protocol.md: "Timestamps are ISO 8601 strings in UTC")."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_id(prefix: str) -> str:
    """Return a fresh id ``<prefix>_<32 hex digits>``."""
    return f"{prefix}_{uuid.uuid4().hex}"


@attrs.frozen
class TableSpec(Generic[T]):
    """How one table maps to one attrs class.

    Attributes:
        table: the table name.
        cls: the attrs class of a row.
        key: the primary-key column.
        json: columns stored as JSON text.
        bools: columns stored as 0/1.
        touch: column set to :func:`utc_now` on every update (``None`` for none).
    """

    table: str
    cls: type[T]
    key: str = "id"
    json: frozenset[str] = frozenset()
    bools: frozenset[str] = frozenset()
    touch: str | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(f.name for f in attrs.fields(self.cls))

    def encode(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Return column values ready for SQLite (JSON text, 0/1)."""
        out: dict[str, Any] = {}
        for name, value in values.items():
            if name in self.json:
                out[name] = None if value is None else dumps(value).decode()
            elif name in self.bools:
                out[name] = int(bool(value))
            else:
                out[name] = value
        return out

    def decode(self, row: sqlite3.Row) -> T:
        """Return the attrs instance for a row (JSON decoded, 0/1 to bool)."""
        values: dict[str, Any] = {}
        for name in row.keys():  # noqa: SIM118 (sqlite3.Row iterates values, not keys)
            value = row[name]
            if name in self.json:
                value = None if value is None else loads(value)
            elif name in self.bools:
                value = bool(value)
            values[name] = value
        return self.cls(**values)

    def insert(self, conn: sqlite3.Connection, obj: T) -> T:
        """INSERT ``obj`` as a new row; return it.

        Raises:
            Conflict: (from the writer's translation) a constraint refused it.
        """
        values = self.encode(attrs.asdict(obj, recurse=False))
        cols = ", ".join(values)
        marks = ", ".join(f":{c}" for c in values)
        conn.execute(f"INSERT INTO {self.table} ({cols}) VALUES ({marks})", values)
        return obj

    def get(self, conn: sqlite3.Connection, key: Any) -> T:
        """Return the row with this primary key (read-only).

        Raises:
            NotFound: there is none.
        """
        row = conn.execute(f"SELECT * FROM {self.table} WHERE {self.key} = ?", (key,)).fetchone()
        if row is None:
            raise NotFound(f"no {self.table} row with {self.key}={key!r}", kind=self.table)
        return self.decode(row)

    def select(
        self,
        conn: sqlite3.Connection,
        where: str = "1",
        params: Iterable[Any] = (),
        *,
        order: str,
        limit: int | None = None,
    ) -> list[T]:
        """Return the rows matching ``where`` (an SQL expression with ``?`` marks), in ``order``."""
        sql = f"SELECT * FROM {self.table} WHERE {where} ORDER BY {order}"
        params = tuple(params)
        if limit is not None:
            sql += " LIMIT ?"
            params += (int(limit),)
        return [self.decode(r) for r in conn.execute(sql, params)]

    def update(self, conn: sqlite3.Connection, key: Any, changes: Mapping[str, Any]) -> T:
        """UPDATE the named columns of one row; return the row as stored after the change.

        Raises:
            NotFound: there is no such row.
            UsageError: a name in ``changes`` is not a column (or is the key).
        """
        unknown = set(changes) - set(self.columns) | ({self.key} & set(changes))
        if unknown:
            raise UsageError(f"cannot update {self.table} column(s) {sorted(unknown)}")
        values = self.encode(changes)
        if self.touch and self.touch not in values:
            values[self.touch] = utc_now()
        if values:
            sets = ", ".join(f"{c} = :{c}" for c in values)
            cur = conn.execute(f"UPDATE {self.table} SET {sets} WHERE {self.key} = :_key", {**values, "_key": key})
            if cur.rowcount == 0:
                raise NotFound(f"no {self.table} row with {self.key}={key!r}", kind=self.table)
        return self.get(conn, key)

    def delete(self, conn: sqlite3.Connection, key: Any) -> None:
        """DELETE one row.

        Raises:
            NotFound: there was no such row.
        """
        cur = conn.execute(f"DELETE FROM {self.table} WHERE {self.key} = ?", (key,))
        if cur.rowcount == 0:
            raise NotFound(f"no {self.table} row with {self.key}={key!r}", kind=self.table)
