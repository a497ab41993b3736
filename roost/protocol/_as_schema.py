"""A JSON Schema (draft 2020-12) of the app-server messages Roost sends and accepts.

``roost app-server --print-schema`` prints :func:`app_server_schema`. Where the schema comes from:

- **Request params are generated from the code.** Every handler registered with
  :func:`roost.protocol._appserver.method` checks its params with
  :func:`roost.protocol._params.check_params` and a spec ``{name: (types, required)}``. This
  module reads each handler's source, finds that call and evaluates its spec expression in the
  handler's own module globals, so the schema is the spec the server enforces (``additionalProperties:
  false``, the required names, the accepted JSON types; an optional field also accepts ``null``,
  which the server treats as absent). A handler whose spec cannot be found is an error
  (:class:`SchemaError`), never silently skipped.
- **The ``thread`` object's field list is generated** from
  :func:`roost.actors.thread_view`-style code (:func:`_thread_fields`).
- **Results, notification params, the turn/item/input/run/agent objects and the server-initiated
  ``approval/request`` are hand-written** here: the code builds them as plain dicts and has no type
  definitions to derive them from. They list the fields Roost always sends (``required``) and allow
  additional ones (app-server-protocol.md: clients tolerate additive fields). The end-to-end test
  ``tests/test_appserver_schema.py`` validates every line of a real session against them.

Each definition carries ``x-roost-source``: ``"generated"`` or ``"hand-written"``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

from roost.errors import PROTOCOL_ERRORS
from roost.protocol import (  # noqa: F401  (register methods)
    _as_attachments,
    _as_config,
    _as_content,
    _as_processes,
    _as_remote,
    _as_runs,
    _as_threads,
    _as_turns,
    _as_usage,
)
from roost.protocol._appserver import METHODS, PROTOCOL_VERSION, UNSUPPORTED_METHODS
from roost.protocol._params import ANY, BOOL, DICT, INT, LIST, NUM, STR

__all__ = [
    "METHODS",
    "NOTIFICATIONS",
    "SERVER_REQUESTS",
    "UNSUPPORTED_METHODS",
    "SchemaError",
    "app_server_schema",
    "def_name",
    "params_spec",
]

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class SchemaError(Exception):
    """A handler's params spec could not be read from its source."""


# -- request params: generated from the check_params specs ----------------------------------------

_TYPE_NAMES: list[tuple[tuple[type, ...], str | None]] = [
    (STR, "string"),
    (INT, "integer"),
    (NUM, "number"),
    (BOOL, "boolean"),
    (DICT, "object"),
    (LIST, "array"),
    (ANY, None),
]


def _json_type(types: tuple[type, ...]) -> str | None:
    for known, name in _TYPE_NAMES:
        if types == known:
            return name
    raise SchemaError(f"no JSON type for {types!r}")


def params_spec(name: str) -> dict[str, tuple[tuple[type, ...], bool]]:
    """The ``check_params`` spec of method ``name``, read from its handler's source.

    Returns:
        ``{param: (allowed Python types, required)}``; ``{}`` for a handler that takes none.

    Raises:
        SchemaError: the handler has no ``check_params(...)`` call whose spec evaluates in its
            module's globals.
    """
    handler = METHODS[name]
    tree = ast.parse(textwrap.dedent(inspect.getsource(handler)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "check_params" and len(node.args) == 3:
            expr = ast.Expression(node.args[2])
            try:
                spec = eval(compile(expr, f"<spec of {name}>", "eval"), handler.__globals__)
            except NameError as exc:
                raise SchemaError(f"{name}: the params spec uses a local name ({exc})") from None
            if not isinstance(spec, dict):
                raise SchemaError(f"{name}: the params spec is not a dict")
            return spec
    raise SchemaError(f"{name}: its handler calls no check_params(method, params, spec)")


def _params_schema(name: str) -> dict:
    spec = params_spec(name)
    props: dict[str, Any] = {}
    for field, (types, required) in spec.items():
        json_type = _json_type(types)
        if json_type is None:
            props[field] = {}
        else:
            props[field] = {"type": json_type if required else [json_type, "null"]}
    schema: dict[str, Any] = {
        "type": ["object", "null"] if not any(r for _, r in spec.values()) else "object",
        "properties": props,
        "additionalProperties": False,
        "required": [f for f, (_, r) in spec.items() if r],
        "x-roost-source": "generated",
    }
    return schema


def def_name(method: str, part: str) -> str:
    """``thread/edit-message`` + ``Params`` -> ``ThreadEditMessageParams`` (a ``$defs`` key)."""
    words = method.replace("-", "/").replace("_", "/").split("/")
    return "".join(w[:1].upper() + w[1:] for w in words) + part


# -- hand-written object shapes --------------------------------------------------------------------


def _obj(required: list[str], props: dict[str, Any] | None = None, *, nullable: bool = False) -> dict:
    props = dict(props or {})
    for name in required:
        props.setdefault(name, {})
    return {
        "type": ["object", "null"] if nullable else "object",
        "required": required,
        "properties": props,
        "x-roost-source": "hand-written",
    }


def _ref(name: str) -> dict:
    return {"$ref": f"#/$defs/{name}"}


S, I, B, O, A = ({"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "object"}, {"type": "array"})
NS, NI, NO = {"type": ["string", "null"]}, {"type": ["integer", "null"]}, {"type": ["object", "null"]}


def _thread_fields() -> list[str]:
    """The keys of the ``thread`` object, from the code that builds it."""
    from roost.actors import thread_view

    class Blank:
        def __getattr__(self, name: str) -> Any:
            return None

    return list(thread_view(Blank(), ephemeral=False, status="idle", active_turn_id=None))


def _objects() -> dict[str, dict]:
    thread = _obj(
        _thread_fields(),
        {
            "id": S,
            "kind": {"enum": ["chat", "orchestration", "worker"]},
            "title": NS,
            "cwd": NS,
            "status": S,
            "active_turn_id": NS,
            "ephemeral": B,
            "pinned": B,
            "archived": B,
            "parent_thread_id": NS,
            "created_at": S,
            "updated_at": S,
            "model_options": O,
        },
    )
    thread["x-roost-source"] = "generated (field list from roost.actors thread_view), types hand-written"
    content_ref = _obj(
        ["type", "method", "thread_id", "turn_id", "item_id", "field", "bytes", "sha256"],
        {"type": {"const": "content_ref"}, "method": {"const": "thread/content/read"}, "bytes": I},
    )
    item = _obj(
        ["id", "type", "status", "thread_id"],
        {
            "id": S,
            "type": S,
            "status": S,
            "turn_id": NS,
            "thread_id": S,
            "seq": I,
            "text": {"anyOf": [NS, content_ref]},  # a content_ref only for deferred_notification_content clients
        },
    )
    usage = _obj(["input_tokens", "output_tokens"], {"input_tokens": I, "output_tokens": I, "cached_tokens": I})
    turn = _obj(
        ["id", "thread_id", "status"],
        {
            "id": S,
            "thread_id": S,
            "status": S,
            "run_id": NS,
            "started_at": NS,
            "completed_at": NS,
            "error": {"anyOf": [{"type": "null"}, _ref("TurnError")]},
            "usage": {"anyOf": [{"type": "null"}, _ref("Usage")]},
            "items": {"type": "array", "items": _ref("Item")},
        },
    )
    user_input = _obj(["id", "kind"], {"id": S, "kind": S, "held": B, "client_id": NS, "prompt": NS, "position": NI})
    run = _obj(
        ["id", "thread_id", "status"],
        {
            "id": S,
            "thread_id": S,
            "status": S,
            "request": O,
            "runtime": O,
            "workspace": O,
            "turns": A,
            "created_at": S,
        },
    )
    agent = _obj(
        ["id", "thread_id", "root_thread_id", "name", "status"],
        {
            "id": S,
            "thread_id": S,
            "root_thread_id": S,
            "parent_id": NS,
            "name": S,
            "status": S,
            "depth": I,
        },
    )
    error = _obj(["code", "message"], {"code": {"type": "string"}, "message": S, "data": O})
    # A turn's error names a failure category (engine failures: roost.errors.EngineFailure.CATEGORIES,
    # "internal" for others, "cancelled" with a "reason" for an interrupted turn), not a wire code.
    turn_error = _obj(["category", "message"], {"category": S, "message": S, "reason": S, "retryable": B})
    catalog = _obj(
        ["id", "name", "type", "base_url", "model_count", "default_model"],
        {
            "id": S,
            "name": S,
            "type": S,
            "base_url": S,
            "api_key_env": NS,
            "model_count": I,
            "default_model": S,
            "models": {"type": "array", "items": _obj(["id"], {"id": S, "default": B})},
        },
    )
    counts = ["input_tokens", "output_tokens", "cached_tokens", "total_tokens", "turns", "sessions", "agents"]
    totals = _obj(counts, {**{c: I for c in counts}, "active_days": I})
    process = _obj(
        ["id", "thread_id", "command", "status", "trigger"],
        {
            "id": S,
            "thread_id": S,
            "command": S,
            "cwd": NS,
            "pid": NI,
            "exit_code": NI,
            "reason": NS,
            "status": {"enum": ["running", "exited", "stopped", "lost"]},
            "trigger": _obj(
                ["status", "on_exit"],
                {"status": {"enum": ["waiting", "received", "handled", "cancelled", "stopped"]}, "on_exit": S},
            ),
        },
    )
    return {
        "Process": process,
        "UsageTotals": totals,
        "CatalogProvider": catalog,
        "Thread": thread,
        "Turn": turn,
        "Item": item,
        "Usage": usage,
        "UserInput": user_input,
        "Run": run,
        "Agent": agent,
        "Error": error,
        "TurnError": turn_error,
    }


def _thread_page() -> dict:
    return _obj(["threads", "next_cursor"], {"threads": {"type": "array", "items": _ref("Thread")}, "next_cursor": NS})


def _turns() -> dict:
    return {"type": "array", "items": _ref("Turn")}


def _snapshot(*extra: str) -> dict:
    return _obj(["thread", "turns", *extra], {"thread": _ref("Thread"), "turns": _turns()})


def _results() -> dict[str, dict]:
    inp = _obj(["input"], {"input": _ref("UserInput")})
    thread = _obj(["thread"], {"thread": _ref("Thread")})
    usage = {
        "timezone": S,
        "total_sessions": I,
        "metrics": _ref("UsageTotals"),
        "days": {
            "type": "array",
            "items": {"allOf": [_ref("UsageTotals")], "required": ["date"], "properties": {"date": S}},
        },
    }
    return {
        "initialize": _obj(
            [
                "protocol_version",
                "status",
                "issues",
                "server",
                "runtime_host",
                "model",
                "permissions",
                "features",
                "max_parallel",
            ],
            {
                "protocol_version": {"const": PROTOCOL_VERSION},
                "status": {"enum": ["ready", "needs_setup"]},
                "issues": {"type": "array", "items": S},
                "model": NO,
                "max_parallel": I,
                "runtime_host": _obj(
                    ["kind", "instance_id"], {"kind": {"enum": ["local", "cloud"]}, "instance_id": S, "workspace_id": S}
                ),
                "catalog_providers": {"type": "array", "items": _ref("CatalogProvider")},
            },
        ),
        "shutdown": _obj(["ok"], {"ok": {"const": True}}),
        "thread/start": thread,
        "thread/resume": _snapshot("held_user_messages", "pending_user_messages", "agents"),
        "thread/history/read": _obj(
            ["thread_id", "turns", "history_cursor", "has_more"],
            {"thread_id": S, "turns": _turns(), "history_cursor": NS, "has_more": B},
        ),
        "thread/fork": _snapshot(),
        "thread/edit-message": _snapshot("draft", "retracted_item_ids", "retracted_turn_ids"),
        "thread/list": _thread_page(),
        "thread/listAll": _thread_page(),
        "thread/listArchived": _thread_page(),
        "thread/search": _obj(
            ["results"],
            {
                "results": {
                    "type": "array",
                    "items": _obj(["thread", "snippet"], {"thread": _ref("Thread"), "snippet": S, "message_seq": I}),
                }
            },
        ),
        "thread/rename": thread,
        "thread/pin": thread,
        "thread/archive": thread,
        "thread/delete": _obj(["thread_id"], {"thread_id": S, "worktree": O}),
        "turn/start": _obj(["turn"], {"turn": _ref("Turn")}),
        "turn/interrupt": _obj(
            ["thread_id", "interrupted"],
            {"thread_id": S, "interrupted": B, "turn": {"anyOf": [{"type": "null"}, _ref("Turn")]}},
        ),
        "turn/queue": inp,
        "turn/update-queued": inp,
        "turn/dequeue": inp,
        "turn/unsteer": inp,
        "turn/steer": _obj(
            ["thread_id", "delivery"],
            {"thread_id": S, "delivery": {"enum": ["active_turn", "queued"]}, "turn": _ref("Turn"), "turn_id": S},
        ),
        "run/start": _obj(["run"], {"run": _ref("Run")}),
        "run/interrupt": _obj(["run"], {"run": _ref("Run")}),
        "config/model/update": _obj(["model"], {"thread": _ref("Thread")}),
        "engine/list": _obj(
            ["engines"],
            {
                "engines": {
                    "type": "array",
                    "items": _obj(
                        ["id", "enabled"],
                        {
                            "id": S,
                            "enabled": B,
                            "permission_modes": {
                                "type": "array",
                                "items": _obj(["id", "label"], {"id": S, "label": S, "native_id": S}),
                            },
                        },
                    ),
                }
            },
        ),
        "thread/attachment/read": _obj(
            [
                "thread_id",
                "turn_id",
                "item_id",
                "content_index",
                "sha256",
                "preview",
                "content_type",
                "offset",
                "total",
                "data",
                "next_offset",
            ],
            {
                "thread_id": S,
                "turn_id": S,
                "item_id": S,
                "content_index": I,
                "sha256": S,
                "preview": B,
                "content_type": S,
                "offset": I,
                "total": I,
                "data": S,
                "next_offset": NI,
                "width": I,
                "height": I,
            },
        ),
        "process/list": _obj(["processes"], {"processes": {"type": "array", "items": _ref("Process")}}),
        "process/read": _obj(["process", "output"], {"process": _ref("Process"), "output": S}),
        "process/stop": _obj(["process"], {"process": _ref("Process")}),
        "process/cancel-notifications": _obj(["process"], {"process": _ref("Process")}),
        "thread/activity/read": _obj(
            ["thread_id", "turn", "next_cursor"],
            {
                "thread_id": S,
                "next_cursor": NS,
                "turn": _obj(
                    ["id", "thread_id", "status", "items"],
                    {"id": S, "thread_id": S, "status": S, "items": {"type": "array", "items": _ref("Item")}},
                ),
            },
        ),
        "thread/content/read": _obj(
            ["thread_id", "turn_id", "item_id", "field", "content", "bytes", "sha256"],
            {
                "thread_id": S,
                "turn_id": S,
                "item_id": S,
                "field": {"enum": ["text", "output", "arguments"]},
                "content": S,
                "bytes": I,
                "sha256": S,
            },
        ),
        "usage/overview": _obj(["timezone", "total_sessions", "metrics", "days"], usage),
        "settings/usage": _obj(
            ["timezone", "total_sessions", "metrics", "days", "engine_breakdowns"],
            {
                **usage,
                "engine_breakdowns": {
                    "type": "array",
                    "items": _obj(["engine_id", "in_wuu"], {"engine_id": S, "in_wuu": _ref("UsageTotals")}),
                },
            },
        ),
        "config/model-catalog/refresh": _obj(
            ["catalog_providers", "providers", "counts"],
            {
                "catalog_providers": {"type": "array", "items": _ref("CatalogProvider")},
                "providers": A,
                "counts": _obj(
                    ["catalog_providers", "providers", "available"],
                    {"catalog_providers": I, "providers": I, "available": I},
                ),
            },
        ),
        "config/model-catalog/providers": _obj(
            ["providers"], {"providers": {"type": "array", "items": _ref("CatalogProvider")}}
        ),
    }


#: Notifications Roost sends: method -> params schema (hand-written; see the module docstring).
def _notifications() -> dict[str, dict]:
    thread = _obj(["thread"], {"thread": _ref("Thread")})
    turn = _obj(["thread_id", "turn"], {"thread_id": S, "turn": _ref("Turn")})
    item = _obj(["thread_id", "turn_id", "item"], {"thread_id": S, "turn_id": NS, "item": _ref("Item")})
    delta = _obj(["thread_id", "turn_id", "item_id", "delta"], {"thread_id": S, "turn_id": S, "item_id": S, "delta": S})
    replace = _obj(["thread_id", "turn_id", "item_id", "text"], {"thread_id": S, "turn_id": S, "item_id": S, "text": S})
    inp = _obj(["thread_id", "input"], {"thread_id": S, "input": _ref("UserInput")})
    run = _obj(["thread_id", "run"], {"thread_id": S, "run": _ref("Run")})
    return {
        "thread/started": thread,
        "thread/resumed": thread,
        "thread/updated": thread,
        "turn/started": turn,
        "turn/completed": turn,
        "turn/error": turn,
        "turn/queued": inp,
        "turn/dequeued": inp,
        "turn/held": inp,
        "turn/unsteered": inp,
        "turn/steered": _obj(
            ["thread_id", "turn_id", "input"], {"thread_id": S, "turn_id": S, "input": _ref("UserInput")}
        ),
        "item/started": item,
        "item/completed": item,
        "item/removed": _obj(["thread_id", "turn_id", "item_id"], {"thread_id": S, "turn_id": S, "item_id": S}),
        "item/agentMessage/delta": delta,
        "item/agentMessage/replace": replace,
        "item/reasoning/delta": delta,
        "item/reasoning/replace": replace,
        "item/toolCall/delta": delta,
        "item/toolCall/outputDelta": delta,
        "turn/usage": _obj(["thread_id", "turn_id", "usage"], {"thread_id": S, "turn_id": S, "usage": _ref("Usage")}),
        "turn/event": _obj(["thread_id", "turn_id", "event"], {"thread_id": S, "turn_id": S, "event": O}),
        "run/started": run,
        "run/updated": run,
        "agent/updated": _obj(["thread_id", "agent"], {"thread_id": S, "agent": _ref("Agent")}),
        "agent/mailbox": _obj(["thread_id", "message"], {"thread_id": S, "message": O}),
        "config/error": _obj(["path", "message"], {"path": S, "message": S}),
        "config/changed": _obj(
            ["path", "status", "model", "providers"],
            {"path": S, "status": {"const": "ready"}, "model": O, "providers": A},
        ),
        "mcp/status/updated": _obj(
            ["name", "state", "connected", "tool_count"],
            {
                "name": S,
                "state": {"enum": ["configured", "connecting", "connected", "failed"]},
                "connected": B,
                "tool_count": I,
                "error": S,
            },
        ),
    }


NOTIFICATIONS: frozenset[str] = frozenset(_notifications())
#: Server-initiated requests (reverse RPC), sent only when the client listed them in initialize.
SERVER_REQUESTS: frozenset[str] = frozenset({"approval/request"})


def _approval_request() -> dict:
    return _obj(
        ["thread_id", "turn_id", "item_id", "kind"],
        {
            "thread_id": S,
            "turn_id": S,
            "item_id": S,
            "kind": {"enum": ["shell_command", "file_write", "tool_action", "route_approval"]},
        },
    )


# -- the whole schema ------------------------------------------------------------------------------


def app_server_schema() -> dict:
    """The JSON Schema (draft 2020-12) of every line ``roost app-server`` writes, with ``$defs``
    for every request's params and result and every notification's params.

    ``x-methods`` maps each method to its ``params``/``result`` definitions (``result`` absent for
    the ``unsupported`` methods, which always answer an error); ``x-notifications`` and
    ``x-server-requests`` list the method names of those message kinds.

    Raises:
        SchemaError: a handler's params spec could not be read (see :func:`params_spec`).
    """
    defs: dict[str, Any] = dict(_objects())
    results = _results()
    methods: dict[str, dict] = {}
    for name in sorted(METHODS):
        defs[def_name(name, "Params")] = _params_schema(name)
        if name not in results:
            raise SchemaError(f"{name}: no result schema (add one to roost/protocol/_as_schema.py)")
        defs[def_name(name, "Result")] = results[name]
        methods[name] = {
            "params": f"#/$defs/{def_name(name, 'Params')}",
            "result": f"#/$defs/{def_name(name, 'Result')}",
        }
    for name in sorted(UNSUPPORTED_METHODS):
        methods[name] = {"unsupported": True}
    notifications = []
    for name, params in sorted(_notifications().items()):
        key = def_name(name, "Notification")
        defs[key] = params
        notifications.append(
            {
                "type": "object",
                "required": ["method", "params"],
                "not": {"required": ["id"]},
                "properties": {"method": {"const": name}, "params": _ref(key)},
            }
        )
    defs["ApprovalRequestParams"] = _approval_request()
    rid = {"type": ["string", "integer"]}
    defs["Response"] = {
        "type": "object",
        "required": ["id", "result"],
        "additionalProperties": False,
        "properties": {"id": rid, "result": {}},
    }
    defs["ErrorResponse"] = {
        "type": "object",
        "required": ["id", "error"],
        "additionalProperties": False,
        "properties": {
            "id": {"type": ["string", "integer", "null"]},
            "error": {"allOf": [_ref("Error")], "properties": {"code": {"enum": sorted(PROTOCOL_ERRORS)}}},
        },
    }
    defs["Notification"] = {"oneOf": notifications}
    defs["ServerRequest"] = {
        "type": "object",
        "required": ["id", "method", "params"],
        "properties": {
            "id": {"type": "string"},
            "method": {"const": "approval/request"},
            "params": _ref("ApprovalRequestParams"),
        },
    }
    defs["Request"] = {
        "type": "object",
        "required": ["id", "method"],
        "additionalProperties": False,
        "properties": {"id": rid, "method": {"enum": sorted(methods)}, "params": {}, "jsonrpc": {}},
    }
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": "https://roost.invalid/schema/app-server.json",
        "title": f"Roost app-server messages ({PROTOCOL_VERSION})",
        "description": "One line the server writes: a response, an error response, a notification or a "
        "server-initiated request. Request params and results are in $defs (see x-methods).",
        "oneOf": [_ref("Response"), _ref("ErrorResponse"), _ref("Notification"), _ref("ServerRequest")],
        "x-protocol-version": PROTOCOL_VERSION,
        "x-methods": methods,
        "x-notifications": sorted(NOTIFICATIONS),
        "x-server-requests": sorted(SERVER_REQUESTS),
        "$defs": defs,
    }
