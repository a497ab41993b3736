"""Wire types, JSONL framing, the two dialects and their transports (DESIGN.md section 3).

Public names are re-exported here from the private modules that define them, on first access
(PEP 562, :mod:`roost._lazy`): the framing imports trio, and ``roost sessions --json`` (which
uses only the wire types) should not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roost._lazy import attach as _attach

if TYPE_CHECKING:
    from roost.protocol._a2a_host import a2a_unhostable as a2a_unhostable
    from roost.protocol._a2a_host import install_a2a as install_a2a
    from roost.protocol._as_connection import StdioClientTooSlow as StdioClientTooSlow
    from roost.protocol._as_connection import StdioConnectionCrashed as StdioConnectionCrashed
    from roost.protocol._as_early import EarlyInitialize as EarlyInitialize
    from roost.protocol._as_early import answer_initialize_early as answer_initialize_early
    from roost.protocol._as_schema import app_server_schema as app_server_schema
    from roost.protocol._bridge import failed_result as failed_result
    from roost.protocol._bridge import run_bridge as run_bridge
    from roost.protocol._bridge import run_session as run_session
    from roost.protocol._engines import EngineCatalog as EngineCatalog
    from roost.protocol._errors import wire_error as wire_error
    from roost.protocol._framing import DEFAULT_MAX_LINE_BYTES as DEFAULT_MAX_LINE_BYTES
    from roost.protocol._framing import Frame as Frame
    from roost.protocol._framing import FrameError as FrameError
    from roost.protocol._framing import JsonlWriter as JsonlWriter
    from roost.protocol._framing import LineDecoder as LineDecoder
    from roost.protocol._framing import PrefixedReceiveStream as PrefixedReceiveStream
    from roost.protocol._framing import line_limit as line_limit
    from roost.protocol._framing import open_stdio_stream as open_stdio_stream
    from roost.protocol._framing import read_frames as read_frames
    from roost.protocol._outbox import DEFAULT_OUTBOX_LINES as DEFAULT_OUTBOX_LINES
    from roost.protocol._repl_prompts import questions_enabled as questions_enabled
    from roost.protocol._repl_serve import serve_repl as serve_repl
    from roost.protocol._serve_appserver import serve_app_server as serve_app_server
    from roost.protocol._serve_auth import ServeAuth as ServeAuth
    from roost.protocol._serve_auth import parse_client_id as parse_client_id
    from roost.protocol._serve_daemon import DaemonRunning as DaemonRunning
    from roost.protocol._serve_daemon import ServeDaemon as ServeDaemon
    from roost.protocol._serve_daemon import ServeOptions as ServeOptions
    from roost.protocol._serve_daemon import claim_socket_path as claim_socket_path
    from roost.protocol._serve_daemon import default_socket_path as default_socket_path
    from roost.protocol._serve_events import auto_dispatched_event as auto_dispatched_event
    from roost.protocol._serve_metrics import DaemonMetrics as DaemonMetrics
    from roost.protocol._serve_status import register_daemon as register_daemon
    from roost.protocol._serve_status import registered_daemons as registered_daemons
    from roost.protocol._serve_status import unregister_daemon as unregister_daemon
    from roost.protocol._stdout import silence_stdout as silence_stdout
    from roost.protocol._wire_resources import ConfigSummary as ConfigSummary
    from roost.protocol._wire_resources import ContextFileInfo as ContextFileInfo
    from roost.protocol._wire_resources import ContextItem as ContextItem
    from roost.protocol._wire_resources import InitResult as InitResult
    from roost.protocol._wire_resources import McpPlugin as McpPlugin
    from roost.protocol._wire_resources import Memory as Memory
    from roost.protocol._wire_resources import MemoryAgent as MemoryAgent
    from roost.protocol._wire_resources import Objective as Objective
    from roost.protocol._wire_resources import ObjectiveTaskInfo as ObjectiveTaskInfo
    from roost.protocol._wire_resources import Plugin as Plugin
    from roost.protocol._wire_resources import PluginFunction as PluginFunction
    from roost.protocol._wire_resources import Template as Template
    from roost.protocol._wire_resources import Validation as Validation
    from roost.protocol._wire_resources import ValidationIssue as ValidationIssue
    from roost.protocol._wire_types import AgentMessage as AgentMessage
    from roost.protocol._wire_types import ReplSession as ReplSession
    from roost.protocol._wire_types import Session as Session
    from roost.protocol._wire_types import SessionDetail as SessionDetail
    from roost.protocol._wire_types import ToolCallSummary as ToolCallSummary
    from roost.protocol._wire_types import error_envelope as error_envelope
    from roost.protocol._wire_types import item_envelope as item_envelope
    from roost.protocol._wire_types import items_envelope as items_envelope
    from roost.protocol._wire_types import to_wire as to_wire

#: Every export is loaded on first access (PEP 562, roost/_lazy.py): `roost sessions --json` and the
#: app-server's start-up must not import the daemon, the repl or hypercorn (issue 19).
_LAZY = {
    "EarlyInitialize": "roost.protocol._as_early",
    "answer_initialize_early": "roost.protocol._as_early",
    "PrefixedReceiveStream": "roost.protocol._framing",
    "wire_error": "roost.protocol._errors",
    "Objective": "roost.protocol._wire_resources",
    "ObjectiveTaskInfo": "roost.protocol._wire_resources",
    "auto_dispatched_event": "roost.protocol._serve_events",
    "app_server_schema": "roost.protocol._as_schema",
    "install_a2a": "roost.protocol._a2a_host",
    "a2a_unhostable": "roost.protocol._a2a_host",
    "failed_result": "roost.protocol._bridge",
    "run_bridge": "roost.protocol._bridge",
    "run_session": "roost.protocol._bridge",
    "EngineCatalog": "roost.protocol._engines",
    "DEFAULT_MAX_LINE_BYTES": "roost.protocol._framing",
    "Frame": "roost.protocol._framing",
    "FrameError": "roost.protocol._framing",
    "JsonlWriter": "roost.protocol._framing",
    "LineDecoder": "roost.protocol._framing",
    "line_limit": "roost.protocol._framing",
    "open_stdio_stream": "roost.protocol._framing",
    "read_frames": "roost.protocol._framing",
    "DEFAULT_OUTBOX_LINES": "roost.protocol._outbox",
    "serve_repl": "roost.protocol._repl_serve",
    "questions_enabled": "roost.protocol._repl_prompts",
    "serve_app_server": "roost.protocol._serve_appserver",
    "StdioClientTooSlow": "roost.protocol._as_connection",
    "StdioConnectionCrashed": "roost.protocol._as_connection",
    "ServeAuth": "roost.protocol._serve_auth",
    "parse_client_id": "roost.protocol._serve_auth",
    "DaemonRunning": "roost.protocol._serve_daemon",
    "ServeDaemon": "roost.protocol._serve_daemon",
    "ServeOptions": "roost.protocol._serve_daemon",
    "claim_socket_path": "roost.protocol._serve_daemon",
    "default_socket_path": "roost.protocol._serve_daemon",
    "DaemonMetrics": "roost.protocol._serve_metrics",
    "register_daemon": "roost.protocol._serve_status",
    "registered_daemons": "roost.protocol._serve_status",
    "unregister_daemon": "roost.protocol._serve_status",
    "silence_stdout": "roost.protocol._stdout",
    "AgentMessage": "roost.protocol._wire_types",
    "ConfigSummary": "roost.protocol._wire_resources",
    "ContextFileInfo": "roost.protocol._wire_resources",
    "ContextItem": "roost.protocol._wire_resources",
    "InitResult": "roost.protocol._wire_resources",
    "Memory": "roost.protocol._wire_resources",
    "MemoryAgent": "roost.protocol._wire_resources",
    "Plugin": "roost.protocol._wire_resources",
    "McpPlugin": "roost.protocol._wire_resources",
    "PluginFunction": "roost.protocol._wire_resources",
    "ReplSession": "roost.protocol._wire_types",
    "Session": "roost.protocol._wire_types",
    "SessionDetail": "roost.protocol._wire_types",
    "Template": "roost.protocol._wire_resources",
    "ToolCallSummary": "roost.protocol._wire_types",
    "Validation": "roost.protocol._wire_resources",
    "ValidationIssue": "roost.protocol._wire_resources",
    "error_envelope": "roost.protocol._wire_types",
    "item_envelope": "roost.protocol._wire_types",
    "items_envelope": "roost.protocol._wire_types",
    "to_wire": "roost.protocol._wire_types",
}

__all__ = sorted(_LAZY)

_RENAMED = ("FrameError", "JsonlWriter", "LineDecoder", "line_limit", "open_stdio_stream", "read_frames")


def _fix_module_metadata(names: list[str]) -> None:
    for name in names:
        if name in _RENAMED:
            globals()[name].__module__ = __name__


__getattr__, __dir__ = _attach(globals(), _LAZY, on_load=_fix_module_metadata)
