"""The per-thread event hub: stamps each event with a monotonic ``seq``, encodes it once, fans out.

Subscribers receive pre-encoded JSONL lines (``bytes``) through a non-blocking ``deliver``; a
subscriber whose own outbox is full deals with it itself (a connection closes as a slow consumer),
so one slow client never slows the turn or the other clients.
"""

from __future__ import annotations

import collections
import logging
from typing import Any, Protocol

from roost._json import dumps_line

__all__ = ["Subscriber", "EventHub"]

log = logging.getLogger("roost.hub")


class Subscriber(Protocol):
    """Anything that takes encoded notification lines without blocking."""

    def deliver(self, line: bytes) -> None: ...


class EventHub:
    """Fan-out of one thread's notifications.

    Args:
        replay: how many recent events to keep for late subscribers (a bounded ring; 0, the
            default, keeps none: no transport resumes from a seq yet, and a ring costs memory
            per thread that has streamed).
    """

    __slots__ = ("seq", "_subscribers", "_ring")

    def __init__(self, replay: int = 0) -> None:
        self.seq = 0
        self._subscribers: list[Subscriber] = []
        self._ring: collections.deque[tuple[int, str, dict]] = collections.deque(maxlen=replay)

    def use_subscribers(self, subscribers: list[Subscriber]) -> None:
        """Share ``subscribers`` (a list owned by the registry) so they outlive this hub."""
        subscribers.extend(s for s in self._subscribers if s not in subscribers)
        self._subscribers = subscribers

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
        """Encode ``{"method", "params"}`` once and deliver it to every subscriber; return its seq.

        With no subscriber nothing is encoded (a worker's thread streams to nobody); the replay
        ring keeps the event and encodes it only if it is ever replayed.
        """
        seq = self.seq = self.seq + 1
        if self._ring.maxlen:
            self._ring.append((seq, method, params))
        subscribers = self._subscribers
        if subscribers:
            line = dumps_line({"method": method, "params": params})
            # One subscriber (the usual case) needs no snapshot of the list to iterate safely.
            for subscriber in (subscribers[0],) if len(subscribers) == 1 else tuple(subscribers):
                try:
                    subscriber.deliver(line)
                except Exception:  # a broken subscriber is dropped; the thread goes on
                    log.exception("dropping a subscriber that failed to take an event")
                    self.unsubscribe(subscriber)
        return seq

    def since(self, seq: int) -> list[bytes]:
        """Encoded lines with a seq greater than ``seq`` still in the replay ring."""
        return [dumps_line({"method": m, "params": p}) for s, m, p in self._ring if s > seq]
