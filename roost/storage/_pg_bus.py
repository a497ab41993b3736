"""The node bus's wake-up on PostgreSQL: a ``LISTEN`` connection per node.

The bus itself (rows, states, the ``NOTIFY`` sent by ``post_message``) is one implementation for
both backends, :mod:`roost.storage._bus`. This is the PostgreSQL-only part: a dedicated connection
that waits for notifications on :data:`~roost.storage._bus.CHANNEL`
(https://www.postgresql.org/docs/15/sql-listen.html).
"""

from __future__ import annotations

import threading

import psycopg

from ._bus import CHANNEL
from ._pg_connect import connect_pg, translate_pg_error

__all__ = ["PgBusListener"]


class PgBusListener:
    """A dedicated connection that ``LISTEN``s on the bus channel for one node.

    :meth:`wait` blocks (run it in a worker thread) until a notification for ``node_id`` arrives
    or ``timeout`` passes. :meth:`close` is idempotent and safe while a :meth:`wait` runs in
    another thread (the waiting thread closes the connection when its wait returns).

    Raises (constructor, :meth:`wait`): DatabaseUnreachable and the other errors of
    :func:`roost.storage._pg_connect.translate_pg_error`.
    """

    def __init__(self, url: str, node_id: str) -> None:
        self.node_id = node_id
        self._url = url
        self._conn = connect_pg(url)
        self._lock = threading.Lock()
        self._closed = False
        self._conn.execute(f"LISTEN {CHANNEL}")

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a notification addressed to this node.

        Returns:
            True when one arrived (claim now), False on timeout or after :meth:`close`.
        """
        with self._lock:
            if self._closed:
                return False
            try:
                for note in self._conn.notifies(timeout=timeout):
                    if note.payload.split(" ", 1)[0] == self.node_id:
                        return True
                return False
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
