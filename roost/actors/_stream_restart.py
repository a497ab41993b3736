"""A model stream retried from its beginning after partial output (app-server-protocol.md,
"Notifications": ``item/removed`` "retracts an attempt-scoped item", ``item/agentMessage/replace``
and ``item/reasoning/replace`` "replace accumulated text").

When an engine retries a stream that had already streamed events (:class:`roost.engines.Retrying`
with ``restart=True``, :class:`roost.engines._http.RetryPolicy`), what that attempt streamed is
void. The turn keeps the response's visible agent message and reasoning items and replaces their
accumulated text with ``""`` (the retry's deltas append to them); tool-call items the attempt
started (never run: tools run after a stream ends) are retracted with ``item/removed``. An agent
message or reasoning item whose text was replaced and that the retry leaves empty is retracted
when the response closes, rather than completed with no text. Checkpointed rows follow: a replaced
item's row is checkpointed empty, a retracted item's row is deleted, so neither a restart nor a
crash after it leaves the failed attempt's text in the thread's history.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from roost import storage
from roost.errors import RoostError
from roost.storage import leases

__all__ = ["retract_item", "replace_text"]

log = logging.getLogger("roost.turn")


def replace_text(turn: Any, view: dict, text: str) -> None:
    """Emit the ``replace`` notification of ``view`` (an agent message or reasoning item) with its
    new accumulated ``text``: ``item/agentMessage/replace`` or ``item/reasoning/replace``,
    ``{thread_id, turn_id, item_id, text}``."""
    host = turn.host
    method = "item/agentMessage/replace" if view["type"] == "agent_message" else "item/reasoning/replace"
    host.emit(method, {"thread_id": host.thread.id, "turn_id": turn.id, "item_id": view["id"], "text": text})


def retract_item(turn: Any, view: dict, open_items: dict[str, dict]) -> None:
    """Retract ``view``, an in-progress item of ``turn``: it leaves ``open_items`` (it is never
    settled), ``item/removed`` ``{thread_id, turn_id, item_id}`` is emitted, and its checkpointed
    row, if any, is deleted (queued on the writer, fenced by the turn's lease token; never waits)."""
    host = turn.host
    open_items.pop(view["id"], None)
    host.emit("item/removed", {"thread_id": host.thread.id, "turn_id": turn.id, "item_id": view["id"]})
    if host.ephemeral or view["id"] not in turn.checkpointed:
        return
    turn.checkpointed.discard(view["id"])
    write: Callable[..., Any] = functools.partial(storage.discard_in_progress_item, item_id=view["id"])
    if turn.token is not None:
        write = leases.fenced(leases.thread_lease_key(host.thread.id), turn.token, write)
    try:
        host.services.store.writer.submit_nowait(write)
    except RoostError as exc:  # StoreFull / StoreClosed: the row stays; it settles as interrupted
        log.warning("thread %s: checkpoint of retracted item %s not deleted (%s)", host.thread.id, view["id"], exc)
