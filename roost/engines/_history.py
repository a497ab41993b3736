"""History rules shared by the adapters, and the tool-call argument accumulator."""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any

from roost._json import JSONDecodeError, dumps, loads
from roost.engines._types import (
    HistoryItem,
    ToolCall,
    ToolCallEnd,
    ToolResult,
)
from roost.errors import EngineFailure

__all__ = [
    "INTERRUPTED_OUTPUT",
    "pair_tool_results",
    "parse_arguments",
    "arguments_text",
    "ToolCallBuffer",
    "CallIds",
    "new_call_id",
]

#: Output given to a tool call that has no result in the history (interrupted or lost).
INTERRUPTED_OUTPUT = "error: the tool call was interrupted before it produced a result"


def pair_tool_results(history: Iterable[HistoryItem]) -> list[HistoryItem]:
    """Return ``history`` with every tool call directly followed by its own result.

    Providers require each assistant tool call to be answered before anything else. After a run of
    consecutive :class:`ToolCall` items, the results of those calls are placed in call order: the
    call's real :class:`ToolResult` when the history has one (the first unused result with its id
    after the call, else anywhere), otherwise an error result with :data:`INTERRUPTED_OUTPUT`.
    Results whose call is not in the history are dropped.

    A call id that repeats (history stored before ids were made unique, issue 14 case 2) is
    renamed ``<id>_dup<n>`` in the later call and in the result paired with it, so every call on the
    wire has an id of its own.

    Args:
        history: items oldest first.

    Returns:
        A new list; the input is not changed.
    """
    items = list(history)
    kinds = set(map(type, items))
    if ToolCall not in kinds and ToolResult not in kinds:
        return items  # nothing to pair (most turns of a chat)
    by_id: dict[str, list[int]] = {}
    for pos, item in enumerate(items):
        if isinstance(item, ToolResult):
            by_id.setdefault(item.call_id, []).append(pos)
    used: set[int] = set()
    seen: dict[str, int] = {}
    out: list[HistoryItem] = []
    pending: list[tuple[ToolCall, ToolResult | None]] = []

    def own_result(pos: int, call: ToolCall) -> ToolResult | None:
        positions = by_id.get(call.call_id, ())
        for candidate in [p for p in positions if p > pos] + [p for p in positions if p < pos]:
            if candidate not in used:
                used.add(candidate)
                result = items[candidate]
                assert isinstance(result, ToolResult)
                return result
        return None

    def flush() -> None:
        for call, result in pending:
            if result is None:
                out.append(ToolResult(call.call_id, INTERRUPTED_OUTPUT, True))
            else:
                out.append(ToolResult(call.call_id, result.output, result.is_error))
        pending.clear()

    for pos, item in enumerate(items):
        if isinstance(item, ToolCall):
            result = own_result(pos, item)
            count = seen.get(item.call_id, 0)
            seen[item.call_id] = count + 1
            call = item if count == 0 else ToolCall(f"{item.call_id}_dup{count + 1}", item.name, item.arguments)
            out.append(call)
            pending.append((call, result))
            continue
        flush()
        if isinstance(item, ToolResult):
            continue
        out.append(item)
    flush()
    return out


def parse_arguments(name: str, text: str) -> dict[str, Any]:
    """Parse a tool call's complete argument text.

    Args:
        name: the tool's name (for the error message).
        text: the concatenated argument fragments; ``""`` (or whitespace) means ``{}``.

    Returns:
        The JSON object.

    Raises:
        EngineFailure: (category ``provider``) the text is not a JSON object; the message names
            the tool. A call is never reported with ``{}`` in place of invalid arguments.
    """
    if not text.strip():
        return {}
    try:
        value = loads(text)
    except JSONDecodeError as exc:
        raise EngineFailure(
            f"tool call {name!r}: the model sent invalid JSON arguments ({exc}): {text[:200]!r}",
            category="provider",
            provider_code="invalid_tool_arguments",
        ) from exc
    if not isinstance(value, dict):
        raise EngineFailure(
            f"tool call {name!r}: arguments must be a JSON object, got {type(value).__name__}",
            category="provider",
            provider_code="invalid_tool_arguments",
        )
    return value


def arguments_text(value: Any) -> str:
    """A streamed ``arguments`` value as JSON text.

    Providers send a string (a fragment of JSON); some proxies send the whole object instead
    (issue 14, case 3), which is encoded here. ``None`` is ``""``.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return dumps(value).decode()


def new_call_id(prefix: str = "call") -> str:
    """A fresh tool-call id Roost made itself: ``<prefix>_roost_<24 hex digits>`` (96 random bits),
    so it never repeats within a thread (or across threads)."""
    return f"{prefix}_roost_{secrets.token_hex(12)}"


class CallIds:
    """Assigns each streamed tool call an id unique within the thread.

    The server's id is kept when it is new (it is what the provider expects back on the wire);
    a missing id, or one the history or this response already uses (servers that number their
    calls ``call_0``, ``call_1`` in every round), is replaced by :func:`new_call_id`, so each tool
    result is paired with its own call when the history goes back to the model (issue 14, case 2).

    Args:
        history: the request's history; its tool calls' ids are taken.
        prefix: the prefix of Roost's own ids (``toolu`` for Anthropic, ``call`` otherwise).
    """

    __slots__ = ("taken", "prefix")

    def __init__(self, history: Iterable[HistoryItem] = (), prefix: str = "call") -> None:
        self.taken = {item.call_id for item in history if isinstance(item, ToolCall)}
        self.prefix = prefix

    def assign(self, server_id: Any) -> str:
        """Return the id to use for a call the server named ``server_id`` (maybe ``None``/``""``)."""
        if isinstance(server_id, str) and server_id and server_id not in self.taken:
            call_id = server_id
        else:
            call_id = new_call_id(self.prefix)
        self.taken.add(call_id)
        return call_id


class ToolCallBuffer:
    """Accumulates one streamed tool call's argument fragments until it ends."""

    __slots__ = ("call_id", "name", "index", "parts", "ended", "server_id", "initial")

    def __init__(self, call_id: str, name: str, index: int, *, server_id: str | None = None) -> None:
        self.call_id = call_id
        self.name = name
        self.index = index
        self.parts: list[str] = []
        self.ended = False
        #: the id the server gave the call ("" or None when it gave none)
        self.server_id = server_id
        #: arguments given whole at the start of the call (Anthropic-compatible gateways that
        #: send the input in ``content_block_start`` and no ``input_json_delta``)
        self.initial: str = ""

    def end(self, full_text: str | None = None) -> ToolCallEnd:
        """Parse the arguments (``full_text`` overrides the fragments) and return the end event.

        Raises:
            EngineFailure: invalid JSON, see :func:`parse_arguments`.
        """
        self.ended = True
        text = full_text if full_text is not None else "".join(self.parts)
        if not text.strip() and self.initial:
            text = self.initial
        return ToolCallEnd(self.call_id, self.name, parse_arguments(self.name, text))
