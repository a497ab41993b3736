"""The StoreWriter: the one task that owns a process's write connection, with group commit.

Callers queue write functions; the writer takes everything queued (up to ``batch_max``) and runs
it in one ``BEGIN IMMEDIATE ... COMMIT``, each function inside its own SAVEPOINT. A function that
raises rolls back alone and its caller gets the error; the rest of the group commits. Callers
are woken only after COMMIT returns, so an acknowledged write is durable (``synchronous=NORMAL``
in WAL: durable against process crashes; an OS crash may lose the last transactions, never
corrupt the file).

Where a group commits (issue 19, control before data). A small group (at most
:data:`_INLINE_MAX_WRITES` writes carrying at most :data:`_INLINE_MAX_BYTES` of text) commits on
the event loop's own thread: in a worker thread, the two hand-offs and that thread waiting for
the GIL at every SQLite call cost far more than the commit (traced under the peers harness's
saturated phase: a one-write group took 18 ms in the worker thread, under 1 ms inline). Inline,
a group never waits for a lock (``busy_timeout`` 0: a lock held by another process sends it to
the worker thread as usual), never runs a WAL checkpoint (once :data:`_THREADED_EVERY_S` has
passed, the next data group commits in the worker thread, where the connection's
``wal_autocheckpoint`` runs), and a data group stops after :data:`INLINE_SLICE_S` of work, the
rest going first in the next group: a bounded slice of the loop, as for streams. A larger group
(a burst of data, a long reply's items) commits in the worker thread, where SQLite's own work
runs beside the loop on another core (with every group inline, bench_appserver's saturated
phase went from 7 to 14 ms at interrupt p50: the loop did that work too); while an urgent or
control write waits for such a group, the interpreter's switch interval is
:data:`_HURRY_SWITCH_S`, so the thread gets the GIL back quickly at each SQLite call.

Lanes. :meth:`StoreWriter.submit_urgent` writes (the end of an interrupted turn) skip the queue:
on an idle writer they commit in the caller's own task at once (no scheduler batch for the
writer task, none for the caller's wake-up); otherwise in a group of their own right after the
group being committed, which stops taking further writes as soon as an urgent one waits (under
saturation a group of fifty writes took 70-100 ms in the worker thread, and an interrupt's
settle write waited for all of it); the writes it did not reach go first in the next ordinary
group. :meth:`StoreWriter.submit_control` writes (a new turn's admission) form a lane between the
two: ahead of queued data, behind urgent writes, taken :data:`_INLINE_MAX_WRITES` at a time,
each slice committed on the loop's thread (under 100 streams admissions arrive by the dozen: all
of them together held the loop for 6-10 ms). They cut a group in flight short only after
:data:`_DATA_BEFORE_CONTROL` of its writes: an admission then waits for a bounded part of a data
group, while data still moves under a stream of admissions.
"""

from __future__ import annotations

import collections
import enum
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio

from roost._faults import fault_point
from roost.errors import LifecycleError, StoreClosed, StoreError, StoreFull

from ._connect import DEFAULT_BUSY_TIMEOUT, connect, immediate, translate_error
from ._write_size import carries_at_most, group_bound_bytes

__all__ = ["StoreWriter", "WriterStats", "WriterState"]

R = TypeVar("R")

#: Re-runs of a group whose transaction was destroyed by a failing write (bounded).
_MAX_GROUP_RESTARTS = 8
#: A group whose arguments hold at least this many bytes of text is followed by a fresh connection.
_REOPEN_AFTER_BYTES = 1 << 20
#: Put on the queue to wake the writer for an urgent write (never run).
_WAKE: Any = object()
#: A group whose writes carry at most this many bytes of text (arguments and closures,
#: :func:`~roost.storage._write_size.carries_at_most`) may commit on the event loop's thread
#: (module doc); a larger one (e.g. a long reply's items) commits in the worker thread.
_INLINE_MAX_BYTES = 64 << 10
#: Writes of an ordinary group that commit before waiting control writes cut it short (data
#: keeps moving under a stream of admissions, and an admission waits for at most this many).
_DATA_BEFORE_CONTROL = 16
#: A group of more writes than this (urgent or data) commits in the worker thread, and control
#: writes are taken this many at a time (a bounded slice of the event loop: each such write takes
#: about 0.1-0.4 ms of SQLite work).
_INLINE_MAX_WRITES = 8
#: Seconds of SQLite work an ordinary group does on the event loop's thread before it commits
#: what ran (the rest goes first in the next group): a bounded slice of the loop, as for streams.
INLINE_SLICE_S = 0.001
#: Seconds after which the next ordinary group commits in the worker thread again, where the WAL
#: checkpoint (``wal_autocheckpoint``) runs: inline groups never checkpoint.
_THREADED_EVERY_S = 1.0
#: The interpreter's thread switch interval (seconds, :func:`sys.setswitchinterval`) while a
#: group commits in the worker thread and an urgent or control write waits for it (module doc).
_HURRY_SWITCH_S = 0.0002


class WriterState(enum.Enum):
    """Lifecycle of a :class:`StoreWriter`."""

    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


@attrs.define
class WriterStats:
    """Counters since the writer was created.

    Attributes:
        transactions: committed transactions (groups).
        writes: write functions that ran and committed.
        failed: write functions that raised (rolled back alone).
        largest_group: the most writes committed in one transaction.
    """

    transactions: int = 0
    writes: int = 0
    failed: int = 0
    largest_group: int = 0


@attrs.define(eq=False)
class _Write:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    done: trio.Event | None
    result: Any = None
    error: BaseException | None = None


class StoreWriter:
    """The single writer of one process: a trio service with a bounded inbound queue.

    Start it with ``await nursery.start(writer.run)``; it serves until cancelled. Writes may be
    queued before it starts; they run once it does.

    Args:
        path: the database file (already migrated).
        queue_size: bound of the inbound queue (writes waiting for a group).
        batch_max: most writes committed in one transaction.
        busy_timeout: seconds the write connection waits for another process's lock.
    """

    #: the write connection while serving (None: not serving, or no connection of this process's
    #: own to commit on: :class:`~roost.storage._pg_writer.PgWriter` borrows one per group)
    _conn: sqlite3.Connection | None = None
    #: a group (or the connection's set-up) runs in the worker thread
    _in_thread = False
    #: the switch interval to restore once the group in the worker thread is done (None: not hurried)
    _saved_switch: float | None = None

    def __init__(
        self,
        path: str | Path,
        *,
        queue_size: int = 4096,
        batch_max: int = 512,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        if batch_max < 1 or queue_size < 1:
            raise ValueError("batch_max and queue_size must be at least 1")
        self.path = Path(path)
        self.batch_max = batch_max
        self.busy_timeout = busy_timeout
        self.stats = WriterStats()
        self.state = WriterState.NEW
        self._send, self._receive = trio.open_memory_channel[_Write](queue_size)
        self._urgent: collections.deque[_Write] = collections.deque()
        self._control: collections.deque[_Write] = collections.deque()  # see submit_control
        self._carried: list[_Write] = []  # taken for a group that stopped early for urgent writes
        self._autocheckpoint: int | None = None  # the write connection's wal_autocheckpoint (pages)
        #: the write connection has the settings of an inline group (busy_timeout and
        #: wal_autocheckpoint 0), kept until the next group in the worker thread restores them
        self._inline_settings = False
        self._last_threaded = time.monotonic()  # when a group last committed in the worker thread
        self._slice_end: float | None = None  # an inline ordinary group stops its writes then

    # -- callers ------------------------------------------------------------------------------

    async def submit(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """Run ``fn(conn, *args, **kwargs)`` in the next group transaction and return its result.

        Waits for queue space (backpressure) and then for the group's COMMIT.

        Args:
            fn: a blocking function of a connection (in a transaction) and ``args``; it runs on
                the event loop's thread or in a worker thread (module doc), inside its own
                savepoint.

        Returns:
            What ``fn`` returned, once it is committed.

        Raises:
            StoreClosed: the writer has stopped (before or while the write was queued).
            StoreBusy: the database stayed locked by another process past every retry.
            Conflict: a constraint refused the write (sqlite3 errors are translated, ``from`` them).
            Exception: whatever ``fn`` raised; its changes were rolled back, the group's were not.

        Cancellation:
            Cancelled while waiting for queue space: nothing was queued. Cancelled after that: the
            write may still commit; its outcome is not reported.
        """
        write = _Write(fn, args, kwargs, trio.Event())
        await self._enqueue(write)
        assert write.done is not None
        await write.done.wait()
        if write.error is not None:
            raise write.error
        return write.result

    async def submit_urgent(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """:meth:`submit`, ahead of the queue: ``fn`` commits in a group of its own, right after
        the group being committed (if any), before the writes that were queued. On an idle
        writer it commits in the caller's task before this returns, with no schedule point.

        For the few writes a person waits on under load: the end of an interrupted turn, whose
        terminal event is sent only once it is durable. The caller must not depend on a write of
        its own that is still queued (an actor's writes are awaited one at a time, so they never
        are). Not subject to the queue bound.

        Raises:
            The errors of :meth:`submit`.
        """
        return await self._ahead(self._urgent, fn, args, kwargs)

    async def submit_control(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """:meth:`submit`, ahead of the queued writes but behind :meth:`submit_urgent` ones: for
        control a client waits on that comes in bulk under load (a new turn's admission, its
        lease with its turn row: DESIGN.md section 4, "admissions"). Such writes commit together, in slices of
        :data:`_INLINE_MAX_WRITES` on the event loop's thread; the group being committed stops
        for them once it has committed :data:`_DATA_BEFORE_CONTROL` writes (module doc). The
        caller must not depend on a write of its own that is still queued. Not subject to the
        queue bound.

        Raises:
            The errors of :meth:`submit`.
        """
        return await self._ahead(self._control, fn, args, kwargs)

    async def _ahead(self, lane: collections.deque[_Write], fn: Callable[..., R], args: tuple, kwargs: dict) -> R:
        if self.state is WriterState.STOPPED:
            raise StoreClosed("the store writer has stopped")
        write = _Write(fn, args, kwargs, trio.Event())
        if self._in_thread:
            self._hurry()
        elif lane is self._urgent and self._commit_now(write):  # committed: no schedule point
            if write.error is not None:
                raise write.error
            return write.result
        lane.append(write)
        try:
            self._send.send_nowait(_WAKE)  # a full queue means the writer is not waiting anyway
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        assert write.done is not None
        await write.done.wait()
        if write.error is not None:
            raise write.error
        return write.result

    def submit_nowait(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Queue ``fn(conn, *args, **kwargs)`` without waiting (fire-and-forget; not a checkpoint).

        A failure of the write is counted in :attr:`stats` and otherwise dropped.

        Raises:
            StoreFull: the queue is full; nothing was queued.
            StoreClosed: the writer has stopped.
        """
        if self.state is WriterState.STOPPED:
            raise StoreClosed("the store writer has stopped")
        try:
            self._send.send_nowait(_Write(fn, args, kwargs, None))
        except trio.WouldBlock:
            raise StoreFull("the store writer's queue is full") from None
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise StoreClosed("the store writer has stopped") from None

    async def _enqueue(self, write: _Write) -> None:
        if self.state is WriterState.STOPPED:
            raise StoreClosed("the store writer has stopped")
        try:
            await self._send.send(write)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise StoreClosed("the store writer has stopped") from None

    # -- the service --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve writes until cancelled, then :meth:`close` (one-shot: :meth:`serve` + close).

        Raises:
            LifecycleError: run twice (or while serving).
            StoreError: the connection could not be opened.
        """
        try:
            await self.serve(task_status=task_status)
        finally:
            self.close()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve writes until cancelled or crashed; restartable (a supervisor's permanent child).

        Opens a fresh write connection, reports ``started``, then repeatedly commits groups. On
        exit the connection is closed but the queue stays open: writes queued meanwhile wait for
        the next :meth:`serve` (a restart loses no accepted write). :meth:`close` ends that.

        Raises:
            LifecycleError: already serving, or closed.
            StoreError: the connection could not be opened.

        Cancellation:
            A group being committed when the cancel arrives finishes (its thread is not
            abandoned) and its callers are answered. The connection is closed.
        """
        if self.state is not WriterState.NEW:
            raise LifecycleError(f"StoreWriter.serve called in state {self.state.value}")
        self.state = WriterState.RUNNING
        conn: sqlite3.Connection | None = None
        try:
            conn = await self._in_worker_thread(lambda: connect(self.path, busy_timeout=self.busy_timeout))
            self._inline_settings = False
            self._conn = conn
            task_status.started()
            while True:
                fault_point("store_writer")
                group, urgent = await self._next_group()
                if not group:
                    continue
                deferred: list[_Write] | None = None
                inline = False
                try:
                    if urgent and len(group) <= _INLINE_MAX_WRITES:
                        deferred = self._commit_inline(conn, group)
                    elif not urgent and len(group) <= _INLINE_MAX_WRITES and self._data_inline():
                        deferred = self._commit_inline(conn, group, slice_s=INLINE_SLICE_S)
                    inline = deferred is not None
                    if deferred is None:
                        deferred = await self._in_worker_thread(self._commit_threaded, conn, group)
                except BaseException:
                    # Only a non-Exception (e.g. KeyboardInterrupt in a write) gets here: the
                    # group was rolled back; answer its callers before the writer dies.
                    for write in group:
                        write.error = StoreClosed("the store writer crashed during this write")
                    raise
                finally:
                    self._answer(group, deferred or [])
                # SQLite keeps a cached statement's last bound values (a copy of them) until the
                # statement runs again: a fresh connection frees a large write's copies. (Inline
                # groups are small by estimate, which does not look into every record.)
                reopen = group_bound_bytes(group) >= _REOPEN_AFTER_BYTES
                # Let go of the group now, before any schedule point: its arguments and results
                # can be large (a 30 MiB reply's item and task rows; issue 18, finding 5).
                del group, deferred
                if reopen:
                    conn = self._conn = await self._in_worker_thread(self._reopen, conn)
                elif inline:
                    await trio.lowlevel.checkpoint()  # the next group waits for others to run
        finally:
            self._conn = None
            if self.state is WriterState.RUNNING:
                self.state = WriterState.NEW
            if conn is not None:
                conn.close()

    async def _in_worker_thread(self, fn: Callable[..., R], *args: Any) -> R:
        """``fn(*args)`` in a worker thread, the connection marked busy meanwhile (no caller
        commits on it then: :meth:`_commit_now`)."""
        self._in_thread = True
        try:
            return await trio.to_thread.run_sync(fn, *args)
        finally:
            self._in_thread = False
            if self._saved_switch is not None:
                sys.setswitchinterval(self._saved_switch)
                self._saved_switch = None

    def _data_inline(self) -> bool:
        """Whether the next ordinary group may commit on the event loop's thread: yes, but once
        every :data:`_THREADED_EVERY_S` one commits in the worker thread, where the WAL checkpoint
        runs."""
        return time.monotonic() - self._last_threaded < _THREADED_EVERY_S

    def _hurry(self) -> None:
        """Shorten the interpreter's switch interval until the group in the worker thread is done:
        that thread needs the GIL at every SQLite call, and with the event loop busy it waited up
        to the default 5 ms each time (a one-write group took 18 ms). Restored by
        :meth:`_in_worker_thread`."""
        if self._saved_switch is None:
            self._saved_switch = sys.getswitchinterval()
            sys.setswitchinterval(min(self._saved_switch, _HURRY_SWITCH_S))

    def _commit_now(self, write: _Write) -> bool:
        """Commit urgent ``write`` in the caller's task, now, when the write connection is idle
        (serving, no group in the worker thread, no urgent write waiting): the caller then waits
        for neither the writer task's turn nor its own wake-up, two scheduler batches under
        saturation (issue 19). False: nothing ran; queue it."""
        conn = self._conn
        if conn is None or self._urgent or self.state is not WriterState.RUNNING:
            return False
        deferred = self._commit_inline(conn, [write])
        return deferred is not None

    def _reopen(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        """Close ``conn`` and open a fresh write connection (blocking, in a worker thread)."""
        conn.close()
        self._inline_settings = False
        return connect(self.path, busy_timeout=self.busy_timeout)

    def _answer(self, group: list[_Write], deferred: list[_Write]) -> None:
        """Wake the callers of ``group``'s writes that ran; keep ``deferred`` for the next group.

        A fire-and-forget write's result is dropped (nobody reads it), and no reference to a
        write outlives this call, so a large row is freed as soon as its caller is done with it.
        """
        waiting = {id(w) for w in deferred}
        self._carried = deferred + self._carried  # (an urgent group leaves the older ones)
        for write in group:
            if write.done is None:
                write.result = None
            elif id(write) not in waiting:
                write.done.set()

    def close(self) -> None:
        """Stop for good: writes still queued get :class:`StoreClosed`, later ones too (idempotent)."""
        self.state = WriterState.STOPPED
        self._fail_queued()
        self._receive.close()

    async def _next_group(self) -> tuple[list[_Write], bool]:
        """The next writes to commit together, and whether they are urgent or control writes:
        the urgent ones alone, else a slice of the control ones (:data:`_INLINE_MAX_WRITES`),
        else what is queued (up to ``batch_max``, in order); empty after a wake-up whose writes were already taken."""
        if not (self._urgent or self._control or self._carried):
            first = await self._receive.receive()
            if first is not _WAKE:
                self._carried.append(first)
        while not (self._urgent or self._control) and len(self._carried) < self.batch_max:
            try:
                write = self._receive.receive_nowait()
            except trio.WouldBlock:
                break
            if write is not _WAKE:
                self._carried.append(write)
        for lane in (self._urgent, self._control):
            if lane:
                count = len(lane) if lane is self._urgent else min(len(lane), _INLINE_MAX_WRITES, self.batch_max)
                return [lane.popleft() for _ in range(count)], True
        group, self._carried = self._carried[: self.batch_max], self._carried[self.batch_max :]
        return group, False

    def _fail_queued(self) -> None:
        # No checkpoint between this drain and closing the channel, so nothing slips in between.
        carried, self._carried = self._carried, []
        for write in carried:
            write.error = StoreClosed("the store writer stopped before this write ran")
            if write.done is not None:
                write.done.set()
        while True:
            try:
                write = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.ClosedResourceError, trio.EndOfChannel):
                break
            if write is _WAKE:
                continue
            write.error = StoreClosed("the store writer stopped before this write ran")
            if write.done is not None:
                write.done.set()
        while self._urgent or self._control:
            write = (self._urgent or self._control).popleft()
            write.error = StoreClosed("the store writer stopped before this write ran")
            if write.done is not None:
                write.done.set()

    # -- committing (on the loop's thread, or in the worker thread) ----------------------------

    def _commit_inline(
        self, conn: sqlite3.Connection, group: list[_Write], *, slice_s: float | None = None
    ) -> list[_Write] | None:
        """Commit ``group`` on the calling (event loop) thread if it is small and the write lock
        is free at once (module doc); None: nothing ran, commit it in the worker thread. With
        ``slice_s``, the writes stop after that many seconds of work (at least one runs); those
        not run are returned, for the next group.

        Blocks for the group's own SQLite work (well under a millisecond for an interrupted
        turn's end or a lease renewal), never for another connection's lock or a WAL checkpoint.
        """
        if not carries_at_most(group, _INLINE_MAX_BYTES):
            return None
        if not self._inline_settings:
            # Kept for the inline groups that follow (an interrupt's end after an admission, a
            # burst of admissions): :meth:`_commit_threaded` restores them before the next group
            # in the worker thread, so that one waits for locks and checkpoints as usual.
            if self._autocheckpoint is None:
                self._autocheckpoint = int(conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
            conn.execute("PRAGMA busy_timeout = 0")
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            self._inline_settings = True
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            return None  # locked by another process (or failing): the worker thread retries it
        self._slice_end = None if slice_s is None else time.perf_counter() + slice_s
        try:
            return self._commit_group(conn, group, begun=True)
        finally:
            self._slice_end = None

    def _commit_threaded(self, conn: sqlite3.Connection, group: list[_Write]) -> list[_Write]:
        """:meth:`_commit_group` in the worker thread, with the connection's own lock wait and
        WAL checkpoints (restored if an inline group left them off)."""
        if self._inline_settings:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute(f"PRAGMA wal_autocheckpoint = {self._autocheckpoint}")
            self._inline_settings = False
        self._last_threaded = time.monotonic()
        return self._commit_group(conn, group)

    def _commit_group(self, conn: sqlite3.Connection, group: list[_Write], *, begun: bool = False) -> list[_Write]:
        """Run one group in one transaction (blocking: on the loop's thread or in a worker
        thread; ``begun``: its ``BEGIN IMMEDIATE`` already ran, see :meth:`_commit_inline`).

        Returns:
            The writes not run because an urgent write came in meanwhile (untouched, in order).
        """
        pending = list(group)
        deferred: list[_Write] = []
        for _ in range(_MAX_GROUP_RESTARTS):
            for write in pending:
                write.result, write.error = None, None
            try:
                with immediate(conn, begun=begun):
                    begun = False
                    destroyed, ran = self._run_writes(conn, pending)
                    if destroyed is not None:
                        # The failing write ended the transaction; `immediate` has nothing to
                        # commit. Re-run the others in a fresh transaction.
                        raise _Restart(destroyed)
                    pending, deferred = pending[:ran], pending[ran:] + deferred
            except _Restart as restart:
                pending = [w for w in pending if w is not restart.write]
                if not pending:
                    break
                continue
            except StoreError as exc:
                # BEGIN IMMEDIATE or COMMIT failed: nothing of the group is stored.
                for write in pending:
                    write.error = _fresh(exc)
                return deferred
            ok = sum(1 for w in pending if w.error is None)
            self.stats.transactions += 1
            self.stats.writes += ok
            self.stats.failed += len(pending) - ok
            self.stats.largest_group = max(self.stats.largest_group, ok)
            return deferred
        for write in pending:
            write.error = StoreError("the write group could not be committed")
        return deferred

    def _run_writes(self, conn: sqlite3.Connection, writes: list[_Write]) -> tuple[_Write | None, int]:
        """Run each write in its own savepoint, stopping early once an urgent write waits (after
        at least one) or a control write does (after :data:`_DATA_BEFORE_CONTROL`); return a
        write that destroyed the transaction (or None) and how many writes ran."""
        slice_end = self._slice_end
        for index, write in enumerate(writes):
            if index and (self._urgent or (self._control and index >= _DATA_BEFORE_CONTROL)):
                return None, index
            if slice_end is not None and index and time.perf_counter() >= slice_end:
                return None, index
            try:
                with immediate(conn):
                    write.result = write.fn(conn, *write.args, **write.kwargs)
            except sqlite3.Error as exc:
                write.error = _translate(exc)
            except Exception as exc:
                write.error = exc
            if not conn.in_transaction:
                return write, index + 1
        return None, len(writes)


class _Restart(Exception):
    def __init__(self, write: _Write) -> None:
        super().__init__("group restart")
        self.write = write


def _translate(exc: sqlite3.Error) -> StoreError:
    err = translate_error(exc)
    err.__cause__ = exc
    return err


def _fresh(exc: StoreError) -> StoreError:
    """A separate exception object per caller (tracebacks of one raise must not be shared)."""
    try:
        err: StoreError = type(exc)(str(exc))  # keep the class: callers map it to a typed code
    except TypeError:
        err = StoreError(str(exc))
    err.__cause__ = exc.__cause__ or exc
    return err
