"""StdioConnection: ``roost app-server``'s one client, an actor (DESIGN.md section 2, issue 12).

A :class:`~roost.actors.ConnectionActor` whose mailbox holds the request lines read from stdin:
its reader task decodes lines (the one sans-IO :class:`~roost.protocol._framing.LineDecoder`) and
waits while 64 frames, or frames of 1 MiB of request lines beyond a single one, are queued, so a client that
floods stdin is slowed at the pipe. Each frame is handed, in arrival order, to the session's
dispatcher (:meth:`AppServerSession.handle_frame`), which answers at once or starts a request task in
the actor's nursery (at most ``MAX_IN_FLIGHT`` at once). The outbox writer writes to stdout.

It runs as the temporary child ``connection:stdio`` of the app-server's ``connections``
supervisor. Its ends:

* end of input (EOF, SIGTERM) or ``shutdown``: the requests already read finish, running turns
  are interrupted and persisted, what is queued is written, the actor stops (a normal end);
* the client stops reading (outbox overflow) or closes stdout: the same clean-up, nothing more is
  written (a normal end, logged); a write to a slow client cut in the middle of a line is given
  the rest of that line first (:class:`~roost.protocol._as_stdout.LineEndingFdStream`, at most
  :data:`~roost.protocol._as_stdout.FINISH_LINE_S` seconds), so stdout ends at a line boundary;
* a crash (a bug in a handler, or the fault hook): the clean-up still interrupts and persists the
  running turns (:meth:`on_stop`, shielded and bounded), the supervisor logs the end and does not
  restart it: a stdio connection cannot be re-opened, and reading again from the same stdin would
  lose the half-read line and the in-flight requests' answers. The process then ends
  (:func:`roost.protocol._serve_appserver.serve_connection` raises :class:`StdioConnectionCrashed`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import trio

from roost._faults import fault_point
from roost.actors import ConnectionActor, InputEnded, InputFrame
from roost.protocol._as_stdout import LineEndingFdStream
from roost.protocol._framing import LineDecoder, line_limit

__all__ = ["StdioConnection", "StdioConnectionCrashed", "STDIO_CHILD"]

log = logging.getLogger("roost.appserver")

#: The child id of the stdio connection under the ``connections`` supervisor.
STDIO_CHILD = "connection:stdio"


class StdioConnectionCrashed(Exception):
    """The app-server's stdio connection ended abnormally (crashed, or was crashed by its
    supervisor): the session is over and the process must end (exit status 1)."""


class StdioClientTooSlow(Exception):
    """The app-server's client stopped reading stdout (its outbox overflowed: the slow-consumer
    policy, :mod:`roost.protocol._outbox`): the session is over, running turns were interrupted and
    persisted, and the process ends with exit status 3 (not 0: input did not end)."""


class StdioConnection(ConnectionActor):
    """The app-server's stdio client as an actor (see the module docstring).

    Args:
        session: the :class:`~roost.protocol._appserver.AppServerSession` it serves (its outbox is
            this actor's; its request tasks run in this actor's nursery).
        receive: the byte stream of requests (stdin); closing it (SIGTERM) ends input.
        send: the byte stream responses and notifications are written to (stdout).
        mailbox_size, max_waiting_bytes: :class:`~roost.actors.ConnectionActor`'s bounds.

    Attributes:
        ended_normally: True once it ended by end of input, ``shutdown``, or the client going
            away; False while running and after a crash or a stop from outside.
        end_reason: why it ended (for the log), or None.
    """

    #: on_stop interrupts the running turns and waits up to 15 s for them to persist
    stop_timeout = 30.0

    def __init__(
        self,
        session: Any,
        receive: trio.abc.ReceiveStream,
        send: trio.abc.SendStream,
        *,
        mailbox_size: int | None = None,
        max_waiting_bytes: int | None = None,
    ) -> None:
        async def no_close(code: int, reason: str) -> None:
            """stdout is the process's; it is left open (logs and a last line may follow)."""

        if isinstance(send, trio.lowlevel.FdStream):  # the process's stdout: a drop ends lines
            send = LineEndingFdStream(send)

        super().__init__(
            frames=_sized_frames(receive, LineDecoder(max_line_bytes=line_limit())),
            stream=send,
            outbox=session.outbox,
            handle_line=_unused,
            close=no_close,
            mailbox_size=mailbox_size,
            max_waiting_bytes=max_waiting_bytes,
            name=STDIO_CHILD,
        )
        self.session = session
        self.ended_normally = False
        self.end_reason: str | None = None
        self._ending = False  # input has ended: later frames (read ahead of a shutdown) are dropped
        self._settled = False  # the running turns were interrupted and persisted

    async def on_start(self) -> None:
        if getattr(self.session, "answered_early", False):
            fault_point("connection")  # test-only: the line answered before the event loop counts too
        self.session.serve_in(self.nursery)
        self.nursery.start_soon(self._write)
        self.nursery.start_soon(self._read)
        self.nursery.start_soon(self._watch_closed)

    async def handle(self, message: Any) -> None:
        if isinstance(message, InputFrame):
            self._waiting_bytes -= message.size
            self._drained.set()
            if self._ending:
                return
            fault_point("connection")  # test-only: crash before a line is handled
            await self.session.handle_frame(message.frame)
            if self.session.shutdown_requested:
                await self._end_input("shutdown")
        elif isinstance(message, InputEnded):
            if not self._ending:
                self.session.input_ended()  # a worker process whose front went away ends here
                await self._end_input("end of input")
        else:
            raise TypeError(f"{self.name} cannot handle {type(message).__name__}")

    async def _end_input(self, reason: str) -> None:
        """Stop reading; let the requests already read finish; interrupt and persist the running
        turns; close the outbox (the writer writes what is queued, then stops the actor)."""
        self._ending = True
        if self._reader_scope is not None:
            self._reader_scope.cancel()
        await self.session.wait_idle()
        with trio.CancelScope(shield=True):
            await self.session.interrupt_all()
        self._settled = True
        self._end_normally(reason)
        self.session.closed.set()
        self.outbox.close()

    def _end_normally(self, reason: str) -> None:
        if self.end_reason is None:
            self.ended_normally, self.end_reason = True, reason

    async def _watch_closed(self) -> None:
        """The session closed by itself (its outbox overflowed: the client stopped reading)."""
        await self.session.closed.wait()
        if not self._ending and self.end_reason is None:  # (not: the client closed stdout, see _write)
            log.warning("app-server: the client stopped reading stdout (its outbox overflowed); the session ends")
            self._end_normally(TOO_SLOW)
            self.stop(self.end_reason or "closed")

    async def _write(self) -> None:
        try:
            await self.outbox.run_writer(self._stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            if self.end_reason is None and not self._ending:
                log.warning("app-server: the client closed stdout; the session ends")
            self._end_normally(CLOSED_STDOUT)
            self.session.closed.set()
        self.stop(self.end_reason or "the outbox ended")

    async def on_stop(self) -> None:
        """Interrupt and persist the running turns unless end of input did (shielded and bounded by
        :attr:`stop_timeout`), also after a crash; then close the session."""
        if not self._settled:
            await self.session.interrupt_all()
        self.session.closed.set()
        self.outbox.close()
        if isinstance(self._stream, LineEndingFdStream) and self._stream.cut_tail:
            # a slow client dropped in the middle of a line: give it the rest of that line
            log.info("app-server: the rest of a cut line (%d bytes) waits for the client", len(self._stream.cut_tail))
            ended = await self._stream.finish_line()
            log.info(
                "app-server: the last line %s", "was completed" if ended else "stays cut (the client reads nothing)"
            )


#: The end reason of a client that stopped reading (:class:`StdioClientTooSlow`, exit status 3).
TOO_SLOW = "the client stopped reading stdout (outbox overflow)"
#: The end reason of a client that closed its end of stdout (a broken pipe: exit status 0, as
#: input ending is; nothing more can be told to it).
CLOSED_STDOUT = "the client closed stdout"

#: The most bytes asked of each read of stdin.
_RECEIVE_BYTES = 64 * 1024


async def _sized_frames(receive: trio.abc.ReceiveStream, decoder: LineDecoder) -> AsyncIterator[InputFrame]:
    """The decoded frames of ``receive``, each with the byte length of its line (the mailbox's
    byte budget counts what the request lines weighed), until end of input."""
    while True:
        data = await receive.receive_some(_RECEIVE_BYTES)
        frames = decoder.feed(data) if data else decoder.finish()
        for frame, size in zip(frames, decoder.last_sizes, strict=True):
            yield InputFrame(frame, size)
        if not data:
            return


async def _unused(conn: ConnectionActor, frame: Any) -> None:  # pragma: no cover - handle() is overridden
    raise AssertionError("StdioConnection handles its frames itself")
