"""The hand-written shapes of :mod:`roost.protocol._as_schema`: the thread/turn/item/input/run/
agent objects, every method's result, every notification's params and the server-initiated
``approval/request`` (app-server-protocol.md; the code builds them as plain dicts and has no type
definitions to derive them from). Each lists the fields Roost always sends (``required``) and
allows additional ones; ``tests/test_appserver_schema.py`` validates a real session against them.
"""

from __future__ import annotations

from typing import Any

from roost.protocol._appserver import PROTOCOL_VERSION

__all__ = [
    "NOTIFICATIONS",
    "SERVER_REQUESTS",
    "approval_request_def",
    "notification_defs",
    "obj",
    "object_defs",
    "ref",
    "result_defs",
]


# -- hand-written object shapes --------------------------------------------------------------------


def obj(required: list[str], props: dict[str, Any] | None = None, *, nullable: bool = False) -> dict:
    props = dict(props or {})
    for name in required:
        props.setdefault(name, {})
    return {
        "type": ["object", "null"] if nullable else "object",
        "required": required,
        "properties": props,
        "x-roost-source": "hand-written",
    }


def ref(name: str) -> dict:
    return {"$ref": f"#/$defs/{name}"}


#: One-letter JSON Schema shorthands.
S, I, B, O, A = ({"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "object"}, {"type": "array"})  # noqa: E741
NS, NI, NO = {"type": ["string", "null"]}, {"type": ["integer", "null"]}, {"type": ["object", "null"]}


def _thread_fields() -> list[str]:
    """The keys of the ``thread`` object, from the code that builds it."""
    from roost.actors import thread_view

    class Blank:
        def __getattr__(self, name: str) -> Any:
            return None

    return list(thread_view(Blank(), ephemeral=False, status="idle", active_turn_id=None))


def object_defs() -> dict[str, dict]:
    """The shared object shapes (``$defs`` ``Thread``, ``Turn``, ``Item``, ``Run``, ...)."""
    conversation, service = _conversation_defs(), _service_defs()
    order = ["Process", "UsageTotals", "CatalogProvider", "Thread", "Turn", "Item", "Usage", "UserInput"]
    order += ["Run", "Agent", "Error", "TurnError"]
    return {name: conversation.get(name) or service[name] for name in order}


def _conversation_defs() -> dict[str, dict]:
    """Thread, Turn, Item, Usage and UserInput."""
    thread = obj(
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
    content_ref = obj(
        ["type", "method", "thread_id", "turn_id", "item_id", "field", "bytes", "sha256"],
        {"type": {"const": "content_ref"}, "method": {"const": "thread/content/read"}, "bytes": I},
    )
    item = obj(
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
    usage = obj(["input_tokens", "output_tokens"], {"input_tokens": I, "output_tokens": I, "cached_tokens": I})
    turn = obj(
        ["id", "thread_id", "status"],
        {
            "id": S,
            "thread_id": S,
            "status": S,
            "run_id": NS,
            "started_at": NS,
            "completed_at": NS,
            "error": {"anyOf": [{"type": "null"}, ref("TurnError")]},
            "usage": {"anyOf": [{"type": "null"}, ref("Usage")]},
            "items": {"type": "array", "items": ref("Item")},
        },
    )
    user_input = obj(["id", "kind"], {"id": S, "kind": S, "held": B, "client_id": NS, "prompt": NS, "position": NI})
    return {"Thread": thread, "Turn": turn, "Item": item, "Usage": usage, "UserInput": user_input}


def _service_defs() -> dict[str, dict]:
    """Run, Agent, Error, TurnError, CatalogProvider, UsageTotals and Process."""
    run = obj(
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
    agent = obj(
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
    error = obj(["code", "message"], {"code": {"type": "string"}, "message": S, "data": O})
    # A turn's error names a failure category (engine failures: roost.errors.EngineFailure.CATEGORIES,
    # "internal" for others, "cancelled" with a "reason" for an interrupted turn), not a wire code.
    turn_error = obj(["category", "message"], {"category": S, "message": S, "reason": S, "retryable": B})
    catalog = obj(
        ["id", "name", "type", "base_url", "model_count", "default_model"],
        {
            "id": S,
            "name": S,
            "type": S,
            "base_url": S,
            "api_key_env": NS,
            "model_count": I,
            "default_model": S,
            "models": {"type": "array", "items": obj(["id"], {"id": S, "default": B})},
        },
    )
    counts = ["input_tokens", "output_tokens", "cached_tokens", "total_tokens", "turns", "sessions", "agents"]
    totals = obj(counts, {**{c: I for c in counts}, "active_days": I})
    process = obj(
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
            "trigger": obj(
                ["status", "on_exit"],
                {"status": {"enum": ["waiting", "received", "handled", "cancelled", "stopped"]}, "on_exit": S},
            ),
        },
    )
    return {
        "Process": process,
        "UsageTotals": totals,
        "CatalogProvider": catalog,
        "Run": run,
        "Agent": agent,
        "Error": error,
        "TurnError": turn_error,
    }


def _thread_page() -> dict:
    return obj(["threads", "next_cursor"], {"threads": {"type": "array", "items": ref("Thread")}, "next_cursor": NS})


def _turns() -> dict:
    return {"type": "array", "items": ref("Turn")}


def _snapshot(*extra: str) -> dict:
    return obj(["thread", "turns", *extra], {"thread": ref("Thread"), "turns": _turns()})


def result_defs() -> dict[str, dict]:
    """Every method's result shape (``$defs`` ``<Method>Result``)."""
    return {**_session_results(), **_conversation_results(), **_service_results()}


def _session_results() -> dict[str, dict]:
    """initialize and shutdown."""
    return {
        "initialize": obj(
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
                "runtime_host": obj(
                    ["kind", "instance_id"], {"kind": {"enum": ["local", "cloud"]}, "instance_id": S, "workspace_id": S}
                ),
                "catalog_providers": {"type": "array", "items": ref("CatalogProvider")},
            },
        ),
        "shutdown": obj(["ok"], {"ok": {"const": True}}),
    }


def _conversation_results() -> dict[str, dict]:
    """thread/*, turn/* and run/* (the conversation's methods)."""
    inp = obj(["input"], {"input": ref("UserInput")})
    thread = obj(["thread"], {"thread": ref("Thread")})
    return {
        "thread/start": thread,
        "thread/resume": _snapshot("held_user_messages", "pending_user_messages", "agents"),
        "thread/history/read": obj(
            ["thread_id", "turns", "history_cursor", "has_more"],
            {"thread_id": S, "turns": _turns(), "history_cursor": NS, "has_more": B},
        ),
        "thread/fork": _snapshot(),
        "thread/edit-message": _snapshot("draft", "retracted_item_ids", "retracted_turn_ids"),
        "thread/list": _thread_page(),
        "thread/listAll": _thread_page(),
        "thread/listArchived": _thread_page(),
        "thread/search": obj(
            ["results"],
            {
                "results": {
                    "type": "array",
                    "items": obj(["thread", "snippet"], {"thread": ref("Thread"), "snippet": S, "message_seq": I}),
                }
            },
        ),
        "thread/rename": thread,
        "thread/pin": thread,
        "thread/archive": thread,
        "thread/delete": obj(["thread_id"], {"thread_id": S, "worktree": O}),
        "turn/start": obj(["turn"], {"turn": ref("Turn")}),
        "turn/interrupt": obj(
            ["thread_id", "interrupted"],
            {"thread_id": S, "interrupted": B, "turn": {"anyOf": [{"type": "null"}, ref("Turn")]}},
        ),
        "turn/queue": inp,
        "turn/update-queued": inp,
        "turn/dequeue": inp,
        "turn/unsteer": inp,
        "turn/steer": obj(
            ["thread_id", "delivery"],
            {"thread_id": S, "delivery": {"enum": ["active_turn", "queued"]}, "turn": ref("Turn"), "turn_id": S},
        ),
        "run/start": obj(["run"], {"run": ref("Run")}),
        "run/interrupt": obj(["run"], {"run": ref("Run")}),
    }


def _service_results() -> dict[str, dict]:
    """config/model/update, engine/list and thread/attachment/read; then :func:`_process_results`."""
    return {
        "config/model/update": obj(["model"], {"thread": ref("Thread")}),
        "engine/list": obj(
            ["engines"],
            {
                "engines": {
                    "type": "array",
                    "items": obj(
                        ["id", "enabled"],
                        {
                            "id": S,
                            "enabled": B,
                            "permission_modes": {
                                "type": "array",
                                "items": obj(["id", "label"], {"id": S, "label": S, "native_id": S}),
                            },
                        },
                    ),
                }
            },
        ),
        "thread/attachment/read": obj(
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
    } | _process_results()


def _process_results() -> dict[str, dict]:
    """process/*, activity, content, usage and the model catalog."""
    usage = {
        "timezone": S,
        "total_sessions": I,
        "metrics": ref("UsageTotals"),
        "days": {
            "type": "array",
            "items": {"allOf": [ref("UsageTotals")], "required": ["date"], "properties": {"date": S}},
        },
    }
    return {
        "process/list": obj(["processes"], {"processes": {"type": "array", "items": ref("Process")}}),
        "process/read": obj(["process", "output"], {"process": ref("Process"), "output": S}),
        "process/stop": obj(["process"], {"process": ref("Process")}),
        "process/cancel-notifications": obj(["process"], {"process": ref("Process")}),
        "thread/activity/read": obj(
            ["thread_id", "turn", "next_cursor"],
            {
                "thread_id": S,
                "next_cursor": NS,
                "turn": obj(
                    ["id", "thread_id", "status", "items"],
                    {"id": S, "thread_id": S, "status": S, "items": {"type": "array", "items": ref("Item")}},
                ),
            },
        ),
        "thread/content/read": obj(
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
        "usage/overview": obj(["timezone", "total_sessions", "metrics", "days"], usage),
        "settings/usage": obj(
            ["timezone", "total_sessions", "metrics", "days", "engine_breakdowns"],
            {
                **usage,
                "engine_breakdowns": {
                    "type": "array",
                    "items": obj(["engine_id", "in_wuu"], {"engine_id": S, "in_wuu": ref("UsageTotals")}),
                },
            },
        ),
        "config/model-catalog/refresh": obj(
            ["catalog_providers", "providers", "counts"],
            {
                "catalog_providers": {"type": "array", "items": ref("CatalogProvider")},
                "providers": A,
                "counts": obj(
                    ["catalog_providers", "providers", "available"],
                    {"catalog_providers": I, "providers": I, "available": I},
                ),
            },
        ),
        "config/model-catalog/providers": obj(
            ["providers"], {"providers": {"type": "array", "items": ref("CatalogProvider")}}
        ),
    }


#: Notifications Roost sends: method -> params schema (hand-written; see the module docstring).
def notification_defs() -> dict[str, dict]:
    thread = obj(["thread"], {"thread": ref("Thread")})
    turn = obj(["thread_id", "turn"], {"thread_id": S, "turn": ref("Turn")})
    item = obj(["thread_id", "turn_id", "item"], {"thread_id": S, "turn_id": NS, "item": ref("Item")})
    delta = obj(["thread_id", "turn_id", "item_id", "delta"], {"thread_id": S, "turn_id": S, "item_id": S, "delta": S})
    replace = obj(["thread_id", "turn_id", "item_id", "text"], {"thread_id": S, "turn_id": S, "item_id": S, "text": S})
    inp = obj(["thread_id", "input"], {"thread_id": S, "input": ref("UserInput")})
    run = obj(["thread_id", "run"], {"thread_id": S, "run": ref("Run")})
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
        "turn/steered": obj(
            ["thread_id", "turn_id", "input"], {"thread_id": S, "turn_id": S, "input": ref("UserInput")}
        ),
        "item/started": item,
        "item/completed": item,
        "item/removed": obj(["thread_id", "turn_id", "item_id"], {"thread_id": S, "turn_id": S, "item_id": S}),
        "item/agentMessage/delta": delta,
        "item/agentMessage/replace": replace,
        "item/reasoning/delta": delta,
        "item/reasoning/replace": replace,
        "item/toolCall/delta": delta,
        "item/toolCall/outputDelta": delta,
        "turn/usage": obj(["thread_id", "turn_id", "usage"], {"thread_id": S, "turn_id": S, "usage": ref("Usage")}),
        "turn/event": obj(["thread_id", "turn_id", "event"], {"thread_id": S, "turn_id": S, "event": O}),
        "run/started": run,
        "run/updated": run,
        "agent/updated": obj(["thread_id", "agent"], {"thread_id": S, "agent": ref("Agent")}),
        "agent/mailbox": obj(["thread_id", "message"], {"thread_id": S, "message": O}),
        "config/error": obj(["path", "message"], {"path": S, "message": S}),
        "config/changed": obj(
            ["path", "status", "model", "providers"],
            {"path": S, "status": {"const": "ready"}, "model": O, "providers": A},
        ),
        "mcp/status/updated": obj(
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


NOTIFICATIONS: frozenset[str] = frozenset(notification_defs())
#: Server-initiated requests (reverse RPC), sent only when the client listed them in initialize.
SERVER_REQUESTS: frozenset[str] = frozenset({"approval/request"})


def approval_request_def() -> dict:
    return obj(
        ["thread_id", "turn_id", "item_id", "kind"],
        {
            "thread_id": S,
            "turn_id": S,
            "item_id": S,
            "kind": {"enum": ["shell_command", "file_write", "tool_action", "route_approval"]},
        },
    )
