"""OpenAI Responses (``POST {base_url}/responses``, ``stream: true``).

Stream format (OpenAI API reference, "Responses: streaming events"): ``event: <type>`` plus
``data: {"type": <type>, ...}``. Used here: ``response.output_text.delta``,
``response.reasoning_summary_text.delta`` / ``response.reasoning_text.delta``,
``response.output_item.added`` / ``.done`` (``function_call`` items), ``response.function_call_arguments
.delta`` / ``.done`` (keyed by ``item_id`` and ``output_index``), terminal ``response.completed``,
``response.incomplete``, ``response.failed``, and ``error``.
"""

from __future__ import annotations

from typing import Any

import orjson

from roost._json import JSONDecodeError, dumps
from roost.engines._history import CallIds, ToolCallBuffer, arguments_text, pair_tool_results
from roost.engines._http import HttpEngine
from roost.engines._openai_chat import OpenAIChatEngine
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

__all__ = ["OpenAIResponsesEngine", "ResponsesParser", "responses_input"]


def responses_input(request: EngineRequest, encoded: MessageJSON | None = None) -> list[Any]:
    """Map the history to Responses ``input`` items (messages, function calls and their outputs).

    Requests are stateless (``store: false``), so the reasoning items a response produced (with
    ``encrypted_content``) are sent back in place, before that response's message and calls
    (Responses API, "Reasoning: encrypted reasoning items").

    Args:
        encoded: when given, text-only messages come from it as encoded JSON
            (``orjson.Fragment``; for the wire, not for inspection).
    """
    items: list[Any] = []
    for item in pair_tool_results(request.history):
        # exact types (frozen attrs classes), the common ones first: cheaper than isinstance per item
        if encoded is not None and (
            type(item) is AgentMessage or (type(item) is UserMessage and not item.images and not item.documents)
        ):
            items.append(encoded.get(item))
        elif type(item) is AgentMessage:
            items.append(
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": item.text}]}
            )
        elif type(item) is UserMessage:
            content: list[dict[str, Any]] = [{"type": "input_text", "text": item.text}]
            if item.images:
                content += [{"type": "input_image", "image_url": im.data_url()} for im in item.images]
            if item.documents:
                # OpenAI "File inputs": an input_file item with base64 file_data (a data URL) and filename
                content += [
                    {"type": "input_file", "filename": d.name, "file_data": d.data_url()} for d in item.documents
                ]
            items.append({"type": "message", "role": "user", "content": content})
        elif type(item) is ToolCall:
            items.append(
                {
                    "type": "function_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "arguments": dumps(item.arguments).decode(),
                }
            )
        elif type(item) is ToolResult:
            items.append({"type": "function_call_output", "call_id": item.call_id, "output": item.output})
        elif type(item) is Reasoning and item.provider == "openai-responses":
            items.extend(dict(kept) for kept in item.items)  # encrypted reasoning, unchanged
    return items


class MessageJSON:
    """Encoded Responses ``input`` items of text-only messages, by role and text.

    Every call sends the thread's whole history again (``store: false``) and its messages do not
    change, so each is mapped and encoded once and then embedded as is (``orjson.Fragment``).
    Kept up to :attr:`LIMIT` bytes of JSON, then started over.
    """

    __slots__ = ("_user", "_assistant", "_size")

    #: bytes of encoded messages kept before the cache is cleared
    LIMIT = 4 * 1024 * 1024

    def __init__(self) -> None:
        self._user: dict[str, orjson.Fragment] = {}
        self._assistant: dict[str, orjson.Fragment] = {}
        self._size = 0

    def get(self, item: UserMessage | AgentMessage) -> orjson.Fragment:
        """The encoded item of ``item`` (a user message without images or documents, or an agent message)."""
        assistant = type(item) is AgentMessage
        table = self._assistant if assistant else self._user
        fragment = table.get(item.text)
        if fragment is None:
            if assistant:
                doc = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": item.text}]}
            else:
                doc = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": item.text}]}
            raw = dumps(doc)
            if self._size + len(raw) > self.LIMIT:
                self._user.clear()
                self._assistant.clear()
                self._size = 0
            fragment = table[item.text] = orjson.Fragment(raw)
            self._size += len(raw)
        return fragment


#: Events named in their ``event:`` line whose data Roost does not use: not decoded at all (the
#: ``response.created``/``.in_progress`` snapshots echo the whole request configuration).
_UNUSED_EVENTS = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.queued",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.done",
        "response.output_text.annotation.added",
        "response.refusal.done",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_part.done",
        "response.reasoning_summary_text.done",
        "response.reasoning_text.done",
    }
)


class ResponsesParser:
    """Sans-IO parser of one Responses stream (see the module docstring).

    ``reasoning`` output items that carry ``encrypted_content`` are collected and sent as one
    :class:`ReasoningItems` before :class:`Finish`, for :func:`responses_input` to replay. A
    ``function_call`` item first seen in ``response.output_item.done`` (servers that skip
    ``.added``) still starts and ends a call; ``arguments`` sent as an object are accepted.

    Args:
        ids: assigns call ids (default: a fresh :class:`CallIds` with nothing taken).
    """

    def __init__(self, ids: CallIds | None = None) -> None:
        self.done = False
        self._ids = ids or CallIds()
        self._by_item: dict[str, ToolCallBuffer] = {}
        self._by_index: dict[int, ToolCallBuffer] = {}
        self._order: list[ToolCallBuffer] = []
        self._final_args: dict[str, str] = {}
        self._reasoning: list[dict[str, Any]] = []
        self._terminal: dict[str, Any] | None = None

    def _find(self, doc: dict[str, Any]) -> ToolCallBuffer | None:
        item_id = doc.get("item_id")
        if item_id is not None and item_id in self._by_item:
            return self._by_item[item_id]
        index = doc.get("output_index")
        if index is not None:
            return self._by_index.get(index)
        return None

    def feed(self, event: str, data: str) -> list[EngineEvent]:
        if event in _UNUSED_EVENTS:
            return []
        try:
            doc = orjson.loads(data)
        except (JSONDecodeError, ValueError) as exc:
            raise EngineFailure(f"openai-responses: malformed event: {data[:200]!r}", category="provider") from exc
        if type(doc) is not dict:
            raise EngineFailure(f"openai-responses: malformed event: {data[:200]!r}", category="provider")
        kind = doc.get("type") or event
        if kind == "response.output_text.delta" or kind == "response.refusal.delta":
            return [TextDelta(doc["delta"])] if doc.get("delta") else []
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            return [ReasoningDelta(doc["delta"])] if doc.get("delta") else []
        if kind == "response.function_call_arguments.delta":
            buf = self._find(doc)
            delta = arguments_text(doc.get("delta"))
            if buf is None or not delta:
                return []
            buf.parts.append(delta)
            return [ToolCallDelta(buf.call_id, delta)]
        if kind == "response.function_call_arguments.done":
            buf = self._find(doc)
            if buf is not None and doc.get("arguments") is not None:
                self._final_args[buf.call_id] = arguments_text(doc["arguments"])
            return []
        if kind == "response.output_item.added":
            item = doc.get("item") or {}
            if item.get("type") != "function_call":
                return []
            return [self._start(item, doc.get("output_index"))]
        if kind == "response.output_item.done":
            return self._item_done(doc)
        if kind in ("response.completed", "response.incomplete", "response.done"):
            self.done = True
            self._terminal = doc.get("response") or {}
            return []
        if kind == "response.failed":
            error = (doc.get("response") or {}).get("error") or {}
            raise EngineFailure(
                f"openai-responses: response failed: {error.get('message') or 'unknown error'}",
                category=_category(error.get("code")),
                retryable=error.get("code") in _TRANSIENT,
                provider_code=error.get("code") or "response_failed",
            )
        if kind == "error":
            nested = doc.get("error")
            err: dict[str, Any] = nested if isinstance(nested, dict) else doc
            code = err.get("code") or err.get("type")
            raise EngineFailure(
                f"openai-responses: the server sent an error inside the stream: {err.get('message') or data[:200]}",
                category=_category(code),
                retryable=code in _TRANSIENT,
                provider_code=code or "stream_error",
            )
        return []

    def _start(self, item: dict[str, Any], output_index: Any) -> ToolCallStart:
        server_id = item.get("call_id") or item.get("id") or None
        buf = ToolCallBuffer(self._ids.assign(server_id), item.get("name") or "", len(self._order), server_id=server_id)
        if item.get("id"):
            self._by_item[item["id"]] = buf
        if output_index is not None:
            self._by_index[output_index] = buf
        self._order.append(buf)
        return ToolCallStart(buf.call_id, buf.name, buf.index)

    def _item_done(self, doc: dict[str, Any]) -> list[EngineEvent]:
        item = doc.get("item") or {}
        itype = item.get("type")
        if itype == "reasoning":
            if item.get("encrypted_content"):
                # Replayed without its id, as stateless (store: false) clients do.
                kept = {
                    "type": "reasoning",
                    "summary": item.get("summary") or [],
                    "encrypted_content": item["encrypted_content"],
                }
                if item.get("content"):
                    kept["content"] = item["content"]
                self._reasoning.append(kept)
            return []
        if itype != "function_call":
            return []
        out: list[EngineEvent] = []
        buf = self._by_item.get(item.get("id")) or self._by_index.get(doc.get("output_index"))  # type: ignore[arg-type]
        if buf is None:
            out.append(self._start(item, doc.get("output_index")))
            buf = self._order[-1]
        if buf.ended:
            return out
        if item.get("name") and not buf.name:
            buf.name = item["name"]
        args = item.get("arguments")
        full = arguments_text(args) if args is not None else self._final_args.get(buf.call_id)
        out.append(buf.end(full))
        return out

    def finish(self) -> list[EngineEvent]:
        if self._terminal is None:
            raise EngineFailure(
                "openai-responses: the stream ended without response.completed",
                category="network",
                retryable=True,  # a dropped stream: sent again (RetryPolicy)
                provider_code="incomplete_stream",
            )
        out: list[EngineEvent] = [buf.end(self._final_args.get(buf.call_id)) for buf in self._order if not buf.ended]
        if self._reasoning:
            out.append(ReasoningItems("openai-responses", tuple(self._reasoning)))
        usage = self._terminal.get("usage")
        if usage:
            details = usage.get("input_tokens_details") or {}
            out.append(Usage(usage.get("input_tokens"), usage.get("output_tokens"), details.get("cached_tokens")))
        status = self._terminal.get("status")
        if status == "incomplete":
            why = (self._terminal.get("incomplete_details") or {}).get("reason")
            out.append(Finish("content_filter" if why == "content_filter" else "length"))
        elif status == "cancelled":
            out.append(Finish("cancelled"))
        elif status == "failed":
            error = self._terminal.get("error") or {}
            raise EngineFailure(
                f"openai-responses: response failed: {error.get('message') or 'unknown error'}",
                category=_category(error.get("code")),
                retryable=error.get("code") in _TRANSIENT,
                provider_code=error.get("code") or "response_failed",
            )
        else:
            out.append(Finish("tool_calls" if self._order else "stop"))
        return out


#: Error codes of ``response.failed`` / ``error`` events that a later attempt may not meet (the
#: Responses API's ``server_error``, and rate limiting); anything else fails the call.
_TRANSIENT = frozenset({"server_error", "rate_limit_exceeded"})


def _category(code: str | None) -> str:
    if code == "rate_limit_exceeded":
        return "rate_limit"
    if code == "context_length_exceeded":
        return "context_length"
    if code in ("invalid_prompt", "invalid_request_error"):
        return "invalid_request"
    return "provider"


class OpenAIResponsesEngine(OpenAIChatEngine, HttpEngine):
    """OpenAI Responses adapter; shares base URL, auth and model listing with Chat Completions."""

    name = "openai-responses"

    def _url(self) -> str:
        return self._base() + "/responses"

    _messages: MessageJSON | None = None

    def _encode_body(self, request: EngineRequest) -> bytes:
        # the same JSON as dumps(self._body(request)), with the history's messages encoded once
        if self._messages is None:
            self._messages = MessageJSON()
        return dumps(self._body(request, self._messages))

    def _body(self, request: EngineRequest, encoded: MessageJSON | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model(request),
            "input": responses_input(request, encoded),
            "stream": True,
            "store": False,
        }
        if request.system:
            body["instructions"] = request.system
        if request.tools:
            body["tools"] = [
                {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
                for t in request.tools
            ]
        if request.max_tokens is not None:
            body["max_output_tokens"] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.effort is not None:
            body["reasoning"] = {"effort": request.effort, "summary": "auto"}
        replaying = Reasoning in map(type, request.history) and any(
            type(i) is Reasoning and i.provider == "openai-responses" for i in request.history
        )
        if request.effort is not None or replaying:
            body["include"] = ["reasoning.encrypted_content"]  # store: false keeps no state
        return body

    def _parser(self, request: EngineRequest) -> ResponsesParser:  # type: ignore[override]
        return ResponsesParser(CallIds(request.history))
