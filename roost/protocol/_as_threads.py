"""App-server thread methods (app-server-protocol.md, "Session methods")."""

from __future__ import annotations

import base64
import functools
import os
import subprocess
from pathlib import Path
from typing import Any

import trio

from roost._json import dumps, loads
from roost.actors._messages import Snapshot, UpdateThread, IsBusy
from roost.actors._views import thread_view
from roost.errors import InvalidParams, NotFound, ThreadBusy, ThreadNotFound, TurnNotFound, Unsupported
from roost.model import Thread
from roost.protocol._appserver import AppServerSession, initialize_result, method, PROTOCOL_VERSION
from roost.protocol._params import ANY, BOOL, DICT, INT, STR, check_params
from roost.storage import _items, _threads
from roost.storage._rows import new_id, utc_now

PERMISSION_MODES = ("read_only", "standard", "unconfined")
#: Turns per page of ``thread/history/read`` and ``history_page`` snapshots.
HISTORY_PAGE_TURNS = 20


@method("initialize")
async def initialize(session: AppServerSession, params: Any) -> dict:
    p = check_params("initialize", params, {
        "protocol_version": (STR, False), "client": (DICT, False), "capabilities": (DICT, False),
    })
    version = p.get("protocol_version")
    if version is not None and version != PROTOCOL_VERSION:
        raise InvalidParams(f"unsupported protocol_version {version!r}; this server speaks {PROTOCOL_VERSION}")
    session.capabilities = p.get("capabilities") or {}
    reverse = (session.capabilities.get("reverse_rpc") or {}).get("methods") or []
    session.reverse_methods = {m for m in reverse if isinstance(m, str)}
    client = p.get("client") or {}
    session.client_name = str(client.get("name") or "client")
    return initialize_result(session)


@method("shutdown")
async def shutdown(session: AppServerSession, params: Any) -> dict:
    check_params("shutdown", params, {})
    session.shutdown_requested = True
    return {"ok": True}


async def _read(session: AppServerSession, fn: Any, *args: Any, **kwargs: Any) -> Any:
    store = session.runtime.store

    def run() -> Any:
        with store.read() as conn:
            return fn(conn, *args, **kwargs)

    return await trio.to_thread.run_sync(run)


async def _thread_snapshot(session: AppServerSession, thread_id: str, history_turns: int | None = None) -> dict:
    actor = await session.runtime.registry.get(thread_id)
    await session.subscribe(actor)
    return await actor.ref.ask(Snapshot(history_turns))


def _git(cwd: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise InvalidParams(f"git {' '.join(args)} failed: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip()


def _create_worktree(cwd: Path, base_revision: str | None, thread_id: str) -> dict:
    """A detached worktree of the repository at ``cwd``; raises InvalidParams with no side effects."""
    try:
        repo = Path(_git(cwd, "rev-parse", "--show-toplevel"))
    except (InvalidParams, FileNotFoundError, subprocess.TimeoutExpired):
        raise InvalidParams(f"{cwd} is not inside a git repository; workspace worktree needs one") from None
    revision = base_revision or "HEAD"
    try:
        commit = _git(repo, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    except InvalidParams:
        raise InvalidParams(f"unknown base_revision {revision!r}") from None
    from roost._paths import roost_home

    path = roost_home() / "worktrees" / thread_id
    path.parent.mkdir(parents=True, exist_ok=True)
    _git(repo, "worktree", "add", "--detach", str(path), commit)
    return {"path": str(path), "base_commit": commit, "base_repository": str(repo), "base_revision": revision}


@method("thread/start")
async def thread_start(session: AppServerSession, params: Any) -> dict:
    p = check_params("thread/start", params, {
        "cwd": (STR, False), "workspace_id": (STR, False), "engine": (STR, False), "provider": (STR, False),
        "model": (STR, False), "effort": (STR, False), "permission_mode": (STR, False),
        "approve_for_me": (BOOL, False), "ephemeral": (BOOL, False), "workspace": (STR, False),
        "base_revision": (STR, False), "title": (STR, False), "model_options": (DICT, False),
    })
    engine = p.get("engine", "roost")
    if engine not in ("roost", "wuu", "builtin"):
        raise Unsupported(f"external engine {engine!r} is not supported by Roost; use the built-in engine")
    mode = p.get("permission_mode", "standard")
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
    cwd = Path(p.get("cwd") or os.getcwd()).expanduser()
    if not cwd.is_absolute() or not cwd.is_dir():
        raise InvalidParams(f"cwd {str(cwd)!r} is not an existing absolute directory")
    settings = session.settings
    provider = p.get("provider") or (settings.provider if settings else None)
    model = p.get("model") or (settings.model if settings else None)
    thread_id = new_id("thr")
    metadata: dict = {}
    if p.get("model_options"):
        metadata["model_options"] = p["model_options"]
    if p.get("workspace_id"):
        metadata["workspace_id"] = p["workspace_id"]
    if workspace == "worktree":
        worktree = await trio.to_thread.run_sync(_create_worktree, cwd, p.get("base_revision"), thread_id)
        metadata["worktree"] = worktree
        cwd = Path(worktree["path"])
    now = utc_now()
    thread = Thread(id=thread_id, kind="chat", title=p.get("title"), cwd=str(cwd), provider=provider,
                    model=model, effort=p.get("effort"), permission_mode=mode, created_at=now,
                    updated_at=now, metadata=metadata)
    actor = await session.runtime.registry.create(thread, ephemeral=ephemeral)
    await session.subscribe(actor)
    view = actor.view()
    session.notify("thread/started", {"thread": view})
    return {"thread": view}


@method("thread/resume")
async def thread_resume(session: AppServerSession, params: Any) -> dict:
    p = check_params("thread/resume", params, {
        "session_id": (STR, False), "thread_id": (STR, False), "response_only": (BOOL, False),
        "history_page": (ANY, False), "conversation_history": (BOOL, False), "cwd": (STR, False),
    })
    thread_id = p.get("session_id") or p.get("thread_id")
    if thread_id is None:
        cwd = str(Path(p.get("cwd") or os.getcwd()).resolve())
        threads = await _read(session, _threads.list_threads, archived=False, kind="chat", limit=500)
        match = next((t for t in threads if t.cwd and str(Path(t.cwd).resolve()) == cwd), None)
        if match is None:
            raise ThreadNotFound(f"no thread for workspace {cwd}")
        thread_id = match.id
    page = p.get("history_page")
    turns_limit = None
    if page is not None:
        turns_limit = page.get("turns", HISTORY_PAGE_TURNS) if isinstance(page, dict) else HISTORY_PAGE_TURNS
        if not isinstance(turns_limit, int) or turns_limit < 1:
            raise InvalidParams("history_page.turns must be a positive integer")
    snapshot = await _thread_snapshot(session, thread_id, turns_limit)
    if turns_limit is not None and snapshot["turns"]:
        snapshot["history_cursor"] = _encode_cursor(thread_id, snapshot["turns"][0]["id"]) if snapshot["has_more"] else None
    if not p.get("response_only"):
        session.notify("thread/resumed", {"thread": snapshot["thread"]})
    return snapshot


def _encode_cursor(thread_id: str, before_turn_id: str) -> str:
    return base64.urlsafe_b64encode(dumps({"t": thread_id, "b": before_turn_id})).decode()


def _decode_cursor(cursor: str) -> dict:
    try:
        data = loads(base64.urlsafe_b64decode(cursor.encode()))
        if not isinstance(data, dict) or not isinstance(data.get("t"), str) or not isinstance(data.get("b"), str):
            raise ValueError
        return data
    except Exception:
        raise InvalidParams("history_cursor is not a cursor this server issued") from None


@method("thread/history/read")
async def thread_history_read(session: AppServerSession, params: Any) -> dict:
    p = check_params("thread/history/read", params, {
        "thread_id": (STR, True), "history_cursor": (STR, False), "cursor": (STR, False), "limit": (INT, False),
    })
    limit = p.get("limit", HISTORY_PAGE_TURNS)
    if limit < 1 or limit > 100:
        raise InvalidParams("limit must be between 1 and 100")
    snapshot = await _thread_snapshot(session, p["thread_id"])
    turns = snapshot["turns"]
    cursor = p.get("history_cursor") or p.get("cursor")
    end = len(turns)
    if cursor is not None:
        data = _decode_cursor(cursor)
        if data["t"] != p["thread_id"]:
            raise InvalidParams("history_cursor belongs to another thread")
        ids = [t["id"] for t in turns]
        if data["b"] not in ids:
            raise InvalidParams("history_cursor no longer matches the thread's history")
        end = ids.index(data["b"])
    start = max(0, end - limit)
    page = turns[start:end]
    next_cursor = _encode_cursor(p["thread_id"], page[0]["id"]) if start > 0 and page else None
    return {"thread_id": p["thread_id"], "turns": page, "history_cursor": next_cursor}


def _list_views(session: AppServerSession, threads: list) -> list[dict]:
    registry = session.runtime.registry
    out = []
    for thread in threads:
        actor = registry.actors.get(thread.id)
        active = actor.active.id if actor is not None and actor.active is not None else None
        out.append(thread_view(thread, ephemeral=False, status="running" if active else "idle", active_turn_id=active))
    return out


def _ephemeral_views(session: AppServerSession) -> list[dict]:
    return [a.view() for a in session.runtime.registry.loaded() if a.ephemeral and not a.thread.archived]


@method("thread/list")
async def thread_list(session: AppServerSession, params: Any) -> dict:
    p = check_params("thread/list", params, {"cwd": (STR, False), "limit": (INT, False), "cursor": (STR, False),
                                             "kind": (STR, False)})
    limit = p.get("limit", 50)
    if limit < 1 or limit > 500:
        raise InvalidParams("limit must be between 1 and 500")
    threads = await _read(session, _threads.list_threads, archived=False, kind=p.get("kind", "chat"),
                          updated_before=p.get("cursor"), limit=limit + 1)
    if "cwd" in p:
        cwd = str(Path(p["cwd"]).resolve())
        threads = [t for t in threads if t.cwd and str(Path(t.cwd).resolve()) == cwd]
    more = len(threads) > limit
    threads = threads[:limit]
    views = _list_views(session, threads)
    if not p.get("cursor"):
        views = _ephemeral_views(session) + views
    return {"threads": views, "next_cursor": threads[-1].updated_at if more and threads else None}


@method("thread/listAll")
async def thread_list_all(session: AppServerSession, params: Any) -> dict:
    p = check_params("thread/listAll", params, {"limit": (INT, False), "cursor": (STR, False)})
    limit = p.get("limit", 200)
    threads = await _read(session, _threads.list_threads, archived=None, updated_before=p.get("cursor"), limit=limit + 1)
    more = len(threads) > limit
    threads = threads[:limit]
    return {"threads": _list_views(session, threads), "next_cursor": threads[-1].updated_at if more and threads else None}


@method("thread/listArchived")
async def thread_list_archived(session: AppServerSession, params: Any) -> dict:
    p = check_params("thread/listArchived", params, {"limit": (INT, False), "cursor": (STR, False)})
    limit = p.get("limit", 200)
    threads = await _read(session, _threads.list_threads, archived=True, updated_before=p.get("cursor"), limit=limit + 1)
    more = len(threads) > limit
    threads = threads[:limit]
    return {"threads": _list_views(session, threads), "next_cursor": threads[-1].updated_at if more and threads else None}


@method("thread/search")
async def thread_search(session: AppServerSession, params: Any) -> dict:
    p = check_params("thread/search", params, {"query": (STR, True), "limit": (INT, False)})
    limit = p.get("limit", 20)
    if limit < 1 or limit > 100:
        raise InvalidParams("limit must be between 1 and 100")
    query = p["query"].strip()

    def search(conn: Any) -> list[dict]:
        results: list[dict] = []
        if not query:
            for thread in _threads.list_threads(conn, archived=False, kind="chat", limit=limit):
                results.append({"thread": thread, "snippet": thread.title or "", "message_seq": None})
            return results
        seen: set[str] = set()
        lowered = query.lower()
        for thread in _threads.list_threads(conn, archived=None, kind="chat", limit=1000):
            if thread.title and lowered in thread.title.lower():
                results.append({"thread": thread, "snippet": thread.title, "message_seq": None})
                seen.add(thread.id)
        for hit in _items.search_items(conn, query, limit=limit * 4):
            if hit.thread_id in seen:
                continue
            try:
                thread = _threads.get_thread(conn, hit.thread_id)
            except NotFound:
                continue
            if thread.kind != "chat":
                continue
            seen.add(hit.thread_id)
            results.append({"thread": thread, "snippet": hit.snippet, "message_seq": hit.seq})
        return results[:limit]

    rows = await _read(session, search)
    views = _list_views(session, [r["thread"] for r in rows])
    return {"results": [
        {"thread": view, "snippet": row["snippet"], **({"message_seq": row["message_seq"]} if row["message_seq"] is not None else {})}
        for view, row in zip(views, rows)
    ]}


async def _update(session: AppServerSession, thread_id: str, changes: dict) -> dict:
    actor = await session.runtime.registry.get(thread_id)
    await session.subscribe(actor)
    return await actor.ref.ask(UpdateThread(changes=changes))


@method("thread/rename")
async def thread_rename(session: AppServerSession, params: Any) -> dict:
    p = check_params("thread/rename", params, {"thread_id": (STR, True), "title": (STR, True)})
    return {"thread": await _update(session, p["thread_id"], {"title": p["title"].strip() or None})}


@method("thread/pin")
async def thread_pin(session: AppServerSession, params: Any) -> dict:
    p = check_params("thread/pin", params, {"thread_id": (STR, True), "pinned": (BOOL, False)})
    return {"thread": await _update(session, p["thread_id"], {"pinned": p.get("pinned", True)})}


@method("thread/archive")
async def thread_archive(session: AppServerSession, params: Any) -> dict:
    p = check_params("thread/archive", params, {"thread_id": (STR, True), "archived": (BOOL, False)})
    actor = await session.runtime.registry.get(p["thread_id"])
    if p.get("archived", True) and await actor.ref.ask(IsBusy()):
        raise ThreadBusy(f"thread {p['thread_id']} is running; interrupt it first")
    return {"thread": await _update(session, p["thread_id"], {"archived": p.get("archived", True)})}


@method("thread/delete")
async def thread_delete(session: AppServerSession, params: Any) -> dict:
    p = check_params("thread/delete", params, {"thread_id": (STR, True), "only_if_archived": (BOOL, False)})
    thread_id = p["thread_id"]
    registry = session.runtime.registry
    actor = await registry.get(thread_id)
    if await actor.ref.ask(IsBusy()):
        raise ThreadBusy(f"thread {thread_id} is running; interrupt it first")
    if actor.ephemeral:
        if p.get("only_if_archived") and not actor.thread.archived:
            raise InvalidParams(f"thread {thread_id} is not archived")
    else:
        from roost.storage import leases

        def delete(conn: Any) -> None:
            # Checked inside the deletion transaction: a thread restored since the list was read stays.
            thread = _threads.get_thread(conn, thread_id)
            if p.get("only_if_archived") and not thread.archived:
                raise InvalidParams(f"thread {thread_id} is not archived (restored since listed?)")
            lease = leases.get_lease(conn, leases.thread_lease_key(thread_id))
            import time as _time

            if lease and lease.get("owner") and (lease.get("expires_at") or 0) > _time.time():
                raise ThreadBusy(f"thread {thread_id} is executing in another process")
            _threads.delete_thread(conn, thread_id)

        await session.runtime.store.writer.submit(delete)
    await registry.supervisor.terminate_child(f"thread:{thread_id}")
    registry.forget(thread_id)
    session.subscribed.discard(thread_id)
    return {"thread_id": thread_id}


@method("thread/fork")
async def thread_fork(session: AppServerSession, params: Any) -> dict:
    p = check_params("thread/fork", params, {
        "thread_id": (STR, True), "turn_id": (STR, False), "item_id": (STR, False), "target": (STR, False),
        "mode": (STR, False), "history_page": (ANY, False),
    })
    source = await session.runtime.registry.get(p["thread_id"])
    snapshot = await source.ref.ask(Snapshot(None))
    items = [i for t in snapshot["turns"] for i in t["items"]]
    turns = snapshot["turns"]
    if "turn_id" in p:
        ids = [t["id"] for t in turns]
        if p["turn_id"] not in ids:
            raise TurnNotFound(f"thread {p['thread_id']} has no turn {p['turn_id']}")
        turns = turns[: ids.index(p["turn_id"]) + 1]
        keep = {t["id"] for t in turns}
        items = [i for i in items if i.get("turn_id") in keep]
    if "item_id" in p:
        ids = [i["id"] for i in items]
        if p["item_id"] not in ids:
            raise InvalidParams(f"thread {p['thread_id']} has no item {p['item_id']}")
        items = items[: ids.index(p["item_id"]) + 1]
    if any(t["status"] == "running" for t in turns):
        turns = [t for t in turns if t["status"] != "running"]
        live = {t["id"] for t in turns}
        items = [i for i in items if i.get("turn_id") in live]
    src = source.thread
    now = utc_now()
    new_thread = Thread(id=new_id("thr"), kind="chat", title=(src.title or "") + " (fork)" if src.title else None,
                        cwd=src.cwd, provider=src.provider, model=src.model, effort=src.effort,
                        permission_mode=src.permission_mode, parent_thread_id=src.id, created_at=now,
                        updated_at=now, metadata={"forked_from": src.id})
    turn_map = {t["id"]: new_id("turn") for t in turns}
    if not source.ephemeral:
        def copy(conn: Any) -> None:
            fields = {k: getattr(new_thread, k) for k in ("title", "cwd", "provider", "model", "effort",
                                                          "permission_mode", "parent_thread_id", "metadata")}
            _threads.create_thread(conn, kind="chat", id=new_thread.id, **fields)
            for t in turns:
                _threads.create_turn(conn, new_thread.id, id=turn_map[t["id"]], status=t["status"])
                _threads.update_turn(conn, turn_map[t["id"]], completed_at=t.get("completed_at"),
                                     error=t.get("error"), usage=t.get("usage"))
            for i in items:
                payload = {k: v for k, v in i.items() if k not in ("id", "type", "status", "turn_id", "thread_id", "seq")}
                _items.append_item(conn, new_thread.id, type=i["type"], payload=payload,
                                   text=i.get("text") if i["type"] in ("user_message", "agent_message") else None,
                                   turn_id=turn_map.get(i.get("turn_id")), status=i["status"])

        await session.runtime.store.writer.submit(copy)
        actor = await session.runtime.registry.get(new_thread.id)
    else:
        actor = await session.runtime.registry.create(new_thread, ephemeral=True)
    await session.subscribe(actor)
    forked = await actor.ref.ask(Snapshot(None))
    session.notify("thread/started", {"thread": forked["thread"]})
    return {"thread": forked["thread"], "turns": forked["turns"], "worktree": None}


@method("thread/edit-message")
async def thread_edit_message(session: AppServerSession, params: Any) -> dict:
    p = check_params("thread/edit-message", params, {"thread_id": (STR, True), "turn_id": (STR, True),
                                                     "item_id": (STR, True)})
    raise Unsupported("thread/edit-message is not implemented yet in Roost")
