"""Opening an engine from resolved provider settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

from roost.engines._settings import ProviderSettings
from roost.engines._types import Engine

if TYPE_CHECKING:
    import httpx

    from roost.engines._http import RetryPolicy

__all__ = ["open_engine"]


def open_engine(
    settings: ProviderSettings,
    *,
    client: httpx.AsyncClient | None = None,
    retry: RetryPolicy | None = None,
    pacing: bool = True,
) -> Engine:
    """Return the engine for ``settings`` (no I/O; an HTTP engine connects on first use).

    Only the chosen engine's module is imported (the HTTP adapters import httpx, the scripted
    engine PyYAML): start-up time is a goal (issue 19).

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
        from roost.engines._scripted import ScriptedEngine, load_script

        script = load_script(settings.script or "demo")
        return ScriptedEngine(script, pacing=pacing, model=settings.model)
    if settings.provider == "openai":
        from roost.engines._openai_chat import OpenAIChatEngine

        return OpenAIChatEngine(settings, client=client, retry=retry)
    if settings.provider == "openai-responses":
        from roost.engines._openai_responses import OpenAIResponsesEngine

        return OpenAIResponsesEngine(settings, client=client, retry=retry)
    if settings.provider == "anthropic":
        from roost.engines._anthropic import AnthropicEngine

        return AnthropicEngine(settings, client=client, retry=retry)
    raise KeyError(settings.provider)
