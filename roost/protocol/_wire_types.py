"""Wire-protocol item types of the ``--json`` session queries, the conversion and the envelopes.

Each attrs class below (and in :mod:`roost.protocol._wire_resources`, the other resources' item
types, kept apart so that ``roost sessions --json`` does not create them) is one item type of
``spec/wire-protocol.md`` ("Resource queries"), with the Python field names in snake_case.
:func:`to_wire` unstructures them to the wire's camelCase names (``session_id`` ->
``sessionId``) and never omits a field: a nullable field that is ``None`` is sent as ``null``
(wire-protocol.md: "A field documented as nullable is present with null, not omitted").
Timestamps are ISO 8601 UTC strings, as the store keeps them.

The envelopes (wire-protocol.md, "Resource queries")::

    {"protocolVersion":1,"items":[...]}     many things (an empty result is "items":[])
    {"protocolVersion":1,"item":{...}}      one thing
    {"protocolVersion":1,"error":"..."}     a failure (the command exits with status 1)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import attrs

from roost._json import dumps_line

__all__ = [
    "PROTOCOL_VERSION",
    "to_wire",
    "items_envelope",
    "item_envelope",
    "error_envelope",
    "Session",
    "SessionDetail",
    "AgentMessage",
    "ToolCallSummary",
    "ReplSession",
]

#: wire-protocol.md, "Versioning".
PROTOCOL_VERSION = 1

_CAMEL_RE = re.compile(r"_([a-z0-9])")


def camel(name: str) -> str:
    """Return the camelCase spelling of a snake_case name (``turn_index`` -> ``turnIndex``)."""
    return _CAMEL_RE.sub(lambda m: m.group(1).upper(), name)


@attrs.frozen(kw_only=True)
class ToolCallSummary:
    """``{name, argsSummary, succeeded}`` of one tool call in an AgentMessage."""

    name: str
    args_summary: str
    succeeded: bool


@attrs.frozen(kw_only=True)
class AgentMessage:
    """One message of an orchestration session (SessionDetail, run --bridge ``agent_message``)."""

    agent_name: str
    role: str
    content: str
    turn_index: int
    timestamp: str
    input_tokens: int | None
    output_tokens: int | None
    is_compaction_summary: bool
    tool_calls: list[ToolCallSummary] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class Session:
    """An orchestration session (a Roost thread of kind ``orchestration``)."""

    session_id: str
    task: str
    working_directory: str | None
    config_path: str | None
    started_at: str
    last_updated_at: str
    is_complete: bool
    turn_count: int


@attrs.frozen(kw_only=True)
class SessionDetail:
    """A Session's fields but ``turnCount``, plus its ``messages``."""

    session_id: str
    task: str
    working_directory: str | None
    config_path: str | None
    started_at: str
    last_updated_at: str
    is_complete: bool
    messages: list[AgentMessage] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class ReplSession:
    """A REPL chat (a Roost thread of kind ``chat``)."""

    session_id: str
    model_id: str
    cwd: str
    title: str | None
    auto_title: str | None
    started_at: str
    last_updated_at: str
    turn_index: int
    first_user_message: str


#: attrs class -> its ``(attribute, wire name)`` pairs, in field order (filled on first use).
_WIRE_FIELDS: dict[type, tuple[tuple[str, str], ...]] = {}


def to_wire(value: Any) -> Any:
    """Unstructure an item (or a list of items) to JSON-ready camelCase primitives.

    Every field is present (``None`` as ``null``), under its camelCase name, in field order;
    nested items, lists and dict values are unstructured alike; anything else (``str``, ``int``,
    ``bool``, ``None``) is returned as it is. Hand-written rather than a cattrs converter: these
    types hold nothing else, and ``roost sessions --json`` then starts without importing cattrs
    (issue 19).
    """
    if isinstance(value, list | tuple):
        return [to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: to_wire(v) for k, v in value.items()}
    cls = type(value)
    fields = _WIRE_FIELDS.get(cls)
    if fields is None:
        if not attrs.has(cls):
            return value
        fields = _WIRE_FIELDS[cls] = tuple((a.name, camel(a.name)) for a in attrs.fields(cls))
    return {wire: to_wire(getattr(value, name)) for name, wire in fields}


def items_envelope(items: Iterable[Any]) -> bytes:
    """Return the ``{"protocolVersion":1,"items":[...]}`` line (with its newline)."""
    return dumps_line({"protocolVersion": PROTOCOL_VERSION, "items": [to_wire(i) for i in items]})


def item_envelope(item: Any) -> bytes:
    """Return the ``{"protocolVersion":1,"item":{...}}`` line (with its newline)."""
    return dumps_line({"protocolVersion": PROTOCOL_VERSION, "item": to_wire(item)})


def error_envelope(message: str) -> bytes:
    """Return the ``{"protocolVersion":1,"error":"..."}`` line (with its newline)."""
    return dumps_line({"protocolVersion": PROTOCOL_VERSION, "error": message})
