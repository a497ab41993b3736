"""``roost sessions``: orchestration sessions and REPL chats (wire-protocol.md Session, ReplSession).

Roost keeps both as threads: orchestration sessions are threads of kind ``orchestration``, REPL
chats threads of kind ``chat``. A session's fields come from the thread row and its metadata:

* ``task``: ``metadata["task"]`` (else the first user message), first line, at most 120 characters;
* ``configPath``: ``metadata["config_path"]``; ``workingDirectory``: the thread's ``cwd``;
* ``isComplete``: ``metadata["is_complete"]`` when set, else whether the thread's latest run
  ended ``completed``;
* ``autoTitle`` (chats): ``metadata["auto_title"]``.
"""

from __future__ import annotations

import os
from typing import Any

import click

from roost._json import dumps
from roost.cli._res_common import emit_item, emit_items, fail, json_option, open_cli_store
from roost.errors import NotFound, RoostError
from roost.protocol import AgentMessage, ReplSession, Session, SessionDetail, ToolCallSummary
from roost.storage import count_turns, first_user_text, latest_run_status

__all__ = ["sessions_command", "session_rows", "repl_rows", "session_detail"]

_TASK_CHARS = 120
_PREVIEW_CHARS = 500
_ARGS_SUMMARY_CHARS = 120


def _first_user_text(conn: Any, thread_id: str) -> str:
    return first_user_text(conn, thread_id)


def _task_of(conn: Any, thread: Any) -> str:
    task = (thread.metadata or {}).get("task")
    text = task if isinstance(task, str) else _first_user_text(conn, thread.id)
    lines = text.strip().splitlines()
    return (lines[0] if lines else "")[:_TASK_CHARS]


def _is_complete(conn: Any, thread: Any) -> bool:
    flag = (thread.metadata or {}).get("is_complete")
    if flag is not None:
        return bool(flag)
    return latest_run_status(conn, thread.id) == "completed"


def _turn_count(conn: Any, thread_id: str) -> int:
    return count_turns(conn, thread_id)


def _in_project(directory: str | None, project: str | None) -> bool:
    if project is None:
        return True
    if not directory:
        return False
    d = os.path.normpath(directory)
    return d == project or d.startswith(project.rstrip(os.sep) + os.sep)


#: Most threads one listing reads.
_MAX_THREADS = 100_000


def _threads(conn: Any, kind: str) -> list[Any]:
    from roost.storage import list_threads

    return list_threads(conn, archived=None, kind=kind, limit=_MAX_THREADS)


def session_rows(conn: Any, *, include_complete: bool, project: str | None) -> list[Session]:
    """Return orchestration sessions, most recently updated first (read-only)."""
    out = []
    for thread in _threads(conn, "orchestration"):
        if not _in_project(thread.cwd, project):
            continue
        complete = _is_complete(conn, thread)
        if complete and not include_complete:
            continue
        out.append(
            Session(
                session_id=thread.id,
                task=_task_of(conn, thread),
                working_directory=thread.cwd,
                config_path=(thread.metadata or {}).get("config_path"),
                started_at=thread.created_at,
                last_updated_at=thread.updated_at,
                is_complete=complete,
                turn_count=_turn_count(conn, thread.id),
            )
        )
    return out


def repl_rows(conn: Any, *, project: str | None) -> list[ReplSession]:
    """Return REPL chats (threads of kind ``chat``), newest first (read-only)."""
    out = []
    rows = sorted(_threads(conn, "chat"), key=lambda t: (t.created_at, t.id), reverse=True)
    for thread in rows:
        if not _in_project(thread.cwd, project):
            continue
        meta = thread.metadata or {}
        out.append(
            ReplSession(
                session_id=thread.id,
                model_id=_model_id(thread),
                cwd=thread.cwd or "",
                title=thread.title,
                auto_title=meta.get("auto_title"),
                started_at=thread.created_at,
                last_updated_at=thread.updated_at,
                turn_index=_turn_count(conn, thread.id),
                first_user_message=_first_user_text(conn, thread.id)[:_PREVIEW_CHARS],
            )
        )
    return out


def _args_summary(arguments: Any) -> str:
    if isinstance(arguments, dict) and len(arguments) == 1:
        (value,) = arguments.values()
        text = value if isinstance(value, str) else dumps(value).decode()
    else:
        text = dumps(arguments if arguments is not None else {}).decode()
    text = " ".join(text.split())
    return text if len(text) <= _ARGS_SUMMARY_CHARS else text[: _ARGS_SUMMARY_CHARS - 1] + "…"


def session_detail(conn: Any, session_id: str) -> SessionDetail:
    """Return one orchestration session with its messages (read-only).

    Messages: each user message (agent ``Human``, or ``Orchestrator`` for an injected correction,
    role ``user``), each agent message (role ``assistant``, the agent from the item or
    ``Assistant``), each compaction summary. A turn's tool calls go to the agent message that
    follows them (the turn's last one when none follows); the turn's token usage to its last
    agent message (null on the others).

    Raises:
        NotFound: no orchestration session has this id.
    """
    from roost.storage import get_thread, list_items, list_turns

    thread = get_thread(conn, session_id)
    if thread.kind != "orchestration":
        raise NotFound(f"{session_id!r} is not an orchestration session")
    turns = list_turns(conn, thread.id)
    turn_index: dict[str | None, int] = {t.id: i for i, t in enumerate(turns)}
    usage: dict[str | None, dict[str, Any] | None] = {
        t.id: t.usage if isinstance(t.usage, dict) else None for t in turns
    }
    messages: list[dict[str, Any]] = []
    pending: dict[str | None, list[ToolCallSummary]] = {}
    last_agent: dict[str | None, dict[str, Any]] = {}
    for item in list_items(conn, thread.id):
        p = item.payload if isinstance(item.payload, dict) else {}
        index = turn_index.get(item.turn_id, max(len(turns) - 1, 0))
        if item.type == "tool_call":
            ok = p.get("output") is not None and not p.get("is_error") and item.status == "completed"
            pending.setdefault(item.turn_id, []).append(
                ToolCallSummary(
                    name=str(p.get("name") or ""), args_summary=_args_summary(p.get("arguments")), succeeded=bool(ok)
                )
            )
            continue
        if item.type == "user_message":
            synthetic = str(p.get("source_id") or "").startswith("roost:")
            agent = p.get("agent") or ("Orchestrator" if synthetic else "Human")
            role = "user"
        elif item.type in ("agent_message", "compaction"):
            agent, role = p.get("agent") or p.get("agent_name") or "Assistant", "assistant"
        else:
            continue
        msg: dict[str, Any] = {
            "agent_name": str(agent),
            "role": role,
            "content": item.text or p.get("text") or p.get("summary") or "",
            "turn_index": index,
            "timestamp": item.created_at,
            "input_tokens": None,
            "output_tokens": None,
            "is_compaction_summary": item.type == "compaction",
            "tool_calls": [],
        }
        if role == "assistant":
            msg["tool_calls"] = pending.pop(item.turn_id, [])
            last_agent[item.turn_id] = msg
        messages.append(msg)
    for turn_id, calls in pending.items():
        if turn_id in last_agent:
            last_agent[turn_id]["tool_calls"].extend(calls)
    for turn_id, msg in last_agent.items():
        u = usage.get(turn_id) or {}
        if u:
            msg["input_tokens"] = u.get("input_tokens")
            msg["output_tokens"] = u.get("output_tokens")
    return SessionDetail(
        session_id=thread.id,
        task=_task_of(conn, thread),
        working_directory=thread.cwd,
        config_path=(thread.metadata or {}).get("config_path"),
        started_at=thread.created_at,
        last_updated_at=thread.updated_at,
        is_complete=_is_complete(conn, thread),
        messages=[AgentMessage(**m) for m in messages],
    )


@click.command("sessions", short_help="List, show or delete orchestration sessions (or list chats).")
@json_option
@click.option("--all", "include_all", is_flag=True, help="Include completed sessions.")
@click.option(
    "--project", type=click.Path(), default=None, help="Only sessions that ran in this directory (or below it)."
)
@click.option("--show", "show_id", metavar="ID", default=None, help="Show one session with its messages.")
@click.option("--repl", "repl", is_flag=True, help="List REPL chats instead, newest first.")
@click.option("--delete", "delete_id", metavar="ID", default=None, help="Delete a session (and its turns and items).")
@click.option("--prune", is_flag=True, help="Delete every completed orchestration session (--project narrows it).")
@click.option(
    "--cleanup",
    is_flag=True,
    help="Delete incomplete orchestration sessions that never recorded a turn and no live "
    "process holds (left by runs that failed before starting; --project narrows it).",
)
def sessions_command(
    as_json: bool,
    include_all: bool,
    project: str | None,
    show_id: str | None,
    repl: bool,
    delete_id: str | None,
    prune: bool,
    cleanup: bool,
) -> None:
    """List orchestration sessions (incomplete ones unless --all), or show, list chats, delete.

    --json prints one wire-protocol line: Session items, a SessionDetail item (--show), or
    ReplSession items (--repl). --delete, --prune and --cleanup report by exit status (and a
    line saying how many were deleted) and cannot be combined with --json.

    Exit status: 0 on success; 1 on failure (an unknown or malformed id; with --json an error
    envelope on stdout); 2 for a usage error, or without --json an unusable ROOST_HOME or
    database (with --json: exit 1 and an error envelope, as the wire protocol fixes).
    """
    project_dir = os.path.abspath(project) if project else None
    for flag, given in (("--prune", prune), ("--cleanup", cleanup), ("--delete", delete_id is not None)):
        if given and as_json:
            fail("sessions", f"--json can't be combined with {flag}", as_json=True)
    if delete_id is not None:
        _delete(delete_id)
        return
    if prune or cleanup:
        _sweep(project_dir, prune=prune, cleanup=cleanup)
        return
    try:
        with open_cli_store("sessions", as_json=as_json) as store, store.read() as conn:
            if show_id is not None:
                if not show_id.strip() or any(c.isspace() or ord(c) < 32 for c in show_id):
                    fail("sessions", f"malformed session id {show_id!r}", as_json=as_json)
                try:
                    detail = session_detail(conn, show_id)
                except NotFound:
                    fail("sessions", f"no session with id {show_id!r}", as_json=as_json)
                if as_json:
                    emit_item(detail)
                else:
                    _print_detail(detail)
                return
            rows: list[Any] = (
                repl_rows(conn, project=project_dir)
                if repl
                else session_rows(conn, include_complete=include_all, project=project_dir)
            )
            hint = "" if as_json or rows or repl else _empty_hint(conn, include_all=include_all, project=project_dir)
    except RoostError as exc:
        fail("sessions", str(exc), as_json=as_json)
    if as_json:
        emit_items(rows)
        return
    if not rows:
        click.echo("no chats" if repl else f"no sessions{hint}")
    for row in rows:
        if repl:
            label = row.title or row.auto_title or row.first_user_message[:60]
            click.echo(f"{row.session_id}  {row.last_updated_at}  {label}")
        else:
            state = "complete" if row.is_complete else "incomplete"
            click.echo(f"{row.session_id}  {row.last_updated_at}  {state:10}  {row.task}")


def _empty_hint(conn: Any, *, include_all: bool, project: str | None) -> str:
    """What an empty ``roost sessions`` (text) adds: where the other threads are listed. Sessions
    are orchestration runs and daemon tasks (wire-protocol.md, Session); the threads of ``roost
    exec``, ``app-server`` and ``repl`` are chats (``--repl``), and completed sessions need ``--all``."""
    notes = []
    if not include_all:
        done = len(session_rows(conn, include_complete=True, project=project))
        if done:
            notes.append(f"{done} completed: roost sessions --all")
    chats = sum(1 for t in _threads(conn, "chat") if _in_project(t.cwd, project))
    if chats:
        notes.append(f"{chats} chat{'s' if chats != 1 else ''} (roost exec, app-server, repl): roost sessions --repl")
    if not notes:
        return " (orchestration runs and daemon tasks; chats of roost exec, app-server and repl: --repl)"
    return f" (orchestration runs and daemon tasks); {'; '.join(notes)}"


def _delete(session_id: str) -> None:
    from roost.storage import delete_thread, get_thread

    try:
        with open_cli_store("sessions", as_json=False) as store, store.transaction() as conn:
            thread = get_thread(conn, session_id)
            if thread.kind == "worker":
                raise NotFound(f"no session with id {session_id!r}")
            delete_thread(conn, session_id)
    except NotFound:
        fail("sessions", f"no session with id {session_id!r}", as_json=False)
    except RoostError as exc:
        fail("sessions", str(exc), as_json=False)


def _sweep(project: str | None, *, prune: bool, cleanup: bool) -> None:
    """``--prune`` (completed sessions) and ``--cleanup`` (incomplete ones with no turn and no live
    lease holder), in one write transaction; prints how many were deleted."""
    from roost.storage import delete_thread, get_lease, thread_lease_key
    from roost.storage.leases import live_elsewhere

    pruned = cleaned = 0
    try:
        with open_cli_store("sessions", as_json=False) as store, store.transaction() as conn:
            for thread in _threads(conn, "orchestration"):
                if not _in_project(thread.cwd, project):
                    continue
                complete = _is_complete(conn, thread)
                if prune and complete:
                    delete_thread(conn, thread.id)
                    pruned += 1
                elif (
                    cleanup
                    and not complete
                    and _turn_count(conn, thread.id) == 0
                    and not live_elsewhere(get_lease(conn, thread_lease_key(thread.id)), owner="roost-cli")
                ):
                    delete_thread(conn, thread.id)
                    cleaned += 1
    except RoostError as exc:
        fail("sessions", str(exc), as_json=False)
    if prune:
        click.echo(f"pruned {pruned} completed session{'s' if pruned != 1 else ''}")
    if cleanup:
        click.echo(f"cleaned up {cleaned} empty session{'s' if cleaned != 1 else ''}")


def _print_detail(detail: SessionDetail) -> None:
    click.echo(f"session {detail.session_id}  ({'complete' if detail.is_complete else 'incomplete'})")
    click.echo(f"task: {detail.task}")
    for m in detail.messages:
        click.echo(f"\n[{m.turn_index}] {m.agent_name} ({m.role}):")
        for call in m.tool_calls:
            click.echo(f"  $ {call.name} {call.args_summary} {'ok' if call.succeeded else 'failed'}")
        click.echo(m.content)


def _model_id(thread: Any) -> str:
    """A chat's ``modelId``, never empty: its model, else its provider (what ``ready``'s ``model``
    names for a provider without model ids, e.g. ``scripted``), else ``default``."""
    return thread.model or thread.provider or "default"
