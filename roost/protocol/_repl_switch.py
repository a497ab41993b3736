"""``/switch ID`` and ``/fork [switch]`` of ``roost repl --vscode`` (wire-protocol.md "Turn events":
``title`` names the session the process now runs as).

``/switch ID`` moves the process onto chat ``ID``: the session subscribes to that chat's thread
actor, leaves the old one, sends ``title`` (its ``sessionId`` is ``ID``) and ``replay`` (its
earlier turns). ``/fork`` copies the chat's settled turns and items into a new chat (as the
app-server's ``thread/fork`` does, with its helpers) and says so with ``info``; ``/fork switch``
then switches to the copy.
"""

from __future__ import annotations

import logging
from typing import Any

from roost.errors import RoostError
from roost.protocol._repl_events import ChatTranslator, replay_event

log = logging.getLogger("roost.repl")

__all__ = ["switch_chat", "fork_chat"]


async def switch_chat(session: Any, target: str) -> bool:
    """Run the chat ``target`` in ``session`` (a :class:`~roost.protocol._repl.ReplSession`).

    Returns False (after an ``error`` event) when ``target`` is empty, the current chat, unknown
    or not a chat.
    """
    from roost.actors import Snapshot, Subscribe, Unsubscribe

    if not target:
        session.emit({"type": "error", "text": "usage: /switch <session id>"})
        return False
    if session.registry is None:
        session.emit({"type": "error", "text": "/switch is not available here"})
        return False
    if target == session.actor.thread_id:
        session.emit({"type": "error", "text": f"already running as {target}"})
        return False
    try:
        actor = await session.registry.get(target)
    except RoostError:
        session.emit({"type": "error", "text": f"no chat with id {target!r}"})
        return False
    kind = actor.facts().thread.kind
    if kind != "chat":
        session.emit({"type": "error", "text": f"{target} is a {kind} thread, not a chat"})
        return False
    snapshot = await actor.ref.ask(Snapshot())
    await actor.ref.ask(Subscribe(session))
    try:
        await session.actor.ref.ask(Unsubscribe(session), timeout=5)
    except RoostError:
        log.debug("the previous chat's actor did not take the unsubscribe", exc_info=True)
    session.actor = actor
    session.translator = ChatTranslator(cwd=actor.facts().cwd, turn_index=len(snapshot["turns"]))
    session.first_prompt = None if not snapshot["turns"] else ""  # no auto-title for an older chat
    session.emit(session.title_event())
    session.emit(replay_event(snapshot))
    return True


async def fork_chat(session: Any, arg: str) -> str | None:
    """Copy the chat into a new one; with ``arg == "switch"`` continue in it. Returns the new
    chat's id, or None (after an ``error`` event) for a bad argument or a failed copy."""
    from roost.actors import Snapshot
    from roost.protocol._as_threads import _copy_history, _cut, _fork_thread
    from roost.storage import new_id

    if arg not in ("", "switch"):
        session.emit({"type": "error", "text": "usage: /fork [switch]"})
        return None
    if session.registry is None:
        session.emit({"type": "error", "text": "/fork is not available here"})
        return None
    src = session.actor.facts().thread
    try:
        snapshot = await session.actor.ref.ask(Snapshot())
        turns, items = _cut(snapshot, src.id, None, None)
        thread, _ = _fork_thread(src, turns, None)  # the same row as thread/fork's
        turn_map = {t["id"]: new_id("turn") for t in turns}
        item_map = {i["id"]: new_id("item") for i in items}
        await session.registry.services.store.writer.submit(_copy_history, thread, turns, items, turn_map, item_map)
    except RoostError as exc:
        session.emit({"type": "error", "text": f"could not fork the chat: {exc}"})
        return None
    session.emit({"type": "info", "text": f"Forked this chat as {thread.id}."})
    if arg == "switch" and not await switch_chat(session, thread.id):
        return None
    return thread.id
