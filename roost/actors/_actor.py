"""The Actor base class: a trio task with a bounded mailbox and an explicit lifecycle.

An actor handles one message at a time, in arrival order. Long work (a turn, a stream) runs in
child tasks of the actor's own nursery (:attr:`Actor.nursery`), so stopping the actor cancels it.

Replies: a handler's return value answers an ``ask``. A handler that raises a
:class:`~roost.errors.RoostError` answers the asker with that error and the actor lives on
(expected errors are replies). Any other exception is a bug: the actor crashes, every pending asker
gets :class:`~roost.errors.ActorCrashed`, and the exception propagates to its supervisor. A stop
(:meth:`Actor.stop`, or cancellation from outside) is not a crash: askers still waiting, including
the one whose handler was running, get :class:`~roost.errors.MailboxClosed`.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

from roost.actors._mailbox import Envelope, Mailbox, Ref, fail_pending
from roost.errors import ActorCrashed, LifecycleError, MailboxClosed, RoostError

__all__ = ["Actor", "ActorState", "shielded_cleanup"]

log = logging.getLogger("roost.actors")

#: Messages an actor handles per scheduler round when its mailbox has a backlog.
_DRAIN = 64


class ActorState(enum.Enum):
    """Lifecycle of an actor; it only moves forward."""

    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@contextmanager
def shielded_cleanup(timeout: float) -> Iterator[trio.CancelScope]:
    """Run clean-up that outer cancellation cannot interrupt, but that cannot hang either.

    Use in a ``finally``: the body is shielded from outer cancellation and is itself cancelled
    after ``timeout`` seconds (``scope.cancelled_caught`` then tells the caller it was cut short).

    Args:
        timeout: seconds the clean-up may take (trio's clock).

    Raises:
        ValueError: ``timeout`` is negative or NaN.
    """
    if not timeout >= 0:
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")
    with trio.CancelScope(shield=True, deadline=trio.current_time() + timeout) as scope:
        yield scope
    if scope.cancelled_caught:
        log.warning("clean-up cut short after %.3f s", timeout)


class Actor:
    """Base class of every long-lived Roost component that receives messages.

    Subclasses override :meth:`handle` (and optionally :meth:`on_start`, :meth:`on_stop`) and are
    started with ``ref = await nursery.start(actor.run)`` or as a supervisor child.

    Args:
        name: a label for logs and the supervision tree.
        mailbox_size: mailbox capacity in messages (bounded; default :attr:`mailbox_size`).
        stop_timeout: seconds :meth:`on_stop` may take before it is cut short.
    """

    #: default mailbox capacity, in messages
    mailbox_size: int = 256
    #: default bound on :meth:`on_stop`, in seconds
    stop_timeout: float = 5.0

    def __init__(
        self, *, name: str | None = None, mailbox_size: int | None = None, stop_timeout: float | None = None
    ) -> None:
        self.name = name or type(self).__name__
        self.state = ActorState.NEW
        self._mailbox: Mailbox[Any] = Mailbox(mailbox_size or self.mailbox_size)
        self.ref: Ref[Any] = Ref(self.name, self._mailbox)
        if stop_timeout is not None:
            self.stop_timeout = stop_timeout
        self._nursery: trio.Nursery | None = None
        self._stop_scope: trio.CancelScope | None = None
        self.stop_reason: str | None = None

    # -- hooks ----------------------------------------------------------------------------------

    async def on_start(self) -> None:
        """Called once before the first message; may start child tasks in :attr:`nursery`."""

    async def handle(self, message: Any) -> Any:
        """Handle one message; the return value answers an ``ask``. Override this."""
        raise NotImplementedError(f"{type(self).__name__} does not handle {type(message).__name__}")

    async def on_stop(self) -> None:
        """Called once when stopping, shielded and bounded by :attr:`stop_timeout` seconds."""

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def nursery(self) -> trio.Nursery:
        """The actor's own nursery; child tasks started here end when the actor stops.

        Raises:
            LifecycleError: the actor is not running.
        """
        if self._nursery is None:
            raise LifecycleError(f"{self.name} is {self.state.value}; it has no nursery")
        return self._nursery

    def stop(self, reason: str = "stopped") -> None:
        """Ask the actor to stop (idempotent, not a checkpoint): pending messages are refused."""
        if self.stop_reason is None:
            self.stop_reason = reason
        if self._stop_scope is not None:
            self._stop_scope.cancel()
        elif self.state is ActorState.NEW:
            self.state = ActorState.STOPPED

    async def run(self, *, task_status: trio.TaskStatus[Ref[Any]] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the actor until it is stopped or cancelled; reports its :class:`Ref` when started.

        Raises:
            LifecycleError: the actor was started before (actors are not restartable: a supervisor
                restarts a child by building a new instance).
            Exception: whatever a handler raised that is not a ``RoostError`` (a crash).
        """
        if self.state is not ActorState.NEW:
            raise LifecycleError(f"{self.name} cannot start: it is {self.state.value}")
        self.state = ActorState.STARTING
        crash: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                with trio.CancelScope() as self._stop_scope:
                    if self.stop_reason is not None:
                        self._stop_scope.cancel()
                    await self.on_start()
                    self.state = ActorState.RUNNING
                    task_status.started(self.ref)
                    await self._loop()
                nursery.cancel_scope.cancel()
        except BaseException as exc:
            crash = exc
            raise
        finally:
            self.state = ActorState.STOPPING
            self._nursery = None
            left = self._mailbox.close()
            if crash is None or _is_cancellation(crash):
                # A stop (stop() or cancellation from outside) is not a crash: askers see the
                # mailbox closed, never an ActorCrashed carrying a repr of Cancelled.
                for env in left:
                    if env.reply is not None:
                        env.reply.set_exception(MailboxClosed(f"{self.name} stopped"))
            else:
                fail_pending(left, f"{self.name} crashed: {crash!r}")
            if type(self).on_stop is not Actor.on_stop:  # (a turn has none: no bounded scope per turn)
                with shielded_cleanup(self.stop_timeout):
                    try:
                        await self.on_stop()
                    except Exception:
                        log.exception("%s: on_stop failed", self.name)
            self.state = ActorState.STOPPED

    async def _loop(self) -> None:
        # After one blocking receive, handle up to _DRAIN - 1 more waiting messages without a
        # scheduler round each; then yield again, so other tasks (and stop()) wait at most that long.
        while True:
            try:
                env = await self._mailbox.get()
            except trio.EndOfChannel:
                return
            await self._dispatch(env)
            for _ in range(_DRAIN - 1):
                try:
                    env = self._mailbox.get_nowait()
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
                await self._dispatch(env)

    async def _dispatch(self, env: Envelope) -> None:
        try:
            result = await self.handle(env.message)
        except RoostError as exc:
            if env.reply is not None:
                env.reply.set_exception(exc)
            else:
                log.warning("%s: %s from a told %s", self.name, exc, type(env.message).__name__)
        except BaseException as exc:
            if env.reply is not None:
                if _is_cancellation(exc):
                    env.reply.set_exception(MailboxClosed(f"{self.name} stopped"))
                else:
                    env.reply.set_exception(ActorCrashed(f"{self.name} crashed: {exc!r}"))
            raise
        else:
            if env.reply is not None:
                env.reply.set_result(result)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.state.value}>"


def _is_cancellation(exc: BaseException) -> bool:
    """True for ``trio.Cancelled`` or a group holding nothing but Cancelled (a stop, not a crash)."""
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_is_cancellation(inner) for inner in exc.exceptions)
    return False
