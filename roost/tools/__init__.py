"""Built-in tools and the permission/approval policy (DESIGN.md section 7).

Layout: ``_model`` (Tool, ToolContext, ToolResult), ``_schema`` (argument validation), ``_policy``
(run_tool: permission modes, approvals, error results), ``_shell`` and ``_files`` (the built-ins),
``_output`` (capped output), ``_builtin`` (the registry), ``_memory_tools`` (memory_save,
memory_recall, context_read over the store), ``_plugins`` (the plugin groups of an agent's
``Plugins``).
"""

from __future__ import annotations

from roost.tools._ask import ask_user_tool as ask_user_tool
from roost.tools._builtin import builtin_tools as builtin_tools
from roost.tools._files import resolve_path as resolve_path
from roost.tools._files import unified_diff as unified_diff
from roost.tools._memory_tools import context_items as context_items
from roost.tools._memory_tools import forget_memory as forget_memory
from roost.tools._memory_tools import import_context as import_context
from roost.tools._memory_tools import memory_agents as memory_agents
from roost.tools._memory_tools import memory_entries as memory_entries
from roost.tools._memory_tools import memory_tools as memory_tools
from roost.tools._memory_tools import remove_context as remove_context
from roost.tools._memory_tools import scan_context_dir as scan_context_dir
from roost.tools._model import APPROVAL_KINDS as APPROVAL_KINDS
from roost.tools._model import DEFAULT_KILL_GRACE_S as DEFAULT_KILL_GRACE_S
from roost.tools._model import DEFAULT_OUTPUT_CAP_BYTES as DEFAULT_OUTPUT_CAP_BYTES
from roost.tools._model import PERMISSION_MODES as PERMISSION_MODES
from roost.tools._model import ApprovalRequester as ApprovalRequester
from roost.tools._model import PermissionMode as PermissionMode
from roost.tools._model import QuestionAsker as QuestionAsker
from roost.tools._model import Tool as Tool
from roost.tools._model import ToolContext as ToolContext
from roost.tools._model import ToolResult as ToolResult
from roost.tools._model import UnattendedPolicy as UnattendedPolicy
from roost.tools._output import OutputBuffer as OutputBuffer
from roost.tools._plan import plan_tool as plan_tool
from roost.tools._plugins import PLUGIN_GROUPS as PLUGIN_GROUPS
from roost.tools._plugins import plugin_tool_names as plugin_tool_names
from roost.tools._policy import approval_request_for as approval_request_for
from roost.tools._policy import run_tool as run_tool
from roost.tools._schema import validate_args as validate_args
from roost.tools._shell import spawn_shell as spawn_shell
from roost.tools._shell import stop_process_group as stop_process_group

__all__ = [
    "ask_user_tool",
    "plan_tool",
    "context_items",
    "forget_memory",
    "import_context",
    "memory_agents",
    "memory_entries",
    "remove_context",
    "scan_context_dir",
    "spawn_shell",
    "APPROVAL_KINDS",
    "DEFAULT_KILL_GRACE_S",
    "DEFAULT_OUTPUT_CAP_BYTES",
    "PERMISSION_MODES",
    "PLUGIN_GROUPS",
    "ApprovalRequester",
    "OutputBuffer",
    "PermissionMode",
    "QuestionAsker",
    "Tool",
    "ToolContext",
    "ToolResult",
    "UnattendedPolicy",
    "approval_request_for",
    "builtin_tools",
    "memory_tools",
    "plugin_tool_names",
    "resolve_path",
    "run_tool",
    "spawn_shell",
    "stop_process_group",
    "unified_diff",
    "validate_args",
]

for _obj in (
    OutputBuffer,
    Tool,
    ToolContext,
    ToolResult,
    approval_request_for,
    builtin_tools,
    memory_tools,
    plugin_tool_names,
    resolve_path,
    run_tool,
    stop_process_group,
    unified_diff,
    validate_args,
):
    _obj.__module__ = __name__
del _obj
