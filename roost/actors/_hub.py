"""The per-thread event hub: stamps each event with a monotonic ``seq``, encodes it once, fans out.

Subscribers receive pre-encoded JSONL lines (``bytes``) through a non-blocking ``deliver``; a
subscriber whose own outbox is full deals with it itself (a connection closes as a slow consumer),
so one slow client never slows the turn or the other clients.
"""

from __future__ import annotations

import collections
from typing import Any, Protocol

from roost._json import dumps_line

__all__ = ["Subscriber", "EventHub"]


class Subscriber(Protocol):
    """Anything that takes encoded notification lines without blocking."""

    def deliver(self, line: bytes) -> None: ...


class EventHub:
    """Fan-out of one thread's notifications.

    Args:
        replay: how many recent lines to keep for late subscribers (a bounded ring).
    """

    __slots__ = ("seq", "_subscribers", "_ring")

    def __init__(self, replay: int = 256) -> None:
        self.seq = 0
        self._subscribers: list[Subscriber] = []
        self._ring: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=replay)

    def subscribe(self, subscriber: Subscriber) -> None:
        """Add ``subscriber`` (idempotent)."""
        if subscriber not in self._subscribers:
            self._subscribers.append(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Remove ``subscriber`` if present."""
        try:
            self._subscribers.remove(subscriber)
        except ValueError:
            pass

    @property
    def subscribers(self) -> list[Subscriber]:
        return list(self._subscribers)

    def emit(self, method: str, params: dict[str, Any]) -> int:
        """Encode ``{"method", "params"}`` once and deliver it to every subscriber; return its seq."""
        self.seq += 1
        line = dumps_line({"method": method, "params": params})
        self._ring.append((self.seq, line))
        for subscriber in self._subscribers:
            subscriber.deliver(line)
        return self.seq

    def since(self, seq: int) -> list[bytes]:
        """Lines with a seq greater than ``seq`` still in the replay ring."""
        return [line for s, line in self._ring if s > seq]
