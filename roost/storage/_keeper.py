"""The LeaseKeeper: renews the leases of this process's executions and fences off lost ones."""

from __future__ import annotations

import enum
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import trio

from roost._faults import fault_point
from roost.errors import LifecycleError, StaleLease, StoreClosed, StoreError, StoreFull

from . import leases as _sqlite_leases
from ._owner import default_owner
from ._writer import StoreWriter
from .leases import Lease

__all__ = ["LeaseKeeper", "Execution", "default_owner"]

R = TypeVar("R")


def _ops(writer: StoreWriter) -> Any:
    """The lease functions of the writer's backend: PostgreSQL's for a ``PgWriter``
    (its ``lease_ops``), else SQLite's (:mod:`roost.storage.leases`)."""
    return getattr(writer, "lease_ops", _sqlite_leases)


class _State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    #: between two runs of :meth:`LeaseKeeper.serve` (a restart): holds still queue
    IDLE = "idle"
    STOPPED = "stopped"


@attrs.define(eq=False)
class Execution:
    """One execution holding a lease; run its work inside :attr:`cancel_scope`.

    Attributes:
        lease: the current lease (``expires_at`` moves on each renewal; the token never changes).
        cancel_scope: cancelled when the lease is lost; the caller enters it around the work.
        lost_reason: ``None`` while held; else why it was lost: ``"superseded"`` (another
            acquisition, a release or a hand-over made the token stale), ``"expired"`` (renewals
            failed until the lease expired), ``"keeper_stopped"``.
        lost: set when the lease is lost.
        renewals: successful renewals so far.
        renewed: set at the next successful renewal, then replaced by a fresh event (wait on
            ``execution.renewed.wait()`` to observe one renewal).
        handed_over_to: the successor named by :meth:`hand_over`, or ``None``.
        released: a committed write of the caller released the lease (:meth:`mark_released`).
    """

    lease: Lease
    _writer: StoreWriter
    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    lost_reason: str | None = None
    lost: trio.Event = attrs.field(factory=trio.Event)
    renewals: int = 0
    renewed: trio.Event = attrs.field(factory=trio.Event)
    handed_over_to: str | None = None
    released: bool = False
    _done: trio.Event = attrs.field(factory=trio.Event)

    async def submit(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """Run ``fn(conn, *args, **kwargs)`` through the writer, fenced by this execution's token.

        Raises:
            StaleLease: the token is stale; the write changed nothing and the execution's scope
                is cancelled (``lost_reason="superseded"``).
            Whatever :meth:`StoreWriter.submit` raises.
        """
        try:
            return await self._writer.submit(
                _ops(self._writer).fenced(self.lease.key, self.lease.token, fn), *args, **kwargs
            )
        except StaleLease:
            self._lose("superseded")
            raise

    async def submit_urgent(self, fn: Callable[..., R], *args: Any) -> R:
        """:meth:`submit` ahead of the writer's queue (:meth:`StoreWriter.submit_urgent`).

        Raises:
            The errors of :meth:`submit`.
        """
        return await self._fenced(self._writer.submit_urgent, fn, args)

    async def submit_control(self, fn: Callable[..., R], *args: Any) -> R:
        """:meth:`submit` in the writer's control lane (:meth:`StoreWriter.submit_control`).

        Raises:
            The errors of :meth:`submit`.
        """
        return await self._fenced(self._writer.submit_control, fn, args)

    async def _fenced(self, submit: Callable[..., Any], fn: Callable[..., R], args: tuple) -> R:
        try:
            fenced = _ops(self._writer).fenced
            return await submit(fenced(self.lease.key, self.lease.token, fn), *args)
        except StaleLease:
            self._lose("superseded")
            raise

    async def hand_over(self, successor: str, *, ttl: float | None = None) -> None:
        """Hand the lease to the owner ``successor`` (see :func:`roost.storage.leases.hand_over`).

        Renewal stops; this execution's writes are stale from now on; the scope is not cancelled
        (the caller finishes on its own).

        Raises:
            StaleLease: the lease was already lost (the scope is cancelled).
        """
        try:
            await self._writer.submit(_ops(self._writer).hand_over, self.lease, successor, ttl=ttl)
        except StaleLease:
            self._lose("superseded")
            raise
        self.handed_over_to = successor
        self._done.set()

    def mark_released(self) -> None:
        """Record that a write of the caller's own, now committed, released the lease (a turn's
        end releases it in the transaction of its turn row, :func:`roost.storage.release`): the
        hold's exit then writes no release of its own (a transaction per turn that changed
        nothing). Call it only once that write is durable; renewal stops."""
        self.released = True
        self._done.set()

    def _lose(self, reason: str) -> None:
        if self._done.is_set() or self.lost_reason is not None:
            return
        self.lost_reason = reason
        self.cancel_scope.cancel()
        self.lost.set()


class LeaseKeeper:
    """A trio service that acquires, renews and releases this process's execution leases.

    Start it with ``await nursery.start(keeper.run)`` after the writer; then::

        async with keeper.hold(thread_lease_key(thread_id), ttl=30) as execution:
            with execution.cancel_scope:
                ...  # the execution; writes go through execution.submit(fn, *args)

    Each held lease is renewed every ``ttl * renew_fraction`` seconds through the writer. When a
    renewal finds the token stale, or renewals keep failing until the lease's wall-clock expiry,
    the execution's cancel scope is cancelled and ``lost_reason`` recorded.

    Args:
        writer: the process's :class:`StoreWriter` (all lease operations go through it).
        owner: this process's owner identity (default :func:`default_owner`).
        ttl: default lease duration in seconds.
        renew_fraction: renew after this fraction of the ttl (default 1/3).
        release_timeout: seconds the shielded release on exit may take.
        queue_size: bound of the inbound queue of new executions to watch.
    """

    def __init__(
        self,
        writer: StoreWriter,
        *,
        owner: str | None = None,
        ttl: float = 30.0,
        renew_fraction: float = 1 / 3,
        release_timeout: float = 5.0,
        queue_size: int = 256,
    ) -> None:
        if not 0 < renew_fraction < 1:
            raise ValueError("renew_fraction must be between 0 and 1")
        self.writer = writer
        self.owner = owner or default_owner()
        self.ttl = ttl
        self.renew_fraction = renew_fraction
        self.release_timeout = release_timeout
        self._state = _State.NEW
        self._held: set[Execution] = set()
        self._send, self._receive = trio.open_memory_channel[Execution](queue_size)

    @property
    def executions(self) -> frozenset[Execution]:
        """The executions currently holding a lease through this keeper."""
        return frozenset(self._held)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled, then :meth:`close` (one-shot: :meth:`serve` + close).

        Cancellation:
            Renewals stop; every execution still held is cancelled with ``"keeper_stopped"``
            (its own ``hold`` exit releases the lease).
        """
        try:
            await self.serve(task_status=task_status)
        finally:
            self.close()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch every held and new execution and renew its lease; restartable.

        A fresh instance of the service (a restart after a crash) takes over every execution
        still held: their leases are renewed at once, then on the usual schedule. Ending (crash or
        cancel) does not cancel the executions; :meth:`close` does.

        Raises:
            LifecycleError: already serving. StoreClosed: closed.
        """
        if self._state is _State.RUNNING:
            raise LifecycleError("LeaseKeeper.serve called while it serves")
        if self._state is _State.STOPPED:
            raise StoreClosed("the lease keeper has stopped")
        self._state = _State.RUNNING
        watched: set[Execution] = set()
        try:
            async with trio.open_nursery() as nursery:
                for execution in list(self._held):
                    watched.add(execution)
                    nursery.start_soon(self._watch, execution, 0.0, watched)
                task_status.started()
                async for first in self._receive:
                    # Every execution waiting, not one per scheduler batch: under a burst of
                    # admissions (100 threads) one a batch let the bounded queue fill up.
                    for execution in _with_waiting(first, self._receive):
                        if execution not in watched and not execution._done.is_set():
                            watched.add(execution)
                            nursery.start_soon(self._watch, execution, None, watched)
        finally:
            if self._state is _State.RUNNING:
                self._state = _State.IDLE

    def close(self) -> None:
        """Stop for good: every execution still held is cancelled with ``"keeper_stopped"``."""
        self._state = _State.STOPPED
        self._receive.close()
        for execution in list(self._held):
            execution._lose("keeper_stopped")

    @asynccontextmanager
    async def hold(self, key: str, *, ttl: float | None = None, control: bool = False) -> AsyncIterator[Execution]:
        """Acquire lease ``key`` and keep it renewed for the block.

        Args:
            key: the lease key (e.g. ``thread_lease_key(thread_id)``).
            ttl: lease duration in seconds (default: the keeper's).
            control: acquire in the writer's control lane, ahead of its queue
                (:meth:`StoreWriter.submit_control`): an admission a client waits on (control
                before data, issue 19). The caller must not depend on a write of its own that is
                still queued.

        Yields:
            The :class:`Execution`; run the work inside its ``cancel_scope``.

        Raises:
            LeaseHeld: another live owner holds it (nothing was acquired).
            LifecycleError: the keeper is not running yet. StoreClosed: it has stopped.
            StoreFull: too many executions are waiting to be watched (the lease is released).

        Cancellation:
            On exit (normal, error or cancelled) the lease is released under a shielded scope
            bounded by ``release_timeout``; a release that fails leaves the lease to expire.
        """
        self._check_state("hold")
        ttl = self.ttl if ttl is None else ttl
        submit = self.writer.submit_control if control else self.writer.submit
        lease = await submit(_ops(self.writer).acquire, key, self.owner, ttl)
        async with self.adopt(lease) as execution:
            yield execution

    @asynccontextmanager
    async def hold_with(
        self, key: str, fn: Callable[..., R], *args: Any, ttl: float | None = None, control: bool = False
    ) -> AsyncIterator[tuple[Execution, R]]:
        """:meth:`hold`, with the execution's first write ``fn(conn, *args)`` committed in the
        acquisition's own transaction (:func:`roost.storage.leases.acquire_then`): one commit
        instead of two for a turn's admission (issue 12), and no fence to check.

        Yields:
            ``(execution, what fn returned)``.

        Raises:
            LeaseHeld: another live owner holds it (``fn`` did not run, nothing was written).
            Exception: whatever ``fn`` raised (nothing was written and no lease was taken).
            LifecycleError, StoreClosed, StoreFull: as :meth:`hold`.

        Cancellation:
            As :meth:`hold`. Cancelled while the acquisition is queued or committing, the lease and
            ``fn``'s write may still commit, unreported (shield the call to keep them in step).
        """
        self._check_state("hold_with")
        ttl = self.ttl if ttl is None else ttl
        submit = self.writer.submit_control if control else self.writer.submit
        lease, result = await submit(_ops(self.writer).acquire_then, key, self.owner, ttl, fn, *args)
        async with self.adopt(lease) as execution:
            yield execution, result

    def _check_state(self, verb: str) -> None:
        if self._state is _State.NEW:
            raise LifecycleError(f"LeaseKeeper.{verb} before the keeper was started")
        if self._state is _State.STOPPED:
            raise StoreClosed("the lease keeper has stopped")

    @asynccontextmanager
    async def adopt(self, lease: Lease) -> AsyncIterator[Execution]:
        """Keep ``lease`` (acquired by this keeper's owner, e.g. with a task claim,
        :func:`roost.storage.claim_daemon_task`) renewed for the block, as :meth:`hold` does.

        Raises:
            LifecycleError, StoreClosed, StoreFull: as :meth:`hold` (the lease is released).

        Cancellation:
            As :meth:`hold`: on exit the lease is released, shielded and bounded.
        """
        if self._state is _State.NEW:
            raise LifecycleError("LeaseKeeper.adopt before the keeper was started")
        execution = Execution(lease, self.writer)
        self._held.add(execution)
        try:
            if self._state is _State.STOPPED:
                raise StoreClosed("the lease keeper has stopped")
            try:
                self._send.send_nowait(execution)
            except trio.WouldBlock:
                raise StoreFull("the lease keeper's queue is full") from None
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                raise StoreClosed("the lease keeper has stopped") from None
            yield execution
        finally:
            execution._done.set()
            self._held.discard(execution)
            if execution.handed_over_to is None and not execution.released:
                with trio.move_on_after(self.release_timeout) as scope:
                    scope.shield = True
                    try:
                        await self.writer.submit(_ops(self.writer).release, execution.lease)
                    except StoreError:
                        pass  # the lease expires on its own; its token fences any late write

    async def _watch(self, execution: Execution, first: float | None, watched: set[Execution]) -> None:
        """:meth:`_keep`, then forget ``execution``: ``watched`` (of :meth:`serve`) only stops a
        second watch of a live one, and must not keep every finished execution (with its lease,
        scope and events) for the life of the process."""
        try:
            await self._keep(execution, first)
        finally:
            watched.discard(execution)

    async def _keep(self, execution: Execution, first: float | None) -> None:
        """Renew ``execution``'s lease until it is done or lost (first after ``first`` seconds,
        default the usual interval)."""
        interval = execution.lease.ttl * self.renew_fraction if first is None else first
        while True:
            with trio.move_on_after(interval):
                await execution._done.wait()
                return
            fault_point("lease_keeper")
            try:
                # control before data (issue 19): a renewal does not wait behind queued writes
                execution.lease = await self.writer.submit_urgent(_ops(self.writer).renew, execution.lease)
            except StaleLease:
                execution._lose("superseded")
                return
            except StoreError:
                remaining = execution.lease.expires_at - time.time()
                if remaining <= 0:
                    execution._lose("expired")
                    return
                interval = min(execution.lease.ttl * self.renew_fraction, remaining / 2)
                continue
            execution.renewals += 1
            execution.renewed, fired = trio.Event(), execution.renewed
            fired.set()
            interval = execution.lease.ttl * self.renew_fraction


def _with_waiting(first: Execution, receive: trio.MemoryReceiveChannel[Execution]) -> list[Execution]:
    """``first`` and every execution already waiting in ``receive`` (not a checkpoint)."""
    batch = [first]
    while True:
        try:
            batch.append(receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return batch
