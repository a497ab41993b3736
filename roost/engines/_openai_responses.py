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

from roost._json import JSONDecodeError, dumps, loads
from roost.engines._history import ToolCallBuffer, pair_tool_results
from roost.engines._http import HttpEngine
from roost.engines._openai_chat import OpenAIChatEngine
from roost.engines._types import (
    AgentMessage,
    EngineEvent,
    EngineRequest,
    Finish,
    Reasoning,
    ReasoningDelta,
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


def responses_input(request: EngineRequest) -> list[dict[str, Any]]:
    """Map the history to Responses ``input`` items (messages, function calls and their outputs)."""
    items: list[dict[str, Any]] = []
    for item in pair_tool_results(request.history):
        if isinstance(item, UserMessage):
            content: list[dict[str, Any]] = [{"type": "input_text", "text": item.text}]
            content += [{"type": "input_image", "image_url": im.data_url()} for im in item.images]
            items.append({"type": "message", "role": "user", "content": content})
        elif isinstance(item, AgentMessage):
            items.append(
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": item.text}]}
            )
        elif isinstance(item, ToolCall):
            items.append(
                {
                    "type": "function_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "arguments": dumps(item.arguments).decode(),
                }
            )
        elif isinstance(item, ToolResult):
            items.append({"type": "function_call_output", "call_id": item.call_id, "output": item.output})
        elif isinstance(item, Reasoning):
            continue  # replaying reasoning needs the provider's encrypted item; not kept
    return items


class ResponsesParser:
    """Sans-IO parser of one Responses stream (see the module docstring)."""

    def __init__(self) -> None:
        self.done = False
        self._by_item: dict[str, ToolCallBuffer] = {}
        self._by_index: dict[int, ToolCallBuffer] = {}
        self._order: list[ToolCallBuffer] = []
        self._final_args: dict[str, str] = {}
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
        try:
            doc = loads(data)
        except (JSONDecodeError, ValueError) as exc:
            raise EngineFailure(f"openai-responses: malformed event: {data[:200]!r}", category="provider") from exc
        kind = doc.get("type") or event
        if kind == "response.output_text.delta":
            return [TextDelta(doc["delta"])] if doc.get("delta") else []
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            return [ReasoningDelta(doc["delta"])] if doc.get("delta") else []
        if kind == "response.function_call_arguments.delta":
            buf = self._find(doc)
            delta = doc.get("delta") or ""
            if buf is None or not delta:
                return []
            buf.parts.append(delta)
            return [ToolCallDelta(buf.call_id, delta)]
        if kind == "response.function_call_arguments.done":
            buf = self._find(doc)
            if buf is not None and isinstance(doc.get("arguments"), str):
                self._final_args[buf.call_id] = doc["arguments"]
            return []
        if kind == "response.output_item.added":
            item = doc.get("item") or {}
            if item.get("type") != "function_call":
                return []
            buf = ToolCallBuffer(item.get("call_id") or item.get("id") or "", item.get("name") or "", len(self._order))
            if item.get("id"):
                self._by_item[item["id"]] = buf
            if doc.get("output_index") is not None:
                self._by_index[doc["output_index"]] = buf
            self._order.append(buf)
            return [ToolCallStart(buf.call_id, buf.name, buf.index)]
        if kind == "response.output_item.done":
            item = doc.get("item") or {}
            if item.get("type") != "function_call":
                return []
            buf = self._by_item.get(item.get("id") or "") or self._by_index.get(doc.get("output_index"))
            if buf is None or buf.ended:
                return []
            full = item.get("arguments") if isinstance(item.get("arguments"), str) else self._final_args.get(buf.call_id)
            return [buf.end(full)]
        if kind in ("response.completed", "response.incomplete"):
            self.done = True
            self._terminal = doc.get("response") or {}
            return []
        if kind == "response.failed":
            error = (doc.get("response") or {}).get("error") or {}
            raise EngineFailure(
                f"openai-responses: response failed: {error.get('message') or 'unknown error'}",
                category=_category(error.get("code")),
                retryable=error.get("code") in ("server_error", "rate_limit_exceeded"),
                provider_code=error.get("code"),
            )
        if kind == "error":
            code = doc.get("code")
            raise EngineFailure(
                f"openai-responses: stream error: {doc.get('message') or data[:200]}",
                category=_category(code),
                retryable=code in ("server_error", "rate_limit_exceeded", None),
                provider_code=code,
            )
        return []

    def finish(self) -> list[EngineEvent]:
        if self._terminal is None:
            raise EngineFailure(
                "openai-responses: the stream ended without response.completed", category="network", retryable=True
            )
        out: list[EngineEvent] = [buf.end(self._final_args.get(buf.call_id)) for buf in self._order if not buf.ended]
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
        else:
            out.append(Finish("tool_calls" if self._order else "stop"))
        return out


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

    def _body(self, request: EngineRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model(request),
            "input": responses_input(request),
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
        return body

    def _parser(self) -> ResponsesParser:  # type: ignore[override]
        return ResponsesParser()
