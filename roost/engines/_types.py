"""Normalized engine types: the request every engine takes and the events every engine streams.

A request is provider-neutral (system prompt, history items, tool schemas, selection); each adapter
maps it to its provider's wire format. Events are the union :data:`EngineEvent`; failures are not
events but :class:`roost.errors.EngineFailure` raised by the stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeAlias, runtime_checkable

import attrs

__all__ = [
    "Image",
    "Document",
    "DOCUMENT_TYPES",
    "UserMessage",
    "AgentMessage",
    "Reasoning",
    "ToolCall",
    "ToolResult",
    "HistoryItem",
    "ToolSchema",
    "EngineRequest",
    "TextDelta",
    "ReasoningDelta",
    "ReasoningItems",
    "ToolCallStart",
    "ToolCallDelta",
    "ToolCallEnd",
    "Usage",
    "Finish",
    "Retrying",
    "EngineEvent",
    "FINISH_REASONS",
    "ModelInfo",
    "Engine",
]


def _as_tuple(values: Any) -> tuple[Any, ...]:
    """``tuple(values)``; a Python function, not the builtin, because attrs inspects a converter's
    signature and ``inspect.signature(tuple)`` costs a one-off tokenizer regex compile at import."""
    return tuple(values)


# -- history ------------------------------------------------------------------------------------


@attrs.frozen
class Image:
    """An image attached to a user message.

    Attributes:
        media_type: MIME type, e.g. ``"image/png"``.
        data: the image bytes, base64-encoded (standard alphabet, no line breaks).
    """

    media_type: str
    data: str

    def data_url(self) -> str:
        """Return the image as an RFC 2397 ``data:`` URL."""
        return f"data:{self.media_type};base64,{self.data}"


#: Media types of :class:`Document` attachments the HTTP adapters send to their providers.
DOCUMENT_TYPES = frozenset({"application/pdf"})


@attrs.frozen
class Document:
    """A file attached to a user message that the provider reads itself (a PDF).

    Each adapter sends it in its provider's documented form: Anthropic Messages a ``document``
    block with a base64 source, OpenAI Responses an ``input_file`` with ``file_data``, Chat
    Completions a ``file`` content part with ``file_data`` (both as an RFC 2397 data URL).

    Attributes:
        media_type: one of :data:`DOCUMENT_TYPES`.
        data: the file's bytes, base64-encoded (standard alphabet, no line breaks).
        filename: the file's name as the client gave it, or None.
    """

    media_type: str
    data: str
    filename: str | None = None

    def data_url(self) -> str:
        """Return the file as an RFC 2397 ``data:`` URL."""
        return f"data:{self.media_type};base64,{self.data}"

    @property
    def name(self) -> str:
        """``filename``, or ``document.pdf`` when none was given."""
        return self.filename or "document.pdf"


@attrs.frozen
class UserMessage:
    """A user (or injected) message: text plus optional images and documents (PDFs).

    ``synthetic`` marks input Roost injected itself (a worker's result, a worker-tree snapshot):
    providers receive it as user input like any other; the scripted engine ignores it when it
    matches rules against the prompt and counts the model calls of the turn.
    """

    text: str
    images: tuple[Image, ...] = attrs.field(default=(), converter=_as_tuple)
    synthetic: bool = False
    documents: tuple[Document, ...] = attrs.field(default=(), converter=_as_tuple)


@attrs.frozen
class AgentMessage:
    """Text the model produced."""

    text: str


@attrs.frozen
class Reasoning:
    """Reasoning the model exposed.

    Attributes:
        text: the readable reasoning (thinking text or summaries), for clients.
        provider: the engine whose wire format ``items`` are in (``"anthropic"``,
            ``"openai-responses"``), or ``None``.
        items: the provider's own reasoning items, replayed unchanged to that provider: Anthropic
            ``thinking`` blocks with their ``signature`` and ``redacted_thinking`` blocks (Messages
            API, "Extended thinking": they must be passed back in the tool loop), Responses
            ``reasoning`` items with ``encrypted_content`` (Responses API with ``store: false``).
            Adapters of other providers drop them, and drop reasoning without items.
    """

    text: str
    provider: str | None = None
    items: tuple[dict[str, Any], ...] = attrs.field(default=(), converter=_as_tuple)


@attrs.frozen
class ToolCall:
    """A tool call the model made; ``arguments`` is the parsed JSON object."""

    call_id: str
    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ToolResult:
    """The result of the tool call ``call_id``; ``is_error`` marks failed or interrupted calls."""

    call_id: str
    output: str
    is_error: bool = False


HistoryItem: TypeAlias = UserMessage | AgentMessage | Reasoning | ToolCall | ToolResult


@attrs.frozen
class ToolSchema:
    """A tool offered to the model; ``parameters`` is a JSON Schema object."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = attrs.field(factory=lambda: {"type": "object", "properties": {}})


@attrs.frozen(kw_only=True)
class EngineRequest:
    """One model call.

    Attributes:
        system: the system prompt ("" for none).
        history: the conversation so far, oldest first.
        tools: tool schemas offered to the model.
        model: model id; ``None`` uses the provider settings' model.
        effort: reasoning effort (``"low"``, ``"medium"``, ``"high"``) or ``None``.
        max_tokens: output token limit or ``None`` for the adapter's default.
        temperature: sampling temperature or ``None`` for the provider's default.
        agent: the worker name for a worker thread (scripted ``match.agent``), ``None`` otherwise.
    """

    system: str = ""
    history: tuple[HistoryItem, ...] = attrs.field(default=(), converter=_as_tuple)
    tools: tuple[ToolSchema, ...] = attrs.field(default=(), converter=_as_tuple)
    model: str | None = None
    effort: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    agent: str | None = None

    @property
    def prompt(self) -> str:
        """The text of the last user message not injected by Roost ("" when there is none)."""
        for item in reversed(self.history):
            if isinstance(item, UserMessage) and not item.synthetic:
                return item.text
        return ""


# -- events -------------------------------------------------------------------------------------


@attrs.frozen
class TextDelta:
    """A piece of the assistant's text."""

    text: str


@attrs.frozen
class ReasoningDelta:
    """A piece of the model's exposed reasoning."""

    text: str


@attrs.frozen
class ReasoningItems:
    """The provider's reasoning items of this response, complete (see :class:`Reasoning`).

    Sent once, before :class:`Finish`, by adapters whose provider needs them back; a consumer
    stores them with the response's reasoning and puts them in :attr:`Reasoning.items`.
    """

    provider: str
    items: tuple[dict[str, Any], ...] = attrs.field(converter=_as_tuple)


@attrs.frozen
class ToolCallStart:
    """A tool call began; ``index`` is its position among this response's tool calls (0-based)."""

    call_id: str
    name: str
    index: int


@attrs.frozen
class ToolCallDelta:
    """A fragment of a tool call's JSON arguments, as streamed."""

    call_id: str
    delta: str


@attrs.frozen
class ToolCallEnd:
    """A tool call completed; ``arguments`` are parsed once, from the whole argument text."""

    call_id: str
    name: str
    arguments: dict[str, Any]


@attrs.frozen
class Usage:
    """Token usage of the model call (tokens)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None


#: The reasons a stream may finish with.
FINISH_REASONS = frozenset({"stop", "tool_calls", "length", "content_filter", "cancelled"})


@attrs.frozen
class Finish:
    """The last event of a successful stream; ``reason`` is one of :data:`FINISH_REASONS`."""

    reason: str = attrs.field(validator=attrs.validators.in_(FINISH_REASONS))


@attrs.frozen
class Retrying:
    """A failed attempt is about to be retried.

    ``attempt`` is the number of the attempt that failed (1-based), ``max_attempts`` the limit,
    ``delay_s`` the seconds waited before the next one, ``reason`` the failure category.
    ``restart``: the failed attempt had already streamed events (text, reasoning, tool-call
    starts); they are void, and the next attempt streams the response from its beginning, so a
    consumer discards what it accumulated (the app-server sends ``item/agentMessage/replace``,
    ``item/reasoning/replace`` and ``item/removed``, app-server-protocol.md "Notifications").
    """

    attempt: int
    max_attempts: int
    delay_s: float = 0.0
    reason: str = ""
    restart: bool = False


EngineEvent: TypeAlias = (
    TextDelta
    | ReasoningDelta
    | ReasoningItems
    | ToolCallStart
    | ToolCallDelta
    | ToolCallEnd
    | Usage
    | Finish
    | Retrying
)


@attrs.frozen
class ModelInfo:
    """A model an engine offers (``roost models --json`` item ``{id, current}``)."""

    id: str
    current: bool = False


@runtime_checkable
class Engine(Protocol):
    """A model engine.

    ``stream(request)`` returns an async context manager yielding an async iterator of events. It
    raises :class:`roost.errors.EngineFailure` on failure. Leaving the context (normally, on error,
    or because the consumer was cancelled) closes the underlying HTTP stream at once.
    """

    name: str

    def stream(self, request: EngineRequest) -> AbstractAsyncContextManager[AsyncIterator[EngineEvent]]: ...

    async def list_models(self) -> list[ModelInfo]: ...

    async def aclose(self) -> None: ...
