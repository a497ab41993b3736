"""App-server session methods (app-server-protocol.md, "Transport and initialization", "Session
methods"): ``initialize``, ``shutdown``, ``thread/start``, ``thread/resume``, ``thread/history/read``,
``thread/fork`` and ``thread/edit-message``.

Listing, search and organisation (``thread/list``, ``thread/listAll``, ``thread/listArchived``,
``thread/search``, ``thread/rename``, ``thread/pin``, ``thread/archive``, ``thread/delete``) live in
:mod:`roost.protocol._as_thread_lists`, imported at the end of this module so that importing this
module registers every session method.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import trio

from roost.actors import ImportHistory, RetractFrom, Snapshot, stored_payload
from roost.errors import InvalidParams, ThreadNotFound, TurnNotFound, Unsupported
from roost.model import Thread
from roost.protocol._appserver import PROTOCOL_VERSION, AppServerSession, initialize_result, method
from roost.protocol._as_common import (
    HISTORY_PAGE_TURNS,
    MAX_PAGE_TURNS,
    PERMISSION_MODES,
    check_no_foreign_lease,
    check_writable,
    decode_cursor,
    encode_cursor,
    mark_running_elsewhere,
    page_limit,
    page_start,
    read_store,
    same_dir,
    thread_actor,
    thread_snapshot,
)
from roost.protocol._as_conversation import conversation_page, is_conversation_cursor
from roost.protocol._params import ANY, BOOL, DICT, INT, STR, check_params
from roost.protocol._worktree import create_worktree, remove_worktree
from roost.storage import append_item, chat_threads_with_cwd, create_thread, create_turn, new_id, update_turn, utc_now

__all__ = ["PERMISSION_MODES", "HISTORY_PAGE_TURNS", "BUILTIN_ENGINES"]

#: Engine ids that name Roost's own engine (``thread/start`` ``engine``); others are external.
BUILTIN_ENGINES = ("roost", "builtin", "wuu")


# -- initialize / shutdown ----------------------------------------------------------------------


@method("initialize")
async def initialize(session: AppServerSession, params: Any) -> dict:
    """``initialize``: check ``protocol_version`` (exact match), record client and capabilities.

    Returns the server description (:func:`initialize_result`); ``status: needs_setup`` with
    ``issues`` when no engine is usable. Reverse requests are enabled only for the methods listed
    in ``capabilities.reverse_rpc.methods``. A repeated ``initialize`` replaces what it names:
    without ``capabilities`` (or ``client``) the earlier ones stay, so approvals keep working.
    """
    p = check_params(
        "initialize",
        params,
        {
            "protocol_version": (STR, False),
            "client": (DICT, False),
            "capabilities": (DICT, False),
        },
    )
    for key in ("name", "version"):  # the spec's client {name, version}: strings
        value = (p.get("client") or {}).get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidParams(f"client.{key} must be a string, not {type(value).__name__}")
    version = p.get("protocol_version")
    if version is not None and version != PROTOCOL_VERSION:
        raise InvalidParams(f"unsupported protocol_version {version!r}; this server speaks {PROTOCOL_VERSION}")
    capabilities = p.get("capabilities") or {}
    deferred = capabilities.get("deferred_notification_content")
    if deferred is not None and not isinstance(deferred, bool):
        raise InvalidParams(
            f"capabilities.deferred_notification_content must be true or false, not {type(deferred).__name__}"
        )
    reverse = capabilities.get("reverse_rpc") or {}
    if not isinstance(reverse, dict):
        raise InvalidParams("capabilities.reverse_rpc must be an object with methods")
    methods = reverse.get("methods") or []
    if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
        raise InvalidParams("capabilities.reverse_rpc.methods must be an array of method names")
    if "capabilities" in p or not session.initialized:
        session.capabilities = capabilities
        session.reverse_methods = set(methods)
    if "client" in p or not session.initialized:
        session.client_name = str((p.get("client") or {}).get("name") or "client")
    if not session.initialized:
        session.announce_mcp(session.after_response())  # mcp/status/updated: each server's state
    session.initialized = True
    return initialize_result(session)


@method("shutdown")
async def shutdown(session: AppServerSession, params: Any) -> dict:
    """``shutdown``: answer, then stop reading; running turns are interrupted and persisted."""
    check_params("shutdown", params, {})
    session.shutdown_requested = True
    return {"ok": True}


# -- thread/start -------------------------------------------------------------------------------


def _workspace_default(session: AppServerSession, key: str) -> Any:
    """A workspace default set by ``config/model/update`` without ``thread_id`` (or None)."""
    return (getattr(session, "workspace_defaults", None) or {}).get(key)


_START_PARAMS = {
    "cwd": (STR, False),
    "workspace_id": (STR, False),
    "engine": (STR, False),
    "provider": (STR, False),
    "model": (STR, False),
    "effort": (STR, False),
    "permission_mode": (STR, False),
    "approve_for_me": (BOOL, False),
    "ephemeral": (BOOL, False),
    "workspace": (STR, False),
    "base_revision": (STR, False),
    "title": (STR, False),
    "model_options": (DICT, False),
}


def _start_options(session: AppServerSession, p: dict) -> tuple[str, str, bool, dict, Path]:
    """The checked ``thread/start`` options: ``(permission_mode, workspace, ephemeral,
    model_options, cwd)``.

    Raises:
        InvalidParams, Unsupported: see :func:`thread_start`.
    """
    engine = p.get("engine", "roost")
    if engine not in BUILTIN_ENGINES:
        raise Unsupported(f"external engine {engine!r} is not supported by Roost; use the built-in engine")
    if p.get("approve_for_me"):
        raise Unsupported("approve_for_me: Roost has no automatic approval reviewer; approvals go to the client")
    mode = p.get("permission_mode") or _workspace_default(session, "permission_mode") or "standard"
    if mode not in PERMISSION_MODES:
        raise InvalidParams(f"permission_mode must be one of {', '.join(PERMISSION_MODES)}")
    workspace = p.get("workspace", "shared")
    if workspace not in ("shared", "worktree"):
        raise InvalidParams("workspace must be shared or worktree")
    if "base_revision" in p and workspace != "worktree":
        raise InvalidParams("base_revision requires workspace: worktree")
    ephemeral = bool(p.get("ephemeral", False))
    if ephemeral and workspace == "worktree":
        raise InvalidParams("ephemeral threads cannot use a worktree")
    options = p.get("model_options") or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in options.items()):
        raise InvalidParams("model_options must map strings to strings")
    cwd = Path(p.get("cwd") or os.getcwd()).expanduser()
    if not cwd.is_absolute() or not cwd.is_dir():
        raise InvalidParams(f"cwd {str(cwd)!r} is not an existing absolute directory")
    return mode, workspace, ephemeral, options, cwd


@method("thread/start")
async def thread_start(session: AppServerSession, params: Any) -> dict:
    """``thread/start``: a new conversation; persistent unless ``ephemeral: true``.

    The engine binding (provider, model, effort) and permission mode are fixed at creation and
    changed only through ``config/model/update``. ``workspace: worktree`` runs the thread in a new
    detached git worktree (from ``base_revision``, default HEAD); a request that cannot be
    honoured fails with ``invalid_params`` and leaves no thread and no worktree behind.

    Raises:
        InvalidParams: bad cwd, mode, workspace or provider; worktree impossible.
        Unsupported: an external engine, or ``approve_for_me: true`` (Roost has no approval reviewer).
    """
    p = check_params("thread/start", params, _START_PARAMS)
    mode, workspace, ephemeral, options, cwd = _start_options(session, p)
    settings = session.settings
    provider = p.get("provider") or (settings.provider if settings else None)
    model = p.get("model") or (settings.model if settings else None)
    effort = p.get("effort") or _workspace_default(session, "effort")
    thread_id = new_id("thr")
    now = utc_now()
    metadata: dict = {}
    if options:
        metadata["model_options"] = dict(options)
    workspace_id = p.get("workspace_id") or (session.host or {}).get("workspace_id")  # hosted mode's default
    if workspace_id:
        metadata["workspace_id"] = workspace_id
    thread = Thread(
        id=thread_id,
        kind="chat",
        title=(p.get("title") or "").strip() or None,
        cwd=str(cwd),
        provider=provider,
        model=model,
        effort=effort,
        permission_mode=mode,
        created_at=now,
        updated_at=now,
        metadata=metadata,
    )
    if "provider" in p:
        # an unusable explicit binding fails now, not at the first turn
        session.engines.settings_for(thread, origin="the thread/start param")
    worktree = None
    if workspace == "worktree":
        worktree = await trio.to_thread.run_sync(create_worktree, cwd, p.get("base_revision"), thread_id)
        metadata["worktree"] = worktree
        thread.cwd = worktree["path"]
    try:
        actor = await session.runtime.registry.create(thread, ephemeral=ephemeral)
    except BaseException:
        if worktree is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(remove_worktree, worktree)
        raise
    await session.subscribe(actor)
    view = actor.view()
    session.notify("thread/started", {"thread": view})
    return {"thread": view}


# -- thread/resume and history pages ------------------------------------------------------------


async def _most_recent(session: AppServerSession, cwd: str) -> str:
    """The most recently updated visible (unarchived chat) thread whose cwd is ``cwd``."""

    def find(conn: Any) -> Any:
        rows = chat_threads_with_cwd(conn)
        return next((t for t in rows if same_dir(t.cwd, cwd)), None)

    best = await read_store(session, find)
    best_id, best_updated = (best.id, best.updated_at) if best is not None else (None, "")
    for view in session.runtime.registry.ephemeral_views():  # ephemeral threads have no rows
        if (
            not view["archived"]
            and same_dir(view["cwd"], cwd)
            and (best_id is None or view["updated_at"] > best_updated)
        ):
            best_id, best_updated = view["id"], view["updated_at"]
    if best_id is None:
        raise ThreadNotFound(f"no thread for workspace {cwd}")
    return str(best_id)


def _add_cursor(snapshot: dict, thread_id: str) -> dict:
    turns = snapshot["turns"]
    snapshot["history_cursor"] = encode_cursor(thread_id, turns[0]["id"]) if snapshot["has_more"] and turns else None
    return snapshot


@method("thread/resume")
async def thread_resume(session: AppServerSession, params: Any) -> dict:
    """``thread/resume``: the thread snapshot plus pending and held user input.

    ``session_id`` omitted: the most recent visible thread of the workspace (``cwd``, default the
    server's working directory). ``history_page`` bounds the turns returned and adds a
    ``history_cursor`` for ``thread/history/read``. ``response_only`` suppresses the
    ``thread/resumed`` notification. ``conversation_history: true`` returns a conversation page
    instead (``items_view: "conversation"``, process regions as ``process_summary`` items, up to
    100 turns and 1 MiB; :mod:`roost.protocol._as_conversation`).
    """
    p = check_params(
        "thread/resume",
        params,
        {
            "session_id": (STR, False),
            "thread_id": (STR, False),
            "response_only": (BOOL, False),
            "history_page": (ANY, False),
            "conversation_history": (BOOL, False),
            "cwd": (STR, False),
        },
    )
    thread_id = p.get("session_id") or p.get("thread_id")
    if thread_id is None:
        thread_id = await _most_recent(session, str(Path(p.get("cwd") or os.getcwd()).resolve()))
    limit = page_limit(p["history_page"]) if "history_page" in p else None
    snapshot = await thread_snapshot(session, thread_id)
    if p.get("conversation_history"):
        turns = snapshot["turns"]
        snapshot.update(conversation_page(thread_id, turns, len(turns), limit or MAX_PAGE_TURNS))
    elif limit is not None:
        turns = snapshot["turns"]
        start = page_start(turns, len(turns), limit)
        snapshot["turns"] = turns[start:]
        snapshot["has_more"] = start > 0
        _add_cursor(snapshot, thread_id)
    await mark_running_elsewhere(session, [snapshot["thread"]])  # a turn another process runs
    if not p.get("response_only"):
        session.notify("thread/resumed", {"thread": snapshot["thread"]})
    return snapshot


@method("thread/history/read")
async def thread_history_read(session: AppServerSession, params: Any) -> dict:
    """``thread/history/read``: the page of turns before an opaque ``history_cursor``.

    Without a cursor (omitted or null), the most recent page; an empty string is not a cursor and
    answers ``invalid_params``. Pages hold at most ``limit`` (default 20, at most 100)
    turns and about 256 KiB of items. The returned ``history_cursor`` is null on the oldest page.
    """
    p = check_params(
        "thread/history/read",
        params,
        {
            "thread_id": (STR, True),
            "history_cursor": (STR, False),
            "cursor": (STR, False),
            "limit": (INT, False),
        },
    )
    limit = p.get("limit", HISTORY_PAGE_TURNS)
    if not 1 <= limit <= MAX_PAGE_TURNS:
        raise InvalidParams(f"limit must be between 1 and {MAX_PAGE_TURNS}")
    snapshot = await thread_snapshot(session, p["thread_id"])
    turns = snapshot["turns"]
    for key in ("history_cursor", "cursor"):
        if p.get(key) == "":
            raise InvalidParams(
                f"{key} must be the opaque string a page returned (omit it for the most recent page), not empty"
            )
    cursor = p.get("history_cursor") or p.get("cursor")
    end = len(turns)
    if cursor is not None:
        before = decode_cursor(cursor, p["thread_id"])
        ids = [t["id"] for t in turns]
        if before not in ids:
            raise InvalidParams("history_cursor no longer matches the thread's history (edited or deleted)")
        end = ids.index(before)
    if cursor is not None and is_conversation_cursor(cursor):  # continue in conversation form
        return {"thread_id": p["thread_id"], **conversation_page(p["thread_id"], turns, end, limit)}
    start = page_start(turns, end, limit)
    page = turns[start:end]
    next_cursor = encode_cursor(p["thread_id"], page[0]["id"]) if start > 0 and page else None
    return {"thread_id": p["thread_id"], "turns": page, "history_cursor": next_cursor, "has_more": start > 0}


# -- thread/fork --------------------------------------------------------------------------------


def _cut(snapshot: dict, thread_id: str, turn_id: str | None, item_id: str | None) -> tuple[list, list]:
    """The settled turns and items of a fork: up to ``turn_id`` and/or ``item_id`` (inclusive)."""
    turns = [t for t in snapshot["turns"] if t["status"] not in ("running", "queued")]
    if turn_id is not None:
        ids = [t["id"] for t in turns]
        if turn_id not in ids:
            if any(t["id"] == turn_id for t in snapshot["turns"]):
                raise InvalidParams(f"turn {turn_id} is still running; fork at a settled turn")
            raise TurnNotFound(f"thread {thread_id} has no turn {turn_id}")
        turns = turns[: ids.index(turn_id) + 1]
    items = [i for t in turns for i in t["items"]]
    if item_id is not None:
        ids = [i["id"] for i in items]
        if item_id not in ids:
            raise InvalidParams(
                f"thread {thread_id} has no settled item {item_id}" + (f" in turn {turn_id}" if turn_id else "")
            )
        cut = items[ids.index(item_id)]
        if turn_id is not None and cut.get("turn_id") != turn_id:
            raise InvalidParams(f"item {item_id} is not in turn {turn_id}")
        items = items[: ids.index(item_id) + 1]
        turn_ids = [t["id"] for t in turns]
        turns = turns[: turn_ids.index(cut["turn_id"]) + 1]
    return turns, items


@method("thread/fork")
async def thread_fork(session: AppServerSession, params: Any) -> dict:
    """``thread/fork``: a new thread with a copy of the source's settled history and selection.

    ``turn_id``/``item_id`` cut the copy after that turn/item. ``target: worktree`` runs the fork
    in a new detached worktree of the source's project. ``history_page`` bounds the turns in the
    result and in ``thread/started`` and adds a ``history_cursor``. A fork of an ephemeral thread
    is ephemeral. The source is never changed.

    Raises:
        ThreadNotFound, TurnNotFound, InvalidParams; Unsupported for ``mode``.
    """
    p = check_params(
        "thread/fork",
        params,
        {
            "thread_id": (STR, True),
            "turn_id": (STR, False),
            "item_id": (STR, False),
            "target": (STR, False),
            "mode": (STR, False),
            "history_page": (ANY, False),
        },
    )
    if "mode" in p:
        raise Unsupported("thread/fork mode is not supported by Roost; omit it to copy the conversation")
    target = p.get("target", "shared")
    if target not in ("shared", "worktree"):
        raise InvalidParams("target must be shared or worktree")
    limit = page_limit(p["history_page"]) if "history_page" in p else None
    source_actor = await session.runtime.registry.get(p["thread_id"])
    snapshot = await source_actor.ref.ask(Snapshot(None))
    turns, items = _cut(snapshot, p["thread_id"], p.get("turn_id"), p.get("item_id"))
    source = source_actor.facts()
    if target == "worktree" and source.ephemeral:
        raise InvalidParams("an ephemeral thread cannot be forked into a worktree")
    src = source.thread
    new_thread, metadata = _fork_thread(src, turns, p.get("item_id"))
    worktree = None
    if target == "worktree":
        worktree = await trio.to_thread.run_sync(create_worktree, Path(src.cwd or os.getcwd()), None, new_thread.id)
        metadata["worktree"] = worktree
        new_thread.cwd = worktree["path"]
    try:
        actor = await _import_fork(session, new_thread, turns, items, ephemeral=source.ephemeral)
    except BaseException:
        if worktree is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(remove_worktree, worktree)
        raise
    await session.subscribe(actor)
    forked = await actor.ref.ask(Snapshot(None))
    result: dict = {"thread": forked["thread"], "turns": forked["turns"], "worktree": worktree}
    started: dict = {"thread": forked["thread"]}
    if limit is not None:
        all_turns = forked["turns"]
        start = page_start(all_turns, len(all_turns), limit)
        page = {"turns": all_turns[start:], "has_more": start > 0}
        _add_cursor(page, new_thread.id)
        result.update(page)
        started.update(page)
    session.notify("thread/started", started)
    return result


def _fork_thread(src: Thread, turns: list[dict], item_id: str | None) -> tuple[Thread, dict]:
    """The new thread row of a fork of ``src`` (cut after ``turns``/``item_id``), and its metadata."""
    now = utc_now()
    metadata = {k: v for k, v in (src.metadata or {}).items() if k not in ("worktree", "forked_from")}
    metadata["forked_from"] = {
        "thread_id": src.id,
        "turn_id": turns[-1]["id"] if turns else None,
        "item_id": item_id,
    }
    new_thread = Thread(
        id=new_id("thr"),
        kind="chat",
        title=f"{src.title} (fork)" if src.title else None,
        cwd=src.cwd,
        provider=src.provider,
        model=src.model,
        effort=src.effort,
        permission_mode=src.permission_mode,
        parent_thread_id=src.id,
        created_at=now,
        updated_at=now,
        metadata=metadata,
    )
    return new_thread, metadata


async def _import_fork(
    session: AppServerSession, new_thread: Thread, turns: list[dict], items: list[dict], *, ephemeral: bool
) -> Any:
    """Create the fork's thread with copies of ``turns`` and ``items`` (new ids); return its actor."""
    turn_map = {t["id"]: new_id("turn") for t in turns}
    item_map = {i["id"]: new_id("item") for i in items}
    if ephemeral:
        actor = await session.runtime.registry.create(new_thread, ephemeral=True)
        await actor.ref.ask(
            ImportHistory(
                turns=tuple({k: v for k, v in t.items() if k != "items"} | {"id": turn_map[t["id"]]} for t in turns),
                items=tuple(dict(i, id=item_map[i["id"]], turn_id=turn_map.get(i.get("turn_id"))) for i in items),
            )
        )
    else:
        await session.runtime.store.writer.submit(_copy_history, new_thread, turns, items, turn_map, item_map)
        actor = await session.runtime.registry.get(new_thread.id)
    return actor


def _copy_history(conn: Any, thread: Thread, turns: list, items: list, turn_map: dict, item_map: dict) -> None:
    """Write a fork: the thread row, its copied turns and items (one transaction)."""
    fields = {
        k: getattr(thread, k)
        for k in ("title", "cwd", "provider", "model", "effort", "permission_mode", "parent_thread_id", "metadata")
    }
    create_thread(conn, kind="chat", id=thread.id, **fields)
    for t in turns:
        create_turn(conn, thread.id, id=turn_map[t["id"]], status=t["status"], run_id=None)
        update_turn(
            conn,
            turn_map[t["id"]],
            started_at=t.get("started_at"),
            completed_at=t.get("completed_at"),
            error=t.get("error"),
            usage=t.get("usage"),
        )
    for i in items:
        append_item(
            conn,
            thread.id,
            type=i["type"],
            payload=stored_payload(i),
            id=item_map[i["id"]],
            text=i.get("text") if i["type"] in ("user_message", "agent_message") else None,
            turn_id=turn_map.get(i.get("turn_id")),
            status=i["status"],
        )


# -- thread/edit-message ------------------------------------------------------------------------


@method("thread/edit-message")
async def thread_edit_message(session: AppServerSession, params: Any) -> dict:
    """``thread/edit-message``: retract a user message and everything after it; return the draft.

    The selected user message and every later item leave the active conversation (snapshots,
    history pages, search, and the model's history); the stored transcript keeps them, marked
    ``retracted`` (append-only audit). The result is the rewound thread (``thread``, ``turns``) and
    ``draft``: the selected message's ``prompt``, ``images``, ``content_parts`` and ``client_id``,
    for the client to edit and send again.

    Raises:
        ThreadBusy: a turn is running (here or in another process).
        ReadOnly: the thread is archived.
        TurnNotFound: no such turn.
        InvalidParams: no such item in that turn, or it is not a user message.
    """
    p = check_params(
        "thread/edit-message", params, {"thread_id": (STR, True), "turn_id": (STR, True), "item_id": (STR, True)}
    )
    actor = await thread_actor(session, p["thread_id"])
    check_writable(actor)
    await check_no_foreign_lease(session, p["thread_id"])
    edit = await actor.ref.ask(RetractFrom(turn_id=p["turn_id"], item_id=p["item_id"]))
    snapshot = await actor.ref.ask(Snapshot(None))
    return {
        "thread": snapshot["thread"],
        "turns": snapshot["turns"],
        "draft": edit["draft"],
        "retracted_item_ids": edit["retracted_item_ids"],
        "retracted_turn_ids": edit["retracted_turn_ids"],
    }


from roost.protocol import _as_thread_lists  # noqa: E402,F401  (registers the list/organise methods)
