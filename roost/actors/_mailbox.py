"""Bounded mailboxes, actor references, ``tell`` and ``ask``.

A mailbox is a bounded trio memory channel. ``tell`` never blocks: a full mailbox raises
:class:`~roost.errors.MailboxFull` to the sender, which a front door turns into a
``server_overloaded`` error for its client (backpressure is explicit, never a hidden wait).
``ask`` sends a message with a reply slot and waits for the reply under a timeout.
"""

from __future__ import annotations

import math
from typing import Any, Generic, TypeVar

import attrs
import trio

from roost.errors import ActorCrashed, AskTimeout, MailboxClosed, MailboxFull

__all__ = ["Mailbox", "Ref", "ReplySlot", "Envelope", "DEFAULT_ASK_TIMEOUT"]

M = TypeVar("M")

#: Seconds ``ask`` waits for a reply unless told otherwise.
DEFAULT_ASK_TIMEOUT = 10.0


class ReplySlot:
    """A one-shot slot an actor fills with its reply (a value or an exception).

    The first :meth:`set_result` / :meth:`set_exception` wins; later ones are ignored, so an actor
    that crashes after replying cannot overwrite the reply.
    """

    __slots__ = ("_event", "_value", "_error")

    def __init__(self) -> None:
        self._event = trio.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        """True once a reply (or an error) has been set."""
        return self._event.is_set()

    def set_result(self, value: Any) -> None:
        """Deliver ``value`` to the asker (no-op if already replied)."""
        if not self._event.is_set():
            self._value = value
            self._event.set()

    def set_exception(self, error: BaseException) -> None:
        """Deliver ``error`` to the asker, who raises it (no-op if already replied)."""
        if not self._event.is_set():
            self._error = error
            self._event.set()

    async def wait(self) -> Any:
        """Wait for the reply and return it, or raise the delivered exception.

        Cancellation: a checkpoint; cancelling the wait leaves the slot unchanged.
        """
        await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value


@attrs.define(slots=True)
class Envelope:
    """A message in a mailbox, with the reply slot of an ``ask`` (None for ``tell``)."""

    message: Any
    reply: ReplySlot | None = None


class Mailbox(Generic[M]):
    """A bounded FIFO of :class:`Envelope`; the receiving end belongs to one actor.

    Args:
        capacity: how many messages may wait (>= 1). ``math.inf`` is refused: every mailbox in
            Roost is bounded.

    Raises:
        ValueError: ``capacity`` is not a positive whole number.
    """

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or capacity < 1 or capacity == math.inf:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self._send, self._receive = trio.open_memory_channel[Envelope](capacity)

    def put_nowait(self, envelope: Envelope) -> None:
        """Enqueue without blocking.

        Raises:
            MailboxFull: ``capacity`` messages are already waiting.
            MailboxClosed: the owner has stopped.
        """
        try:
            self._send.send_nowait(envelope)
        except trio.WouldBlock:
            raise MailboxFull(f"mailbox full ({self.capacity} messages waiting)") from None
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise MailboxClosed("the actor has stopped") from None

    async def put(self, envelope: Envelope) -> None:
        """Enqueue, waiting while the mailbox is full (a checkpoint).

        Only for an actor's own producer tasks that must apply backpressure to a source (a
        connection's reader stops reading its transport); senders use :meth:`Ref.tell`, which
        never waits.

        Raises:
            MailboxClosed: the owner has stopped.
        """
        try:
            await self._send.send(envelope)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise MailboxClosed("the actor has stopped") from None

    async def get(self) -> Envelope:
        """Receive the next envelope (a checkpoint).

        Raises:
            trio.EndOfChannel: the mailbox was closed and is empty.
        """
        return await self._receive.receive()

    def get_nowait(self) -> Envelope:
        """Receive without blocking; raises ``trio.WouldBlock`` when empty."""
        return self._receive.receive_nowait()

    def __len__(self) -> int:
        return self._send.statistics().current_buffer_used

    def close(self) -> list[Envelope]:
        """Refuse further messages and return those still waiting (undelivered). Idempotent."""
        self._send.close()
        left: list[Envelope] = []
        while True:
            try:
                left.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        self._receive.close()
        return left


class Ref(Generic[M]):
    """A handle to an actor: the only way to talk to it.

    Refs are cheap and may be shared freely between tasks; they never expose the actor's state.
    """

    __slots__ = ("name", "_mailbox")

    def __init__(self, name: str, mailbox: Mailbox[M]) -> None:
        self.name = name
        self._mailbox = mailbox

    def tell(self, message: M) -> None:
        """Send ``message`` without waiting. Never blocks; not a checkpoint.

        Raises:
            MailboxFull: the actor's mailbox is full; the message was not delivered.
            MailboxClosed: the actor has stopped.
        """
        self._mailbox.put_nowait(Envelope(message))

    async def ask(self, message: M, *, timeout: float | None = DEFAULT_ASK_TIMEOUT) -> Any:
        """Send ``message`` and wait for the actor's reply.

        Args:
            message: an attrs message instance the actor handles.
            timeout: seconds to wait for the reply; ``None`` waits without limit (the caller's own
                cancel scopes still apply).

        Returns:
            Whatever the actor's handler returned.

        Raises:
            MailboxFull: the mailbox was full; nothing was sent.
            MailboxClosed: the actor has stopped.
            AskTimeout: no reply within ``timeout`` seconds (the message may still be handled).
            ActorCrashed: the actor died before replying.
            RoostError: an expected error the handler raised, delivered as the reply.

        Cancellation: a checkpoint. If cancelled, the message may already have been delivered.
        """
        slot = ReplySlot()
        self._mailbox.put_nowait(Envelope(message, slot))
        if timeout is None:
            return await slot.wait()
        with trio.move_on_after(timeout):
            return await slot.wait()
        raise AskTimeout(f"{self.name} did not reply within {timeout} s to {type(message).__name__}")

    @property
    def queued(self) -> int:
        """How many messages wait in the mailbox now."""
        return len(self._mailbox)

    def __repr__(self) -> str:
        return f"<Ref {self.name}>"


def fail_pending(envelopes: list[Envelope], reason: str) -> None:
    """Answer every pending ``ask`` among ``envelopes`` with :class:`ActorCrashed`."""
    for env in envelopes:
        if env.reply is not None:
            env.reply.set_exception(ActorCrashed(reason))
