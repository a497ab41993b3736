"""Helpers shared by the app-server method modules (``_as_threads``, ``_as_thread_lists``,
``_as_turns``, ``_as_config``): store reads, thread lookup, history pages and their cursors."""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any

import trio

from roost._json import dumps, loads
from roost.actors import Snapshot
from roost.errors import InvalidParams, NodeUnreachable, ReadOnly, ThreadBusy
from roost.storage import leases, list_turns

__all__ = [
    "PERMISSION_MODES",
    "HISTORY_PAGE_TURNS",
    "HISTORY_PAGE_BYTES",
    "MAX_PAGE_TURNS",
    "read_store",
    "thread_actor",
    "thread_snapshot",
    "check_writable",
    "check_no_foreign_lease",
    "mark_running_elsewhere",
    "forwarded",
    "page_limit",
    "page_start",
    "encode_cursor",
    "decode_cursor",
    "same_dir",
]

log = logging.getLogger("roost.appserver")

PERMISSION_MODES = ("read_only", "standard", "unconfined")
#: Default turns per history page (app-server-protocol.md: "20 turns ... for ordinary item history").
HISTORY_PAGE_TURNS = 20
#: Most turns one page may hold.
MAX_PAGE_TURNS = 100
#: Serialized item bytes per history page (app-server-protocol.md: "256 KiB for ordinary item history").
HISTORY_PAGE_BYTES = 256 * 1024


async def read_store(session: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run the read-only storage function ``fn(conn, *args, **kwargs)`` in a worker thread.

    Cancellation: abandons the result (the read itself finishes in its thread).
    """
    store = session.runtime.store

    def run() -> Any:
        with store.read() as conn:
            return fn(conn, *args, **kwargs)

    return await trio.to_thread.run_sync(run)


async def thread_actor(session: Any, thread_id: str) -> Any:
    """The loaded ThreadActor of ``thread_id``, with ``session`` subscribed to its notifications.

    Raises:
        ThreadNotFound: no such thread.
    """
    actor = await session.runtime.registry.get(thread_id)
    await session.subscribe(actor)
    return actor


async def thread_snapshot(session: Any, thread_id: str, history_turns: int | None = None) -> dict:
    """The thread snapshot (``Snapshot`` reply) of ``thread_id``; subscribes ``session``."""
    actor = await thread_actor(session, thread_id)
    return await actor.ref.ask(Snapshot(history_turns))


def check_writable(actor: Any) -> None:
    """Refuse new input for an archived thread.

    Roost treats an archived conversation as read-only: it must be restored (``thread/archive``
    with ``archived: false``) before it takes input, so a conversation that was put away never
    changes behind the archive.

    Raises:
        ReadOnly: the thread is archived.
    """
    if actor.facts().thread.archived:
        raise ReadOnly(
            f"thread {actor.thread_id} is archived; restore it with thread/archive "
            "(archived: false) before sending input"
        )


async def mark_running_elsewhere(session: Any, views: list[dict]) -> None:
    """Report threads another live process executes now as running, in place (``status:
    "running"``, ``active_turn_id`` its running turn; the thread object of docs/app-server.md).

    This process's view of a thread whose turn runs elsewhere says ``idle``; a view is changed
    when another live owner holds the thread's execution lease (:func:`leases.held_elsewhere_many`)
    and the thread has a ``running`` turn row. Ephemeral threads are never elsewhere. One store
    read for all of ``views``.
    """
    ids = [v["id"] for v in views if v.get("status") == "idle" and not v.get("ephemeral")]
    if not ids:
        return
    owner = session.runtime.services.owner

    def read(conn: Any) -> dict[str, str]:
        running: dict[str, str] = {}
        held = leases.held_elsewhere_many(conn, [leases.thread_lease_key(tid) for tid in ids], owner)
        for tid in ids:
            if leases.thread_lease_key(tid) in held:
                turns = list_turns(conn, tid, status="running")
                if turns:
                    running[tid] = turns[-1].id
        return running

    running = await read_store(session, read)
    for view in views:
        if view["id"] in running and view.get("status") == "idle":
            view["status"], view["active_turn_id"] = "running", running[view["id"]]


async def check_no_foreign_lease(session: Any, thread_id: str) -> None:
    """Refuse when another process holds the thread's live execution lease.

    Raises:
        ThreadBusy: another live owner holds an unexpired lease on the thread (a dead process of
            this host does not count; see :func:`roost.storage.leases.live_elsewhere`).
    """
    lease = await read_store(
        session, leases.held_elsewhere, leases.thread_lease_key(thread_id), session.runtime.services.owner
    )
    if lease is not None:
        raise ThreadBusy(f"thread {thread_id} is executing in another process ({lease['owner']})")


async def forwarded(session: Any, actor: Any, op: str, params: dict) -> dict | None:
    """``op``'s result from the node that executes ``actor``'s thread, or None to apply it locally.

    None when the thread runs here (or is ephemeral), when no other node on the bus executes it
    now, or when that node did not take the request in time (withdrawn unclaimed: it will never
    run there).

    Raises:
        ProtocolError: the executing node's answer was an error (the same code).
        ThreadBusy: the node took the request and stopped answering (it may have applied it;
            a retry with the same ``client_id`` is deduplicated).
    """
    remote = session.runtime.services.remote
    facts = actor.facts()
    if remote is None or facts.ephemeral or facts.running:
        return None
    thread_id = actor.thread_id
    node = await remote.executing_node(thread_id)
    if node is None:
        return None
    if op == "interrupt":  # its answer goes before the turn/completed it causes (docs/app-server.md)
        remote.hold(thread_id, session.after_response())
    try:
        return await remote.forward(node, op, thread_id, params, session=session)
    except NodeUnreachable as exc:
        if exc.delivered:
            raise ThreadBusy(
                f"thread {thread_id} executes in {node}, which took the {op} and stopped answering; "
                "retry with the same client_id"
            ) from None
        log.warning("thread %s: %s not taken by %s (%s); applying the local rules", thread_id, op, node, exc)
        return None


def page_limit(value: Any, *, name: str = "history_page") -> int:
    """The number of turns a ``history_page`` asks for.

    The documented form is ``{limit: N}`` (docs/app-server.md); ``true`` (the default page), a bare
    integer and ``{turns: N}`` (an older spelling, which wins over ``limit`` when both are given)
    are accepted too. Error messages name the documented field.

    Raises:
        InvalidParams: not one of those forms, or N outside 1..100.
    """
    if value is True:
        return HISTORY_PAGE_TURNS
    if isinstance(value, dict):
        unknown = set(value) - {"turns", "limit"}
        if unknown:
            raise InvalidParams(f"{name}: unknown field(s) {', '.join(sorted(unknown))}; expected {{limit: N}}")
        value = value.get("turns", value.get("limit", HISTORY_PAGE_TURNS))
        field = f"{name}.limit"
        wrong_type = f"{field} must be an integer number of turns (1 to {MAX_PAGE_TURNS})"
    else:  # a bare number of turns
        field = f"{name} (a number of turns, or {{limit: N}})"
        wrong_type = f"{name} must be {{limit: N}} (N turns, 1 to {MAX_PAGE_TURNS}) or true"
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParams(wrong_type)
    if not 1 <= value <= MAX_PAGE_TURNS:
        raise InvalidParams(f"{field} must be between 1 and {MAX_PAGE_TURNS}, not {value}")
    return value


def page_start(turns: list[dict], end: int, limit: int, budget: int = HISTORY_PAGE_BYTES) -> int:
    """Index of the oldest turn of the page ending before ``turns[end]``.

    At most ``limit`` turns and about ``budget`` bytes of serialized turns; a page always holds at
    least one turn when one is available.
    """
    start = end
    size = 0
    while start > 0 and end - start < limit:
        cost = len(dumps(turns[start - 1]))
        if end - start >= 1 and size + cost > budget:
            break
        size += cost
        start -= 1
    return start


def encode_cursor(thread_id: str, before_turn_id: str) -> str:
    """An opaque history cursor: the page before turn ``before_turn_id`` of ``thread_id``."""
    return base64.urlsafe_b64encode(dumps({"t": thread_id, "b": before_turn_id})).decode()


def decode_cursor(cursor: str, thread_id: str) -> str:
    """The ``before_turn_id`` of a cursor from :func:`encode_cursor`.

    Raises:
        InvalidParams: not a cursor this server issued, or one of another thread.
    """
    try:
        data = loads(base64.urlsafe_b64decode(cursor.encode()))
        if not isinstance(data, dict) or not isinstance(data.get("t"), str) or not isinstance(data.get("b"), str):
            raise ValueError(cursor)
    except Exception:
        raise InvalidParams("history_cursor is not a cursor this server issued") from None
    if data["t"] != thread_id:
        raise InvalidParams("history_cursor belongs to another thread")
    return data["b"]


def same_dir(a: str | None, b: str) -> bool:
    """Whether directory ``a`` is ``b`` (both resolved; ``b`` already resolved)."""
    return a is not None and a != "" and str(Path(a).resolve()) == b
