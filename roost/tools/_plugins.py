"""Plugin groups: the names an orchestration agent's ``Plugins`` list may use for sets of tools.

An agent's ``Plugins: [files, shell, memory, ...]`` picks the tools of its turns: each entry is a
group of :data:`PLUGIN_GROUPS` or, otherwise, one tool's name. ``roost plugins`` lists the same
groups (``roost.cli._res_config.builtin_plugins``).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["PLUGIN_GROUPS", "plugin_tool_names", "unknown_plugins"]

#: Built-in plugin group -> the model-facing tool names it stands for, in declaration order.
PLUGIN_GROUPS: dict[str, tuple[str, ...]] = {
    "shell": ("shell",),
    "files": ("read_file", "write_file", "list_dir", "search_files"),
    "memory": ("memory_save", "memory_recall", "context_read"),
    # the worker-tree tools (roost.actors._workers.AGENT_TOOL_NAMES), served by the turn loop
    "agents": ("spawn_agent", "send_message", "close_agent", "wait_agents"),
}


def plugin_tool_names(
    plugins: list[str], groups: Mapping[str, tuple[str, ...]] | None = None
) -> tuple[str, ...] | None:
    """Return the tool names an agent with ``plugins`` may use.

    Args:
        plugins: the agent's ``Plugins`` entries: group names of :data:`PLUGIN_GROUPS` or of
            ``groups``; any other entry is taken as the name of one tool.
        groups: more groups, e.g. each MCP server's name -> its tools' names.

    Returns:
        ``None`` when ``plugins`` is empty (every tool); otherwise the groups' tool names and the
        other entries, in order, without duplicates.
    """
    if not plugins:
        return None
    known = {**PLUGIN_GROUPS, **(groups or {})}
    names = (name for plugin in plugins for name in known.get(plugin, (plugin,)))
    return tuple(dict.fromkeys(names))


def unknown_plugins(plugins: list[str], tool_names: set[str] | frozenset[str]) -> list[str]:
    """Return the entries of ``plugins`` that are neither a plugin group nor one of ``tool_names``.

    Args:
        plugins: an agent's ``Plugins`` entries.
        tool_names: the tool names known besides the groups' (e.g. the subagent tools).

    Returns:
        The unknown entries, in order (empty when all are known).
    """
    return [p for p in plugins if p not in PLUGIN_GROUPS and p not in tool_names]
