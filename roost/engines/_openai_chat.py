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

import orjson

from roost._json import JSONDecodeError, dumps
from roost.engines._history import CallIds, ToolCallBuffer, arguments_text, pair_tool_results
from roost.engines._http import HttpEngine
from roost.engines._settings import DEFAULT_BASE_URLS
from roost.engines._types import (
    AgentMessage,
    EngineEvent,
    EngineRequest,
    Finish,
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

#: finish_reason values of OpenAI and of compatible servers (vLLM, Ollama, LiteLLM, OpenRouter,
#: Gemini's compatibility layer) -> Roost's finish reasons; anything else is "stop".
_FINISH = {
    "stop": "stop",
    "eos": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "tool_use": "tool_calls",
    "length": "length",
    "max_tokens": "length",
    "model_length": "length",
    "content_filter": "content_filter",
    "safety": "content_filter",
    "recitation": "content_filter",
    "refusal": "content_filter",
}
#: finish_reason values that mean the generation failed (OpenRouter, vLLM and LMDeploy send them)
_FAILED_FINISH = frozenset({"error", "abort"})


def chat_messages(request: EngineRequest) -> list[dict[str, Any]]:
    """Map the request's system prompt and history to Chat Completions ``messages``.

    Consecutive assistant text and tool calls of one model call become one assistant message with
    ``tool_calls``; each is followed by ``role: tool`` results (see :func:`pair_tool_results`).
    Images become ``image_url`` parts with data URLs, PDFs ``file`` parts (``file_data``, a data
    URL, and ``filename``). Reasoning items are not replayed.
    """
    messages: list[dict[str, Any]] = []
    if request.system:
        messages.append({"role": "system", "content": request.system})
    assistant: dict[str, Any] | None = None
    for item in pair_tool_results(request.history):
        cls = type(item)  # exact types (frozen attrs classes); cheaper than isinstance per item
        if cls is UserMessage:
            assistant = None
            assert isinstance(item, UserMessage)
            if item.images or item.documents:
                parts: list[dict[str, Any]] = [{"type": "text", "text": item.text}]
                parts += [{"type": "image_url", "image_url": {"url": im.data_url()}} for im in item.images]
                # OpenAI "File inputs": Chat Completions takes PDFs as file parts with base64 file_data
                parts += [
                    {"type": "file", "file": {"filename": doc.name, "file_data": doc.data_url()}}
                    for doc in item.documents
                ]
                messages.append({"role": "user", "content": parts})
            else:
                messages.append({"role": "user", "content": item.text})
        elif cls is AgentMessage:
            assert isinstance(item, AgentMessage)
            if assistant is None or assistant.get("tool_calls"):
                assistant = {"role": "assistant", "content": item.text}
                messages.append(assistant)
            else:
                assistant["content"] = (assistant.get("content") or "") + item.text
        elif cls is ToolCall:
            assert isinstance(item, ToolCall)
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
        elif cls is ToolResult:
            assert isinstance(item, ToolResult)
            assistant = None
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        # Reasoning is not replayed to Chat Completions (and does not end the assistant message)
    return messages


class ChatCompletionsParser:
    """Sans-IO parser of one Chat Completions stream (see the module docstring).

    Beyond OpenAI's documented stream it accepts what compatible servers send (issue 14):
    parallel calls whose fragments share one ``index`` but carry different ``id`` s are kept
    apart; ids that are missing or already used in the thread are replaced (:class:`CallIds`);
    ``arguments`` sent as a JSON object; the legacy ``function_call`` delta; ``reasoning_content``
    (DeepSeek, vLLM) and ``reasoning`` (OpenRouter, Ollama) deltas; ``refusal`` text; an
    ``error`` object (or vLLM's ``{"object": "error"}``) inside the 200 stream, which fails the
    call without a retry; usage in any chunk (the last one counts).

    Args:
        ids: assigns call ids (default: a fresh :class:`CallIds` with nothing taken).
    """

    def __init__(self, ids: CallIds | None = None) -> None:
        self.done = False
        self._ids = ids or CallIds()
        self._order: list[ToolCallBuffer] = []
        self._by_index: dict[Any, ToolCallBuffer] = {}
        self._by_server_id: dict[str, ToolCallBuffer] = {}
        self._finish: str | None = None
        self._failed: str | None = None
        self._usage: Usage | None = None

    def feed(self, event: str, data: str) -> list[EngineEvent]:
        if data == "[DONE]" or (data[:1] != "{" and data.strip().startswith("[DONE]")):
            self.done = True
            return []
        try:
            chunk = orjson.loads(data)
        except (JSONDecodeError, ValueError) as exc:
            raise EngineFailure(f"openai: malformed stream chunk: {data[:200]!r}", category="provider") from exc
        if type(chunk) is not dict:
            raise EngineFailure(f"openai: malformed stream chunk: {data[:200]!r}", category="provider")
        choices = chunk.get("choices")
        # The common case first: one text delta (OpenAI sends "usage": null in every chunk).
        if choices and len(choices) == 1 and chunk.get("usage") is None and "error" not in chunk:
            choice = choices[0]
            delta = choice.get("delta")
            if delta and choice.get("finish_reason") is None:
                content = delta.get("content")
                if (
                    type(content) is str
                    and content
                    and len(delta) == (2 if "role" in delta else 1)
                    and choice.get("index", 0) == 0
                ):
                    return [TextDelta(content)]
        if chunk.get("error") or chunk.get("object") == "error":  # "error": null is no error
            _raise_stream_error(chunk, data)
        out: list[EngineEvent] = []
        if choices:
            for choice in choices:
                if choice.get("index", 0) == 0:
                    self._choice(choice, out)
        usage = chunk.get("usage")
        if usage:
            details = usage.get("prompt_tokens_details") or {}
            self._usage = Usage(
                usage.get("prompt_tokens"), usage.get("completion_tokens"), details.get("cached_tokens")
            )
        return out

    def _choice(self, choice: dict[str, Any], out: list[EngineEvent]) -> None:
        delta = choice.get("delta")
        if delta:
            content = delta.get("content")
            if (
                type(content) is str and content and len(delta) <= 2
            ):  # the common case: {"content"} or {"role", "content"}
                out.append(TextDelta(content))
            else:
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if reasoning and isinstance(reasoning, str):
                    out.append(ReasoningDelta(reasoning))
                if isinstance(content, str) and content:
                    out.append(TextDelta(content))
                elif isinstance(content, list):  # content parts (Mistral): text and thinking
                    _content_parts(content, out)
                refusal = delta.get("refusal")
                if refusal and isinstance(refusal, str):
                    out.append(TextDelta(refusal))
                for frag in delta.get("tool_calls") or ():
                    self._tool_fragment(frag, out)
                legacy = delta.get("function_call")
                if legacy:
                    self._tool_fragment({"index": "function_call", "function": legacy}, out)
        reason = choice.get("finish_reason")
        if reason:
            if reason in _FAILED_FINISH:
                self._failed = reason
            self._finish = _FINISH.get(reason, "stop")

    def _buffer_for(self, frag: dict[str, Any], name: str) -> ToolCallBuffer | None:
        """The call a fragment continues, or None when it starts a new one."""
        server_id = frag.get("id")
        if server_id and server_id in self._by_server_id:
            return self._by_server_id[server_id]
        index = frag.get("index")
        if index is not None:
            buf = self._by_index.get(index)
            if buf is not None and server_id and buf.server_id and server_id != buf.server_id:
                return None  # same index, another id: a parallel call (issue 14, case 1)
            return buf
        if server_id or not self._order:
            return None
        last = self._order[-1]
        # No index and no id: a fragment naming a tool after the last call got its arguments
        # starts a new call (servers that send each parallel call whole).
        if name and last.name and (last.parts or last.initial):
            return None
        return last

    def _tool_fragment(self, frag: dict[str, Any], out: list[EngineEvent]) -> None:
        function = frag.get("function") or {}
        name = function.get("name") or ""
        buf = self._buffer_for(frag, name)
        if buf is None:
            server_id = frag.get("id") or None
            buf = ToolCallBuffer(self._ids.assign(server_id), name, len(self._order), server_id=server_id)
            self._order.append(buf)
            if frag.get("index") is not None:
                self._by_index[frag["index"]] = buf
            if server_id:
                self._by_server_id[server_id] = buf
            out.append(ToolCallStart(buf.call_id, buf.name, buf.index))
        elif name and not buf.name:
            buf.name = name
        args = arguments_text(function.get("arguments"))
        if args:
            buf.parts.append(args)
            out.append(ToolCallDelta(buf.call_id, args))

    def finish(self) -> list[EngineEvent]:
        if not self.done and self._finish is None:
            raise EngineFailure(
                "openai: the stream ended without [DONE] or a finish_reason",
                category="network",
                retryable=True,  # a dropped stream: sent again (RetryPolicy)
                provider_code="incomplete_stream",
            )
        if self._failed is not None:  # never a silent success on a generation the server gave up
            raise EngineFailure(
                f"openai: the server ended the response with finish_reason {self._failed!r}",
                category="provider",
                retryable=False,
                provider_code=f"finish_reason_{self._failed}",
            )
        out: list[EngineEvent] = [buf.end() for buf in self._order]
        if self._usage is not None:
            out.append(self._usage)
        reason = self._finish or "stop"
        if self._order and reason == "stop":
            reason = "tool_calls"
        out.append(Finish(reason))
        return out


def _content_parts(parts: list[Any], out: list[EngineEvent]) -> None:
    """``delta.content`` given as parts: ``{"type": "text", "text"}`` is text, ``{"type": "thinking",
    "thinking": [{"type": "text", "text"}]}`` (Mistral's reasoning models) is reasoning."""
    for part in parts:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text" and isinstance(part.get("text"), str) and part["text"]:
            out.append(TextDelta(part["text"]))
        elif part.get("type") == "thinking":
            inner = part.get("thinking")
            texts = [p.get("text") for p in inner if isinstance(p, dict)] if isinstance(inner, list) else [inner]
            text = "".join(t for t in texts if isinstance(t, str))
            if text:
                out.append(ReasoningDelta(text))


#: Codes / types of an error object inside a stream that a later attempt may not meet.
_TRANSIENT_CODES = frozenset({"server_error", "rate_limit_exceeded", "overloaded_error", "api_error"})


def _raise_stream_error(chunk: dict[str, Any], data: str) -> None:
    """Fail on an error object sent inside a 200 stream (OpenAI, OpenRouter, LiteLLM, vLLM shapes).

    Retryable when its code or type names a transient server condition (``server_error``,
    ``rate_limit_exceeded``, ``overloaded_error``, ``api_error``); the stream is then sent again
    (:class:`roost.engines._http.RetryPolicy`).
    """
    error = chunk.get("error")
    if error is None and chunk.get("object") == "error":
        error = chunk
    if isinstance(error, dict):
        message = error.get("message") or data[:200]
        code = error.get("code") or error.get("type")
    else:
        message, code = str(error), None
    text = str(message)
    category = "context_length" if "context" in text.lower() and "length" in text.lower() else "provider"
    raise EngineFailure(
        f"openai: the server sent an error inside the stream: {text}",
        category=category,
        retryable=code in _TRANSIENT_CODES,
        provider_code=str(code) if code is not None else "stream_error",
    )


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
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
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

    def _parser(self, request: EngineRequest) -> ChatCompletionsParser:
        return ChatCompletionsParser(CallIds(request.history))
