"""A small built-in directory of well-known OpenAI-compatible model services.

app-server-protocol.md ("Model and permission selection"): ``initialize.catalog_providers`` and
``config/model-catalog/providers`` list the catalog services that can be connected with an
endpoint and a key, ordered by name, each with its ``type``, ``base_url``, ``model_count`` and a
suggested ``default_model``; with ``provider`` the result holds that service alone, including its
models. Every service here speaks OpenAI Chat Completions at the documented base URL, so Roost's
``openai`` provider reaches it: set ``[provider] name = "openai"``, ``base_url`` and
``api_key_env`` in ``$ROOST_HOME/config.toml`` (Roost never stores keys sent over the protocol).

The model lists are suggestions taken from each vendor's public model documentation; the service
itself is the authority on what it serves (``engine/list`` asks the configured endpoint).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CATALOG", "catalog_providers"]

#: id -> (display name, base URL, suggested key variable, models; the first is the default).
CATALOG: dict[str, tuple[str, str, str | None, tuple[str, ...]]] = {
    "deepseek": ("DeepSeek", "https://api.deepseek.com", "DEEPSEEK_API_KEY", ("deepseek-chat", "deepseek-reasoner")),
    "fireworks": (
        "Fireworks AI",
        "https://api.fireworks.ai/inference/v1",
        "FIREWORKS_API_KEY",
        ("accounts/fireworks/models/llama-v3p3-70b-instruct", "accounts/fireworks/models/qwen2p5-coder-32b-instruct"),
    ),
    "groq": (
        "Groq",
        "https://api.groq.com/openai/v1",
        "GROQ_API_KEY",
        ("llama-3.3-70b-versatile", "llama-3.1-8b-instant"),
    ),
    "mistral": (
        "Mistral AI",
        "https://api.mistral.ai/v1",
        "MISTRAL_API_KEY",
        ("mistral-large-latest", "mistral-small-latest", "codestral-latest"),
    ),
    "moonshot": (
        "Moonshot AI (Kimi)",
        "https://api.moonshot.ai/v1",
        "MOONSHOT_API_KEY",
        ("kimi-k2-0711-preview", "moonshot-v1-8k"),
    ),
    "ollama": ("Ollama (local)", "http://localhost:11434/v1", None, ("llama3.2", "qwen2.5-coder")),
    "openrouter": (
        "OpenRouter",
        "https://openrouter.ai/api/v1",
        "OPENROUTER_API_KEY",
        ("openai/gpt-4o-mini", "anthropic/claude-3.5-sonnet", "meta-llama/llama-3.3-70b-instruct"),
    ),
    "together": (
        "Together AI",
        "https://api.together.xyz/v1",
        "TOGETHER_API_KEY",
        ("meta-llama/Llama-3.3-70B-Instruct-Turbo", "Qwen/Qwen2.5-Coder-32B-Instruct"),
    ),
    "xai": ("xAI", "https://api.x.ai/v1", "XAI_API_KEY", ("grok-2-latest",)),
}


def _entry(service_id: str, *, with_models: bool) -> dict[str, Any]:
    name, base_url, key_env, models = CATALOG[service_id]
    entry: dict[str, Any] = {
        "id": service_id,
        "name": name,
        "type": "openai",
        "base_url": base_url,
        "api_key_env": key_env,
        "model_count": len(models),
        "default_model": models[0],
    }
    if with_models:
        entry["models"] = [{"id": m, "default": i == 0} for i, m in enumerate(models)]
    return entry


def catalog_providers(provider: str | None = None) -> list[dict[str, Any]]:
    """The directory ordered by name, without model lists; or ``[service]`` with its models.

    Args:
        provider: a service id (``deepseek``, ``groq``...), or None for all.

    Raises:
        KeyError: ``provider`` is not in the directory.
    """
    if provider is not None:
        if provider not in CATALOG:
            raise KeyError(provider)
        return [_entry(provider, with_models=True)]
    return [_entry(s, with_models=False) for s in sorted(CATALOG, key=lambda s: CATALOG[s][0].lower())]
