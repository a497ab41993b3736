"""Model engines: the scripted default and the OpenAI Chat, OpenAI Responses and Anthropic adapters.

An engine turns an :class:`EngineRequest` into a stream of normalized events::

    async with engine.stream(request) as events:
        async for event in events:
            ...   # TextDelta, ReasoningDelta, ToolCallStart/Delta/End, Usage, Finish

Failures are raised as :class:`roost.errors.EngineFailure` (category ``network``, ``auth``,
``rate_limit``, ``provider``, ``invalid_request``, ``context_length`` or ``cancelled``; retryable;
provider code; HTTP status; the partial text; and the recovery facts of app-server-protocol.md).
Leaving the ``stream`` context (also by cancellation) closes the HTTP stream at once.

Layout: ``_types`` (request, history, events), ``_settings`` (ProviderSettings), ``_history``
(tool-result pairing, call ids, argument parsing), ``_sse`` (event-stream framing), ``_http``
(streaming, retries, error mapping, connection reuse),
``_openai_chat``, ``_openai_responses``, ``_anthropic`` (sans-IO parsers + adapters),
``_scripted`` (the deterministic engine; ``scripts/demo.yaml``, shipped parsed as ``demo.json``),
``_factory`` (open_engine).
This room never imports ``roost.actors``, ``roost.protocol`` or ``roost.storage``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roost._lazy import attach as _attach
from roost.engines._settings import DEFAULT_BASE_URLS as DEFAULT_BASE_URLS
from roost.engines._settings import DEFAULT_KEY_ENVS as DEFAULT_KEY_ENVS
from roost.engines._settings import PROVIDERS as PROVIDERS
from roost.engines._settings import ProviderSettings as ProviderSettings
from roost.errors import EngineFailure as EngineFailure

if TYPE_CHECKING:
    from roost.engines._anthropic import AnthropicEngine as AnthropicEngine
    from roost.engines._anthropic import AnthropicParser as AnthropicParser
    from roost.engines._factory import open_engine as open_engine
    from roost.engines._history import INTERRUPTED_OUTPUT as INTERRUPTED_OUTPUT
    from roost.engines._history import new_call_id as new_call_id
    from roost.engines._history import pair_tool_results as pair_tool_results
    from roost.engines._history import parse_arguments as parse_arguments
    from roost.engines._http import HttpEngine as HttpEngine
    from roost.engines._http import RetryPolicy as RetryPolicy
    from roost.engines._openai_chat import ChatCompletionsParser as ChatCompletionsParser
    from roost.engines._openai_chat import OpenAIChatEngine as OpenAIChatEngine
    from roost.engines._openai_responses import OpenAIResponsesEngine as OpenAIResponsesEngine
    from roost.engines._openai_responses import ResponsesParser as ResponsesParser
    from roost.engines._scripted import Script as Script
    from roost.engines._scripted import ScriptedEngine as ScriptedEngine
    from roost.engines._scripted import builtin_scripts as builtin_scripts
    from roost.engines._scripted import load_script as load_script
    from roost.engines._scripted import parse_script as parse_script
    from roost.engines._scripted import split_deltas as split_deltas
    from roost.engines._types import DOCUMENT_TYPES as DOCUMENT_TYPES
    from roost.engines._types import FINISH_REASONS as FINISH_REASONS
    from roost.engines._types import AgentMessage as AgentMessage
    from roost.engines._types import Document as Document
    from roost.engines._types import Engine as Engine
    from roost.engines._types import EngineEvent as EngineEvent
    from roost.engines._types import EngineRequest as EngineRequest
    from roost.engines._types import Finish as Finish
    from roost.engines._types import HistoryItem as HistoryItem
    from roost.engines._types import Image as Image
    from roost.engines._types import ModelInfo as ModelInfo
    from roost.engines._types import Reasoning as Reasoning
    from roost.engines._types import ReasoningDelta as ReasoningDelta
    from roost.engines._types import ReasoningItems as ReasoningItems
    from roost.engines._types import Retrying as Retrying
    from roost.engines._types import TextDelta as TextDelta
    from roost.engines._types import ToolCall as ToolCall
    from roost.engines._types import ToolCallDelta as ToolCallDelta
    from roost.engines._types import ToolCallEnd as ToolCallEnd
    from roost.engines._types import ToolCallStart as ToolCallStart
    from roost.engines._types import ToolResult as ToolResult
    from roost.engines._types import ToolSchema as ToolSchema
    from roost.engines._types import Usage as Usage
    from roost.engines._types import UserMessage as UserMessage

#: Every export but the provider settings is loaded on first access (PEP 562): the HTTP adapters
#: import httpx, the scripted engine its script parser, and the request, history and event types
#: are some twenty attrs classes (a few ms of class creation) that ``roost app-server`` on an HTTP
#: provider needs only after it has answered ``initialize`` (issue 19), and that ``roost.config``
#: (which only needs the settings) never needs.
_LAZY = {
    "INTERRUPTED_OUTPUT": "roost.engines._history",
    "new_call_id": "roost.engines._history",
    "pair_tool_results": "roost.engines._history",
    "parse_arguments": "roost.engines._history",
    "DOCUMENT_TYPES": "roost.engines._types",
    "FINISH_REASONS": "roost.engines._types",
    "AgentMessage": "roost.engines._types",
    "Document": "roost.engines._types",
    "Engine": "roost.engines._types",
    "EngineEvent": "roost.engines._types",
    "EngineRequest": "roost.engines._types",
    "Finish": "roost.engines._types",
    "HistoryItem": "roost.engines._types",
    "Image": "roost.engines._types",
    "ModelInfo": "roost.engines._types",
    "Reasoning": "roost.engines._types",
    "ReasoningDelta": "roost.engines._types",
    "ReasoningItems": "roost.engines._types",
    "Retrying": "roost.engines._types",
    "TextDelta": "roost.engines._types",
    "ToolCall": "roost.engines._types",
    "ToolCallDelta": "roost.engines._types",
    "ToolCallEnd": "roost.engines._types",
    "ToolCallStart": "roost.engines._types",
    "ToolResult": "roost.engines._types",
    "ToolSchema": "roost.engines._types",
    "Usage": "roost.engines._types",
    "UserMessage": "roost.engines._types",
    "AnthropicEngine": "roost.engines._anthropic",
    "AnthropicParser": "roost.engines._anthropic",
    "open_engine": "roost.engines._factory",
    "HttpEngine": "roost.engines._http",
    "RetryPolicy": "roost.engines._http",
    "ChatCompletionsParser": "roost.engines._openai_chat",
    "OpenAIChatEngine": "roost.engines._openai_chat",
    "OpenAIResponsesEngine": "roost.engines._openai_responses",
    "ResponsesParser": "roost.engines._openai_responses",
    "Script": "roost.engines._scripted",
    "ScriptedEngine": "roost.engines._scripted",
    "builtin_scripts": "roost.engines._scripted",
    "load_script": "roost.engines._scripted",
    "parse_script": "roost.engines._scripted",
    "split_deltas": "roost.engines._scripted",
}

__all__ = [
    "AgentMessage",
    "AnthropicEngine",
    "AnthropicParser",
    "ChatCompletionsParser",
    "DEFAULT_BASE_URLS",
    "DEFAULT_KEY_ENVS",
    "Engine",
    "EngineEvent",
    "EngineFailure",
    "EngineRequest",
    "FINISH_REASONS",
    "Finish",
    "HistoryItem",
    "HttpEngine",
    "INTERRUPTED_OUTPUT",
    "Image",
    "Document",
    "DOCUMENT_TYPES",
    "ModelInfo",
    "OpenAIChatEngine",
    "OpenAIResponsesEngine",
    "PROVIDERS",
    "ProviderSettings",
    "Reasoning",
    "ReasoningDelta",
    "ReasoningItems",
    "ResponsesParser",
    "RetryPolicy",
    "Script",
    "ScriptedEngine",
    "TextDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallEnd",
    "ToolCallStart",
    "ToolResult",
    "ToolSchema",
    "Usage",
    "Retrying",
    "UserMessage",
    "builtin_scripts",
    "load_script",
    "open_engine",
    "pair_tool_results",
    "parse_arguments",
    "new_call_id",
    "parse_script",
    "split_deltas",
]


def _fix_module_metadata(names: list[str]) -> None:
    import attrs

    for name in names:
        obj = globals()[name]
        if not getattr(obj, "__module__", "").startswith("roost.engines._"):
            continue
        if isinstance(obj, type) and attrs.has(obj):
            attrs.resolve_types(obj)  # resolve string annotations before __module__ changes
        if isinstance(obj, type) or callable(obj):
            obj.__module__ = __name__


__getattr__, __dir__ = _attach(globals(), _LAZY, on_load=_fix_module_metadata)
_fix_module_metadata([n for n in __all__ if n not in _LAZY])
