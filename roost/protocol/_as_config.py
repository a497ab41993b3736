"""App-server configuration and engine methods (app-server-protocol.md, "Model and permission
selection", "Engine inventory and authentication")."""

from __future__ import annotations

from typing import Any

from roost.actors._messages import UpdateThread
from roost.engines import PROVIDERS
from roost.errors import InvalidParams, Unsupported
from roost.protocol._appserver import AppServerSession, method
from roost.protocol._as_threads import PERMISSION_MODES
from roost.protocol._params import BOOL, DICT, STR, check_params


@method("config/model/update")
async def config_model_update(session: AppServerSession, params: Any) -> dict:
    p = check_params("config/model/update", params, {
        "thread_id": (STR, False), "provider": (STR, False), "model": (STR, False), "effort": (STR, False),
        "permission_mode": (STR, False), "reset_model": (BOOL, False), "model_options": (DICT, False),
        "base_url": (STR, False), "api_key": (STR, False), "keep_selection": (BOOL, False),
        "variant": (STR, False), "add_model": (STR, False), "remove_model": (STR, False),
    })
    if "permission_mode" in p and p["permission_mode"] not in PERMISSION_MODES:
        raise InvalidParams(f"permission_mode must be one of {', '.join(PERMISSION_MODES)}")
    if "provider" in p and p["provider"] not in PROVIDERS:
        raise InvalidParams(f"provider must be one of {', '.join(PROVIDERS)}")
    connection = {"base_url", "api_key", "keep_selection", "add_model", "remove_model"} & set(p)
    if "thread_id" in p:
        if connection:
            raise InvalidParams("provider connection changes belong to workspace configuration; "
                                "send them without thread_id")
        changes: dict = {}
        if p.get("reset_model"):
            changes.update(model=None, effort=None)
        for key in ("provider", "model", "effort", "permission_mode"):
            if key in p:
                changes[key] = p[key]
        if "model_options" in p:
            actor = await session.runtime.registry.get(p["thread_id"])
            metadata = dict(actor.thread.metadata or {})
            metadata["model_options"] = p["model_options"]
            changes["metadata"] = metadata
        if not changes:
            raise InvalidParams("nothing to change: give model, provider, effort, permission_mode or reset_model")
        actor = await session.runtime.registry.get(p["thread_id"])
        await session.subscribe(actor)
        view = await actor.ref.ask(UpdateThread(changes=changes, selection=True))
        return {"thread": view, "model": _workspace_model(session)}
    if connection:
        raise Unsupported("provider connections are configured in $ROOST_HOME/config.toml or the environment; "
                          "Roost does not store API keys sent over the protocol")
    if "model" not in p:
        raise InvalidParams("model is required for a workspace update")
    if session.settings is None:
        raise InvalidParams(session.setup_issues[0] if session.setup_issues else "no provider configured")
    import attrs

    session.settings = attrs.evolve(session.settings, model=p["model"])
    session.engines.default = session.settings
    return {"model": _workspace_model(session), "model_aliases": {}}


def _workspace_model(session: AppServerSession) -> dict | None:
    return session.settings.describe() if session.settings is not None else None


@method("engine/list")
async def engine_list(session: AppServerSession, params: Any) -> dict:
    p = check_params("engine/list", params, {"cwd": (STR, False), "refresh_models": (BOOL, False),
                                             "include_models": (BOOL, False), "include_quota": (BOOL, False)})
    if p.get("include_quota"):
        raise Unsupported("subscription quota adapters are not part of Roost")
    include_models = p.get("include_models", True)
    entry: dict = {
        "id": "roost", "display_name": "Roost built-in engine", "enabled": session.settings is not None,
        "binary_ok": True, "protocol": "builtin", "permission_modes": ["standard", "read_only", "unconfined"],
        "providers": [],
    }
    if session.settings is not None:
        entry["providers"].append(session.settings.describe())
    if session.setup_issues:
        entry["error"] = "; ".join(session.setup_issues)
    if not include_models:
        entry["models_status"] = "deferred"
    elif session.settings is None:
        entry["models"], entry["models_status"] = [], "error"
    else:
        try:
            engine = session.engines.engine_for(None)
            models = await engine.list_models()
            entry["models"] = [{"id": m.id, "current": m.current} for m in models]
            entry["models_status"] = "ready" if models else "empty"
        except Exception as exc:
            entry["models"], entry["models_status"], entry["models_error"] = [], "error", str(exc)
    unsupported = [
        {"id": name, "enabled": False, "binary_ok": False, "error": "unsupported: external engines are not part of Roost",
         "models_status": "unsupported"}
        for name in ("codex", "claude", "opencode", "acp")
    ]
    return {"engines": [entry, *unsupported], "settings": {"default_engine": "roost", "roost": {"enabled": True}}}
