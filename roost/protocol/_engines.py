"""Which engine serves a thread: the process's provider settings, refined by the thread's selection."""

from __future__ import annotations

from typing import Any

import attrs

from roost.config import resolve_provider
from roost.engines import ProviderSettings, open_engine
from roost.errors import ConfigError, InvalidParams

__all__ = ["EngineCatalog"]


class EngineCatalog:
    """Opens (and caches) one engine per (provider, model) selection.

    Args:
        default: the resolved default settings, or None when nothing is configured.
        setup_error: why ``default`` is None (shown to clients as ``needs_setup``).
        pacing: scripted engine pacing (False for benchmarks).
    """

    def __init__(self, default: ProviderSettings | None, *, setup_error: str | None = None,
                 pacing: bool = True) -> None:
        self.default = default
        self.setup_error = setup_error
        self.pacing = pacing
        self._engines: dict[tuple, Any] = {}
        if default is not None and default.provider == "scripted":
            try:  # a missing or invalid script is a setup problem, reported before any turn
                self.engine_for(None)
            except InvalidParams as exc:
                self.default, self.setup_error = None, f"the scripted engine's script is unusable: {exc}"

    def settings_for(self, thread: Any) -> ProviderSettings:
        """The settings a thread's turns use.

        Raises:
            InvalidParams: no provider is configured (the message names the settings), or the
                thread's provider cannot be resolved.
        """
        provider = getattr(thread, "provider", None)
        model = getattr(thread, "model", None)
        if self.default is not None and provider in (None, self.default.provider):
            return attrs.evolve(self.default, model=model or self.default.model)
        if provider is None:
            raise InvalidParams(self.setup_error or "no model provider is configured")
        try:
            return resolve_provider(provider=provider, model=model)
        except ConfigError as exc:
            raise InvalidParams(str(exc)) from None

    def engine_for(self, thread: Any) -> Any:
        settings = self.settings_for(thread)
        key = (settings.provider, settings.base_url, settings.model, settings.script)
        engine = self._engines.get(key)
        if engine is None:
            try:
                engine = self._engines[key] = open_engine(settings, pacing=self.pacing)
            except ConfigError as exc:
                raise InvalidParams(str(exc)) from None
        return engine

    async def aclose(self) -> None:
        for engine in self._engines.values():
            try:
                await engine.aclose()
            except Exception:
                pass
        self._engines.clear()
