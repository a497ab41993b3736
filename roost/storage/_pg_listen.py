"""One PostgreSQL ``LISTEN`` connection, shared by the node bus (:mod:`roost.storage._pg_bus`) and
the task queue's wake-up (:mod:`roost.storage._pg_task_wake`).

A dedicated autocommit connection ``LISTEN``s on one channel
(https://www.postgresql.org/docs/15/sql-listen.html); :meth:`PgListener.wait` reads its
notifications with psycopg's ``Connection.notifies(timeout=...)``
(https://www.psycopg.org/psycopg3/docs/advanced/async.html#asynchronous-notifications).
A lost notification only delays its reader until the next poll: each user keeps polling its rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg

from ._pg_connect import connect_pg, translate_pg_error

__all__ = ["PgListener"]


class PgListener:
    """A dedicated connection that ``LISTEN``s on ``channel`` and wakes on wanted payloads.

    ``wanted(payload) -> bool`` picks the notifications that end a :meth:`wait`; the others are
    read and dropped. :meth:`wait` blocks (run it in a worker thread). :meth:`close` is idempotent
    and safe while a :meth:`wait` runs in another thread (the waiting thread closes the connection
    when its wait returns).

    Raises (constructor, :meth:`wait`): DatabaseUnreachable and the other errors of
    :func:`roost.storage._pg_connect.translate_pg_error`.
    """

    def __init__(self, url: str, channel: str, wanted: Callable[[str], bool]) -> None:
        self._url = url
        self._wanted = wanted
        self._conn = connect_pg(url)
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._conn.execute(f"LISTEN {channel}")
        except psycopg.Error as exc:
            self._conn.close()
            raise translate_pg_error(exc, url) from exc

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a wanted notification.

        Returns:
            True when one arrived, False on timeout or after :meth:`close`.
        """
        with self._lock:
            if self._closed:
                return False
            try:
                return any(self._wanted(note.payload) for note in self._conn.notifies(timeout=timeout))
            except psycopg.Error as exc:
                raise translate_pg_error(exc, self._url) from exc
            finally:
                if self._closed:
                    self._conn.close()

    def close(self) -> None:
        """Stop listening and close the connection (idempotent)."""
        self._closed = True
        if self._lock.acquire(blocking=False):
            try:
                self._conn.close()
            finally:
                self._lock.release()
