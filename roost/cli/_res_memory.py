"""``roost memory`` (list, agents, delete) and ``roost context`` (list, add, remove).

The data layout is :mod:`roost.tools._memory_tools`'s: typed memory entries per agent (the shared
store without ``--agent``), context items per project directory (``--dir``, default the current
one). ``list``/``agents`` accept ``--json``; ``delete``/``add``/``remove`` report by exit status.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from roost.cli._res_common import emit_items, fail, json_option, open_cli_store
from roost.errors import RoostError
from roost.protocol import ContextFileInfo, ContextItem, Memory, MemoryAgent
from roost.tools import (
    context_items,
    forget_memory,
    import_context,
    memory_agents,
    memory_entries,
    remove_context,
    scan_context_dir,
)

__all__ = ["memory_group", "context_group"]

_agent_option = click.option("--agent", default=None, help="The agent whose store to use (default: the shared one).")
_dir_option = click.option(
    "--dir", "project", type=click.Path(), default=".", show_default=True, help="The project directory."
)


@click.group("memory", short_help="Manage the typed memories agents save and recall.")
def memory_group() -> None:
    """Typed memories (user, feedback, project, reference) that agents save and recall.

    The names and fields of --json output are the wire protocol's (docs/wire.md, "Resource queries").

    Exit status (every sub-command): 0 on success; 1 on failure (with --json: an error envelope on stdout); 2 for a
    usage error, or without --json an unusable ROOST_HOME or database (with --json: exit 1).
    """


@memory_group.command("list", short_help="List the shared memories, or one agent's (--agent).")
@json_option
@_agent_option
def memory_list(as_json: bool, agent: str | None) -> None:
    """List the memories of the shared store, or of one agent's (--agent). --json: Memory items."""
    try:
        with open_cli_store("memory list", as_json=as_json) as store, store.read() as conn:
            rows = [Memory(**e) for e in memory_entries(conn, agent)]
    except RoostError as exc:
        fail("memory list", str(exc), as_json=as_json)
    if as_json:
        emit_items(rows)
        return
    if not rows:
        click.echo("no memories")
    for m in rows:
        click.echo(f"{m.name}  [{m.type}]  {m.description}")


@memory_group.command("agents", short_help="List the agents with at least one memory.")
@json_option
def memory_agents_command(as_json: bool) -> None:
    """List the agents with at least one memory. --json: MemoryAgent items."""
    try:
        with open_cli_store("memory agents", as_json=as_json) as store, store.read() as conn:
            rows = [MemoryAgent(agent=a, count=n) for a, n in memory_agents(conn)]
    except RoostError as exc:
        fail("memory agents", str(exc), as_json=as_json)
    if as_json:
        emit_items(rows)
        return
    if not rows:
        click.echo("no agent has memories")
    for row in rows:
        click.echo(f"{row.agent}  {row.count}")


@memory_group.command("delete", short_help="Delete the memory NAME (exit status 1 when there is none).")
@click.argument("name")
@_agent_option
def memory_delete(name: str, agent: str | None) -> None:
    """Delete the memory NAME (exit status 1 when there is none)."""
    try:
        with open_cli_store("memory delete", as_json=False) as store, store.transaction() as conn:
            existed = forget_memory(conn, agent=agent, name=name)
    except RoostError as exc:
        fail("memory delete", str(exc), as_json=False)
    if not existed:
        where = f"agent {agent!r}" if agent else "the shared store"
        fail("memory delete", f"no memory named {name!r} in {where}", as_json=False)


@click.group("context", short_help="Manage the reference material agents read in a project.")
def context_group() -> None:
    """Reference material imported into a project, readable by agents through context_read.

    The names and fields of --json output are the wire protocol's (docs/wire.md, "Resource queries").

    Exit status (every sub-command): 0 on success; 1 on failure (with --json: an error envelope on stdout); 2 for a
    usage error, or without --json an unusable ROOST_HOME or database (with --json: exit 1).
    """


@context_group.command("list", short_help="List the project's context items.")
@json_option
@_dir_option
def context_list(as_json: bool, project: str) -> None:
    """List the project's context items. --json: ContextItem items."""
    project_dir = Path(os.path.abspath(project))
    try:
        with open_cli_store("context list", as_json=as_json) as store, store.read() as conn:
            rows = []
            for name, m in context_items(conn, project_dir):
                files = [
                    ContextFileInfo(relative_path=str(f.get("relativePath", "")), size_bytes=int(f.get("sizeBytes", 0)))
                    for f in m.get("files") or []
                ]
                rows.append(
                    ContextItem(
                        name=name,
                        description=m.get("description"),
                        source_path=str(m.get("sourcePath") or ""),
                        imported_at=str(m.get("importedAt") or ""),
                        size_bytes=sum(f.size_bytes for f in files),
                        files=files,
                    )
                )
    except RoostError as exc:
        fail("context list", str(exc), as_json=as_json)
    if as_json:
        emit_items(rows)
        return
    if not rows:
        click.echo("no context items")
    for row in rows:
        click.echo(f"{row.name}  {len(row.files)} files, {row.size_bytes} bytes  from {row.source_path}")


@context_group.command("add", short_help="Import the files under SOURCE into the project's context.")
@click.argument("source", type=click.Path())
@click.option("--name", default=None, help="The item's name (default: the source's base name).")
@click.option("--description", default=None, help="A one-line description.")
@click.option("--force", is_flag=True, help="Replace an item of the same name.")
@_dir_option
def context_add(source: str, name: str | None, description: str | None, force: bool, project: str) -> None:
    """Import the files under SOURCE (a directory or one file) into the project's context."""
    src = Path(source).resolve()
    project_dir = Path(os.path.abspath(project))
    try:
        found = scan_context_dir(src)
        files = [(rel, path.read_bytes()) for rel, path, _ in found]
        with open_cli_store("context add", as_json=False) as store, store.transaction() as conn:
            import_context(
                conn,
                project=project_dir,
                name=name or src.name,
                description=description,
                source=src,
                files=files,
                replace=force,
            )
    except OSError as exc:
        fail("context add", f"cannot read {exc.filename or src}: {exc.strerror or exc}", as_json=False)
    except RoostError as exc:
        fail("context add", str(exc), as_json=False)
    click.echo(f"imported {len(files)} file{'' if len(files) == 1 else 's'} as {name or src.name!r}", err=True)


@context_group.command("remove", short_help="Remove the context item NAME from the project.")
@click.argument("name")
@_dir_option
def context_remove(name: str, project: str) -> None:
    """Remove the context item NAME from the project (exit status 1 when there is none)."""
    project_dir = Path(os.path.abspath(project))
    try:
        with open_cli_store("context remove", as_json=False) as store, store.transaction() as conn:
            existed = remove_context(conn, project=project_dir, name=name)
    except RoostError as exc:
        fail("context remove", str(exc), as_json=False)
    if not existed:
        fail("context remove", f"no context item named {name!r} in {project_dir}", as_json=False)


#: Each sub-command's --help ends with the exit statuses (issue 17: every command documents them).
for _group in (memory_group, context_group):
    for _command in _group.commands.values():
        _command.epilog = _command.epilog or (
            "Exit status: 0 on success; 1 on failure (an unknown name; with --json an error envelope "
            "on stdout); 2 for a usage error, or without --json an unusable ROOST_HOME or database "
            "(with --json: exit 1, as the wire protocol fixes)."
        )
del _group, _command
