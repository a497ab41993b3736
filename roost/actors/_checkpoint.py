"""Checkpoints of streamed text (DESIGN.md: "streamed text is checkpointed periodically so a crash
loses at most a short tail").

While a model response streams agent text or reasoning, :class:`StreamCheckpoints` decides when the
text so far is written as the item's ``in_progress`` row: at most once per :data:`INTERVAL` seconds
(monotonic clock), or sooner once :data:`CHUNK` characters arrived since the last checkpoint; never a
write per delta. Each checkpoint rewrites the whole text so far, so for long texts both bounds grow
with it (the chunk to the size already checkpointed, the interval in proportion beyond 256 Ki
characters): the size-triggered checkpoints of a text of n characters copy O(n) characters in
total (not O(n²)), the timed ones at most about 256 Ki characters per interval. The decision is
two comparisons per delta; the write itself is queued on the group-commit writer without waiting
(:meth:`roost.storage.StoreWriter.submit_nowait`), fenced by the turn's lease token, so the stream
never waits for the disk. An item whose stream moved on to
another item (reasoning, then text; text, then a tool call) is checkpointed then. A response
shorter than the interval is written once, when its item settles.

After a crash (kill -9), start-up reconciliation (:func:`roost.storage.reconcile`) marks the
checkpointed row ``interrupted`` with its turn; the prefix stays in the thread's history.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["StreamCheckpoints", "INTERVAL", "CHUNK"]

#: Seconds between two checkpoints of one streaming item (at most).
INTERVAL = 0.3
#: Characters of new text that trigger a checkpoint before the interval has passed.
CHUNK = 4096
#: Characters of text beyond which the interval and the chunk grow with the text (see the module doc).
_SCALE = 256 * 1024
_monotonic = time.monotonic


class StreamCheckpoints:
    """When to checkpoint the items of one model response (see the module doc).

    Args:
        write: ``write(view, text)`` queues the checkpoint of item ``view`` with its text so far
            (must not block; it may drop the checkpoint under backpressure). None: never checkpoint
            (an ephemeral thread).
        interval: seconds between checkpoints of an item.
        chunk: characters of new text that trigger a checkpoint sooner.
    """

    __slots__ = ("_chunk", "_interval", "_items", "_write")

    def __init__(
        self, write: Callable[[dict, str], None] | None, *, interval: float = INTERVAL, chunk: int = CHUNK
    ) -> None:
        self._write = write
        self._interval = interval
        self._chunk = chunk
        #: item id -> [characters so far, characters that trigger the next checkpoint,
        #: monotonic time it is due, characters at the last checkpoint]
        self._items: dict[str, list] = {}

    def started(self, view: dict) -> None:
        """Item ``view`` started streaming now (its first checkpoint is due an interval later)."""
        if self._write is None:
            return
        self._items[view["id"]] = [0, self._chunk, time.monotonic() + self._interval, 0]

    def grew(self, view: dict, parts: list[str], added: int) -> None:
        """``added`` characters were appended to ``parts`` (the text of ``view``); checkpoint if due.

        The hot path (once per delta): one dict lookup, an addition and two comparisons.
        """
        state = self._items.get(view["id"])
        if state is None:
            return
        size = state[0] = state[0] + added
        if size < state[1] and _monotonic() < state[2]:
            return
        self._checkpoint(view, parts, state)

    def flush(self, view: dict | None, parts: list[str]) -> None:
        """Checkpoint ``view`` now if text arrived since its last checkpoint (its stream moved on
        to another item: reasoning followed by text, text followed by a tool call)."""
        if view is None:
            return
        state = self._items.get(view["id"])
        if state is None or state[0] == state[3]:
            return
        self._checkpoint(view, parts, state)

    def restarted(self, view: dict) -> None:
        """The text of ``view`` was retracted (its stream is retried from the beginning): count
        from zero again, and checkpoint it empty now if a checkpoint already holds text."""
        state = self._items.get(view["id"])
        if state is None:
            return
        written = state[3] > 0
        self._items[view["id"]] = [0, self._chunk, time.monotonic() + self._interval, 0]
        if written:
            assert self._write is not None
            self._write(view, "")

    def _checkpoint(self, view: dict, parts: list[str], state: list) -> None:
        size = state[3] = state[0]
        state[1] = size + max(self._chunk, size)  # the chunk grows to the size checkpointed
        state[2] = time.monotonic() + self._interval * max(1.0, size / _SCALE)
        assert self._write is not None
        self._write(view, "".join(parts))
