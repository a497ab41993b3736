"""ConnectionActor: one attached client of the serve daemon (DESIGN.md section 2, ``temporary``).

It reads the client's input lines and hands each to the front door's handler, and owns the
client's bounded outbox and its writer task. A client that stops reading fills its outbox and is
*kicked* (slow consumer, DESIGN.md section 4 "Events"): no more lines are queued for it, what was
queued is still written for at most ``kick_grace`` seconds, and then the transport is closed with a
reason. Neither the tasks nor the other clients ever wait for it.

The actor is transport-neutral: the front door gives it an async iterator of input lines, a byte
``SendStream`` the outbox writer writes to (for a WebSocket, an adapter that sends one message per
line) and a ``close(code, reason)`` coroutine. The outbox object is injected too (it lives in
``roost.protocol``, which this room does not import).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

from roost._json import dumps_line
from roost.actors._actor import shielded_cleanup

__all__ = ["ConnectionActor", "CLOSE_NORMAL", "CLOSE_POLICY", "CLOSE_GOING_AWAY"]

log = logging.getLogger("roost.serve")

#: WebSocket close codes (RFC 6455 section 7.4.1).
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
#: Seconds the transport close may take.
_CLOSE_TIMEOUT = 5.0

_ids = itertools.count(1)


class ConnectionActor:
    """One client connection.

    Args:
        outbox: a bounded outbox (``deliver(line)``, ``close()``, ``run_writer(stream)``) whose
            overflow callback the creator wires to :meth:`kick`.
        handle_line: ``await handle_line(conn, frame)`` for each input frame, in order.
        close: ``await close(code, reason)`` closes the transport (bounded by the actor).
        kick_grace: seconds a kicked client still gets to read what was queued before the close.
    """

    def __init__(
        self,
        *,
        outbox: Any,
        handle_line: Callable[[ConnectionActor, Any], Awaitable[None]],
        close: Callable[[int, str], Awaitable[None]],
        kick_grace: float = 10.0,
        client: Any = None,
        read_only: bool = False,
    ) -> None:
        self.id = next(_ids)
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

    @property
    def alive(self) -> bool:
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

        Idempotent; the first reason wins. Not a checkpoint.
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

    async def run(self, frames: AsyncIterator[Any], stream: trio.abc.SendStream) -> None:
        """Serve the connection until the client leaves or is kicked; always closes the transport.

        Cancellation: cancelled from outside (daemon shutdown), the transport is still closed
        (shielded, at most 5 s) with code 1001.
        """
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write, stream)
                with trio.CancelScope() as self._reader_scope:
                    try:
                        async for frame in frames:
                            if self.closing:
                                break
                            await self.handle_line(self, frame)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                    except Exception as exc:  # transport-specific "closed" errors
                        if type(exc).__name__ != "ConnectionClosed":
                            raise
                if not self.closing:
                    # The client went away: nothing more to write.
                    self.closing = True
                    self.outbox.close()
                    nursery.cancel_scope.cancel()
        finally:
            if not self.closing:
                self.closing = True
                self.close_code, self.close_reason = CLOSE_GOING_AWAY, "the daemon is stopping"
                self.outbox.close()
            with shielded_cleanup(_CLOSE_TIMEOUT):
                try:
                    await self._close(self.close_code, self.close_reason)
                except Exception:
                    log.debug("connection %s: close failed", self.id, exc_info=True)

    async def _write(self, stream: trio.abc.SendStream) -> None:
        with trio.CancelScope() as self._writer_scope:
            if self.closing:
                self._writer_scope.deadline = trio.current_time() + self.kick_grace
            try:
                await self.outbox.run_writer(stream)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.kick("the client went away", code=CLOSE_GOING_AWAY)
            except Exception as exc:
                if type(exc).__name__ != "ConnectionClosed":
                    raise
                self.kick("the client went away", code=CLOSE_GOING_AWAY)
        if self._reader_scope is not None and self.closing:
            self._reader_scope.cancel()
