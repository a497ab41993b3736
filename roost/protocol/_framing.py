"""JSONL framing: one JSON value per line (DESIGN.md section 5, app-server-protocol.md "Transport").

The decoder is sans-IO: :class:`LineDecoder` turns bytes into frames and never touches a stream, so it
is tested without I/O. :func:`read_frames` and :class:`JsonlWriter` are the thin trio glue that moves
bytes between a stream and the decoder / encoder; :func:`open_stdio_stream` wraps fds 0 and 1.

Framing rules:

- A line ends with ``\\n``; a ``\\r`` before it is accepted (``\\r\\n``).
- A line holds one UTF-8 JSON value of at most ``max_line_bytes`` bytes (terminator excluded;
  default 64 MiB, the app-server's documented stdio line limit).
- Empty and whitespace-only lines are skipped.
- A malformed line (bad JSON, invalid UTF-8) yields one :class:`FrameError` and decoding continues
  with the next line.
- An oversized line yields one :class:`FrameError` as soon as it is known to be too long; the rest
  of that line is discarded up to the next newline (so memory stays bounded), then decoding
  continues. No part of an oversized line ever becomes a frame.
- Text mode (``LineDecoder(parse=False)``): the same rules for lines whose values are plain text
  (the serve socket, ``/attach`` and the terminal's stdin, where a plain text line is input):
  each line is yielded as a ``str`` without its terminator, blank lines included; bytes that are
  not UTF-8 are replaced (U+FFFD), as a terminal sends them, unless ``strict_utf8=True`` (the
  serve socket and ``/attach``): then such a line is a :class:`FrameError` like a malformed one.

This decoder is the one line reader of every input path (DESIGN.md section 5): app-server stdio,
the serve socket and ``/attach``, the repl and bridge stdin, and the terminal stdin of ``roost
repl`` / ``roost attach``. ``ROOST_MAX_LINE_BYTES`` (see :func:`line_limit`) lowers the limit of
all of them, so tests can exercise the oversized path without 64 MiB of input.
"""

from __future__ import annotations

import json as _stdjson
import os
import sys
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import attrs
import trio

from roost._json import JSONDecodeError, dumps_line, loads
from roost._paths import positive_env
from roost.errors import ParseError

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "Frame",
    "FrameError",
    "LineDecoder",
    "line_limit",
    "read_frames",
    "JsonlWriter",
    "open_stdio_stream",
]

#: The default line limit in bytes (64 MiB), matching the app-server's stdio scanner.
DEFAULT_MAX_LINE_BYTES = 64 * 2**20

#: Default size in bytes of each ``receive_some`` call made by :func:`read_frames`.
_RECEIVE_BYTES = 64 * 1024
#: What :meth:`LineDecoder._decode` returns for a blank line (no frame).
_BLANK: Any = object()


@attrs.frozen
class FrameError:
    """A line that did not decode: the error marker a :class:`LineDecoder` yields in its place.

    Attributes:
        code: the wire error code, always ``"parse_error"``.
        message: a human-readable reason (bad JSON, invalid UTF-8, or the size limit).
        oversized: True when the line exceeded ``max_line_bytes``.
    """

    message: str
    oversized: bool = False
    code: str = "parse_error"

    def to_exception(self) -> ParseError:
        """Return the matching :class:`roost.errors.ParseError` (``.to_wire()`` gives the payload)."""
        return ParseError(self.message)


#: A decoded JSON value (dict, list, str, int, float, bool, None) or a :class:`FrameError`.
Frame: TypeAlias = Any


class LineDecoder:
    """Incremental sans-IO JSONL decoder.

    Feed it bytes as they arrive, in chunks of any size; it returns the frames of every line
    completed so far. Work is linear in the input: a chunk is scanned for newlines once, and a
    partial line is carried in a ``bytearray`` until its newline arrives.

    Args:
        max_line_bytes: the longest accepted line in bytes, terminator excluded (default 64 MiB).
        parse: True: each line is a JSON value (blank lines skipped); False: text mode, each line
            is a ``str`` (see the module docstring).
        strict_utf8: text mode only: a line that is not valid UTF-8 is a :class:`FrameError`
            instead of being decoded with replacement characters.

    Attributes:
        last_sizes: the byte length of the line behind each frame the last :meth:`feed` or
            :meth:`finish` returned (0 for a partial line dropped as oversized), for callers that
            bound the memory of frames they hold.

    Raises:
        ValueError: ``max_line_bytes`` is not positive.
    """

    __slots__ = ("_buf", "_discarding", "_max", "_parse", "_strict", "last_sizes")

    def __init__(
        self, *, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, parse: bool = True, strict_utf8: bool = False
    ) -> None:
        if max_line_bytes <= 0:
            raise ValueError(f"max_line_bytes must be positive, got {max_line_bytes!r}")
        self._max = max_line_bytes
        self._buf = bytearray()
        self._discarding = False
        self._parse = parse
        self._strict = strict_utf8
        self.last_sizes: list[int] = []

    @property
    def max_line_bytes(self) -> int:
        """The line limit in bytes."""
        return self._max

    @property
    def buffered_bytes(self) -> int:
        """Bytes of the current partial line held in memory."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add ``data`` and return the frames of the lines it completes, in order.

        Args:
            data: the next bytes of the stream (any chunking; may be empty).

        Returns:
            A list of decoded JSON values and :class:`FrameError` markers, one per non-blank line.
        """
        out: list[Frame] = []
        self.last_sizes = []
        if not data:
            return out
        if isinstance(data, memoryview):
            data = data.tobytes()
        if self._discarding:
            nl = data.find(b"\n")
            if nl < 0:
                return out
            self._discarding = False
            data = data[nl + 1 :]
            if not data:
                return out
        buf = self._buf
        buf += data
        if b"\n" not in data:
            # No line completed; only check that the partial line is still within the limit.
            self._check_partial(out)
            return out
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        append, size = out.append, self.last_sizes.append
        decode = self._decode
        for line in lines:
            frame = decode(line)
            if frame is not _BLANK:
                append(frame)
                size(len(line))
        self._check_partial(out)
        return out

    def _decode(self, line: bytearray) -> Any:
        """The frame of one complete line (without its newline), or ``_BLANK`` for a blank one."""
        n = len(line)
        limit = self._max
        if n > limit and not (n == limit + 1 and line[-1] == 13):
            return _oversized(limit)
        if not self._parse:
            return _strict_text(line) if self._strict else _text(line)
        try:
            value = loads(line)
            if type(value) is dict and type(value.get("id")) is float:
                value = _exact_id(line, value)
            return value
        except JSONDecodeError as exc:
            if line.isspace() or not line:
                return _BLANK
            return _not_utf8(line) or _malformed(exc)

    def finish(self) -> list[Frame]:
        """Signal end of input: decode a last line that had no newline, and reset the decoder.

        Returns:
            The frames of the unterminated last line (empty when there was none).
        """
        out: list[Frame] = []
        self.last_sizes = []
        if not self._discarding and self._buf:
            out = self.feed(b"\n")
        self._buf = bytearray()
        self._discarding = False
        return out

    def _check_partial(self, out: list[Frame]) -> None:
        # A partial line may end with the "\r" of a "\r\n" terminator: allow one extra byte.
        if len(self._buf) > self._max + 1:
            out.append(_oversized(self._max))
            self.last_sizes.append(0)  # the partial line is dropped, not held
            self._buf = bytearray()
            self._discarding = True


def _text(line: bytearray) -> str:
    if line[-1:] == b"\r":
        line = line[:-1]
    return line.decode("utf-8", "replace")


def _strict_text(line: bytearray) -> str | FrameError:
    if line[-1:] == b"\r":
        line = line[:-1]
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return FrameError(f"line is not valid UTF-8: {exc.reason} at byte {exc.start}")


def line_limit() -> int:
    """The line limit of every input path, in bytes: ``ROOST_MAX_LINE_BYTES`` or 64 MiB.

    The variable exists so tests can exercise the oversized-line paths without 64 MiB of input: it
    only lowers the limit. A larger value is clamped to :data:`DEFAULT_MAX_LINE_BYTES`, with one
    warning on stderr per process (docs/app-server.md).

    Raises:
        ConfigError: the variable is not a positive integer (:func:`roost._paths.positive_env`).
    """
    value = int(positive_env("ROOST_MAX_LINE_BYTES", DEFAULT_MAX_LINE_BYTES, integer=True, unit="bytes"))
    if value <= DEFAULT_MAX_LINE_BYTES:
        return value
    if not _clamp_warned:
        _clamp_warned.append(True)
        sys.stderr.write(
            f"roost: warning: ROOST_MAX_LINE_BYTES={value} is above the maximum line limit; "
            f"using {DEFAULT_MAX_LINE_BYTES} bytes (the variable only lowers it)\n"
        )
    return DEFAULT_MAX_LINE_BYTES


#: Holds one item once the clamp warning of :func:`line_limit` was written (once per process).
_clamp_warned: list[bool] = []


def _exact_id(line: bytes | bytearray, value: dict) -> dict:
    """``value`` with an integer ``id`` beyond 64 bits kept exact (orjson reads it as a float).

    Issue 18, finding 10: an integer request id of any size is echoed as sent. The standard
    library's decoder keeps big integers exact; it runs only for a line whose id came out a float.
    """
    try:
        exact = _stdjson.loads(line)
    except ValueError:
        return value
    return exact if isinstance(exact, dict) and isinstance(exact.get("id"), int) else value


def _oversized(limit: int) -> FrameError:
    return FrameError(f"line exceeds the limit of {limit} bytes", oversized=True)


def _not_utf8(line: bytearray) -> FrameError | None:
    """The error of a line that is not UTF-8 (orjson's own says only "surrogates not allowed")."""
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return FrameError(f"line is not valid UTF-8 (byte offset {exc.start})")
    return None


def _malformed(exc: ValueError) -> FrameError:
    return FrameError(f"invalid JSON line: {exc}")


async def read_frames(
    stream: trio.abc.ReceiveStream,
    decoder: LineDecoder | None = None,
    *,
    receive_bytes: int = _RECEIVE_BYTES,
) -> AsyncIterator[Frame]:
    """Yield the frames read from ``stream`` until it reaches end of file.

    Args:
        stream: the byte stream to read.
        decoder: the decoder to use (default: a new :class:`LineDecoder` with the 64 MiB limit).
        receive_bytes: the most bytes asked of each ``receive_some`` call.

    Yields:
        Decoded JSON values and :class:`FrameError` markers, in line order. At end of file the
        last unterminated line (if any) is decoded too.

    Raises:
        trio.BrokenResourceError, trio.ClosedResourceError: from ``stream.receive_some``.

    Cancellation:
        Each ``receive_some`` is a checkpoint. Cancelled while waiting, no bytes are lost from the
        decoder (a partial line stays buffered in ``decoder``). Close the generator
        (``async with contextlib.aclosing(...)``) when abandoning it early.
    """
    if decoder is None:
        decoder = LineDecoder()
    while True:
        data = await stream.receive_some(receive_bytes)
        if not data:
            for frame in decoder.finish():
                yield frame
            return
        for frame in decoder.feed(data):
            yield frame


class JsonlWriter:
    """Serialises JSONL lines onto a send stream, one whole line at a time.

    Concurrent senders are served in FIFO order by a :class:`trio.StrictFIFOLock`, so lines never
    interleave. An async context manager; :meth:`aclose` closes the stream.

    Args:
        stream: the byte stream to write to.
    """

    def __init__(self, stream: trio.abc.SendStream) -> None:
        self._stream = stream
        self._lock = trio.StrictFIFOLock()

    @property
    def stream(self) -> trio.abc.SendStream:
        """The underlying send stream."""
        return self._stream

    async def send(self, obj: Any) -> None:
        """Write one line.

        Args:
            obj: a JSON-ready value (encoded with :func:`roost._json.dumps_line`), or ``bytes``
                holding one or more pre-encoded lines with their ``\\n``, sent as-is.

        Raises:
            TypeError: ``obj`` cannot be encoded as JSON.
            trio.BrokenResourceError: the peer went away.
            trio.ClosedResourceError: this writer was closed.

        Cancellation:
            A checkpoint. Cancelled while waiting for the lock, nothing was written. Cancelled
            inside ``send_all``, part of the line may have been written and the stream is then
            in an unknown state (trio's ``send_all`` contract): close it.
        """
        data = obj if isinstance(obj, (bytes, bytearray, memoryview)) else dumps_line(obj)
        async with self._lock:
            await self._stream.send_all(data)

    async def aclose(self) -> None:
        """Close the underlying stream (idempotent; closes even when cancelled)."""
        await self._stream.aclose()

    async def __aenter__(self) -> JsonlWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def open_stdio_stream() -> trio.StapledStream:
    """Wrap the process's stdin (fd 0) and stdout (fd 1) as one trio stream.

    Both fds are ``os.dup``-ed, so closing the returned stream leaves fds 0 and 1 open.

    Returns:
        A :class:`trio.StapledStream` whose receive half reads fd 0 and whose send half writes
        fd 1 (each a :class:`trio.lowlevel.FdStream`).

    Raises:
        OSError: a descriptor could not be duplicated.

    Note:
        ``FdStream`` puts the descriptor in non-blocking mode, and that flag is shared with the
        original fd. In a protocol mode nothing else may write to stdout anyway (DESIGN.md
        section 5): send logs to stderr.
    """
    receive = trio.lowlevel.FdStream(os.dup(0))
    try:
        send = trio.lowlevel.FdStream(os.dup(1))
    except BaseException:
        receive.close()
        raise
    return trio.StapledStream(send, receive)


class PrefixedReceiveStream(trio.abc.ReceiveStream):
    """``stream`` with ``prefix`` (bytes already read from it) received first: the input that
    ``roost app-server`` read before the event loop (:mod:`roost.protocol._as_early`) reaches
    the line decoder ahead of the rest, so no byte is lost or read twice."""

    def __init__(self, prefix: bytes, stream: trio.abc.ReceiveStream) -> None:
        self._prefix = prefix
        self._stream = stream

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            await trio.lowlevel.checkpoint()
            n = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:n], self._prefix[n:]
            return data
        return bytes(await self._stream.receive_some(max_bytes))

    async def aclose(self) -> None:
        self._prefix = b""
        await self._stream.aclose()
