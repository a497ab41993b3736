"""App-server session listing and organisation (app-server-protocol.md, "Session methods"):
``thread/list``, ``thread/listAll``, ``thread/listArchived``, ``thread/search``, ``thread/rename``,
``thread/pin``, ``thread/archive`` and ``thread/delete``.

Listing pages are ordered most recently updated first and use an opaque ``cursor`` (the
``next_cursor`` of the previous page). Ephemeral threads of this server appear on the first page
of the lists they match; they are not searchable (their text is never indexed).
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any

import trio

from roost._json import dumps, loads
from roost.actors import RETRACTED, IsBusy, UpdateThread, thread_view
from roost.errors import InvalidParams, NotFound, ThreadBusy
from roost.model import THREAD_KINDS
from roost.protocol._appserver import AppServerSession, method
from roost.protocol._as_common import mark_running_elsewhere, read_store, same_dir, thread_actor
from roost.protocol._params import BOOL, INT, STR, check_params
from roost.protocol._worktree import remove_clean_worktree
from roost.storage import (
    chat_ids_with_title,
    delete_thread,
    get_item,
    get_thread,
    leases,
    list_threads,
    page_threads,
    search_items,
)

log = logging.getLogger("roost.protocol")

__all__ = ["MAX_LIST", "MAX_SEARCH"]

#: Most threads one list page may hold.
MAX_LIST = 500
#: Most results of one ``thread/search`` (app-server-protocol.md: "limit (at most 100)").
MAX_SEARCH = 100


def _encode(thread: Any) -> str:
    return base64.urlsafe_b64encode(dumps({"u": thread.updated_at, "i": thread.id})).decode()


def _decode(cursor: str) -> tuple[str, str]:
    try:
        data = loads(base64.urlsafe_b64decode(cursor.encode()))
        if isinstance(data, dict) and isinstance(data.get("u"), str) and isinstance(data.get("i"), str):
            return data["u"], data["i"]
    except Exception:
        log.debug("a list cursor did not decode", exc_info=True)
    raise InvalidParams("cursor is not a list cursor this server issued")


def _limit(p: dict, default: int, most: int) -> int:
    limit = p.get("limit", default)
    if not 1 <= limit <= most:
        raise InvalidParams(f"limit must be between 1 and {most}")
    return limit


async def _page(
    session: AppServerSession, p: dict, *, archived: bool | None, kind: str | None, default_limit: int
) -> dict:
    """One page of persisted threads (plus matching ephemeral ones on the first page)."""
    limit = _limit(p, default_limit, MAX_LIST)
    if kind is not None and kind not in THREAD_KINDS:
        raise InvalidParams(f"kind must be one of {', '.join(THREAD_KINDS)}")
    cwd = str(Path(p["cwd"]).resolve()) if p.get("cwd") else None
    before = _decode(p["cursor"]) if p.get("cursor") else None

    def select(conn: Any) -> list:
        rows = page_threads(conn, archived=archived, kind=kind, before=before, limit=None if cwd else limit + 1)
        if cwd:
            rows = [t for t in rows if same_dir(t.cwd, cwd)][: limit + 1]
        return rows

    threads = await read_store(session, select)
    more = len(threads) > limit
    threads = threads[:limit]
    views = await _views(session, threads)
    if not p.get("cursor"):
        ephemeral = [
            v
            for v in session.runtime.registry.ephemeral_views()
            if (archived is None or v["archived"] == archived)
            and (kind is None or v["kind"] == kind)
            and (cwd is None or same_dir(v["cwd"], cwd))
        ]
        views = sorted(ephemeral, key=lambda v: v["updated_at"], reverse=True) + views
    return {"threads": views, "next_cursor": _encode(threads[-1]) if more and threads else None}


async def _views(session: AppServerSession, threads: list) -> list[dict]:
    """Thread views of stored rows; a loaded thread reports its live state, one another process
    executes is ``running`` (:func:`mark_running_elsewhere`)."""
    registry = session.runtime.registry
    out = []
    for thread in threads:
        live = registry.live_view(thread.id)
        out.append(
            live if live is not None else thread_view(thread, ephemeral=False, status="idle", active_turn_id=None)
        )
    await mark_running_elsewhere(session, out)
    return out


@method("thread/list")
async def thread_list(session: AppServerSession, params: Any) -> dict:
    """``thread/list``: unarchived conversations, optionally of one workspace (``cwd``).

    Params: ``cwd``, ``kind`` (default ``chat``), ``limit`` (1..500, default 50), ``cursor``.
    Result: ``{threads, next_cursor}``.
    """
    p = check_params(
        "thread/list",
        params,
        {"cwd": (STR, False), "limit": (INT, False), "cursor": (STR, False), "kind": (STR, False)},
    )
    return await _page(session, p, archived=False, kind=p.get("kind", "chat"), default_limit=50)


@method("thread/listAll")
async def thread_list_all(session: AppServerSession, params: Any) -> dict:
    """``thread/listAll``: every conversation of the store, archived or not, across workspaces."""
    p = check_params("thread/listAll", params, {"limit": (INT, False), "cursor": (STR, False), "kind": (STR, False)})
    return await _page(session, p, archived=None, kind=p.get("kind", "chat"), default_limit=200)


@method("thread/listArchived")
async def thread_list_archived(session: AppServerSession, params: Any) -> dict:
    """``thread/listArchived``: archived conversations across the store, whatever the workspace."""
    p = check_params("thread/listArchived", params, {"limit": (INT, False), "cursor": (STR, False)})
    return await _page(session, p, archived=True, kind="chat", default_limit=200)


@method("thread/search")
async def thread_search(session: AppServerSession, params: Any) -> dict:
    """``thread/search``: conversations whose title or messages match ``query`` (SQLite FTS5).

    A nonempty query searches titles and message text, archived conversations included; message
    hits carry a ``snippet`` and the matching item's ``message_seq``. Retracted (edited away)
    messages are not found. An empty query returns unarchived conversations as suggestions.
    ``limit`` is at most 100 (default 20). Result: ``{results: [{thread, snippet, message_seq?}]}``.
    """
    p = check_params("thread/search", params, {"query": (STR, True), "limit": (INT, False)})
    limit = _limit(p, 20, MAX_SEARCH)
    query = p["query"].strip()

    def search(conn: Any) -> list[dict]:
        if not query:
            return [
                {"thread": t, "snippet": t.title or "", "message_seq": None}
                for t in list_threads(conn, archived=False, kind="chat", limit=limit)
            ]
        results: list[dict] = []
        seen: set[str] = set()
        lowered = query.lower()
        for thread_id in chat_ids_with_title(conn, lowered, limit=limit):
            thread = get_thread(conn, thread_id)
            results.append({"thread": thread, "snippet": thread.title, "message_seq": None})
            seen.add(thread.id)
        offset_limit = limit * 4 + 20
        for hit in search_items(conn, query, limit=offset_limit):
            if len(results) >= limit:
                break
            if hit.thread_id in seen:
                continue
            try:
                if get_item(conn, hit.item_id).status == RETRACTED:
                    continue
                thread = get_thread(conn, hit.thread_id)
            except NotFound:
                continue
            if thread.kind != "chat":
                continue
            seen.add(hit.thread_id)
            results.append({"thread": thread, "snippet": hit.snippet, "message_seq": hit.seq})
        return results[:limit]

    rows = await read_store(session, search)
    views = await _views(session, [r["thread"] for r in rows])
    return {
        "results": [
            {
                "thread": view,
                "snippet": row["snippet"],
                **({"message_seq": row["message_seq"]} if row["message_seq"] is not None else {}),
            }
            for view, row in zip(views, rows, strict=True)
        ]
    }


async def _update(session: AppServerSession, thread_id: str, changes: dict) -> dict:
    actor = await thread_actor(session, thread_id)
    return await actor.ref.ask(UpdateThread(changes=changes))


@method("thread/rename")
async def thread_rename(session: AppServerSession, params: Any) -> dict:
    """``thread/rename``: set the title (blank clears it). Emits thread/updated."""
    p = check_params("thread/rename", params, {"thread_id": (STR, True), "title": (STR, True)})
    return {"thread": await _update(session, p["thread_id"], {"title": p["title"].strip() or None})}


@method("thread/pin")
async def thread_pin(session: AppServerSession, params: Any) -> dict:
    """``thread/pin``: pin (``pinned``, default true) or unpin. Emits thread/updated."""
    p = check_params("thread/pin", params, {"thread_id": (STR, True), "pinned": (BOOL, False)})
    return {"thread": await _update(session, p["thread_id"], {"pinned": p.get("pinned", True)})}


@method("thread/archive")
async def thread_archive(session: AppServerSession, params: Any) -> dict:
    """``thread/archive``: archive (``archived``, default true) or restore. Emits thread/updated.

    Raises:
        ThreadBusy: archiving a thread that is running.
    """
    p = check_params("thread/archive", params, {"thread_id": (STR, True), "archived": (BOOL, False)})
    actor = await thread_actor(session, p["thread_id"])
    if p.get("archived", True) and await actor.ref.ask(IsBusy()):
        raise ThreadBusy(f"thread {p['thread_id']} is running; interrupt it first")
    return {"thread": await _update(session, p["thread_id"], {"archived": p.get("archived", True)})}


@method("thread/delete")
async def thread_delete(session: AppServerSession, params: Any) -> dict:
    """``thread/delete``: delete a conversation permanently. Result ``{thread_id}``.

    ``only_if_archived: true`` is checked against the stored archive flag inside the deletion
    transaction, so a thread restored since the caller listed it survives with its history.
    A thread's git worktree is removed with it when it is clean; one with local changes is kept
    (the result's ``worktree`` says which).

    Raises:
        ThreadNotFound; ThreadBusy (running here or holding a live lease elsewhere);
        InvalidParams (``only_if_archived`` and the thread is not archived).
    """
    p = check_params("thread/delete", params, {"thread_id": (STR, True), "only_if_archived": (BOOL, False)})
    thread_id = p["thread_id"]
    only_if_archived = bool(p.get("only_if_archived"))
    registry = session.runtime.registry
    actor = await registry.get(thread_id)
    if await actor.ref.ask(IsBusy()):
        raise ThreadBusy(f"thread {thread_id} is running; interrupt it first")
    facts = actor.facts()
    worktree = (facts.thread.metadata or {}).get("worktree")
    if facts.ephemeral:
        if only_if_archived and not facts.thread.archived:
            raise InvalidParams(f"thread {thread_id} is not archived")
    else:
        owner = session.runtime.services.owner

        def delete(conn: Any) -> None:
            thread = get_thread(conn, thread_id)
            if only_if_archived and not thread.archived:
                raise InvalidParams(f"thread {thread_id} is not archived (restored since it was listed?)")
            if leases.held_elsewhere(conn, leases.thread_lease_key(thread_id), owner):
                raise ThreadBusy(f"thread {thread_id} is executing in another process")
            delete_thread(conn, thread_id)

        await session.runtime.store.writer.submit(delete)
    await registry.unload(thread_id)
    session.subscribed.discard(thread_id)
    if not worktree:
        return {"thread_id": thread_id}
    removed = await trio.to_thread.run_sync(remove_clean_worktree, worktree)
    return {"thread_id": thread_id, "worktree": {"path": worktree["path"], "removed": removed}}
