"""Anthropic Messages (``POST {base_url}/v1/messages``, ``stream: true``).

Stream format (Anthropic API reference, "Streaming Messages"): ``message_start``, then per content
block ``content_block_start`` / ``content_block_delta`` (``text_delta``, ``input_json_delta``,
``thinking_delta``, ``signature_delta``) / ``content_block_stop`` keyed by block ``index``,
``message_delta`` (stop reason, output usage), terminal ``message_stop``; ``ping`` anywhere; an
``error`` event may arrive after HTTP 200.

History rules: roles alternate user/assistant (consecutive same-role turns are merged into one
message of content blocks), the first message is a user message, tool results are ``tool_result``
blocks in the following user message, images are base64 ``image`` blocks, and the response's signed
``thinking`` / ``redacted_thinking`` blocks (kept in :attr:`Reasoning.items`) open its assistant
message again, unchanged, as the API requires when thinking is on.
"""

from __future__ import annotations

from typing import Any

from roost._json import JSONDecodeError, loads
from roost.engines._history import CallIds, ToolCallBuffer, arguments_text, pair_tool_results
from roost.engines._http import HttpEngine
from roost.engines._settings import DEFAULT_BASE_URLS
from roost.engines._types import (
    AgentMessage,
    EngineEvent,
    EngineRequest,
    Finish,
    Reasoning,
    ReasoningDelta,
    ReasoningItems,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    ToolResult,
    Usage,
    UserMessage,
)
from roost.errors import EngineFailure

__all__ = ["AnthropicEngine", "AnthropicParser", "anthropic_messages", "ANTHROPIC_VERSION"]

ANTHROPIC_VERSION = "2023-06-01"
#: ``max_tokens`` is required by the Messages API; used when the request sets none.
DEFAULT_MAX_TOKENS = 8192
_THINKING_BUDGET = {"low": 1024, "medium": 4096, "high": 16384}

_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}

_ERROR_CATEGORY = {
    "overloaded_error": ("provider", True),
    "api_error": ("provider", True),
    "rate_limit_error": ("rate_limit", True),
    "authentication_error": ("auth", False),
    "permission_error": ("auth", False),
    "invalid_request_error": ("invalid_request", False),
    "request_too_large": ("invalid_request", False),
    "not_found_error": ("invalid_request", False),
}


def anthropic_messages(request: EngineRequest) -> list[dict[str, Any]]:
    """Map the history to alternating Messages API ``messages`` (see the module docstring)."""
    messages: list[dict[str, Any]] = []

    def add(role: str, block: dict[str, Any]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})

    for item in pair_tool_results(request.history):
        if isinstance(item, UserMessage):
            for doc in item.documents:  # Messages API "PDF support": a base64 document block
                block: dict[str, Any] = {
                    "type": "document",
                    "source": {"type": "base64", "media_type": doc.media_type, "data": doc.data},
                }
                if doc.filename:
                    block["title"] = doc.filename
                add("user", block)
            for im in item.images:
                add(
                    "user",
                    {"type": "image", "source": {"type": "base64", "media_type": im.media_type, "data": im.data}},
                )
            add("user", {"type": "text", "text": item.text or "(empty)"})
        elif isinstance(item, AgentMessage):
            if item.text:
                add("assistant", {"type": "text", "text": item.text})
        elif isinstance(item, ToolCall):
            add("assistant", {"type": "tool_use", "id": item.call_id, "name": item.name, "input": item.arguments})
        elif isinstance(item, ToolResult):
            add(
                "user",
                {"type": "tool_result", "tool_use_id": item.call_id, "content": item.output, "is_error": item.is_error},
            )
        elif isinstance(item, Reasoning):  # noqa: SIM102 (another provider's reasoning must not fall through)
            if item.provider == "anthropic":
                for block in item.items:  # signed thinking / redacted thinking, unchanged
                    add("assistant", dict(block))
            # reasoning without its signed blocks (or from another provider) cannot be replayed
    if messages and messages[0]["role"] != "user":
        messages.insert(0, {"role": "user", "content": [{"type": "text", "text": "(continue)"}]})
    # tool_result blocks must come first in their user message.
    for message in messages:
        if message["role"] == "user":
            message["content"].sort(key=lambda b: b["type"] != "tool_result")
    return messages


class AnthropicParser:
    """Sans-IO parser of one Messages stream (see the module docstring).

    Beyond the documented stream it accepts gateways that put a tool's whole ``input`` (or a text
    block's text) in ``content_block_start`` and send no deltas (issue 14, case 5). ``thinking``
    blocks (their ``thinking_delta`` and ``signature_delta``) and ``redacted_thinking`` blocks are
    collected whole and sent as one :class:`ReasoningItems` before :class:`Finish`, to be replayed
    unchanged (Messages API, "Extended thinking: preserving thinking blocks").

    Args:
        ids: assigns tool-call ids (default: a fresh :class:`CallIds` with nothing taken).
    """

    def __init__(self, ids: CallIds | None = None) -> None:
        self.done = False
        self._ids = ids or CallIds(prefix="toolu")
        self._blocks: dict[int, ToolCallBuffer] = {}
        self._thinking: dict[int, dict[str, Any]] = {}
        self._count = 0
        self._stop: str | None = None
        self._input: int | None = None
        self._cached: int | None = None
        self._output: int | None = None

    def feed(self, event: str, data: str) -> list[EngineEvent]:
        try:
            doc = loads(data)
        except (JSONDecodeError, ValueError) as exc:
            raise EngineFailure(f"anthropic: malformed event: {data[:200]!r}", category="provider") from exc
        if type(doc) is not dict:
            raise EngineFailure(f"anthropic: malformed event: {data[:200]!r}", category="provider")
        kind = doc.get("type") or event
        if kind == "content_block_delta":
            return self._delta(doc)
        if kind == "content_block_start":
            return self._start(doc)
        if kind == "content_block_stop":
            buf = self._blocks.get(doc.get("index"))  # type: ignore[arg-type]
            if buf is None or buf.ended:
                return []
            return [buf.end()]
        if kind == "message_start":
            usage = (doc.get("message") or {}).get("usage") or {}
            self._input = usage.get("input_tokens")
            self._cached = usage.get("cache_read_input_tokens")
            self._output = usage.get("output_tokens")
            return []
        if kind == "message_delta":
            stop = (doc.get("delta") or {}).get("stop_reason")
            if stop:
                self._stop = stop
            usage = doc.get("usage") or {}
            if usage.get("output_tokens") is not None:
                self._output = usage["output_tokens"]
            if usage.get("input_tokens") is not None:
                self._input = usage["input_tokens"]
            if usage.get("cache_read_input_tokens") is not None:
                self._cached = usage["cache_read_input_tokens"]
            return []
        if kind == "message_stop":
            self.done = True
            return []
        if kind == "error":
            _raise_stream_error(doc)
        return []  # ping and future event types

    def _delta(self, doc: dict[str, Any]) -> list[EngineEvent]:
        delta = doc.get("delta") or {}
        dtype = delta.get("type")
        if dtype == "text_delta":
            return [TextDelta(delta["text"])] if delta.get("text") else []
        if dtype == "input_json_delta":
            buf = self._blocks.get(doc.get("index"))  # type: ignore[arg-type]
            part = delta.get("partial_json") or ""
            if buf is None or not part:
                return []
            buf.parts.append(part)
            return [ToolCallDelta(buf.call_id, part)]
        if dtype == "thinking_delta":
            block = self._thinking.get(doc.get("index"))  # type: ignore[arg-type]
            text = delta.get("thinking") or ""
            if block is not None:
                block["thinking"] += text
            return [ReasoningDelta(text)] if text else []
        if dtype == "signature_delta":
            block = self._thinking.get(doc.get("index"))  # type: ignore[arg-type]
            if block is not None:
                block["signature"] += delta.get("signature") or ""
            return []
        return []

    def _start(self, doc: dict[str, Any]) -> list[EngineEvent]:
        block = doc.get("content_block") or {}
        btype = block.get("type")
        index = doc.get("index")
        if btype == "tool_use":
            server_id = block.get("id") or None
            buf = ToolCallBuffer(self._ids.assign(server_id), block.get("name") or "", self._count, server_id=server_id)
            initial = block.get("input")
            if initial:
                buf.initial = arguments_text(initial)
            self._count += 1
            self._blocks[index] = buf  # type: ignore[index]
            return [ToolCallStart(buf.call_id, buf.name, buf.index)]
        if btype == "thinking":
            text = block.get("thinking") or ""
            self._thinking[index] = {  # type: ignore[index]
                "type": "thinking",
                "thinking": text,
                "signature": block.get("signature") or "",
            }
            return [ReasoningDelta(text)] if text else []
        if btype == "redacted_thinking":
            self._thinking[index] = {"type": "redacted_thinking", "data": block.get("data") or ""}  # type: ignore[index]
            return []
        if btype == "text" and block.get("text"):
            return [TextDelta(block["text"])]
        return []

    def finish(self) -> list[EngineEvent]:
        if not self.done:
            raise EngineFailure(  # a dropped stream: sent again (RetryPolicy)
                "anthropic: the stream ended without message_stop",
                category="network",
                retryable=True,
                provider_code="incomplete_stream",
            )
        out: list[EngineEvent] = [buf.end() for buf in self._blocks.values() if not buf.ended]
        # Only signed thinking can be sent back; the API rejects a thinking block without it.
        blocks = [
            b
            for _, b in sorted(self._thinking.items(), key=lambda kv: kv[0] if isinstance(kv[0], int) else 0)
            if b["type"] == "redacted_thinking" or b.get("signature")
        ]
        if blocks:
            out.append(ReasoningItems("anthropic", tuple(blocks)))
        if self._input is not None or self._output is not None:
            out.append(Usage(self._input, self._output, self._cached))
        reason = _STOP.get(self._stop or "end_turn", "stop")
        if reason == "stop" and self._blocks:
            reason = "tool_calls"
        out.append(Finish(reason))
        return out


def _raise_stream_error(doc: dict[str, Any]) -> None:
    """Fail on an ``error`` event inside a 200 stream. Anthropic documents these as the errors of
    the HTTP statuses (``overloaded_error`` is its 529, ``api_error`` its 500): those, and
    ``rate_limit_error``, are retryable (:class:`roost.engines._http.RetryPolicy`)."""
    error = doc.get("error") or {}
    etype = error.get("type") if isinstance(error, dict) else None
    category, retryable = _ERROR_CATEGORY.get(etype or "", ("provider", False))
    message = (error.get("message") if isinstance(error, dict) else str(error)) or "unknown error"
    if category == "invalid_request" and "prompt is too long" in message:
        category = "context_length"
    raise EngineFailure(
        f"anthropic: the server sent an error inside the stream ({etype}): {message}",
        category=category,
        retryable=retryable,
        provider_code=etype or "stream_error",
    )


class AnthropicEngine(HttpEngine):
    """Anthropic Messages adapter; see the module docstring."""

    name = "anthropic"

    def _base(self) -> str:
        base = (self.settings.base_url or DEFAULT_BASE_URLS["anthropic"]).rstrip("/")
        return base[:-3] if base.endswith("/v1") else base

    def _url(self) -> str:
        return self._base() + "/v1/messages"

    def _models_url(self) -> str:
        return self._base() + "/v1/models?limit=1000"

    def _headers(self) -> dict[str, str]:
        headers = {"anthropic-version": ANTHROPIC_VERSION, **self.settings.headers}
        if self.settings.api_key:
            headers["x-api-key"] = self.settings.api_key
        return headers

    def _body(self, request: EngineRequest) -> dict[str, Any]:
        max_tokens = request.max_tokens or DEFAULT_MAX_TOKENS
        body: dict[str, Any] = {
            "model": self._model(request),
            "messages": anthropic_messages(request),
            "max_tokens": max_tokens,
            "stream": True,
        }
        if request.system:
            body["system"] = request.system
        if request.tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in request.tools
            ]
        if request.effort in _THINKING_BUDGET:
            budget = _THINKING_BUDGET[request.effort]
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
            body["max_tokens"] = max(max_tokens, budget + 1024)
        elif request.temperature is not None:
            body["temperature"] = request.temperature  # thinking forbids a custom temperature
        return body

    def _parser(self, request: EngineRequest) -> AnthropicParser:
        return AnthropicParser(CallIds(request.history, prefix="toolu"))
