"""Provider settings: which engine to open and how to reach it."""

from __future__ import annotations

import attrs

__all__ = ["PROVIDERS", "DEFAULT_BASE_URLS", "DEFAULT_KEY_ENVS", "ProviderSettings"]

#: Provider names accepted by ``--provider`` / ``ROOST_PROVIDER`` / ``[provider] name``.
PROVIDERS = ("scripted", "openai", "openai-responses", "anthropic")

#: Base URL used when none is configured.
DEFAULT_BASE_URLS = {
    "openai": "https://api.openai.com/v1",
    "openai-responses": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
}

#: Environment variable holding the API key when ``--api-key-env`` is not given.
DEFAULT_KEY_ENVS = {
    "openai": "OPENAI_API_KEY",
    "openai-responses": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}


@attrs.frozen(kw_only=True)
class ProviderSettings:
    """A resolved provider selection (see :func:`roost.config.resolve_provider`).

    Attributes:
        provider: one of :data:`PROVIDERS`.
        base_url: the HTTP base URL (``None`` for scripted).
        model: default model id, or ``None``.
        script: scripted engine: a script path or built-in name (``"demo"``).
        api_key: the API key (never printed in ``repr``), or ``None``.
        api_key_env: the environment variable the key came from.
        headers: extra HTTP headers sent with every request.
        connect_timeout: seconds to establish a connection.
        read_timeout: seconds to wait for the next bytes of a response.
        max_attempts: attempts per model call (1 = no retries), before the stream starts and
            after partial output (:class:`roost.engines._http.RetryPolicy`).
        source: where the provider choice came from (``"flag"``, ``"env"``, ``"file"``,
            ``"default"``), for diagnostics.
        images: the model takes image input (``[provider] images = false`` in config.toml says it
            does not: a message with images is then refused before it is sent).
    """

    provider: str = attrs.field(validator=attrs.validators.in_(PROVIDERS))
    base_url: str | None = None
    model: str | None = None
    script: str | None = None
    api_key: str | None = attrs.field(default=None, repr=False)
    api_key_env: str | None = None
    headers: dict[str, str] = attrs.field(factory=dict)
    connect_timeout: float = 10.0
    read_timeout: float = 300.0
    max_attempts: int = 4
    source: str = "flag"
    images: bool = True

    def describe(self) -> dict:
        """Return a JSON-ready summary without the API key (for ``engine/list`` and logs)."""
        return {
            "provider": self.provider,
            "base_url": self.base_url,
            "model": self.model,
            "script": self.script,
            "api_key_env": self.api_key_env,
            "api_key_set": self.api_key is not None,
            "source": self.source,
        }
