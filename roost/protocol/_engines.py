"""Which engine serves a thread: the process's provider settings, refined by the thread's selection."""

from __future__ import annotations

import logging
from typing import Any

import attrs

from roost.config import derive_provider, resolve_provider
from roost.engines import ProviderSettings
from roost.errors import ConfigError, InvalidParams, RoostError

log = logging.getLogger("roost.protocol")

__all__ = ["EngineCatalog"]


class EngineCatalog:
    """Opens (and caches) one engine per (provider, model) selection.

    Args:
        default: the resolved default settings, or None when nothing is configured.
        setup_error: why ``default`` is None (shown to clients as ``needs_setup``).
        pacing: scripted engine pacing (False for benchmarks).
        resolve_options: extra keyword arguments of :func:`roost.config.resolve_provider` for the
            providers a thread selects (``env``, ``config_path``: hosted mode reads only its
            ``--config`` file and no ambient provider variables).

    Attributes:
        config_error: set by the configuration reload (``roost.protocol._as_reload``) while the
            edited configuration file is rejected: ``default`` stays for display, but no turn
            may execute on it (:meth:`settings_for` raises) until the file is repaired.
    """

    def __init__(
        self,
        default: ProviderSettings | None,
        *,
        setup_error: str | None = None,
        pacing: bool = True,
        resolve_options: dict[str, Any] | None = None,
    ) -> None:
        self.default = default
        self.setup_error = setup_error
        self.pacing = pacing
        self.resolve_options: dict[str, Any] = dict(resolve_options or {})
        self.config_error: str | None = None
        self._engines: dict[tuple, Any] = {}
        if default is not None and default.provider == "scripted":
            try:  # a missing or invalid script is a setup problem, reported before any turn
                self.engine_for(None)
            except InvalidParams as exc:
                self.default, self.setup_error = None, f"the scripted engine's script is unusable: {exc}"

    def settings_for(self, thread: Any, *, origin: str = "the thread's") -> ProviderSettings:
        """The settings a thread's turns use (``origin``: where the thread's provider and model
        came from, as an error names it, e.g. ``the thread/start param``).

        Raises:
            InvalidParams: no provider is configured (the message names the settings), the
                thread's provider cannot be resolved, or the configuration file is rejected.
        """
        self.check_config()
        provider = getattr(thread, "provider", None)
        model = getattr(thread, "model", None)
        if self.default is not None and provider in (None, self.default.provider):
            return attrs.evolve(self.default, model=model or self.default.model)
        if provider is None:
            raise InvalidParams(self.setup_error or "no model provider is configured")
        try:
            return resolve_provider(provider=provider, model=model, flags_from=origin, **self.resolve_options)
        except ConfigError as exc:
            raise InvalidParams(str(exc)) from None

    def image_refusal(self, thread: Any) -> str | None:
        """Why ``thread``'s model cannot take images (``[provider] images = false``), or None
        when it can (or its provider cannot be resolved: the turn then reports that itself)."""
        try:
            settings = self.settings_for(thread)
        except RoostError as exc:  # the turn reports an unusable provider itself
            log.debug("image check skipped: %s", exc)
            return None
        if settings.images:
            return None
        return (
            f"the model {settings.model or settings.provider!r} (provider {settings.provider}) does not take "
            "images ([provider] images = false in config.toml); send the message without images"
        )

    def check_config(self) -> None:
        """Refuse execution and configuration mutations while the configuration file is rejected.

        app-server-protocol.md ("Transport and initialization"): the previous inventory stays
        for display; it is not a fallback for mutations or execution validation.

        Raises:
            InvalidParams: :attr:`config_error` is set (the message says why and how to recover).
        """
        if self.config_error is not None:
            raise InvalidParams(f"the configuration file was rejected and must be repaired first: {self.config_error}")

    def engine_for(self, thread: Any) -> Any:
        """The engine of ``thread``'s turns (opened once per selection).

        Raises:
            InvalidParams: see :meth:`settings_for`, or the engine cannot be opened.
        """
        return self.engine_for_settings(self.settings_for(thread))

    def settings_for_model(
        self,
        *,
        provider: str | None = None,
        endpoint: str | None = None,
        model: str | None = None,
        api_key_env: str | None = None,
    ) -> ProviderSettings:
        """Settings for an orchestration model alias, derived from the default (see
        :func:`roost.config.derive_provider`).

        Raises:
            ConfigError: no provider, an unknown one, a missing API key, or a rejected
                configuration file.
        """
        if self.config_error is not None:
            raise ConfigError(f"the configuration file was rejected: {self.config_error}")
        if self.default is None and provider is None:
            raise ConfigError(self.setup_error or "no model provider is configured")
        return derive_provider(self.default, provider=provider, base_url=endpoint, model=model, api_key_env=api_key_env)

    def engine_for_settings(self, settings: ProviderSettings) -> Any:
        """The engine for ``settings`` (opened on first use, then shared).

        Raises:
            InvalidParams: the engine cannot be opened (e.g. an unusable script).
        """
        key = (settings.provider, settings.base_url, settings.model, settings.script, settings.api_key_env)
        engine = self._engines.get(key)
        if engine is None:
            # imports httpx or PyYAML: only when an engine opens (start-up time, issue 19)
            from roost.engines import open_engine

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
                log.debug("could not close an engine", exc_info=True)
        self._engines.clear()
