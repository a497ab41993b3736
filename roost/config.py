"""Settings: provider selection from flags, the environment and ``$ROOST_HOME/config.toml``.

Precedence, for each setting separately: command-line flag, then environment variable, then the
``[provider]`` table of the config file::

    [provider]
    name = "openai"                 # scripted | openai | openai-responses | anthropic
    base_url = "http://localhost:11434/v1"
    model = "llama3.2"
    script = "demo"                 # scripted: a path or a built-in script name
    api_key_env = "OPENAI_API_KEY"  # the variable holding the key (never the key itself)
    connect_timeout = 10.0          # seconds
    read_timeout = 300.0            # seconds
    max_attempts = 4
    [provider.headers]
    "X-Team" = "research"

Environment: ``ROOST_PROVIDER``, ``ROOST_BASE_URL``, ``ROOST_MODEL``, ``ROOST_SCRIPT``,
``ROOST_API_KEY_ENV``; keys come from ``OPENAI_API_KEY`` / ``ANTHROPIC_API_KEY`` unless
``--api-key-env NAME`` (or ``api_key_env``) names another variable.

The scripted engine is never chosen silently: with no provider configured, :func:`resolve_provider`
raises :class:`ConfigError` naming these settings, unless the caller passes
``allow_scripted_default=True`` (only ``roost demo`` does).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from roost._paths import config_path as default_config_path
from roost.engines import DEFAULT_BASE_URLS, DEFAULT_KEY_ENVS, PROVIDERS, ProviderSettings
from roost.errors import ConfigError

__all__ = [
    "ProviderSettings",
    "resolve_provider",
    "derive_provider",
    "load_config",
    "parse_config",
    "check_config",
    "SETUP_HINT",
    "PROVIDER_ENV_VARS",
    "configured_mcp_servers",
]

#: What to tell a user who has configured no provider.
SETUP_HINT = (
    "no model provider is configured. Choose one with --provider "
    "(scripted|openai|openai-responses|anthropic) or ROOST_PROVIDER, or a [provider] table with "
    "name = ... in $ROOST_HOME/config.toml; set the model with --model / ROOST_MODEL, the server "
    "with --base-url / ROOST_BASE_URL, the script with --script / ROOST_SCRIPT (scripted), and the "
    "API key in OPENAI_API_KEY / ANTHROPIC_API_KEY (or the variable named by --api-key-env)"
)

_ENV = {
    "provider": "ROOST_PROVIDER",
    "base_url": "ROOST_BASE_URL",
    "model": "ROOST_MODEL",
    "script": "ROOST_SCRIPT",
    "api_key_env": "ROOST_API_KEY_ENV",
}
#: The environment variables that select a provider (hosted mode ignores them: no ambient state).
PROVIDER_ENV_VARS = tuple(_ENV.values())


def load_config(path: Path | None = None) -> dict[str, Any]:
    """Read ``config.toml`` (default ``$ROOST_HOME/config.toml``); a missing file is ``{}``.

    A file whose name ends in ``.json`` holds the same tables as a JSON object (hosted mode's
    ``--config /run/.../config.json``, app-server-protocol.md "Hosted processes").

    Raises:
        ConfigError: the file exists but is unreadable or not valid TOML (or JSON), or a JSON
            document that is not an object (the message has the path).
    """
    path = path if path is not None else default_config_path()
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return {}
    except NotADirectoryError:
        if path.parent.exists() and not path.parent.is_dir():
            from roost._paths import roost_home

            roost_home()  # a file where ROOST_HOME should be: that is the error to report
        raise ConfigError(f"cannot read {path}: its directory {path.parent} is not a directory") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return parse_config(data, path)


def parse_config(data: bytes, path: Path) -> dict[str, Any]:
    """Parse the bytes of the config file ``path`` (TOML, or JSON for a ``.json`` name).

    The document is then checked by :func:`check_config`: every reader of the file (each
    command at start-up, and ``roost app-server``'s live reload) refuses the same documents.

    Raises:
        ConfigError: not valid TOML/JSON, a JSON document that is not an object, or a document
            :func:`check_config` refuses.
    """
    if Path(path).suffix == ".json":
        import json

        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise ConfigError(f"{path} must hold a JSON object")
    else:
        import tomllib  # its parser compiles regexes on import; a home without config.toml never needs it

        try:
            doc = tomllib.loads(data.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    check_config(doc, path)
    return doc


#: The tables of the config file, and the keys of ``[provider]`` (``provider`` is read as another
#: spelling of ``name``; ``headers`` is the ``[provider.headers]`` table).
CONFIG_TABLES = ("provider", "mcp_servers")
PROVIDER_KEYS = (
    "name",
    "base_url",
    "model",
    "script",
    "api_key_env",
    "connect_timeout",
    "read_timeout",
    "max_attempts",
    "images",
    "headers",
    "provider",
)


def check_config(doc: Mapping[str, Any], path: Path) -> None:
    """Refuse a config document with a key Roost does not read, or a malformed table.

    app-server-protocol.md, "Transport and initialization": unknown configuration fields remain
    invalid (a typo such as ``modle`` would otherwise fall back to a default unnoticed). Checked:
    the top-level tables (:data:`CONFIG_TABLES`), the keys of ``[provider]``
    (:data:`PROVIDER_KEYS`), and ``[mcp_servers]`` as
    :func:`roost.plugins.mcp_servers_from_toml` parses it. The provider values themselves are
    checked by :func:`resolve_provider`.

    Raises:
        ConfigError: one message naming the first unknown key, where it is, and the known keys.
    """
    from roost.plugins import mcp_servers_from_toml

    for key, value in doc.items():
        if key not in CONFIG_TABLES:
            what = f"unknown table [{key}]" if isinstance(value, Mapping) else f"unknown top-level key {key!r}"
            raise ConfigError(f"{path}: {what} (known tables: {', '.join(f'[{t}]' for t in CONFIG_TABLES)})")
    table = doc.get("provider")
    if table is not None:
        if not isinstance(table, Mapping):
            raise ConfigError(f"[provider] in {path} must be a table")
        unknown = [str(k) for k in table if k not in PROVIDER_KEYS]
        if unknown:
            raise ConfigError(
                f"[provider] in {path}: unknown key {', '.join(map(repr, unknown))} "
                f"(known keys: {', '.join(PROVIDER_KEYS[:-1])}; provider is another spelling of name)"
            )
        _check_provider_values(table, path)
    mcp_servers_from_toml(doc)


def _check_provider_values(table: Mapping[str, Any], path: Path) -> None:
    """Refuse ``name`` and ``provider`` with different values, and a ``connect_timeout`` /
    ``read_timeout`` (seconds) or ``max_attempts`` (an integer) that is not a positive number
    (a bool is not a number; TOML's ``inf`` and ``nan`` are refused): the rule
    docs/operations.md states for the environment variables.

    Also refused, so that every reader (each command's start, ``roost app-server``'s start and
    its live reload, which sends ``config/error``) refuses the same documents: a ``base_url``, ``model``,
    ``script`` or ``api_key_env`` that is not a string, a ``headers`` table whose values are not
    all strings, and an ``images`` that is not a boolean. A ``name`` / ``provider`` that is not
    one of :data:`~roost.engines.PROVIDERS` is refused by :func:`resolve_provider` when it is the
    one used (a ``--provider`` flag or ``ROOST_PROVIDER`` wins over it, as over every file value).

    Raises:
        ConfigError: one line naming the key(s) and ``path``.
    """
    for key in ("base_url", "model", "script", "api_key_env"):
        if key in table and not isinstance(table[key], str):
            raise ConfigError(f"[provider] {key} in {path} must be a string (got {describe_toml_value(table[key])})")
    headers = table.get("headers", {})
    if not isinstance(headers, Mapping) or not all(isinstance(v, str) for v in headers.values()):
        raise ConfigError(f"[provider.headers] in {path} must map header names to strings")  # (no values: secrets)
    if "images" in table and not isinstance(table["images"], bool):
        raise ConfigError(f"[provider] images in {path} must be true or false, not {table['images']!r}")
    if "name" in table and "provider" in table and table["name"] != table["provider"]:
        raise ConfigError(
            f"[provider] in {path}: name = {table['name']!r} and provider = {table['provider']!r} "
            "disagree (provider is another spelling of name; give one)"
        )
    for key, kinds in (("connect_timeout", (int, float)), ("read_timeout", (int, float)), ("max_attempts", (int,))):
        if key not in table:
            continue
        value = table[key]
        if isinstance(value, bool) or not isinstance(value, kinds) or not 0 < value < math.inf:
            what = "a positive integer" if kinds == (int,) else "a positive finite number (seconds)"
            raise ConfigError(f"[provider] {key} in {path} must be {what} (got {describe_toml_value(value)})")


def describe_toml_value(value: Any) -> str:
    """A config value as a person reads it in an error: ``the integer 5``, ``the boolean true``,
    ``the string 'x'``, ``an array``, ``a table`` (not a Python repr such as ``True``)."""
    if isinstance(value, bool):
        return f"the boolean {'true' if value else 'false'}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    return f"a {type(value).__name__.replace('datetime', 'date-time')}"


def _check_file_provider(file_values: dict, spelled: str, path: Path) -> None:
    """Refuse the file's provider name (``[provider] name``, or its spelling ``provider``) when
    it is the one used: not a string, or not one of :data:`~roost.engines.PROVIDERS`.

    Raises:
        ConfigError: ``[provider] name in PATH must be a string (got the integer 5)`` or
            ``unknown provider 'x' ([provider] name in PATH); choose one of ...``.
    """
    if "provider" not in file_values:
        return
    value = file_values["provider"]
    if not isinstance(value, str):
        raise ConfigError(
            f"[provider] {spelled} in {path} must be a string, one of {', '.join(PROVIDERS)} "
            f"(got {describe_toml_value(value)})"
        )
    if value not in PROVIDERS:
        raise ConfigError(
            f"unknown provider {value!r} ([provider] {spelled} in {path}); choose one of {', '.join(PROVIDERS)}"
        )


def resolve_provider(
    *,
    provider: str | None = None,
    base_url: str | None = None,
    model: str | None = None,
    script: str | None = None,
    api_key_env: str | None = None,
    env: Mapping[str, str] | None = None,
    config_path: Path | None = None,
    allow_scripted_default: bool = False,
    flags_from: str | None = None,
) -> ProviderSettings:
    """Resolve the provider settings: flags, then environment, then the config file.

    Args:
        provider, base_url, model, script, api_key_env: command-line flag values (``None`` = not
            given).
        env: the environment (default ``os.environ``).
        config_path: the config file (default ``$ROOST_HOME/config.toml``).
        allow_scripted_default: with nothing configured, choose the scripted engine with the
            ``demo`` script instead of failing (``roost demo`` only).
        flags_from: where the "flag" values come from when they are no command-line flags, as
            error messages name it (e.g. ``the thread/start param``: "unknown provider 'x' (from
            the thread/start param provider)"); default: the flags (``--provider``).

    Returns:
        The :class:`ProviderSettings`, with the API key read from the environment.

    Raises:
        ConfigError: no provider is configured (the message names every setting), an unknown
            provider name, a bad ``[provider]`` table, or a missing API key where one is required
            (Anthropic, and OpenAI at its default base URL).
    """
    env = os.environ if env is None else env
    flags = {"provider": provider, "base_url": base_url, "model": model, "script": script, "api_key_env": api_key_env}
    file_values, path, spelled = _provider_table(env, config_path)
    if not (flags["provider"] or env.get(_ENV["provider"])):
        _check_file_provider(file_values, spelled, path)
    chosen, sources = _choose(flags, env, file_values)
    name = chosen.get("provider")
    if not name:
        if not allow_scripted_default:
            raise ConfigError(SETUP_HINT)
        name, sources["provider"] = "scripted", "default"
    if name not in PROVIDERS:
        raise ConfigError(
            f"unknown provider {name!r} (from {_describe_source(sources['provider'], 'provider', flags_from)}); "
            f"choose one of {', '.join(PROVIDERS)}"
        )
    headers, options = _file_options(file_values)
    if name == "scripted":
        return ProviderSettings(
            provider=name,
            model=chosen.get("model"),
            script=chosen.get("script") or "demo",
            source=sources["provider"],
            images=options.get("images", True),
        )
    key_env = chosen.get("api_key_env") or DEFAULT_KEY_ENVS[name]
    api_key = env.get(key_env) or None
    resolved_base = chosen.get("base_url") or DEFAULT_BASE_URLS[name]
    needs_key = name == "anthropic" or resolved_base == DEFAULT_BASE_URLS[name]
    if needs_key and api_key is None:
        raise ConfigError(
            f"provider {name!r} needs an API key: set {key_env} (or name another variable with "
            f"--api-key-env / ROOST_API_KEY_ENV / [provider] api_key_env)"
        )
    return ProviderSettings(
        provider=name,
        base_url=resolved_base,
        model=chosen.get("model"),
        api_key=api_key,
        api_key_env=key_env,
        headers={str(k): v for k, v in headers.items()},
        source=sources["provider"],
        **options,
    )


def _provider_table(env: Mapping[str, str], config_path: Path | None) -> tuple[dict, Path, str]:
    """``(values, path, spelled)``: the ``[provider]`` table of the config file (``name`` read as
    ``provider``), the file's path, and how the file spells the name's key (``name`` or ``provider``).

    A broken file is an error even when a flag or the environment chooses the provider: every
    command that runs agents also needs its other tables (``[mcp_servers]``), so ignoring it here
    would only print a warning before that command stops on the same file.

    Raises:
        ConfigError: the file is broken (unreadable or not valid TOML), or ``[provider]`` is not a
            table.
    """
    if config_path is None and "ROOST_HOME" in env:
        config_path = Path(env["ROOST_HOME"]).expanduser() / "config.toml"
    path = config_path if config_path is not None else default_config_path()
    table = load_config(path).get("provider", {})
    if not isinstance(table, dict):
        raise ConfigError("[provider] in config.toml must be a table")
    file_values = dict(table)
    spelled = "provider" if "provider" in file_values else "name"
    if "name" in file_values and "provider" not in file_values:
        file_values["provider"] = file_values.pop("name")
    return file_values, path, spelled


def _choose(
    flags: dict[str, str | None], env: Mapping[str, str], file_values: dict
) -> tuple[dict[str, Any], dict[str, str]]:
    """Each setting from the first of flag, environment, file that gives it: ``(values, sources)``."""
    chosen: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key, flag_value in flags.items():
        if flag_value:
            chosen[key], sources[key] = flag_value, "flag"
        elif env.get(_ENV[key]):
            chosen[key], sources[key] = env[_ENV[key]], "env"
        elif file_values.get(key):
            chosen[key], sources[key] = file_values[key], "file"
    return chosen, sources


def _file_options(file_values: dict) -> tuple[dict, dict[str, Any]]:
    """``(headers, options)`` of the ``[provider]`` table: extra HTTP headers, and the
    ``connect_timeout``/``read_timeout`` (seconds) and ``max_attempts`` numbers, and the
    ``images`` flag.

    Raises:
        ConfigError: headers that are not strings, a setting that is not a number, or an
            ``images`` that is not a boolean.
    """
    headers = file_values.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ConfigError("[provider.headers] in config.toml must map header names to strings")
    options: dict[str, Any] = {}
    for key, kind in (("connect_timeout", float), ("read_timeout", float), ("max_attempts", int)):
        if key in file_values:
            try:
                options[key] = kind(file_values[key])
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"[provider] {key} in config.toml must be a number") from exc
    if "images" in file_values:
        if not isinstance(file_values["images"], bool):
            raise ConfigError("[provider] images in config.toml must be true or false")
        options["images"] = file_values["images"]
    return headers, options


def derive_provider(
    base: ProviderSettings | None,
    *,
    provider: str | None = None,
    base_url: str | None = None,
    model: str | None = None,
    api_key_env: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ProviderSettings:
    """Settings for one agent's model (an orchestration ``Models`` alias), derived from the run's.

    What the alias leaves out comes from ``base`` when it names the same provider (its base URL,
    key, headers and timeouts), else from the provider's defaults. The scripted engine keeps the
    run's script and ignores ``base_url`` and keys.

    Args:
        base: the run's resolved settings, or None when no provider is configured.
        provider, base_url, model, api_key_env: the alias's ``Provider``, ``Endpoint``,
            ``ModelId`` and ``ApiKeyEnv`` (None: not given).
        env: the environment (default ``os.environ``) for the API key.

    Raises:
        ConfigError: no provider (neither the alias nor the run names one), an unknown
            provider, or a missing API key where one is required.
    """
    env = os.environ if env is None else env
    name = provider or (base.provider if base is not None else None)
    if name is None:
        raise ConfigError(SETUP_HINT)
    if name not in PROVIDERS:
        raise ConfigError(f"unknown provider {name!r}; choose one of {', '.join(PROVIDERS)}")
    same = base is not None and base.provider == name
    if not same or base is None:
        base = ProviderSettings(provider=name)  # nothing of another provider's settings is kept
    if name == "scripted":
        script = base.script if same else "demo"
        return ProviderSettings(
            provider=name, model=model or (base.model if same else None), script=script, source="config"
        )
    if same and base_url is None and api_key_env is None:
        return attrs.evolve(base, model=model or base.model)
    key_env = api_key_env or (base.api_key_env if same else None) or DEFAULT_KEY_ENVS[name]
    resolved_base = base_url or (base.base_url if same else None) or DEFAULT_BASE_URLS[name]
    api_key = env.get(key_env) or None
    if api_key is None and (name == "anthropic" or resolved_base == DEFAULT_BASE_URLS[name]):
        raise ConfigError(f"provider {name!r} needs an API key: set {key_env}")
    options: dict[str, Any] = {}
    if same:
        options = {
            "headers": dict(base.headers),
            "connect_timeout": base.connect_timeout,
            "read_timeout": base.read_timeout,
            "max_attempts": base.max_attempts,
        }
    return ProviderSettings(
        provider=name,
        base_url=resolved_base,
        model=model or (base.model if same else None),
        api_key=api_key,
        api_key_env=key_env,
        source="config",
        **options,
    )


def _describe_source(source: str, key: str, flags_from: str | None = None) -> str:
    if source == "flag":
        return f"{flags_from} {key}" if flags_from else f"--{key.replace('_', '-')}"
    if source == "env":
        return _ENV[key]
    return "[provider] in config.toml"


def configured_mcp_servers(config_path: Path | None = None) -> list[Any]:
    """The MCP servers of the ``[mcp_servers]`` table of ``config.toml`` (docs/operations.md).

    Args:
        config_path: the config file (default ``$ROOST_HOME/config.toml``).

    Returns:
        :class:`roost.plugins.McpServerConfig` items, in file order (empty without the table).

    Raises:
        ConfigError: the file or the table is malformed (the message names the table and key).
    """
    config = load_config(config_path)
    if config.get("mcp_servers") is None:
        return []  # no table: roost.plugins (attrs classes, regexes) need not load (issue 19)
    from roost.plugins import mcp_servers_from_toml

    return mcp_servers_from_toml(config)
