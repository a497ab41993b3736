"""History rules shared by the adapters, and the tool-call argument accumulator."""

from __future__ import annotations

from typing import Any, Iterable

from roost._json import JSONDecodeError, loads
from roost.engines._types import (
    HistoryItem,
    ToolCall,
    ToolCallEnd,
    ToolResult,
)
from roost.errors import EngineFailure

__all__ = ["INTERRUPTED_OUTPUT", "pair_tool_results", "parse_arguments", "ToolCallBuffer"]

#: Output given to a tool call that has no result in the history (interrupted or lost).
INTERRUPTED_OUTPUT = "error: the tool call was interrupted before it produced a result"


def pair_tool_results(history: Iterable[HistoryItem]) -> list[HistoryItem]:
    """Return ``history`` with every tool call directly followed by its result.

    Providers require each assistant tool call to be answered before anything else. After a run of
    consecutive :class:`ToolCall` items, the results of those calls are placed in call order: the
    real :class:`ToolResult` when the history has one (wherever it is), otherwise an error result
    with :data:`INTERRUPTED_OUTPUT`. Results whose call is not in the history are dropped.

    Args:
        history: items oldest first.

    Returns:
        A new list; the input is not changed.
    """
    items = list(history)
    results: dict[str, ToolResult] = {}
    call_ids = {item.call_id for item in items if isinstance(item, ToolCall)}
    for item in items:
        if isinstance(item, ToolResult) and item.call_id in call_ids:
            results.setdefault(item.call_id, item)
    out: list[HistoryItem] = []
    pending: list[ToolCall] = []

    def flush() -> None:
        for call in pending:
            out.append(results.get(call.call_id) or ToolResult(call.call_id, INTERRUPTED_OUTPUT, True))
        pending.clear()

    for item in items:
        if isinstance(item, ToolCall):
            out.append(item)
            pending.append(item)
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


class ToolCallBuffer:
    """Accumulates one streamed tool call's argument fragments until it ends."""

    __slots__ = ("call_id", "name", "index", "parts", "ended")

    def __init__(self, call_id: str, name: str, index: int) -> None:
        self.call_id = call_id
        self.name = name
        self.index = index
        self.parts: list[str] = []
        self.ended = False

    def end(self, full_text: str | None = None) -> ToolCallEnd:
        """Parse the arguments (``full_text`` overrides the fragments) and return the end event.

        Raises:
            EngineFailure: invalid JSON, see :func:`parse_arguments`.
        """
        self.ended = True
        text = full_text if full_text is not None else "".join(self.parts)
        return ToolCallEnd(self.call_id, self.name, parse_arguments(self.name, text))
