"""The shared task queue's wake-up on PostgreSQL (issue 13): ``NOTIFY roost_tasks`` when a task
becomes claimable, and a node's ``LISTEN`` connection that wakes its idle runners.

The payload is ``"<task id> <sender owner id>"`` (ids only, far under the 8000-byte limit of
https://www.postgresql.org/docs/15/sql-notify.html); a notification is delivered when the
transaction that sent it commits, so the task's row is visible to whoever it wakes. A claimer
always reads the rows (:func:`roost.storage.claim_daemon_task`): a lost notification only delays
a task until the next poll of its claimers (``ROOST_TASK_POLL_S``), never loses it.

The queue's own channel, apart from the node bus's ``roost_bus`` (:mod:`roost.storage._pg_bus`):
a dispatch wakes every claiming node at once, while a bus message has one target.
"""

from __future__ import annotations

import threading

import psycopg

from ._pg_connect import connect_pg, translate_pg_error

__all__ = ["CHANNEL", "notify_task", "PgTaskWakeListener"]

#: The LISTEN/NOTIFY channel of the shared task queue.
CHANNEL = "roost_tasks"


def notify_task(conn: psycopg.Connection, task_id: str, sender: str) -> None:
    """Send ``NOTIFY roost_tasks, '<task_id> <sender>'`` (delivered when the transaction commits)."""
    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{task_id} {sender}"))


class PgTaskWakeListener:
    """A dedicated autocommit connection that ``LISTEN``s on :data:`CHANNEL` for one node.

    :meth:`wait` blocks (run it in a worker thread) until a notification sent by another owner
    than ``owner`` arrives, or ``timeout`` passes. :meth:`close` is idempotent and safe while a
    :meth:`wait` runs in another thread (that thread closes the connection when its wait ends).

    Raises (constructor, :meth:`wait`): DatabaseUnreachable and the other errors of
    :func:`roost.storage._pg_connect.translate_pg_error`.
    """

    def __init__(self, url: str, owner: str) -> None:
        self.owner = owner
        self._url = url
        self._conn = connect_pg(url)
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._conn.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as exc:
            self._conn.close()
            raise translate_pg_error(exc, url) from exc

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a task notification of another node.

        Returns:
            True when one arrived (claim now), False on timeout or after :meth:`close`.
        """
        with self._lock:
            if self._closed:
                return False
            try:
                for note in self._conn.notifies(timeout=timeout):
                    if note.payload.rpartition(" ")[2] != self.owner:
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
