"""``roost plugins``, ``roost config --list``, ``roost validate PATH`` and ``roost init [PATH]``.

Orchestration configs and templates are :mod:`roost.orchestration`'s. The default config folder
is ``.roost/config`` of the current directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from roost.cli._res_common import emit_item, emit_items, fail, fail_setup, json_option
from roost.orchestration import TEMPLATES, OrchestrationConfig, render_template, validate_config_file
from roost.protocol import (
    ConfigSummary,
    InitResult,
    McpPlugin,
    Plugin,
    PluginFunction,
    Template,
    Validation,
    ValidationIssue,
)

__all__ = [
    "plugins_command",
    "config_command",
    "validate_command",
    "init_command",
    "builtin_plugins",
    "mcp_plugins",
    "known_plugin_names",
    "plugin_warnings",
    "a2a_warnings",
    "DEFAULT_CONFIG_DIR",
    "DEFAULT_CONFIG_FILE",
]

DEFAULT_CONFIG_DIR = Path(".roost") / "config"
DEFAULT_CONFIG_FILE = DEFAULT_CONFIG_DIR / "orchestration.yaml"
#: Model id written by ``init`` when neither --model, ROOST_MODEL nor config.toml names one.
FALLBACK_MODEL = "gpt-4o-mini"
_CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
_GITIGNORE_LINES = ("# Roost: keep the config, ignore local state", ".roost/*", "!.roost/config/")


def _memory_tool_descriptions() -> dict[str, str]:
    """``{name: description}`` of the memory tools (built over no store: only their text is read)."""
    from roost.tools import memory_tools

    return {name: tool.description for name, tool in memory_tools(None).items()}


def builtin_plugins() -> list[Plugin]:
    """Return the built-in tool plugins, each with its functions in declaration order.

    The groups of :data:`roost.tools.PLUGIN_GROUPS` come first (``shell``, ``files``, ``memory``),
    then any built-in tool no group holds as a plugin of its own, then ``agents`` (the subagent
    tools). Descriptions are the tools' own (:func:`roost.tools.builtin_tools`,
    :func:`roost.tools.memory_tools`); a group none of whose tools exists is left out.
    """
    from roost.actors import agent_tool_schemas
    from roost.tools import PLUGIN_GROUPS, builtin_tools

    descriptions = {name: tool.description for name, tool in builtin_tools().items()}
    standalone = list(descriptions)
    descriptions.update(_memory_tool_descriptions())
    plugins: list[Plugin] = []
    grouped: set[str] = set()
    for group, names in PLUGIN_GROUPS.items():
        functions = [PluginFunction(name=n, description=descriptions[n]) for n in names if n in descriptions]
        grouped.update(names)
        if functions:
            plugins.append(Plugin(name=group, source="builtin", functions=functions))
    for name in standalone:
        if name not in grouped:
            plugins.append(
                Plugin(
                    name=name, source="builtin", functions=[PluginFunction(name=name, description=descriptions[name])]
                )
            )
    agents = [PluginFunction(name=s.name, description=s.description) for s in agent_tool_schemas(can_spawn=True)]
    plugins.append(Plugin(name="agents", source="builtin", functions=agents))
    return plugins


def known_plugin_names() -> frozenset[str]:
    """Return every name an agent's ``Plugins`` may use: the plugins of :func:`builtin_plugins`
    and their tools' names."""
    plugins = builtin_plugins()
    return frozenset({p.name for p in plugins} | {f.name for p in plugins for f in p.functions})


def plugin_warnings(config: OrchestrationConfig) -> list[ValidationIssue]:
    """Return a ``warning`` for each ``Plugins`` entry of ``config``'s agents that names neither a
    plugin nor a known tool (``Orchestration.Agents[i].Plugins: ...``); such an entry gives no tool.
    The MCP servers of ``config.toml`` and of ``config``'s ``McpServers`` are plugins (their tools
    are not known without connecting, so any ``mcp__<server>__...`` name is accepted)."""
    from roost.config import configured_mcp_servers
    from roost.errors import ConfigError

    try:
        servers = {s.name for s in configured_mcp_servers()}
    except ConfigError:
        servers = set()  # the commands that start servers report it
    servers |= {s.name for s in config.mcp_servers}
    known = known_plugin_names() | servers
    prefixes = tuple(f"mcp__{name}__" for name in servers)
    return [
        ValidationIssue(
            level="warning",
            message=f"Orchestration.Agents[{i}].Plugins: {name!r} is neither a plugin nor a "
            f"known tool (see roost plugins); it gives the agent no tool",
        )
        for i, agent in enumerate(config.agents)
        for name in agent.plugins
        if name not in known and not (prefixes and name.startswith(prefixes))
    ]


def a2a_warnings(config: OrchestrationConfig) -> list[ValidationIssue]:
    """Return a ``warning`` for each agent of ``config`` that ``roost serve --a2a`` cannot host
    (:func:`roost.protocol.a2a_unhostable`: its name is not one URL segment); the config still
    runs, but ``serve --a2a`` leaves that agent out."""
    from roost.protocol import a2a_unhostable

    return [
        ValidationIssue(
            level="warning",
            message=f"Orchestration.Agents[{i}].Name: {agent.name!r} cannot be hosted over A2A (roost serve --a2a "
            f"leaves it out): {why}",
        )
        for i, agent in enumerate(config.agents)
        if (why := a2a_unhostable(agent.name))
    ]


def mcp_plugins(config_file: str | None) -> list[McpPlugin]:
    """Connect to the configured MCP servers once and return them as ``mcp`` plugins.

    The servers are ``config.toml``'s ``[mcp_servers]`` and, with ``config_file``, that
    orchestration config's ``McpServers``. Each server's first connection attempt is awaited (its
    ``connect_timeout``); one that fails is listed with ``status: failed``, its ``error`` and no
    functions.

    Raises:
        ConfigError: a malformed ``[mcp_servers]`` table or orchestration config.
    """
    import trio

    from roost.config import configured_mcp_servers
    from roost.orchestration import load_config_file
    from roost.plugins import open_mcp_host

    servers = {s.name: s for s in configured_mcp_servers()}
    if config_file is not None:
        servers.update({s.name: s for s in load_config_file(config_file).mcp_servers})
    if not servers:
        return []

    async def connect() -> list[dict[str, Any]]:
        async with open_mcp_host(servers.values()) as host:
            return host.plugins()

    return [
        McpPlugin(
            name=p["name"],
            source="mcp",
            functions=[PluginFunction(name=f["name"], description=f["description"]) for f in p["functions"]],
            status=p["status"]["state"],
            error=p["status"].get("error"),
        )
        for p in trio.run(connect)
    ]


@click.command("plugins", short_help="List the tool plugins agents can use.")
@json_option
@click.option("--plugin", "plugin_name", default=None, help="Only this plugin (no match is an error).")
@click.option(
    "-c",
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Also list this orchestration config's McpServers.",
)
def plugins_command(as_json: bool, plugin_name: str | None, config_file: str | None) -> None:
    """List the tool plugins agents can use. --json: Plugin items.

    Built-in plugins first, then each MCP server of config.toml's [mcp_servers] (and of --config's
    McpServers), connected once to list its tools (source "mcp"; a server that fails to start is
    listed with its status and error). The names and fields of --json output are the wire
    protocol's (docs/wire.md, "Resource queries").

    Exit status: 0 on success; 1 on failure (with --json: an error envelope on stdout); 2 for a
    usage error, or without --json an unusable ROOST_HOME or configuration (with --json: exit 1
    and an error envelope, as the wire protocol fixes).
    """
    from roost.errors import ConfigError

    try:
        plugins = builtin_plugins() + mcp_plugins(config_file)
    except ConfigError as exc:
        fail_setup("plugins", str(exc), as_json=as_json)
    if plugin_name is not None:
        everything = plugins
        plugins = [p for p in plugins if p.name.lower() == plugin_name.lower()]
        if not plugins:
            known = ", ".join(p.name for p in everything)
            fail("plugins", f"no plugin named {plugin_name!r} (known: {known})", as_json=as_json)
    if as_json:
        emit_items(plugins)
        return
    for p in plugins:
        if isinstance(p, McpPlugin):
            click.echo(f"{p.name} ({p.source}, {p.status})" + (f": {p.error}" if p.error else ""))
        else:
            click.echo(f"{p.name} ({p.source})")
        for f in p.functions:
            click.echo(f"  {f.name}: {f.description}")


def summarize(path: Path, config: OrchestrationConfig | None, error: str | None) -> ConfigSummary:
    """The ConfigSummary of a config file (``config`` None when it did not load)."""
    if config is None:
        return ConfigSummary(
            path=str(path),
            name=None,
            description=None,
            agents=[],
            selection_type=None,
            error=error or "the file did not load",
        )
    return ConfigSummary(
        path=str(path),
        name=config.name,
        description=config.description,
        agents=[a.name for a in config.agents],
        selection_type=config.selection.type,
        error=error,
    )


def _config_files(directory: Path) -> list[Path]:
    found: list[Path] = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d != "agents" and not d.startswith("."))
        found.extend(Path(root) / f for f in files if f.lower().endswith(_CONFIG_SUFFIXES))
    return sorted(found)


@click.command("config", short_help="List the orchestration configs of a folder (--list).")
@json_option
@click.option("--list", "list_configs", is_flag=True, help="List the orchestration configs in --dir.")
@click.option(
    "--dir",
    "directory",
    type=click.Path(),
    default=str(DEFAULT_CONFIG_DIR),
    show_default=True,
    help="The config folder (files in agents/ folders are skipped).",
)
def config_command(as_json: bool, list_configs: bool, directory: str) -> None:
    """Orchestration configs: --list them (--json: ConfigSummary items).

    The names and fields of --json output are the wire protocol's (docs/wire.md, "Resource queries").

    Exit status: 0 on success; 1 on failure (with --json: an error envelope on stdout); 2 for a
    usage error.
    """
    if not list_configs:
        fail("config", "nothing to do: use --list", as_json=as_json)
    root = Path(directory).resolve()
    if not root.is_dir():
        fail("config", f"no config folder at {root}", as_json=as_json)
    rows = []
    for path in _config_files(root):
        config, issues = validate_config_file(path)
        errors = [i.message for i in issues if i.level == "error"]
        rows.append(summarize(path, config, "; ".join(errors) or None))
    if as_json:
        emit_items(rows)
        return
    if not rows:
        click.echo(f"no configs in {root}")
    for row in rows:
        status = f"error: {row.error}" if row.error else f"{len(row.agents)} agents, {row.selection_type}"
        click.echo(f"{row.path}  {row.name or ''}  {status}")


@click.command("validate", short_help="Check an orchestration config (exit status 1 on errors).")
@click.argument("path", type=click.Path())
@json_option
@click.option("--diagram", is_flag=True, help="Also print a text diagram of the agents and their routes.")
@click.option("--show-paths", is_flag=True, help="Also print the files the config uses (itself, agent files).")
def validate_command(path: str, as_json: bool, diagram: bool = False, show_paths: bool = False) -> None:
    """Check the orchestration config PATH; exit status 1 when it has errors.

    --json prints the Validation item in every case (also when invalid); it cannot be combined
    with --diagram or --show-paths (an error envelope, exit status 1).

    Exit status: 0 when the config is valid (warnings allowed); 1 when it has errors or cannot be
    read; 2 for a usage error.
    """
    for flag, given in (("--diagram", diagram), ("--show-paths", show_paths)):
        if given and as_json:
            fail("validate", f"--json can't be combined with {flag}", as_json=True)
    file = Path(path).expanduser().resolve()
    config, found = validate_config_file(file)
    issues = [ValidationIssue(level=i.level, message=i.message) for i in found]
    if config is not None:
        issues += plugin_warnings(config) + a2a_warnings(config)
    errors = [i.message for i in issues if i.level == "error"]
    summary = None if config is None else summarize(file, config, "; ".join(errors) or None)
    result = Validation(path=str(file), valid=not errors, issues=issues, config=summary)
    if as_json:
        emit_item(result)
    else:
        for issue in issues:
            click.echo(f"{issue.level}: {issue.message}", err=issue.level == "error")
        click.echo(f"{file}: {'valid' if result.valid else 'invalid'}")
        if config is not None and show_paths:
            click.echo("\n".join(config_paths(file, config)))
        if config is not None and diagram:
            click.echo("\n".join(config_diagram(config)))
    if errors:
        raise SystemExit(1)


def config_paths(file: Path, config: Any) -> list[str]:
    """``validate --show-paths``: the config file and each agent's file (absolute), one a line."""
    lines = [f"config: {file}"]
    for agent in config.agents:
        if agent.file:
            lines.append(f"agent {agent.name}: {(file.parent / agent.file).resolve()}")
        else:
            lines.append(f"agent {agent.name}: (inline in the config)")
    return lines


def config_diagram(config: Any) -> list[str]:
    """``validate --diagram``: a text diagram of the agents (in order) and the selection's routes.

    Sequential selection draws the turn order as a ring; keyword routes are drawn
    ``SOURCE --"KEYWORD"--> TARGET`` (``*`` for any source), with ``[human approval]`` when the
    route needs one.
    """
    selection = config.selection
    names = [a.name for a in config.agents]
    lines = [f"{config.name or 'Orchestration'}  (selection: {selection.type})", "agents:"]
    for agent in config.agents:
        lines.append(f"  [{agent.name}]" + (f"  {agent.description}" if agent.description else ""))
    if selection.type == "sequential" and names:
        lines.append("turn order:")
        lines.append("  " + " -> ".join(f"[{n}]" for n in names) + f" -> [{names[0]}] ...")
    if selection.default_agent:
        lines.append(f"default agent: [{selection.default_agent}]")
    if selection.routes:
        lines.append("routes:")
        for route in selection.routes:
            sources = ", ".join(f"[{s}]" for s in route.source_agents) or "*"
            gate = "  [human approval]" if route.require_human_approval else ""
            lines.append(f'  {sources} --"{route.keyword}"--> [{route.agent}]{gate}')
    return lines


def _default_model_and_endpoint() -> tuple[str, str | None]:
    from roost.config import load_config

    try:
        table = load_config().get("provider", {})
    except Exception:
        table = {}
    table = table if isinstance(table, dict) else {}
    model = os.environ.get("ROOST_MODEL") or table.get("model") or FALLBACK_MODEL
    endpoint = os.environ.get("ROOST_BASE_URL") or table.get("base_url") or None
    return str(model), (str(endpoint) if endpoint else None)


def _ensure_gitignore(project: Path) -> None:
    path = project / ".gitignore"
    existing = path.read_text(encoding="utf-8") if path.exists() else ""
    have = {line.strip() for line in existing.splitlines()}
    missing = [line for line in _GITIGNORE_LINES if line not in have]
    if not missing:
        return
    prefix = "" if not existing or existing.endswith("\n") else "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(prefix + "\n".join(missing) + "\n")


@click.command("init", short_help="Write an orchestration config and agents from a template.")
@click.argument("path", required=False, type=click.Path())
@json_option
@click.option("--template", "template_key", default="assistant", show_default=True, help="The template's key.")
@click.option("--list-templates", is_flag=True, help="List the templates (--json: Template items).")
@click.option("--model", default=None, help="Model id for the agents (default: ROOST_MODEL or config.toml).")
@click.option("--endpoint", default=None, help="Server base URL (default: ROOST_BASE_URL or config.toml).")
@click.option("--force", is_flag=True, help="Overwrite files that exist.")
@click.option("--no-interactive", is_flag=True, help="Accepted for compatibility: init never prompts.")
def init_command(
    path: str | None,
    as_json: bool,
    template_key: str,
    list_templates: bool,
    model: str | None,
    endpoint: str | None,
    force: bool,
    no_interactive: bool,
) -> None:
    """Write an orchestration config and its agent files from a template.

    PATH is the config file (default .roost/config/orchestration.yaml; a directory gets
    orchestration.yaml inside it); agent files go to agents/ beside it. Also creates .roost/ in
    the current directory and adds Roost's lines to its .gitignore. Files that exist are an error
    unless --force. --json: an InitResult item.

    Exit status: 0 when the files were written (or the templates listed); 1 on failure (an
    unknown template, files that exist without --force; with --json an error envelope); 2 for a
    usage error.
    """
    if list_templates:
        rows = [Template(key=t.key, label=t.label, description=t.description) for t in TEMPLATES.values()]
        if as_json:
            emit_items(rows)
        else:
            for t in rows:
                click.echo(f"{t.key:12} {t.label}: {t.description}")
        return
    if template_key not in TEMPLATES:
        fail("init", f"unknown template {template_key!r} (one of {', '.join(TEMPLATES)})", as_json=as_json)
    default_model, default_endpoint = _default_model_and_endpoint()
    model = model or default_model
    endpoint = endpoint or default_endpoint
    project = Path.cwd()
    target = Path(path).expanduser() if path else DEFAULT_CONFIG_FILE
    if target.is_dir() or (path or "").endswith(("/", os.sep)):
        target = target / "orchestration.yaml"
    target = (project / target).resolve()
    config_text, agent_texts = render_template(template_key, model=model, endpoint=endpoint)
    agent_paths = {target.parent / "agents" / name: text for name, text in agent_texts.items()}
    if not force:
        existing = [str(p) for p in (target, *agent_paths) if p.exists()]
        if existing:
            fail("init", f"file(s) exist (use --force to overwrite): {', '.join(existing)}", as_json=as_json)
    try:
        (project / ".roost").mkdir(exist_ok=True)
        for file, text in ((target, config_text), *agent_paths.items()):
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(text, encoding="utf-8")
        _ensure_gitignore(project)
    except OSError as exc:
        fail("init", f"cannot write {exc.filename}: {exc.strerror or exc}", as_json=as_json)
    result = InitResult(
        template=template_key,
        model=model,
        endpoint=endpoint,
        config_path=str(target),
        agent_files=[str(p) for p in agent_paths],
    )
    if as_json:
        emit_item(result)
    else:
        click.echo(f"wrote {target}")
        for p in agent_paths:
            click.echo(f"wrote {p}")
