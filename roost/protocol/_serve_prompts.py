"""Prompts of the serve daemon: an ``approval_request`` or a ``question`` asked of a task's client.

wire-protocol.md, "Prompts" and "Daemon events (serve socket)": a prompt goes only to the client
that dispatched the task, to its newest live connection. When that connection drops, the daemon
waits ``--reconnect-grace`` seconds for the next connection with the same client id and asks it
instead; a client without an id (or nobody back within the grace) cannot answer, and the
unattended rules apply: an approval is decided by ``--unattended-policy``, a question is skipped
(the ``ask_user`` tool tells the model the question was skipped). There are no request ids, so a client
has at most one prompt outstanding (its ``approval_lock``); the next matching response line
(``approval_response`` / ``question_response``) answers it.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import trio

__all__ = ["Pending", "prompt_client", "question_event", "answer_value"]

log = logging.getLogger("roost.serve")


@attrs.define(eq=False)
class Pending:
    """A prompt waiting for its client (``kind``: ``"approval"`` or ``"question"``)."""

    event: dict
    kind: str = "approval"
    asked: Any = None  # the connection last asked
    answer: Any = None
    done: bool = False


def question_event(session_id: str, params: dict) -> dict:
    """The serve ``question`` event of an ``ask_user`` call: ``{question, options, allowOther}``
    (wire-protocol.md "Prompts") plus ``sessionId``, like the daemon's ``approval_request``."""
    return {
        "type": "question",
        "question": str(params.get("question") or ""),
        "options": [str(o) for o in params.get("options") or []],
        "allowOther": bool(params.get("allowOther", True)),
        "sessionId": session_id,
    }


def answer_value(kind: str, message: dict) -> Any:
    """The answer a response line carries: an approval is True only for ``approved: true``
    (anything malformed counts as denied); a question's is its string ``answer``, else None
    (``null`` skips; anything malformed counts as skipped too)."""
    if kind == "approval":
        return message.get("approved") is True
    answer = message.get("answer")
    return answer if isinstance(answer, str) else None


async def prompt_client(client: Any, event: dict, kind: str, *, grace: float, task_id: str) -> Any:
    """Ask ``event`` of ``client`` (see the module doc) and return its answer.

    Args:
        client: the task's :class:`~roost.protocol._serve_daemon.ClientState`.
        event: the prompt event sent to the client's live connection (again to each new one).
        kind: ``"approval"`` or ``"question"`` (which response line answers it).
        grace: seconds to wait for a connection of the client once none is live (``--reconnect-grace``).
        task_id: the task asking (for the log).

    Returns:
        The answer (see :func:`answer_value`), or None when nobody could answer.

    Cancellation: cancelled while waiting (the task was interrupted), nothing is left pending.
    """
    async with client.approval_lock:
        pending = client.pending = Pending(event=event, kind=kind)
        deadline: float | None = None
        try:
            while not pending.done:
                conn = client.live()
                if conn is None:
                    if client.anonymous:
                        return None
                    if deadline is None:
                        deadline = trio.current_time() + grace
                    if trio.current_time() >= deadline:
                        log.info("task %s: no client back within the grace; unattended rules", task_id)
                        return None
                    changed = client.changed
                    with trio.move_on_at(deadline):
                        await changed.wait()
                    continue
                deadline = None
                if pending.asked is not conn:
                    pending.asked = conn
                    conn.send(pending.event)
                await client.changed.wait()
            return pending.answer
        finally:
            client.pending = None
