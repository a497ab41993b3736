"""Wire types, JSONL framing, the two dialects and their transports (DESIGN.md section 3).

Public names are re-exported here from the private modules that define them.
"""

from __future__ import annotations

from roost.protocol._framing import DEFAULT_MAX_LINE_BYTES as DEFAULT_MAX_LINE_BYTES
from roost.protocol._framing import Frame as Frame
from roost.protocol._framing import FrameError as FrameError
from roost.protocol._framing import JsonlWriter as JsonlWriter
from roost.protocol._framing import LineDecoder as LineDecoder
from roost.protocol._framing import open_stdio_stream as open_stdio_stream
from roost.protocol._framing import read_frames as read_frames

from roost.protocol._bridge import failed_result as failed_result
from roost.protocol._bridge import run_bridge as run_bridge
from roost.protocol._bridge import run_session as run_session
from roost.protocol._engines import EngineCatalog as EngineCatalog
from roost.protocol._outbox import DEFAULT_OUTBOX_LINES as DEFAULT_OUTBOX_LINES
from roost.protocol._repl import serve_repl as serve_repl
from roost.protocol._repl_prompts import questions_enabled as questions_enabled
from roost.protocol._serve_appserver import serve_app_server as serve_app_server
from roost.protocol._serve_auth import ServeAuth as ServeAuth
from roost.protocol._serve_auth import parse_client_id as parse_client_id
from roost.protocol._serve_daemon import DaemonRunning as DaemonRunning
from roost.protocol._serve_daemon import ServeDaemon as ServeDaemon
from roost.protocol._serve_daemon import ServeOptions as ServeOptions
from roost.protocol._serve_daemon import claim_socket_path as claim_socket_path
from roost.protocol._serve_daemon import default_socket_path as default_socket_path
from roost.protocol._wire_types import AgentMessage as AgentMessage
from roost.protocol._wire_types import ConfigSummary as ConfigSummary
from roost.protocol._wire_types import ContextFileInfo as ContextFileInfo
from roost.protocol._wire_types import ContextItem as ContextItem
from roost.protocol._wire_types import InitResult as InitResult
from roost.protocol._wire_types import Objective as Objective
from roost.protocol._wire_types import ObjectiveTaskInfo as ObjectiveTaskInfo
from roost.protocol._serve_events import auto_dispatched_event as auto_dispatched_event
from roost.protocol._wire_types import Memory as Memory
from roost.protocol._wire_types import MemoryAgent as MemoryAgent
from roost.protocol._wire_types import Plugin as Plugin
from roost.protocol._wire_types import PluginFunction as PluginFunction
from roost.protocol._wire_types import ReplSession as ReplSession
from roost.protocol._wire_types import Session as Session
from roost.protocol._wire_types import SessionDetail as SessionDetail
from roost.protocol._wire_types import Template as Template
from roost.protocol._wire_types import ToolCallSummary as ToolCallSummary
from roost.protocol._wire_types import Validation as Validation
from roost.protocol._wire_types import ValidationIssue as ValidationIssue
from roost.protocol._wire_types import error_envelope as error_envelope
from roost.protocol._wire_types import item_envelope as item_envelope
from roost.protocol._wire_types import items_envelope as items_envelope
from roost.protocol._wire_types import to_wire as to_wire
from roost.protocol._stdout import silence_stdout as silence_stdout

__all__ = [
    "silence_stdout",
    "Objective",
    "ObjectiveTaskInfo",
    "auto_dispatched_event",
    "AgentMessage",
    "ConfigSummary",
    "ContextFileInfo",
    "ContextItem",
    "DEFAULT_OUTBOX_LINES",
    "DaemonRunning",
    "EngineCatalog",
    "InitResult",
    "Memory",
    "MemoryAgent",
    "Plugin",
    "PluginFunction",
    "ReplSession",
    "ServeAuth",
    "ServeDaemon",
    "ServeOptions",
    "Session",
    "SessionDetail",
    "Template",
    "ToolCallSummary",
    "Validation",
    "ValidationIssue",
    "claim_socket_path",
    "default_socket_path",
    "error_envelope",
    "failed_result",
    "item_envelope",
    "items_envelope",
    "parse_client_id",
    "questions_enabled",
    "run_bridge",
    "run_session",
    "serve_app_server",
    "serve_repl",
    "to_wire",

    "DEFAULT_MAX_LINE_BYTES",
    "Frame",
    "FrameError",
    "JsonlWriter",
    "LineDecoder",
    "open_stdio_stream",
    "read_frames",
]

for _name in ("FrameError", "JsonlWriter", "LineDecoder", "open_stdio_stream", "read_frames"):
    globals()[_name].__module__ = __name__
del _name
