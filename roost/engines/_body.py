"""A streamed response body read by a task of its own, so that an interrupt never waits for it.

An engine's turn used to read its SSE body in its own task. Interrupted there, the ``Cancelled``
arrived inside httpcore's read, and httpcore closes the connection before letting it go on: a
shielded clean-up of several checkpoints, each a whole scheduler batch when 100 turns stream.
Under the peers harness's saturated phase (issue 19) that was 3.5-11 ms of an interrupt's 15-35,
traced per hop. :class:`BodyReader` runs the read in a system task and hands the turn whole
batches of events through a memory channel of one batch: the turn waits on the channel, so an
interrupt reaches it at once and its clean-up happens in the reader's own task, in the
background. The reader owns the response from then on: it closes it (bounded by
:data:`CLOSE_GRACE`), after reading what follows the terminal marker when asked to (so that the
connection goes back to httpx's pool).

Also here: the SSE framing of one network read (:func:`sse_batches`) and ``TCP_QUICKACK``
(:func:`quickack`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any

import httpx
import trio

from roost.engines._sse import SSEDecoder

__all__ = ["BodyReader", "CLOSE_GRACE", "DRAIN_EVENTS", "DRAIN_GRACE", "HEAD_BYTES", "close", "quickack", "sse_batches"]

_log = logging.getLogger("roost.engines.http")

#: Seconds a shielded clean-up (closing a response) may take before it is abandoned.
CLOSE_GRACE = 2.0
#: Seconds, and SSE events, read after a stream's terminal marker to reuse its connection.
DRAIN_GRACE = 0.5
DRAIN_EVENTS = 16
#: Bytes of a stream's body kept to name it when it carried no events.
HEAD_BYTES = 300

Batch = list[tuple[str, str]]


class _Failed:
    """The read failed: the consumer raises ``error`` in its own task."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class BodyReader:
    """The SSE events of ``response``'s body, read in a system task, one batch per network read.

    Args:
        response: a streamed response whose status was checked; the reader owns it from now on
            (do not read or close it elsewhere).
        head: filled with the body's first :data:`HEAD_BYTES` bytes as they are read.

    Iterate it (``async for batch in reader``) for ``[(event, data), ...]`` lists (events with
    data only); the iteration raises what the read raised (``httpx.HTTPError``). Then call
    :meth:`finish` (the terminal marker was seen: read the rest, bounded, then close) or
    :meth:`abandon` (stop now: close in the background); one of them always, e.g. in a
    ``finally``. Not a checkpoint either: both return at once.

    Cancellation: the consumer's waits are plain channel receives, cancelled at once; the read
    itself is cancelled only by :meth:`abandon`, in the reader's task.
    """

    __slots__ = ("_receive", "_scope", "_drain", "_closed", "response")

    def __init__(self, response: httpx.Response, head: bytearray) -> None:
        self.response = response
        send, self._receive = trio.open_memory_channel[Batch | _Failed](1)
        self._scope = trio.CancelScope()
        self._drain = False
        #: set once the reader has closed the response
        self._closed = trio.Event()
        trio.lowlevel.spawn_system_task(self._read, send, head, name="roost.engine-read")

    def __aiter__(self) -> BodyReader:
        return self

    async def __anext__(self) -> Batch:
        try:
            item = await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        if type(item) is _Failed:
            raise item.error
        return item  # type: ignore[return-value]

    def finish(self) -> None:
        """The consumer has what it needs: the reader reads what follows (at most
        :data:`DRAIN_EVENTS` events for :data:`DRAIN_GRACE` seconds), then closes the response."""
        self._drain = True
        self._scope.deadline = min(self._scope.deadline, trio.current_time() + DRAIN_GRACE)
        self._receive.close()

    def abandon(self) -> None:
        """Stop reading now: the read is cancelled and the response closed in the reader's task."""
        self._scope.cancel()
        self._receive.close()

    async def wait_closed(self) -> None:
        """Wait until the reader has closed the response (bounded by its own deadlines)."""
        await self._closed.wait()

    async def _read(self, send: trio.MemorySendChannel[Batch | _Failed], head: bytearray) -> None:
        try:
            with self._scope:
                async with send, aclosing(sse_batches(self.response, head)) as batches:
                    try:
                        async for batch in batches:
                            if self._drain:
                                break
                            await send.send(batch)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass  # the consumer stopped taking batches (finish or abandon)
                    except Exception as exc:  # the read failed: the consumer raises it
                        await _send_failure(send, exc)
                    if self._drain:
                        await _drain(batches)
        finally:
            await close(self.response)
            self._closed.set()


async def _send_failure(send: trio.MemorySendChannel[Batch | _Failed], exc: Exception) -> None:
    try:
        await send.send(_Failed(exc))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        _log.debug("a response body's read failed after its consumer left: %s", exc)


async def _drain(batches: Any) -> None:
    """Read what follows the terminal marker (normally just the end of the body), so the
    connection goes back to httpx's pool instead of being closed and opened again for the next
    call. Bounded: at most DRAIN_EVENTS events, and DRAIN_GRACE seconds (the reader's deadline,
    set by :meth:`BodyReader.finish`): a server that keeps the stream open after its terminal
    marker costs a new connection, nothing more."""
    count = 0
    try:
        async for batch in batches:
            count += len(batch)
            if count >= DRAIN_EVENTS:
                return
    except httpx.HTTPError:
        pass  # the reply is complete; the connection is simply not reused


async def close(response: httpx.Response | None) -> None:
    """Close ``response`` in a shielded scope bounded by CLOSE_GRACE (idempotent; a failure is
    logged at debug level: the connection is simply not reused)."""
    if response is None or response.is_closed:
        return
    with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_GRACE):
        try:
            await response.aclose()
        except Exception:
            _log.debug("closing a response failed", exc_info=True)


async def sse_batches(response: httpx.Response, head: bytearray) -> AsyncGenerator[Batch, None]:
    """The response's SSE events with data, as ``(event, data)``, one list per network read (plus
    the last lone-CR event at the end); keep-alive blocks (comments, ``retry:``) carry no data and
    are left out."""
    decoder = SSEDecoder()
    ack = quickack(response)
    ack()
    async for chunk in response.aiter_bytes():
        ack()
        if len(head) < HEAD_BYTES:
            head += chunk[: HEAD_BYTES - len(head)]
        batch = [event for event in decoder.feed(chunk) if event[1]]
        if batch:
            yield batch
    batch = [event for event in decoder.finish() if event[1]]
    if batch:
        yield batch


def quickack(response: httpx.Response) -> Callable[[], None]:
    """A callable that acknowledges what the connection has received at once (Linux ``TCP_QUICKACK``).

    Connections are pooled, and on a reused connection the kernel delays ACKs (up to 40 ms on
    Linux) to piggyback them on the next request. A server that writes a reply in several small
    writes without ``TCP_NODELAY`` (Nagle's algorithm, RFC 896; Python's ``http.server`` does) then
    waits for that delayed ACK before each write after the first, so a streamed reply stalls about
    40 ms per write. ``TCP_QUICKACK`` is not sticky (tcp(7)), so it is set again after every read:
    one ``setsockopt`` per network read. Elsewhere, or without a socket (a mock transport), the
    callable does nothing. The socket comes from httpcore's documented ``network_stream`` response
    extension.
    """
    option = getattr(socket, "TCP_QUICKACK", None)
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None and option is not None else None
    if sock is None:
        return _nothing

    def ack() -> None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, option, 1)
        except OSError:
            pass  # the connection closed under us; the read that follows reports it

    return ack


def _nothing() -> None:
    return None
