"""The durable side of a ThreadActor: loading a thread from the store and reconciling with it.

Several processes may open one database. A ThreadActor keeps its thread in memory, so it must
notice what another process changed; under the execution lease the store is the truth. The
functions here are the blocking reads and writes (run them in a worker thread or through the
writer) and the one in-memory merge, :func:`apply_state`, that runs in the actor's own task.

* :func:`read_state` / :func:`load_state`: turns, items, pending/held input and the lease row.
* :func:`store_changed`: did anything add turns or items since the actor last looked.
* :func:`apply_state`: replace the actor's conversation with a loaded state and merge its input.
* :func:`settle_abandoned`: turns left ``running`` by a dead or superseded execution become
  ``interrupted`` (called in an admission, under a fresh lease).
* :func:`hold_inputs`: make input durable held work at the end of the input order.
* :func:`live_elsewhere`: is a lease row held by a live execution of another process.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from roost import storage
from roost.actors._edit import RETRACTED
from roost.actors._views import history_from_items
from roost.errors import NotFound
from roost.storage import leases
from roost.storage.leases import owner_is_dead

if TYPE_CHECKING:
    from roost.actors._thread import ThreadActor

__all__ = [
    "read_state",
    "read_lease",
    "read_held",
    "merge_held",
    "load_state",
    "store_changed",
    "apply_state",
    "settle_abandoned",
    "hold_inputs",
    "live_elsewhere",
]


def read_state(conn: Any, thread_id: str) -> dict:
    """A thread's durable state on ``conn`` (blocking, read-only).

    Returns:
        ``{"turns": [Turn], "items": [Item], "inputs": [HeldInput], "lease": dict | None,
        "has_workers": bool}``, rows in thread order (items by ``seq``, input by position);
        ``has_workers``: the thread is the root of a worker tree.
    """
    return {
        "turns": storage.list_turns(conn, thread_id),
        "items": storage.list_items(conn, thread_id),
        "inputs": storage.list_held_input(conn, thread_id),
        "lease": leases.get_lease(conn, leases.thread_lease_key(thread_id)),
        "has_workers": storage.thread_has_workers(conn, thread_id),
    }


def read_lease(store: Any, thread_id: str) -> dict | None:
    """The execution lease row of ``thread_id`` (blocking read; None if it never had one)."""
    with store.read() as conn:
        return leases.get_lease(conn, leases.thread_lease_key(thread_id))


def load_state(store: Any, thread_id: str) -> dict:
    """:func:`read_state` on a read connection of ``store`` (blocking)."""
    with store.read() as conn:
        return read_state(conn, thread_id)


def store_changed(conn: Any, thread_id: str, turn_rows: int, max_seq: int) -> bool:
    """Whether the store holds other turns or items than an actor that saw ``turn_rows`` turn rows
    and items up to ``max_seq`` (blocking, read-only)."""
    return storage.thread_changed_since(conn, thread_id, turn_rows, max_seq)


def live_elsewhere(lease: dict | None, owner: str) -> bool:
    """Whether the lease row ``lease`` is held by a live execution of an owner other than ``owner``.

    Live: not released, not expired (wall clock), and its owner not a dead process of this host
    (:func:`roost.storage.leases.owner_is_dead`).
    """
    if not lease or lease.get("owner") is None or lease["owner"] == owner:
        return False
    return lease["expires_at"] > time.time() and not owner_is_dead(lease["owner"])


def apply_state(actor: ThreadActor, state: dict, *, keep: frozenset[str] = frozenset()) -> list[dict]:
    """Replace ``actor``'s in-memory conversation with ``state`` (:func:`read_state`); merge input.

    Turns, items and the engine history are replaced (retracted rows stay out). Input the actor
    knows keeps its place (and origin); known input gone from the store was consumed or withdrawn
    elsewhere and is dropped. Unknown input is added: held rows as held, pending rows of a live
    execution in another process as *foreign* pending (shown, never dispatched or admitted here),
    other pending rows (left by a dead or superseded execution) as held work, steers first.
    ``keep``: input ids being started right now (left out, as is the one being dispatched).

    Returns:
        The input newly turned into held work; the caller makes that durable (:func:`hold_inputs`).

    Not a checkpoint: run it in the actor's task, not in a worker thread.
    """
    actor.items, actor.turns, actor.consumed_turn_ids = [], [], set()
    actor.stored_turns = len(state["turns"])
    actor.stored_max_seq = max((row.seq for row in state["items"]), default=0)
    for row in state["items"]:
        if row.status == RETRACTED:  # edited away: kept in the transcript, not in the conversation
            continue
        actor.items.append(
            {
                "id": row.id,
                "type": row.type,
                "status": row.status,
                "turn_id": row.turn_id,
                "thread_id": row.thread_id,
                "seq": row.seq,
                **(row.payload or {}),
            }
        )
    for row in state["turns"]:
        if row.status == RETRACTED:
            continue
        actor.turns.append(
            {
                "id": row.id,
                "thread_id": row.thread_id,
                "status": row.status,
                "run_id": row.run_id,
                "started_at": row.started_at,
                "completed_at": row.completed_at,
                "error": row.error,
                "usage": row.usage,
            }
        )
        meta = row.error if isinstance(row.error, dict) else {}
        if meta.get("resume_after_turn_id"):
            actor.consumed_turn_ids.add(meta["resume_after_turn_id"])
    actor.history = history_from_items(actor.items)
    return _merge_inputs(actor, state, keep)


def _merge_inputs(actor: ThreadActor, state: dict, keep: frozenset[str]) -> list[dict]:
    """The input part of :func:`apply_state`: returns the input newly turned into held work."""
    inputs = actor.inputs
    if inputs.dispatching is not None:
        keep = keep | {inputs.dispatching["id"]}
    alive = {row.id for row in state["inputs"]} | inputs.accepting
    pending = [e for e in inputs.pending if e["id"] in alive and not e.get("_foreign")]
    held = [e for e in inputs.held if e["id"] in alive]
    known = {e["id"] for e in pending + held} | keep | inputs.accepting
    foreign = live_elsewhere(state["lease"], actor.services.owner)
    orphans: list[dict] = []
    for row in state["inputs"]:
        if row.id in known:
            continue
        view = {
            "id": row.id,
            "kind": row.kind,
            "held": row.held,
            "client_id": row.client_id,
            "position": row.position,
            **(row.payload or {}),
        }
        if row.held:
            held.append(view)
        elif foreign:
            view["_foreign"] = True
            pending.append(view)
        else:
            orphans.append(view)
    orphans = [e for e in orphans if e["kind"] == "steer"] + [e for e in orphans if e["kind"] != "steer"]
    for view in orphans:
        view["held"] = True
    inputs.pending, inputs.held = pending, held + orphans
    return orphans


def read_held(store: Any, thread_id: str) -> list:
    """The thread's held input rows (``held`` true), in input order (blocking read)."""
    with store.read() as conn:
        return storage.list_held_input(conn, thread_id, held=True)


def merge_held(actor: ThreadActor, rows: list) -> bool:
    """Merge the store's held input ``rows`` (:func:`read_held`) into ``actor``'s held work: rows it
    does not know (held by another process on the same store, e.g. input accepted there while
    this process executes the thread) are added; held entries whose rows are gone (sent or
    withdrawn elsewhere) are dropped, except input being accepted or started here. Pending input
    is left alone. Returns whether anything changed. Not a checkpoint (run it in the actor's task).
    """
    inputs = actor.inputs
    busy = set(inputs.accepting) | ({inputs.dispatching["id"]} if inputs.dispatching else set())
    stored = {row.id for row in rows}
    known = {e["id"] for e in inputs.pending + inputs.held}
    held = [e for e in inputs.held if e["id"] in stored or e["id"] in busy]
    changed = len(held) != len(inputs.held)
    for row in rows:
        if row.id not in known:
            held.append(
                {
                    "id": row.id,
                    "kind": row.kind,
                    "held": True,
                    "client_id": row.client_id,
                    "position": row.position,
                    **(row.payload or {}),
                }
            )
            changed = True
    inputs.held = held
    return changed


def hold_inputs(conn: Any, thread_id: str, entries: list[dict]) -> None:
    """Make ``entries`` held work at the end of the thread's input order, in order (blocking write).

    Rows already gone (consumed or withdrawn meanwhile) are skipped.
    """
    if not entries:
        return
    position = max((row.position for row in storage.list_held_input(conn, thread_id)), default=0)
    for entry in entries:
        position += 1
        try:
            storage.update_held_input(conn, entry["id"], held=True, position=position)
        except NotFound:
            pass


def settle_abandoned(conn: Any, thread_id: str) -> int:
    """Mark the thread's turns still ``running`` in the store as interrupted; return how many.

    Call it in an admission's write, under a fresh execution lease: no execution can still own
    those turns (their process died, or lost the lease and its writes are fenced off), and nobody
    else will settle them. Their ``error`` gets ``reason: "abandoned"``. Blocking write.
    """
    count = 0
    for row in storage.list_turns(conn, thread_id, status="running"):
        error = dict(row.error) if isinstance(row.error, dict) else {}
        error.update(
            category="cancelled",
            reason="abandoned",
            message="interrupted: its execution ended without settling it (the process "
            "died or lost the execution lease)",
        )
        storage.update_turn(conn, row.id, status="interrupted", error=error)
        # a started tool call checkpointed by the dead execution ends with its turn
        storage.interrupt_open_items(conn, row.id)
        count += 1
    return count
