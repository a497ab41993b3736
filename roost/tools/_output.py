"""A bounded output accumulator: keeps the head and the tail of a byte stream, notes what it cut."""

from __future__ import annotations

__all__ = ["OutputBuffer", "cap_text"]


class OutputBuffer:
    """Accumulates output bytes, keeping at most ``cap_bytes`` of them.

    When the output grows past the cap, the first half of the cap (the head) and the last half (the
    tail) are kept and the middle is dropped; :meth:`text` marks the cut. Memory stays within
    ``cap_bytes`` plus one chunk.

    Args:
        cap_bytes: the most bytes kept (at least 2).
    """

    __slots__ = ("_cap", "_head", "_tail", "_total")

    def __init__(self, cap_bytes: int) -> None:
        if cap_bytes < 2:
            raise ValueError(f"cap_bytes must be at least 2, got {cap_bytes!r}")
        self._cap = cap_bytes
        self._head = bytearray()
        self._tail = bytearray()
        self._total = 0

    @property
    def total_bytes(self) -> int:
        """Bytes added so far, kept or not."""
        return self._total

    @property
    def truncated(self) -> bool:
        """True when some bytes were dropped."""
        return self._total > self._cap

    def add(self, chunk: bytes | bytearray) -> None:
        """Append ``chunk``."""
        self._total += len(chunk)
        head_cap = self._cap // 2
        room = head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self._tail += chunk
        tail_cap = self._cap - head_cap
        excess = len(self._tail) - tail_cap
        if excess > 0:
            del self._tail[:excess]

    def text(self) -> str:
        """Return the kept output decoded as UTF-8 (invalid bytes replaced), with a cut marker."""
        if not self.truncated:
            return (bytes(self._head) + bytes(self._tail)).decode("utf-8", "replace")
        dropped = self._total - len(self._head) - len(self._tail)
        return (
            self._head.decode("utf-8", "replace")
            + f"\n[... output truncated: {dropped} of {self._total} bytes omitted ...]\n"
            + self._tail.decode("utf-8", "replace")
        )


def cap_text(text: str, cap_bytes: int) -> tuple[str, bool]:
    """Return ``text`` limited to about ``cap_bytes`` UTF-8 bytes (head and tail) and whether it was cut."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= cap_bytes:
        return text, False
    buf = OutputBuffer(cap_bytes)
    buf.add(data)
    return buf.text(), True
