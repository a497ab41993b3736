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

import psycopg

from ._pg_listen import PgListener

__all__ = ["CHANNEL", "notify_task", "PgTaskWakeListener"]

#: The LISTEN/NOTIFY channel of the shared task queue.
CHANNEL = "roost_tasks"


def notify_task(conn: psycopg.Connection, task_id: str, sender: str) -> None:
    """Send ``NOTIFY roost_tasks, '<task_id> <sender>'`` (delivered when the transaction commits)."""
    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"{task_id} {sender}"))


class PgTaskWakeListener(PgListener):
    """A :class:`~roost.storage._pg_listen.PgListener` on :data:`CHANNEL` for one node.

    :meth:`wait` returns True when a notification sent by another owner than ``owner`` (the
    payload's last word) arrives, False after ``timeout`` seconds or :meth:`close`. Raises as
    :class:`~roost.storage._pg_listen.PgListener`.
    """

    def __init__(self, url: str, owner: str) -> None:
        self.owner = owner
        super().__init__(url, CHANNEL, lambda payload: payload.rpartition(" ")[2] != owner)
