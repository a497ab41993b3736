"""Prompts of a stdio chat: ``approval_request`` and ``question``, and the ``ask_user`` tool.

wire-protocol.md, "Prompts": there are no request ids, a response is simply the next matching line
on stdin (``approval_response`` / ``question_response``). So :class:`PromptBroker` keeps at most one
prompt outstanding at a time (others wait their turn, FIFO), and routes the next matching input
line to it. An ``approval_response`` whose ``approved`` is not a JSON boolean counts as denied.

``ask_user`` (:func:`ask_user_tool`) is a model-facing tool offered only when the client spawned
Roost with ``FUSERAFT_VSCODE_QUESTIONS=1`` (or ``ROOST_VSCODE_QUESTIONS=1``): it sends ``question
{question, options, allowOther}`` and returns the ``question_response`` answer to the model.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import attrs
import trio

from roost.tools import Tool, ToolContext, ToolResult

__all__ = ["PromptBroker", "ask_user_tool", "questions_enabled", "QUESTIONS_ENV"]

#: The environment variables that enable questions (wire-protocol.md, "Prompts"); either spelling.
QUESTIONS_ENV = ("FUSERAFT_VSCODE_QUESTIONS", "ROOST_VSCODE_QUESTIONS")
#: Fields of the thread's approval params that are Roost's routing, not the kind's wire fields.
_ROUTING = frozenset({"thread_id", "turn_id", "item_id", "kind"})


def questions_enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether ``FUSERAFT_VSCODE_QUESTIONS`` or ``ROOST_VSCODE_QUESTIONS`` is ``1`` (or true)."""
    env = os.environ if environ is None else environ
    return any((env.get(name) or "").strip().lower() in ("1", "true", "yes") for name in QUESTIONS_ENV)


class PromptBroker:
    """One outstanding prompt at a time; the next matching input line answers it.

    Args:
        emit: writes one event dict to the client (must not block).
        before_prompt: called with the tool call's ``item_id`` just before its
            ``approval_request`` or ``question`` is sent (the session announces the pending
            ``tool_call`` with it, so a client sees the call first, then what it asks).
    """

    def __init__(self, emit: Callable[[dict], None], *, before_prompt: Callable[[Any], None] | None = None) -> None:
        self._emit = emit
        self._before_prompt = before_prompt
        self._lock = trio.StrictFIFOLock()
        self._pending: tuple[str, trio.MemorySendChannel[Any]] | None = None
        self.closed = False

    @property
    def pending_kind(self) -> str | None:
        """``"approval"``, ``"question"`` or None: what the next response line would answer."""
        return self._pending[0] if self._pending is not None else None

    async def _ask(self, kind: str, event: dict, before: Callable[[], None] | None = None) -> Any:
        async with self._lock:
            if self.closed:
                return None
            send, receive = trio.open_memory_channel[Any](1)
            self._pending = (kind, send)
            try:
                if before is not None:
                    before()
                self._emit(event)
                return await receive.receive()
            finally:
                self._pending = None

    async def request_approval(self, params: dict) -> bool | None:
        """Send ``approval_request`` (kind plus its fields) and wait for ``approval_response``.

        Args:
            params: the thread's approval params ``{thread_id, turn_id, item_id, kind, ...fields}``.

        Returns:
            True approved, False denied (also for a malformed response); None when the chat is
            closing (nobody to ask: the unattended policy decides).

        Cancellation: cancelled while waiting (the turn was interrupted), nothing is left pending.
        """
        event = {
            "type": "approval_request",
            "kind": params.get("kind"),
            **{k: v for k, v in params.items() if k not in _ROUTING},
        }
        answer = await self._ask("approval", event, self._announcer(params.get("item_id")))
        return None if answer is None else answer is True

    def _announcer(self, item_id: Any) -> Callable[[], None] | None:
        hook = self._before_prompt
        if hook is None or item_id is None:
            return None
        return lambda: hook(item_id)

    async def ask_question(
        self, question: str, options: list[str], allow_other: bool, *, item_id: str | None = None
    ) -> str | None:
        """Send ``question`` and wait for ``question_response``; return the answer (None = skipped).

        ``item_id``: the asking ``ask_user`` call; its ``tool_call`` is announced first.

        Cancellation: cancelled while waiting, nothing is left pending.
        """
        event = {"type": "question", "question": question, "options": list(options), "allowOther": allow_other}
        answer = await self._ask("question", event, self._announcer(item_id))
        return answer if isinstance(answer, str) else None

    async def ask(self, params: dict) -> str | None:
        """``Origin.ask_question`` of the chat's turns (``params``: ``{thread_id, turn_id, item_id,
        question, options, allowOther}``): :meth:`ask_question`, after the call's ``tool_call``."""
        return await self.ask_question(
            str(params.get("question") or ""),
            [str(o) for o in params.get("options") or []],
            params.get("allowOther") is not False,
            item_id=params.get("item_id"),
        )

    def answer(self, frame: dict) -> bool:
        """Route an ``approval_response`` / ``question_response`` line to the pending prompt.

        Returns:
            True when it answered the pending prompt of its kind; False when none was pending.
        """
        kind = "approval" if frame.get("type") == "approval_response" else "question"
        if self._pending is None or self._pending[0] != kind:
            return False
        send = self._pending[1]
        if kind == "approval":
            value: Any = frame.get("approved") is True  # anything malformed counts as denied
        else:
            value = frame.get("answer")
            if not isinstance(value, str):
                value = _SKIPPED  # null skips; anything malformed counts as skipped too
        try:
            send.send_nowait(value)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        self._pending = None
        return True

    def close(self) -> None:
        """The chat is ending: a pending prompt gets no answer (None); later prompts none either."""
        self.closed = True
        if self._pending is not None:
            try:
                self._pending[1].send_nowait(None)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass


#: The answer of a skipped question (``question_response`` with ``answer: null``).
_SKIPPED = object()


def ask_user_tool(broker: PromptBroker) -> Tool:
    """The ``ask_user`` tool (:func:`roost.tools.ask_user_tool`) asking through ``broker``.

    Turns started with an ``Origin`` whose ``ask_question`` is :meth:`PromptBroker.ask` (the
    chat's) ask through it, so the call's ``tool_call`` precedes its ``question``; ``broker`` is
    the fallback of a turn whose origin cannot ask.
    """
    from roost.tools import ask_user_tool as tool

    fixed = tool(broker.ask_question)
    via_origin = tool()

    async def run(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await (via_origin if ctx.ask_question is not None else fixed).run(args, ctx)

    return attrs.evolve(fixed, run=run)
