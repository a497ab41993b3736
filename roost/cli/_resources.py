"""The ``--json`` resource queries (wire-protocol.md "Resource queries") and their mutating twins.

Commands: ``sessions``, ``memory list|agents|delete``, ``context list|add|remove``, ``plugins``,
``config --list``, ``validate``, ``init`` (``models`` is :mod:`roost.cli._models`, ``schedule`` the
schedules module's). Each is defined in a ``_res_*`` module; :func:`register_resources` adds them
to the ``roost`` group.
"""

from __future__ import annotations

import click

__all__ = ["resource_commands", "register_resources"]


def resource_commands() -> list[click.Command]:
    """Return the resource query commands and groups."""
    from roost.cli._res_config import config_command, init_command, plugins_command, validate_command
    from roost.cli._res_memory import context_group, memory_group
    from roost.cli._res_sessions import sessions_command

    return [
        sessions_command,
        memory_group,
        context_group,
        plugins_command,
        config_command,
        validate_command,
        init_command,
    ]


def register_resources(group: click.Group) -> None:
    """Add every resource command to ``group`` (the ``roost`` command), skipping names already taken."""
    for command in resource_commands():
        if command.name not in group.commands:
            group.add_command(command)
