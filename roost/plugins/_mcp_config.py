"""MCP server settings: an orchestration config's ``McpServers`` and ``config.toml``'s ``[mcp_servers]``.

wire-protocol.md, appendix: ``McpServers`` lists MCP servers (``stdio`` with a command and
arguments, or ``http`` with a URL) whose tools agents may use through ``Plugins``. Orchestration
keys are PascalCase, ``config.toml`` keys snake_case::

    Orchestration:
      McpServers:
        - {Name: notes, Type: stdio, Command: python, Args: [notes_server.py], Env: {K: v}}
        - {Name: search, Type: http, Url: "http://127.0.0.1:8000/mcp", Headers: {X-Team: a},
           ReadOnly: true, TimeoutSeconds: 30}

    # $ROOST_HOME/config.toml
    [mcp_servers.notes]
    command = "python"
    args = ["notes_server.py"]
    [mcp_servers.search]
    url = "http://127.0.0.1:8000/mcp"
    read_only = true
    read_only_tools = ["lookup"]
    timeout = 30            # seconds per tool call (default 60)
    connect_timeout = 30    # seconds to start and initialize (default 30)

``Type`` (``transport``) may be left out: a command means ``stdio``, a URL ``http``; a server with
both a command and a URL is refused, and so is a key not listed here (a typo such as
``conect_timeout`` would otherwise fall back to the default unnoticed). A tool is
*read-only* (never needs approval) when the MCP server marks it with the ``readOnlyHint``
annotation (MCP specification, "Tool annotations"), when the server is ``ReadOnly``, or when the
tool is listed in ``ReadOnlyTools``; every other MCP tool is mutating.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import attrs

from roost.errors import ConfigError

__all__ = ["McpServerConfig", "mcp_servers_from_toml", "mcp_servers_from_orchestration", "NAME_PATTERN"]

#: A server name: it becomes part of the model-facing tool names (``mcp__<server>__<tool>``).
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,40}")
_DEFAULT_TIMEOUT_S = 60.0
_DEFAULT_CONNECT_TIMEOUT_S = 30.0

# (config.toml key, orchestration key) -> McpServerConfig field
_KEYS = {
    "transport": ("transport", "Type"),
    "command": ("command", "Command"),
    "args": ("args", "Args"),
    "env": ("env", "Env"),
    "cwd": ("cwd", "Cwd"),
    "url": ("url", "Url"),
    "headers": ("headers", "Headers"),
    "read_only": ("read_only", "ReadOnly"),
    "read_only_tools": ("read_only_tools", "ReadOnlyTools"),
    "timeout_s": ("timeout", "TimeoutSeconds"),
    "connect_timeout_s": ("connect_timeout", "ConnectTimeoutSeconds"),
}
_ALIASES = {"Transport": "Type"}


@attrs.frozen(kw_only=True)
class McpServerConfig:
    """One MCP server to connect to.

    Attributes:
        name: unique among the servers; the plugin name (``roost plugins``).
        transport: ``stdio`` (spawn ``command`` with ``args``) or ``http`` (streamable HTTP at ``url``).
        command, args, env, cwd: the stdio server's process; ``env`` is added to the few variables
            it inherits from Roost (``HOME LOGNAME PATH SHELL TERM USER``, the ``mcp`` SDK's
            ``get_default_environment()``: not Roost's API keys).
        url, headers: the HTTP server's endpoint and extra request headers.
        read_only: every tool of the server is read-only (never asks for approval).
        read_only_tools: these tools (the server's own names) are read-only.
        timeout_s: seconds a tool call may take before it fails with a timeout.
        connect_timeout_s: seconds to start the server and finish the MCP handshake.
        source: where it was configured: ``config.toml`` or the orchestration config's path.
    """

    name: str
    transport: Literal["stdio", "http"]
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = attrs.field(factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    read_only: bool = False
    read_only_tools: tuple[str, ...] = ()
    timeout_s: float = _DEFAULT_TIMEOUT_S
    connect_timeout_s: float = _DEFAULT_CONNECT_TIMEOUT_S
    source: str = "config.toml"

    def describe(self) -> str:
        """``command args...`` (stdio) or the URL (http), for messages."""
        if self.transport == "http":
            return str(self.url)
        return " ".join([str(self.command), *self.args])


# resolved here: the package re-exports the class under its own __module__ (roost._lazy.publish)
attrs.resolve_types(McpServerConfig, globals(), locals())


def mcp_servers_from_toml(config: Mapping[str, Any]) -> list[McpServerConfig]:
    """Return the servers of the ``[mcp_servers]`` table of a loaded ``config.toml``.

    Args:
        config: what :func:`roost.config.load_config` returned.

    Returns:
        One config per sub-table, in file order (empty without the table).

    Raises:
        ConfigError: the table or a field is malformed; the message names ``[mcp_servers.<name>]``
            and the key.
    """
    table = config.get("mcp_servers")
    if table is None:
        return []
    if not isinstance(table, Mapping):
        raise ConfigError("[mcp_servers] in config.toml must be a table of tables ([mcp_servers.NAME])")
    servers: list[McpServerConfig] = []
    for name, body in table.items():
        where = f"[mcp_servers.{name}]"
        if not isinstance(body, Mapping):
            raise ConfigError(f"{where} in config.toml must be a table")
        errors: list[str] = []
        _unknown_keys(body, where, toml=True, errors=errors, warnings=None)
        errors += _collect(str(name), body, where, toml=True, base=None, out=servers, source="config.toml")
        if errors:
            raise ConfigError(errors[0])
    return servers


def mcp_servers_from_orchestration(
    raw: Any, *, base: Path | None, warnings: list[str] | None = None
) -> tuple[list[McpServerConfig], list[str]]:
    """Parse an orchestration config's ``McpServers`` list.

    Args:
        raw: the value of ``Orchestration.McpServers`` (None: none).
        base: the config file's directory; a relative ``Cwd`` resolves against it.
        warnings: receives one ``Orchestration.McpServers[i].KEY: unknown key, ignored (known
            keys: ...)`` line per unknown key (``roost validate`` shows them as warnings).

    Returns:
        ``(servers, errors)``: each error starts with the field's path, e.g.
        ``Orchestration.McpServers[0].Command: required for Type stdio``.
    """
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        return [], ["Orchestration.McpServers: expected a list of servers"]
    servers: list[McpServerConfig] = []
    errors: list[str] = []
    source = str(base) if base is not None else "orchestration config"
    for i, body in enumerate(raw):
        where = f"Orchestration.McpServers[{i}]"
        if not isinstance(body, Mapping):
            errors.append(f"{where}: expected a mapping")
            continue
        body = {_ALIASES.get(k, k): v for k, v in body.items()}
        _unknown_keys(body, where, toml=False, errors=errors, warnings=warnings)
        errors += _collect(body.get("Name"), body, where, toml=False, base=base, out=servers, source=source)
    names = [s.name for s in servers]
    errors += [
        f"Orchestration.McpServers: duplicate server name {n!r}" for n in sorted(set(names)) if names.count(n) > 1
    ]
    return servers, errors


def _unknown_keys(body: Mapping[str, Any], where: str, *, toml: bool, errors: list, warnings: list | None) -> None:
    """An unknown key is an error in ``config.toml`` (``toml``: a typo such as ``conect_timeout``
    would silently fall back to the default), a warning appended to ``warnings`` in an
    orchestration config (whose other unknown keys are warnings too, ``roost validate``)."""
    known = [keys[0] for keys in _KEYS.values()] if toml else ["Name", *(keys[1] for keys in _KEYS.values())]
    unknown = [str(k) for k in body if k not in known]
    if unknown and toml:
        keys = ", ".join(map(repr, unknown))
        errors.append(f"{where} in config.toml: unknown key {keys} (known keys: {', '.join(known)})")
    elif warnings is not None:
        warnings += [f"{where}.{k}: unknown key, ignored (known keys: {', '.join(known)})" for k in unknown]


def _collect(
    name: Any, body: Mapping[str, Any], where: str, *, toml: bool, base: Path | None, out: list, source: str
) -> list[str]:
    """Append the server ``body`` describes to ``out``; return its errors (nothing appended then)."""
    errors: list[str] = []
    key_of = {field: keys[0 if toml else 1] for field, keys in _KEYS.items()}

    def at(field: str) -> str:
        """The path of ``field`` in messages."""
        return f"{where} {key_of[field]} in config.toml" if toml else f"{where}.{key_of[field]}"

    def field(f: str, kinds: tuple[type, ...], noun: str) -> Any:
        value = body.get(key_of[f])
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds):
            errors.append(f"{at(f)}: expected {noun}")
            return None
        return value

    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        errors.append(f"{where}{' in config.toml' if toml else '.Name'}: the name must be 1-40 of A-Z a-z 0-9 _ -")
    transport = field("transport", (str,), "stdio or http")
    command = field("command", (str,), "a string")
    url = field("url", (str,), "a string")
    args = field("args", (list,), "a list of strings")
    env = field("env", (dict,), "a mapping of strings")
    headers = field("headers", (dict,), "a mapping of strings")
    read_only = field("read_only", (bool,), "true or false")
    read_only_tools = field("read_only_tools", (list,), "a list of tool names")
    timeout = field("timeout_s", (int, float), "a number of seconds")
    connect_timeout = field("connect_timeout_s", (int, float), "a number of seconds")
    cwd = field("cwd", (str,), "a string")
    transport = transport or ("http" if url and not command else "stdio")
    if command and url:
        errors.append(
            f"{at('url')}: a server has either {key_of['command']} (stdio) or {key_of['url']} (http), not both"
        )
    elif transport not in ("stdio", "http"):
        errors.append(f"{at('transport')}: unknown transport {transport!r} (stdio or http)")
    elif transport == "stdio" and not command:
        errors.append(f"{at('command')}: required for a stdio server")
    elif transport == "http" and not (url and url.startswith(("http://", "https://"))):
        errors.append(f"{at('url')}: an http:// or https:// URL is required for an http server")
    for value, key in ((args, "args"), (read_only_tools, "read_only_tools")):
        if value is not None and not all(isinstance(v, str) for v in value):
            errors.append(f"{at(key)}: expected a list of strings")
    for value, key in ((env, "env"), (headers, "headers")):
        if value is not None and not all(isinstance(v, str) for v in value.values()):
            errors.append(f"{at(key)}: expected a mapping of strings")
    for value, key in ((timeout, "timeout_s"), (connect_timeout, "connect_timeout_s")):
        if value is not None and not 0 < value < math.inf:
            errors.append(f"{at(key)}: must be a positive finite number of seconds")
    if errors:
        return errors
    if cwd is not None and base is not None:
        cwd = str((base / Path(cwd).expanduser()).resolve())
    out.append(
        McpServerConfig(
            name=name,
            transport="http" if transport == "http" else "stdio",
            command=command,
            args=tuple(args or ()),
            env=dict(env or {}),
            cwd=cwd,
            url=url,
            headers=dict(headers or {}),
            read_only=bool(read_only),
            read_only_tools=tuple(read_only_tools or ()),
            timeout_s=float(timeout or _DEFAULT_TIMEOUT_S),
            connect_timeout_s=float(connect_timeout or _DEFAULT_CONNECT_TIMEOUT_S),
            source=source,
        )
    )
    return []
