"""OpenAI Chat Completions (``POST {base_url}/chat/completions``, ``stream: true``).

Works with every compatible server (OpenAI, vLLM, Ollama, llama.cpp server, LM Studio): the base
URL includes the ``/v1`` prefix, e.g. ``http://localhost:11434/v1``.

Stream format (OpenAI API reference, "Chat Completions: streaming"): ``data: {chunk}`` lines, each
chunk ``{"choices": [{"index", "delta": {"content", "tool_calls": [{"index", "id", "function":
{"name", "arguments"}}]}, "finish_reason"}], "usage"}``, a last usage-only chunk with empty
``choices`` when ``stream_options.include_usage`` is set, then ``data: [DONE]``.
"""

from __future__ import annotations

from typing import Any

from roost._json import JSONDecodeError, dumps, loads
from roost.engines._history import ToolCallBuffer, pair_tool_results
from roost.engines._http import HttpEngine
from roost.engines._settings import DEFAULT_BASE_URLS
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

__all__ = ["OpenAIChatEngine", "ChatCompletionsParser", "chat_messages"]

_FINISH = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}


def chat_messages(request: EngineRequest) -> list[dict[str, Any]]:
    """Map the request's system prompt and history to Chat Completions ``messages``.

    Consecutive assistant text and tool calls of one model call become one assistant message with
    ``tool_calls``; each is followed by ``role: tool`` results (see :func:`pair_tool_results`).
    Images become ``image_url`` parts with data URLs. Reasoning items are not replayed.
    """
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    assistant: dict[str, Any] | None = None
    for item in pair_tool_results(request.history):
        if isinstance(item, AgentMessage):
            if assistant is None or assistant.get("tool_calls"):
                assistant = {"role": "assistant", "content": item.text}
                messages.append(assistant)
            else:
                assistant["content"] = (assistant.get("content") or "") + item.text
            continue
        if isinstance(item, ToolCall):
            if assistant is None:
                assistant = {"role": "assistant", "content": None}
                messages.append(assistant)
            assistant.setdefault("tool_calls", []).append(
                {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": dumps(item.arguments).decode()},
                }
            )
            continue
        if isinstance(item, Reasoning):
            continue
        assistant = None
        if isinstance(item, ToolResult):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        elif isinstance(item, UserMessage):
            if item.images:
                parts: list[dict[str, Any]] = [{"type": "text", "text": item.text}]
                parts += [{"type": "image_url", "image_url": {"url": im.data_url()}} for im in item.images]
                messages.append({"role": "user", "content": parts})
            else:
                messages.append({"role": "user", "content": item.text})
    return messages


class ChatCompletionsParser:
    """Sans-IO parser of one Chat Completions stream (see the module docstring)."""

    def __init__(self) -> None:
        self.done = False
        self._calls: dict[int, ToolCallBuffer] = {}
        self._finish: str | None = None
        self._usage: Usage | None = None

    def feed(self, event: str, data: str) -> list[EngineEvent]:
        if data == "[DONE]":
            self.done = True
            return []
        try:
            chunk = loads(data)
        except (JSONDecodeError, ValueError) as exc:
            raise EngineFailure(f"openai: malformed stream chunk: {data[:200]!r}", category="provider") from exc
        if not isinstance(chunk, dict):
            raise EngineFailure(f"openai: malformed stream chunk: {data[:200]!r}", category="provider")
        error = chunk.get("error")
        if error:
            message = error.get("message") if isinstance(error, dict) else str(error)
            code = error.get("code") or error.get("type") if isinstance(error, dict) else None
            raise EngineFailure(
                f"openai: stream error: {message}",
                category="provider",
                retryable=True,
                provider_code=str(code) if code is not None else None,
            )
        out: list[EngineEvent] = []
        usage = chunk.get("usage")
        if usage:
            details = usage.get("prompt_tokens_details") or {}
            self._usage = Usage(usage.get("prompt_tokens"), usage.get("completion_tokens"), details.get("cached_tokens"))
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                out.append(ReasoningDelta(reasoning))
            content = delta.get("content")
            if content:
                out.append(TextDelta(content))
            for frag in delta.get("tool_calls") or ():
                out.extend(self._tool_fragment(frag))
            reason = choice.get("finish_reason")
            if reason:
                self._finish = _FINISH.get(reason, "stop")
        return out

    def _tool_fragment(self, frag: dict[str, Any]) -> list[EngineEvent]:
        index = frag.get("index", len(self._calls))
        function = frag.get("function") or {}
        buf = self._calls.get(index)
        out: list[EngineEvent] = []
        if buf is None:
            buf = ToolCallBuffer(frag.get("id") or f"call_{index}", function.get("name") or "", len(self._calls))
            self._calls[index] = buf
            out.append(ToolCallStart(buf.call_id, buf.name, buf.index))
        elif function.get("name") and not buf.name:
            buf.name = function["name"]
        args = function.get("arguments")
        if args:
            buf.parts.append(args)
            out.append(ToolCallDelta(buf.call_id, args))
        return out

    def finish(self) -> list[EngineEvent]:
        if not self.done and self._finish is None:
            raise EngineFailure(
                "openai: the stream ended without [DONE] or a finish_reason", category="network", retryable=True
            )
        out: list[EngineEvent] = [buf.end() for _, buf in sorted(self._calls.items())]
        if self._usage is not None:
            out.append(self._usage)
        reason = self._finish or "stop"
        if self._calls and reason == "stop":
            reason = "tool_calls"
        out.append(Finish(reason))
        return out


class OpenAIChatEngine(HttpEngine):
    """OpenAI Chat Completions adapter (and every compatible server); see the module docstring."""

    name = "openai"

    def _base(self) -> str:
        return (self.settings.base_url or DEFAULT_BASE_URLS["openai"]).rstrip("/")

    def _url(self) -> str:
        return self._base() + "/chat/completions"

    def _models_url(self) -> str:
        return self._base() + "/models"

    def _headers(self) -> dict[str, str]:
        headers = dict(self.settings.headers)
        if self.settings.api_key:
            headers["authorization"] = f"Bearer {self.settings.api_key}"
        return headers

    def _body(self, request: EngineRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model(request),
            "messages": chat_messages(request),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = [
                {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in request.tools
            ]
        if request.max_tokens is not None:
            # api.openai.com wants max_completion_tokens; compatible servers know max_tokens.
            key = "max_completion_tokens" if "api.openai.com" in self._base() else "max_tokens"
            body[key] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.effort is not None:
            body["reasoning_effort"] = request.effort
        return body

    def _parser(self) -> ChatCompletionsParser:
        return ChatCompletionsParser()
