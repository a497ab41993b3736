"""Server-sent events framing (WHATWG HTML, "9.2.6 Interpreting an event stream"), bytes in, events out.

A lean decoder for the provider streams: it replaces httpx-sse's line-at-a-time decoder on the hot
path (measured at a quarter of an adapter's CPU per delta, benchmarks/bench_provider_path.py),
with the same results (tests/test_engine_sse.py checks it against httpx-sse on random streams and
random network splits). Only what the adapters use is kept: the ``event`` name and the joined
``data``; ``id`` and ``retry`` are parsed away, comment lines (``:``) are skipped, a block without
data is not an event (keep-alives), and an unterminated last block is dropped, as the standard says.
"""

from __future__ import annotations

__all__ = ["SSEDecoder"]

_BOM = "\ufeff"


class SSEDecoder:
    """Incremental decoder: :meth:`feed` network chunks (any split), get complete events.

    Lines end with CRLF, LF or CR (a CR at the end of a chunk waits for the next one, in case an
    LF follows). Text is UTF-8; invalid bytes become U+FFFD.
    """

    __slots__ = ("_started", "_tail")

    def __init__(self) -> None:
        self._tail = b""
        self._started = False

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        """Return the ``(event, data)`` pairs the stream completed with ``chunk`` (``event`` is ``""``
        when the block named none)."""
        return self._decode(self._tail + chunk if self._tail else chunk, final=False)

    def finish(self) -> list[tuple[str, str]]:
        """The stream ended: return the event a last lone CR completed (an unterminated block is
        dropped)."""
        tail, self._tail = self._tail, b""
        return self._decode(tail, final=True) if tail.endswith(b"\r") else []

    def _decode(self, buf: bytes, *, final: bool) -> list[tuple[str, str]]:
        if b"\r" in buf:
            if buf.endswith(b"\r") and not final:  # maybe the first half of a CRLF: wait for more
                self._tail = buf
                return []
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._tail = buf
            return []
        self._tail = buf[end + 2 :]
        # one decode for every complete block ("\n\n" never splits a UTF-8 sequence, and an
        # invalid one ends at the newline either way)
        text = buf[:end].decode("utf-8", "replace")
        if not self._started:
            self._started = True
            if text.startswith(_BOM):
                text = text[1:]
        out: list[tuple[str, str]] = []
        for block in text.split("\n\n"):
            # the common cases first: one data line, or an event line and one data line
            if block.startswith("data: "):
                if "\n" not in block:
                    out.append(("", block[6:]))
                    continue
            elif block.startswith("event: "):
                line = block.find("\n")
                if block.startswith("data: ", line + 1) and block.find("\n", line + 1) < 0:
                    out.append((block[7:line], block[line + 7 :]))
                    continue
            elif not block:
                continue
            event = _block(block)
            if event is not None:
                out.append(event)
        return out


def _block(text: str) -> tuple[str, str] | None:
    """One block's event (``None`` when it carries no data)."""
    name = ""
    data: list[str] = []
    for line in text.split("\n"):
        if not line or line[0] == ":":
            continue
        field, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            name = value
    if not data:
        return None
    return (name, "\n".join(data))
