"""ConnectionActor: one attached client of the serve daemon (DESIGN.md section 2, ``temporary``).

A real :class:`~roost.actors._actor.Actor`: its bounded mailbox holds the client's input frames,
handled one at a time in arrival order by the front door's handler. A reader task (in the actor's
own nursery) puts each frame read from the transport into the mailbox and *waits* while it is full
(64 frames, or 1 MiB of waiting frames beyond a single one), so a client that floods input is
slowed at its transport (backpressure), never buffered without bound. The actor also owns the
client's bounded outbox and its writer task. A client that stops reading fills its outbox and is
*kicked* (slow consumer, DESIGN.md section 4 "Events"): no more lines are queued for it, what was
queued is still written for at most ``kick_grace`` seconds, and then the transport is closed with
a reason. Neither the tasks nor the other clients ever wait for it.

A serve daemon runs each connection's actor as a temporary child ``connection:<n>`` of its
``connections`` supervisor (the child's task is the actor's :meth:`run`); a handler that raises
anything but a :class:`~roost.errors.RoostError` crashes the actor and ends only that connection.

The actor is transport-neutral: the front door gives it an async iterator of input frames, a byte
``SendStream`` the outbox writer writes to (for a WebSocket, an adapter that sends one message per
line) and a ``close(code, reason)`` coroutine. The outbox object is injected too (it lives in
``roost.protocol``, which this room does not import).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import attrs
import trio

from roost._json import dumps_line
from roost.actors._actor import Actor
from roost.actors._mailbox import Envelope
from roost.errors import MailboxClosed, MailboxFull

__all__ = ["ConnectionActor", "InputFrame", "InputEnded", "CLOSE_NORMAL", "CLOSE_POLICY", "CLOSE_GOING_AWAY"]

log = logging.getLogger("roost.serve")

#: WebSocket close codes (RFC 6455 section 7.4.1).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
#: Seconds the transport close may take.
_CLOSE_TIMEOUT = 5.0

_ids = itertools.count(1)


@attrs.frozen
class InputFrame:
    """One input frame read from the client (a line, or the framing's error for a bad one), and
    its size in the mailbox's byte budget."""

    frame: Any
    size: int = 0


@attrs.frozen
class InputEnded:
    """The client's input ended (end of stream, or the transport closed)."""


class ConnectionActor(Actor):
    """One client connection, an actor whose mailbox holds its input frames.

    Args:
        frames: the client's input frames (an async iterator; its "closed" errors end input). A
            frame that is a ``str`` or ``bytes`` counts its length in the byte budget; an
            :class:`InputFrame` its ``size`` (a transport that decodes lines knows their length).
        stream: the byte ``SendStream`` the outbox writer writes to.
        outbox: a bounded outbox (``deliver(line)``, ``close()``, ``run_writer(stream)``) whose
            overflow callback the creator wires to :meth:`kick`.
        handle_line: ``await handle_line(conn, frame)`` for each input frame, in order.
        close: ``await close(code, reason)`` closes the transport (bounded by the actor's
            ``stop_timeout``, 5 s).
        kick_grace: seconds a kicked client still gets to read what was queued before the close.
        client: the front door's record of the client (opaque here).
        read_only: whether the client attached with a read-only grant.
        mailbox_size: input frames that may wait to be handled (default 64).
        max_waiting_bytes: the frames waiting in the mailbox hold at most this many bytes
            (characters of a text line) together, beyond a single frame of any size (default
            1 MiB): a client sending huge lines has at most one waiting, whatever their count.
        name: the actor's name (default ``connection:<n>``).
    """

    mailbox_size = 64
    stop_timeout = _CLOSE_TIMEOUT
    max_waiting_bytes = 2**20

    def __init__(
        self,
        *,
        frames: AsyncIterator[Any],
        stream: trio.abc.SendStream,
        outbox: Any,
        handle_line: Callable[[ConnectionActor, Any], Awaitable[None]],
        close: Callable[[int, str], Awaitable[None]],
        kick_grace: float = 10.0,
        client: Any = None,
        read_only: bool = False,
        mailbox_size: int | None = None,
        max_waiting_bytes: int | None = None,
        name: str | None = None,
    ) -> None:
        self.id = next(_ids)
        super().__init__(name=name or f"connection:{self.id}", mailbox_size=mailbox_size)
        self._frames = frames
        self._stream = stream
        self.outbox = outbox
        self.handle_line = handle_line
        self._close = close
        self.kick_grace = kick_grace
        self.client = client
        self.read_only = read_only
        self.close_code = CLOSE_NORMAL
        self.close_reason = ""
        self.closing = False
        self.sent = 0
        self._reader_scope: trio.CancelScope | None = None
        self._writer_scope: trio.CancelScope | None = None
        if max_waiting_bytes is not None:
            self.max_waiting_bytes = max_waiting_bytes
        self._waiting_bytes = 0  # the byte budget's use by the frames in the mailbox
        self._drained = trio.Event()  # set when a waiting frame leaves the mailbox

    @property
    def alive(self) -> bool:
        """True until the connection starts closing (kicked, gone, or stopping)."""
        return not self.closing

    def send(self, event: dict) -> None:
        """Queue one event for the client (never blocks; dropped once the connection is closing)."""
        if not self.closing:
            self.sent += 1
            self.outbox.deliver(dumps_line(event))

    def send_line(self, line: bytes) -> None:
        """Queue one pre-encoded line (bytes ending in a newline)."""
        if not self.closing:
            self.sent += 1
            self.outbox.deliver(line)

    def kick(self, reason: str, *, code: int = CLOSE_POLICY) -> None:
        """Disconnect the client: stop reading and queueing, flush what is queued (bounded), close.

        Idempotent; the first reason wins. Not a checkpoint. Frames still in the mailbox are
        dropped unhandled.
        """
        if self.closing:
            return
        self.closing = True
        self.close_code, self.close_reason = code, reason
        self.outbox.close()
        if self._reader_scope is not None:
            self._reader_scope.cancel()
        if self._writer_scope is not None:
            self._writer_scope.deadline = min(self._writer_scope.deadline, trio.current_time() + self.kick_grace)

    # -- the actor ------------------------------------------------------------------------------

    async def on_start(self) -> None:
        self.nursery.start_soon(self._write)
        self.nursery.start_soon(self._read)

    async def handle(self, message: Any) -> None:
        if isinstance(message, InputFrame):
            self._waiting_bytes -= message.size
            self._drained.set()
            if not self.closing:
                await self.handle_line(self, message.frame)
        elif isinstance(message, InputEnded):
            if not self.closing:
                # The client went away: nothing more to write.
                self.closing = True
                self.outbox.close()
            self.stop("the client went away")
        else:
            raise TypeError(f"{self.name} cannot handle {type(message).__name__}")

    async def on_stop(self) -> None:
        """Close the transport (shielded and bounded by the actor); a stop from outside (the daemon
        shutting down) closes with code 1001."""
        if not self.closing:
            self.closing = True
            self.close_code, self.close_reason = CLOSE_GOING_AWAY, "the daemon is stopping"
            self.outbox.close()
        try:
            await self._close(self.close_code, self.close_reason)
        except Exception:
            log.debug("connection %s: close failed", self.id, exc_info=True)

    async def _read(self) -> None:
        """Move input frames into the mailbox, waiting while it is full (in frames or in bytes);
        then say input ended."""
        with trio.CancelScope() as self._reader_scope:
            try:
                async for frame in self._frames:
                    if self.closing:
                        return
                    if isinstance(frame, InputFrame):  # sized by the transport
                        frame, size = frame.frame, frame.size
                    else:
                        size = len(frame) if isinstance(frame, (str, bytes)) else 0
                    while self._waiting_bytes and self._waiting_bytes + size > self.max_waiting_bytes:
                        self._drained = trio.Event()
                        await self._drained.wait()
                    self._waiting_bytes += size
                    envelope = Envelope(InputFrame(frame, size))
                    try:  # room is taken without a checkpoint: a chunk's frames cost no batch each
                        self._mailbox.put_nowait(envelope)
                    except MailboxFull:
                        await self._mailbox.put(envelope)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            except Exception as exc:  # transport-specific "closed" errors
                if type(exc).__name__ != "ConnectionClosed":
                    raise
            try:
                await self._mailbox.put(Envelope(InputEnded()))
            except MailboxClosed:
                pass

    async def _write(self) -> None:
        """Write the outbox to the transport; when it ends (drained after a kick, or the client
        gone), the connection stops."""
        with trio.CancelScope() as self._writer_scope:
            if self.closing:
                self._writer_scope.deadline = trio.current_time() + self.kick_grace
            try:
                await self.outbox.run_writer(self._stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.kick("the client went away", code=CLOSE_GOING_AWAY)
            except Exception as exc:
                if type(exc).__name__ != "ConnectionClosed":
                    raise
                self.kick("the client went away", code=CLOSE_GOING_AWAY)
        if self.closing:
            self.stop(self.close_reason or "closed")
