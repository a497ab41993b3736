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
from roost.protocol._as_schema_defs import (
    NOTIFICATIONS,
    SERVER_REQUESTS,
    approval_request_def,
    notification_defs,
    object_defs,
    ref,
    result_defs,
)
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


#: Members of an object parameter that its handler checks beyond the parameter's own type:
#: method -> parameter -> JSON Schema ``properties`` (checked by the handler, so the printed schema
#: types them too; the ``initialize`` ones are spec "initialize": client ``{name, version}``).
_NESTED_PARAMS: dict[str, dict[str, dict[str, Any]]] = {
    "initialize": {
        "client": {"name": {"type": ["string", "null"]}, "version": {"type": ["string", "null"]}},
        "capabilities": {
            "deferred_notification_content": {"type": ["boolean", "null"]},
            "reverse_rpc": {
                "type": ["object", "null"],
                "properties": {"methods": {"type": ["array", "null"], "items": {"type": "string"}}},
            },
        },
    },
}


def _params_schema(name: str) -> dict:
    spec = params_spec(name)
    props: dict[str, Any] = {}
    for field, (types, required) in spec.items():
        json_type = _json_type(types)
        if json_type is None:
            props[field] = {}
        else:
            props[field] = {"type": json_type if required else [json_type, "null"]}
        nested = _NESTED_PARAMS.get(name, {}).get(field)
        if nested is not None:
            props[field]["properties"] = nested
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
    defs: dict[str, Any] = dict(object_defs())
    results = result_defs()
    methods: dict[str, dict] = {}
    for name in sorted(METHODS):
        defs[def_name(name, "Params")] = _params_schema(name)
        if name not in results:
            raise SchemaError(f"{name}: no result schema (add one to roost/protocol/_as_schema_defs.py)")
        defs[def_name(name, "Result")] = results[name]
        methods[name] = {
            "params": f"#/$defs/{def_name(name, 'Params')}",
            "result": f"#/$defs/{def_name(name, 'Result')}",
        }
    for name in sorted(UNSUPPORTED_METHODS):
        methods[name] = {"unsupported": True}
    notifications = []
    for name, params in sorted(notification_defs().items()):
        key = def_name(name, "Notification")
        defs[key] = params
        notifications.append(
            {
                "type": "object",
                "required": ["method", "params"],
                "not": {"required": ["id"]},
                "properties": {"method": {"const": name}, "params": ref(key)},
            }
        )
    defs["ApprovalRequestParams"] = approval_request_def()
    defs.update(_envelope_defs(methods, notifications))
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": "https://roost.invalid/schema/app-server.json",
        "title": f"Roost app-server messages ({PROTOCOL_VERSION})",
        "description": "One line the server writes: a response, an error response, a notification or a "
        "server-initiated request. Request params and results are in $defs (see x-methods).",
        "oneOf": [ref("Response"), ref("ErrorResponse"), ref("Notification"), ref("ServerRequest")],
        "x-protocol-version": PROTOCOL_VERSION,
        "x-methods": methods,
        "x-notifications": sorted(NOTIFICATIONS),
        "x-server-requests": sorted(SERVER_REQUESTS),
        "$defs": defs,
    }


def _envelope_defs(methods: dict[str, dict], notifications: list[dict]) -> dict[str, dict]:
    """The line envelopes: Response, ErrorResponse, Notification (one of ``notifications``),
    ServerRequest and Request (a method of ``methods``)."""
    defs: dict[str, Any] = {}
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
            "error": {"allOf": [ref("Error")], "properties": {"code": {"enum": sorted(PROTOCOL_ERRORS)}}},
        },
    }
    defs["Notification"] = {"oneOf": notifications}
    defs["ServerRequest"] = {
        "type": "object",
        "required": ["id", "method", "params"],
        "properties": {
            "id": {"type": "string"},
            "method": {"const": "approval/request"},
            "params": ref("ApprovalRequestParams"),
        },
    }
    defs["Request"] = {
        "type": "object",
        "required": ["id", "method"],
        "additionalProperties": False,
        "properties": {"id": rid, "method": {"enum": sorted(methods)}, "params": {}, "jsonrpc": {}},
    }
    return defs
