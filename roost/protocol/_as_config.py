"""App-server configuration and engine methods (app-server-protocol.md, "Model and permission
selection", "Engine inventory and authentication"): ``config/model/update`` and ``engine/list``.

Roost has one engine, the built-in one, reaching the configured model provider (scripted, OpenAI
Chat Completions, OpenAI Responses, Anthropic Messages). External engines (Codex, Claude Code,
OpenCode, ACP agents) are listed as unsupported; provider connections and API keys are configured
in ``$ROOST_HOME/config.toml`` or the environment, never over the protocol.
"""

from __future__ import annotations

from typing import Any

import attrs

from roost.actors import UpdateThread
from roost.config import resolve_provider
from roost.engines import PROVIDERS
from roost.errors import ConfigError, InvalidParams, Unsupported
from roost.model import Thread
from roost.protocol._appserver import AppServerSession, method
from roost.protocol._as_common import PERMISSION_MODES, check_no_foreign_lease, thread_actor
from roost.protocol._params import BOOL, DICT, STR, check_params

__all__ = ["EXTERNAL_ENGINES", "PERMISSION_MODE_ROWS", "provider_inventory"]

#: External engines of app-server-protocol.md that Roost reports as unsupported.
EXTERNAL_ENGINES = ("codex", "claude", "opencode", "acp")
#: engine/list ``permission_modes``: the composer access menu as rows ``{id, label}`` (the built-in
#: engine has no native mode ids, so ``native_id`` is absent).
PERMISSION_MODE_ROWS = (
    {"id": "standard", "label": "Standard"},
    {"id": "read_only", "label": "Read only"},
    {"id": "unconfined", "label": "Unconfined"},
)
_CONNECTION = ("base_url", "api_key", "keep_selection", "add_model", "remove_model")


def _check_selection(p: dict) -> None:
    if "permission_mode" in p and p["permission_mode"] not in PERMISSION_MODES:
        raise InvalidParams(f"permission_mode must be one of {', '.join(PERMISSION_MODES)}")
    if "provider" in p and p["provider"] not in PROVIDERS:
        raise InvalidParams(f"provider must be one of {', '.join(PROVIDERS)}")
    for key in ("model", "effort"):
        if key in p and not p[key].strip():
            raise InvalidParams(f"{key} must not be empty")
    options = p.get("model_options")
    if options is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in options.items()):
        raise InvalidParams("model_options must map strings to strings")
    if "variant" in p:
        raise Unsupported("variant is an OpenCode selection; Roost's engine has no variants")


@method("config/model/update")
async def config_model_update(session: AppServerSession, params: Any) -> dict:
    """``config/model/update``: change a conversation's selection, or the workspace defaults.

    With ``thread_id`` (conversation scope): ``provider``, ``model``, ``effort``,
    ``permission_mode``, ``model_options`` and ``reset_model`` change that thread only; omitted
    fields keep its selection; changing ``model`` clears the dependent ``effort`` and
    ``model_options`` unless they are given too; ``reset_model`` clears model, effort and options
    first. Emits thread/updated. Result ``{thread, model}`` (``model``: the workspace summary).

    Without ``thread_id`` (workspace scope): ``model`` is required; ``provider``, ``effort`` and
    ``permission_mode`` become defaults for conversations started later in this server; existing
    conversations keep theirs. Result ``{model, model_aliases, defaults}``.

    Raises:
        ThreadBusy: the thread is executing (here, or under another process's lease).
        InvalidParams: bad values, nothing to change, or connection fields with ``thread_id``.
        Unsupported: provider connection changes (``base_url``, ``api_key``...), ``variant``.
    """
    p = check_params(
        "config/model/update",
        params,
        {
            "thread_id": (STR, False),
            "provider": (STR, False),
            "model": (STR, False),
            "effort": (STR, False),
            "permission_mode": (STR, False),
            "reset_model": (BOOL, False),
            "model_options": (DICT, False),
            "base_url": (STR, False),
            "api_key": (STR, False),
            "keep_selection": (BOOL, False),
            "variant": (STR, False),
            "add_model": (STR, False),
            "remove_model": (STR, False),
        },
    )
    connection = [k for k in _CONNECTION if k in p]
    if "thread_id" in p and connection:
        raise InvalidParams(
            "provider connection changes belong to workspace configuration; "
            "send them without thread_id (a request combining both is rejected)"
        )
    _check_selection(p)
    session.engines.check_config()  # no mutation on top of a rejected configuration file
    if "thread_id" in p:
        return await _update_thread(session, p)
    if connection:
        raise Unsupported(
            "provider connections are configured in $ROOST_HOME/config.toml or the environment; "
            "Roost does not store API keys or endpoints sent over the protocol"
        )
    return _update_workspace(session, p)


async def _update_thread(session: AppServerSession, p: dict) -> dict:
    actor = await thread_actor(session, p["thread_id"])
    thread = actor.facts().thread
    changes: dict = {}
    metadata = dict(thread.metadata or {})
    if p.get("reset_model") or ("model" in p and p["model"] != thread.model):
        changes.update(model=None, effort=None)
        metadata.pop("model_options", None)
    for key in ("provider", "model", "effort", "permission_mode"):
        if key in p:
            changes[key] = p[key]
    if "model_options" in p:
        metadata["model_options"] = dict(p["model_options"])
    if metadata != (thread.metadata or {}):
        changes["metadata"] = metadata
    if not changes and not p.get("reset_model"):
        raise InvalidParams(
            "nothing to change: give model, provider, effort, permission_mode, model_options or reset_model"
        )
    if "provider" in changes or "model" in changes:
        probe = Thread(
            id=thread.id, provider=changes.get("provider", thread.provider), model=changes.get("model", thread.model)
        )
        # InvalidParams when that provider cannot be reached
        session.engines.settings_for(probe, origin="the config/model/update param")
    await check_no_foreign_lease(session, thread.id)
    view = await actor.ref.ask(UpdateThread(changes=changes, selection=True))
    return {"thread": view, "model": _workspace_model(session)}


def _update_workspace(session: AppServerSession, p: dict) -> dict:
    if p.get("reset_model"):
        raise InvalidParams("reset_model applies to a conversation: send it with thread_id")
    if "model_options" in p:
        raise InvalidParams("model_options is a conversation selection: send it with thread_id")
    if "model" not in p:
        raise InvalidParams("model is required for a workspace update")
    current = session.settings
    provider = p.get("provider") or (current.provider if current else None)
    if provider is None:
        raise InvalidParams(session.setup_issues[0] if session.setup_issues else "no provider is configured")
    if current is not None and provider == current.provider:
        settings = attrs.evolve(current, model=p["model"])
    else:
        try:
            settings = resolve_provider(
                provider=provider,
                model=p["model"],
                flags_from="the config/model/update param",
                **session.engines.resolve_options,
            )
        except ConfigError as exc:
            raise InvalidParams(str(exc)) from None
    session.settings = settings
    session.engines.default = settings
    session.engines.setup_error = None
    session.setup_issues = []
    defaults = dict(getattr(session, "workspace_defaults", None) or {})
    for key in ("effort", "permission_mode"):
        if key in p:
            defaults[key] = p[key]
    session.workspace_defaults = defaults
    return {"model": _workspace_model(session), "model_aliases": {}, "defaults": defaults}


def _workspace_model(session: AppServerSession) -> dict | None:
    return session.settings.describe() if session.settings is not None else None


def provider_inventory(session: AppServerSession) -> list[dict]:
    """Every provider Roost can reach, the configured default first, with its availability.

    Each entry: ``{id, default, available, provider, base_url, model, ...}`` or, when the
    provider cannot be resolved, ``{id, default: false, available: false, provider, error}``.
    """
    current = session.settings
    out = []
    if current is not None:
        out.append({"id": current.provider, "default": True, "available": True, **current.describe()})
    for name in PROVIDERS:
        if current is not None and name == current.provider:
            continue
        try:
            settings = resolve_provider(provider=name, **session.engines.resolve_options)
        except ConfigError as exc:
            out.append({"id": name, "default": False, "available": False, "provider": name, "error": str(exc)})
        else:
            out.append({"id": name, "default": False, "available": True, **settings.describe()})
    return out


@method("engine/list")
async def engine_list(session: AppServerSession, params: Any) -> dict:
    """``engine/list``: the built-in engine (its providers and models) and unsupported external ones.

    ``include_models: false`` skips model discovery (``models_status: "deferred"``);
    ``include_quota`` is unsupported (Roost has no subscription adapters).
    Result ``{engines, settings}``.
    """
    p = check_params(
        "engine/list",
        params,
        {
            "cwd": (STR, False),
            "refresh_models": (BOOL, False),
            "include_models": (BOOL, False),
            "include_quota": (BOOL, False),
            "include_activity": (BOOL, False),
        },
    )
    if p.get("include_quota"):
        raise Unsupported("subscription quota adapters are not part of Roost")
    entry: dict = {
        "id": "roost",
        "display_name": "Roost built-in engine",
        "enabled": session.settings is not None,
        "binary_ok": True,
        "protocol": "builtin",
        "permission_modes": [dict(r) for r in PERMISSION_MODE_ROWS],
        "providers": provider_inventory(session),
    }
    if session.setup_issues:
        entry["error"] = "; ".join(session.setup_issues)
    if not p.get("include_models", True):
        entry["models_status"] = "deferred"
    elif session.settings is None:
        entry["models"], entry["models_status"] = [], "error"
        entry["models_error"] = entry.get("error") or "no provider is configured"
    else:
        try:
            models = await session.engines.engine_for(None).list_models()
        except Exception as exc:
            entry["models"], entry["models_status"], entry["models_error"] = [], "error", str(exc)
        else:
            entry["models"] = [{"id": m.id, "current": m.current} for m in models]
            entry["models_status"] = "ready" if models else "empty"
    deferred = not p.get("include_models", True)  # every entry then reports "deferred"
    unsupported = [
        {
            "id": name,
            "enabled": False,
            "binary_ok": False,
            "models_status": "deferred" if deferred else "unsupported",
            "error": "unsupported: external engines are not part of Roost; use the built-in engine",
        }
        for name in EXTERNAL_ENGINES
    ]
    settings = {
        "default_engine": "roost",
        "roost": {"enabled": True},
        **{name: {"enabled": False} for name in EXTERNAL_ENGINES},
    }
    return {"engines": [entry, *unsupported], "settings": settings}


@method("config/model-catalog/refresh")
async def model_catalog_refresh(session: AppServerSession, params: Any) -> dict:
    """``config/model-catalog/refresh``: the catalog directory alongside the configured providers.

    Roost's directory is built in (:mod:`roost.protocol._catalog`), so a refresh fetches nothing
    remote; the configured providers are re-resolved from the configuration. Result
    ``{catalog_providers, providers, counts: {catalog_providers, providers, available}}``.
    """
    from roost.protocol._catalog import catalog_providers

    check_params("config/model-catalog/refresh", params, {})
    catalog = catalog_providers()
    providers = provider_inventory(session)
    return {
        "catalog_providers": catalog,
        "providers": providers,
        "counts": {
            "catalog_providers": len(catalog),
            "providers": len(providers),
            "available": sum(1 for p in providers if p.get("available")),
        },
    }


@method("config/model-catalog/providers")
async def model_catalog_providers(session: AppServerSession, params: Any) -> dict:
    """``config/model-catalog/providers``: the built-in directory of OpenAI-compatible services.

    Params: optional ``provider`` (a service id). Result ``{providers: [{id, name, type,
    base_url, api_key_env, model_count, default_model}]}`` ordered by name; with ``provider``,
    that service alone with its ``models`` (:mod:`roost.protocol._catalog`).

    Raises:
        InvalidParams: ``provider`` is not in the directory (the message lists the ids).
    """
    from roost.protocol._catalog import CATALOG, catalog_providers

    p = check_params("config/model-catalog/providers", params, {"provider": (STR, False)})
    try:
        return {"providers": catalog_providers(p.get("provider"))}
    except KeyError:
        raise InvalidParams(
            f"unknown catalog provider {p['provider']!r}; known: {', '.join(sorted(CATALOG))}"
        ) from None
