"""The model-selection options shared by every command that runs a model."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import click

from roost.config import resolve_provider
from roost.engines import PROVIDERS, ProviderSettings

__all__ = ["EngineFlags", "engine_options"]

F = TypeVar("F", bound=Callable[..., Any])


@attrs.frozen(kw_only=True)
class EngineFlags:
    """The values of ``--provider/--base-url/--model/--script/--api-key-env`` (``None`` = not given)."""

    provider: str | None = None
    base_url: str | None = None
    model: str | None = None
    script: str | None = None
    api_key_env: str | None = None

    def resolve(self, *, allow_scripted_default: bool = False, **kwargs: Any) -> ProviderSettings:
        """Resolve with :func:`roost.config.resolve_provider` (flags, then env, then config.toml).

        Raises:
            ConfigError: nothing configured (names the settings), or an invalid setting.
        """
        return resolve_provider(**attrs.asdict(self), allow_scripted_default=allow_scripted_default, **kwargs)


def engine_options(command: F) -> F:
    """Add the model-selection options to a click command.

    The command receives them collapsed into one keyword argument ``engine_flags``
    (:class:`EngineFlags`); call ``engine_flags.resolve()`` to get :class:`ProviderSettings`.
    Environment variables and the config file are applied by ``resolve``, not by click, so the
    precedence flags > environment > file holds in one place.
    """

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from roost._paths import roost_home

        # An unusable ROOST_HOME is the first thing to say (``roost CMD: error: ROOST_HOME ...``,
        # exit 2, by the group's handler), before its config.toml is read for the provider.
        roost_home()
        flags = EngineFlags(
            provider=kwargs.pop("provider"),
            base_url=kwargs.pop("base_url"),
            model=kwargs.pop("model"),
            script=kwargs.pop("script"),
            api_key_env=kwargs.pop("api_key_env"),
        )
        return command(*args, engine_flags=flags, **kwargs)

    options = [
        click.option(
            "--provider",
            type=click.Choice(PROVIDERS),
            default=None,
            help="Model provider (env ROOST_PROVIDER; config.toml [provider] name).",
        ),
        click.option("--base-url", metavar="URL", default=None, help="Provider base URL (env ROOST_BASE_URL)."),
        click.option("--model", metavar="ID", default=None, help="Model id (env ROOST_MODEL)."),
        click.option(
            "--script",
            metavar="PATH",
            default=None,
            help="Scripted provider: a YAML/JSON script or a built-in name such as 'demo' (env ROOST_SCRIPT).",
        ),
        click.option(
            "--api-key-env",
            metavar="NAME",
            default=None,
            help="Environment variable holding the API key (default OPENAI_API_KEY / ANTHROPIC_API_KEY).",
        ),
    ]
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]
