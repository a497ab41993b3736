"""Opening an engine from resolved provider settings."""

from __future__ import annotations

import httpx

from roost.engines._anthropic import AnthropicEngine
from roost.engines._http import RetryPolicy
from roost.engines._openai_chat import OpenAIChatEngine
from roost.engines._openai_responses import OpenAIResponsesEngine
from roost.engines._scripted import ScriptedEngine, load_script
from roost.engines._settings import ProviderSettings
from roost.engines._types import Engine

__all__ = ["open_engine"]

_HTTP_ENGINES = {
    "openai": OpenAIChatEngine,
    "openai-responses": OpenAIResponsesEngine,
    "anthropic": AnthropicEngine,
}


def open_engine(
    settings: ProviderSettings,
    *,
    client: httpx.AsyncClient | None = None,
    retry: RetryPolicy | None = None,
    pacing: bool = True,
) -> Engine:
    """Return the engine for ``settings`` (no I/O; an HTTP engine connects on first use).

    Args:
        settings: from :func:`roost.config.resolve_provider`.
        client: HTTP engines: a shared ``httpx.AsyncClient`` (not closed by the engine).
        retry: HTTP engines: the retry policy (default from ``settings.max_attempts``).
        pacing: scripted: honour ``tokens_per_second``/``delay`` (``False`` for benchmarks).

    Returns:
        An :class:`~roost.engines.Engine`; close it with ``await engine.aclose()``.

    Raises:
        ConfigError: scripted: the script cannot be loaded.
    """
    if settings.provider == "scripted":
        script = load_script(settings.script or "demo")
        return ScriptedEngine(script, pacing=pacing, model=settings.model)
    return _HTTP_ENGINES[settings.provider](settings, client=client, retry=retry)
