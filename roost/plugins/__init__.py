"""Plugins from outside Roost: MCP servers whose tools threads and agents use like built-in ones.

Layout: ``_mcp_config`` (an orchestration config's ``McpServers``, ``config.toml``'s
``[mcp_servers]``), ``_mcp_conn`` (one server's connection, a supervised actor with a bounded
mailbox, restarted with backoff), ``_mcp_stdio`` (a stdio server's process: its JSON-RPC lines,
its stderr tail, its bounded stop), ``_mcp_host`` (the ``mcp`` supervisor, the servers' tools,
``roost plugins`` items and ``mcp/status/updated`` statuses). The connection modules are loaded
on first use (PEP 562): commands that configure no MCP server do not import them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roost._lazy import attach as _attach
from roost._lazy import publish as _publish
from roost.plugins._mcp_config import NAME_PATTERN as NAME_PATTERN
from roost.plugins._mcp_config import McpServerConfig as McpServerConfig
from roost.plugins._mcp_config import mcp_servers_from_orchestration as mcp_servers_from_orchestration
from roost.plugins._mcp_config import mcp_servers_from_toml as mcp_servers_from_toml

if TYPE_CHECKING:
    from roost.plugins._mcp_conn import McpServerState as McpServerState
    from roost.plugins._mcp_host import McpHost as McpHost
    from roost.plugins._mcp_host import mcp_tool_name as mcp_tool_name
    from roost.plugins._mcp_host import open_mcp_host as open_mcp_host

__all__ = [
    "NAME_PATTERN",
    "McpHost",
    "McpServerConfig",
    "McpServerState",
    "mcp_servers_from_orchestration",
    "mcp_servers_from_toml",
    "mcp_tool_name",
    "open_mcp_host",
]

_LAZY = {
    "McpHost": "roost.plugins._mcp_host",
    "mcp_tool_name": "roost.plugins._mcp_host",
    "open_mcp_host": "roost.plugins._mcp_host",
    "McpServerState": "roost.plugins._mcp_conn",
}


def _fix_module_metadata(names: list[str]) -> None:
    _publish(globals(), names)


__getattr__, __dir__ = _attach(globals(), _LAZY, on_load=_fix_module_metadata)
_fix_module_metadata([n for n in __all__ if n not in _LAZY])
