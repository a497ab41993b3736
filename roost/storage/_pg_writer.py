"""The group-commit writer on PostgreSQL: :class:`StoreWriter`'s queue, urgency and lifecycle,
committing each group in one PostgreSQL transaction on a pooled connection.

A group stops taking further writes once an urgent write waits
(:meth:`StoreWriter.submit_urgent`); the rest go first in the next group. Each write runs in its
own savepoint (``conn.transaction()`` nested), so a write that raises
(:class:`StaleLease`, :class:`Conflict`, any exception) rolls back alone and the group commits
without it, as on SQLite. A failed COMMIT or a lost connection answers every write of the group
with the translated error (:class:`DatabaseUnreachable`, :class:`StoreBusy`...); nothing of the
group is stored.

``lease_ops`` tells :class:`roost.storage.LeaseKeeper` to use the PostgreSQL lease functions.
"""

from __future__ import annotations

import collections
from types import ModuleType
from typing import TYPE_CHECKING

import psycopg
import trio

from roost._faults import fault_point
from roost.errors import LifecycleError, StoreClosed, StoreError

from . import _pg_leases
from ._pg_connect import translate_pg_error
from ._writer import StoreWriter, WriterState, WriterStats, _Write

if TYPE_CHECKING:
    from ._pg_store import PostgresStore

__all__ = ["PgWriter"]


class PgWriter(StoreWriter):
    """The writer of one process on a :class:`PostgresStore` (start it with
    ``await nursery.start(writer.run)``; the same API as :class:`StoreWriter`).

    Args:
        store: the open PostgreSQL store (its pool lends the write connection per group).
        queue_size: bound of the inbound queue.
        batch_max: most writes committed in one transaction.
    """

    lease_ops: ModuleType = _pg_leases

    def __init__(self, store: PostgresStore, *, queue_size: int = 4096, batch_max: int = 512) -> None:
        if batch_max < 1 or queue_size < 1:
            raise ValueError("batch_max and queue_size must be at least 1")
        self.store = store
        self.batch_max = batch_max
        self.stats = WriterStats()
        self.state = WriterState.NEW
        self._send, self._receive = trio.open_memory_channel[_Write](queue_size)
        self._urgent: collections.deque[_Write] = collections.deque()
        self._control: collections.deque[_Write] = collections.deque()
        self._carried: list[_Write] = []  # see StoreWriter: a group cut short for urgent writes

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve writes until cancelled or crashed; restartable, as :meth:`StoreWriter.serve`
        (the root supervisor's permanent ``store_writer`` child). :meth:`run` is serve + close.

        Each group borrows a pooled connection for its transaction, so a restart has no
        connection to reopen; writes queued while it was down wait for the next :meth:`serve`.

        Raises:
            LifecycleError: already serving, or closed.

        Cancellation:
            A group being committed when the cancel arrives finishes (its worker thread is not
            abandoned) and its callers are answered.
        """
        if self.state is not WriterState.NEW:
            raise LifecycleError(f"PgWriter.serve called in state {self.state.value}")
        self.state = WriterState.RUNNING
        try:
            task_status.started()
            while True:
                fault_point("store_writer")
                group, _ = await self._next_group()
                if not group:
                    continue
                deferred: list[_Write] = []
                try:
                    deferred = await trio.to_thread.run_sync(self._commit_pg_group, group)
                except BaseException:
                    for write in group:
                        write.error = StoreClosed("the store writer crashed during this write")
                    raise
                finally:
                    self._answer(group, deferred)
                del group, deferred  # large rows are freed now, not at the next write
        finally:
            if self.state is WriterState.RUNNING:
                self.state = WriterState.NEW

    def _commit_pg_group(self, group: list[_Write]) -> list[_Write]:
        """Run one group in one transaction (blocking, in a worker thread).

        As on SQLite, the group stops taking further writes (after at least one) once an urgent
        write waits, so the urgent one commits next (control before data, issue 19).

        Returns:
            The writes not run because an urgent write came in meanwhile (untouched, in order).
        """
        ran: list[_Write] = []
        deferred: list[_Write] = []
        try:
            with self.store.transaction() as conn:
                for index, write in enumerate(group):
                    if index and self._urgent:
                        deferred = group[index:]
                        break
                    ran.append(write)
                    write.result, write.error = None, None
                    try:
                        with conn.transaction():
                            write.result = write.fn(conn, *write.args, **write.kwargs)
                    except psycopg.Error as exc:
                        if conn.broken:
                            raise
                        write.error = translate_pg_error(exc, self.store.url)
                        write.error.__cause__ = exc
                    except Exception as exc:
                        write.error = exc
        except (StoreError, psycopg.Error) as exc:
            for write in group[: len(group) - len(deferred)]:  # nothing of the group is stored
                err = exc if isinstance(exc, StoreError) else translate_pg_error(exc, self.store.url)
                fresh = type(err)(str(err))  # one exception object per caller
                fresh.__cause__ = exc
                write.error, write.result = fresh, None
            return deferred
        ok = sum(1 for w in ran if w.error is None)
        self.stats.transactions += 1
        self.stats.writes += ok
        self.stats.failed += len(ran) - ok
        self.stats.largest_group = max(self.stats.largest_group, ok)
        return deferred
