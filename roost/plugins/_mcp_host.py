"""The MCP plugin host: a supervisor of one connection actor per MCP server, and their tools.

::

    mcp (one_for_one, intensity 100 per 60 s)
    ├── mcp:<server>   permanent   McpConnection: connect, serve calls, ping; restarted with backoff
    └── ...

A server's tools are offered to threads and agents like the built-in tools, as
``mcp__<server>__<tool>`` (characters outside ``A-Z a-z 0-9 _ -`` become ``_``). A call of a
mutating tool (see :mod:`roost.plugins._mcp_config` for read-only ones) is gated like any
mutating tool by :func:`roost.tools.run_tool` (``tool_action`` approval with ``plugin`` the
server and ``action`` the tool's own name). A server that fails to start, dies mid-call or hangs
gives the call a tool error; its status changes (``mcp/status/updated``) and it is reconnected.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import trio

from roost._json import dumps
from roost.errors import AskTimeout, MailboxClosed, MailboxFull, McpCallTimeout, McpUnavailable
from roost.plugins._mcp_config import McpServerConfig
from roost.plugins._mcp_conn import PING_TIMEOUT_S, CallTool, McpConnection, McpServerState, check_tunables
from roost.supervisor import ChildSpec, Restart, Strategy, Supervisor
from roost.tools import Tool, ToolContext, ToolResult

__all__ = ["McpHost", "open_mcp_host", "mcp_tool_name"]

log = logging.getLogger("roost.plugins")

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
#: Longest ``detail`` of a ``tool_action`` approval request, in characters.
_DETAIL_CHARS = 2000


def mcp_tool_name(server: str, tool: str) -> str:
    """The model-facing name of ``server``'s tool ``tool``: ``mcp__<server>__<tool>`` (<= 64 chars)."""
    return _UNSAFE.sub("_", f"mcp__{server}__{tool}")[:64]


class McpHost:
    """The MCP servers of one process: their states, supervisor and tools.

    Build it with :func:`open_mcp_host`. Not a checkpoint anywhere but :meth:`wait_settled`.
    """

    def __init__(self, configs: Iterable[McpServerConfig]) -> None:
        """Build each server's state and the ``mcp`` supervisor (nothing starts yet).

        Raises:
            ConfigError: ``ROOST_MCP_BACKOFF_S``, ``ROOST_MCP_BACKOFF_MAX_S`` or ``ROOST_MCP_PING_S``
                is set but not a positive number (checked here, not in a connection actor).
        """
        check_tunables()
        self._listeners: list[Callable[[dict[str, Any]], None]] = []
        self.states: dict[str, McpServerState] = {}
        for config in configs:
            if config.name in self.states:
                log.warning("MCP server %s is configured twice; the later one is used", config.name)
            self.states[config.name] = McpServerState(config, on_status=self._notify)
        self.supervisor = Supervisor(
            [self._child(state) for state in self.states.values()],
            name="mcp",
            strategy=Strategy.ONE_FOR_ONE,
            intensity=100,
            period=60.0,
            # independent servers: stop them at once, so leaving waits for the slowest stdio
            # server to exit (the SDK gives each a grace period), not for the sum of them
            stop_together=True,
        )

    @staticmethod
    def _child(state: McpServerState) -> ChildSpec:
        async def start(*, task_status: Any) -> None:
            await McpConnection(state).run(task_status=task_status)

        return ChildSpec(f"mcp:{state.config.name}", start, restart=Restart.PERMANENT, shutdown_timeout=10)

    def add_listener(self, listener: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Call ``listener(status)`` on every status change (``mcp/status/updated`` params); returns
        a function that removes it. The listener must not block."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _notify(self, status: dict[str, Any]) -> None:
        for listener in list(self._listeners):
            listener(status)

    def statuses(self) -> list[dict[str, Any]]:
        """Each server's ``{name, state, connected, tool_count, error?}``, in config order."""
        return [state.status() for state in self.states.values()]

    async def wait_settled(self, timeout_s: float | None = None) -> None:
        """Wait until every server's first connection attempt has finished (connected or failed),
        at most ``timeout_s`` seconds (default: the longest connect timeout plus 1 s)."""
        if timeout_s is None:
            timeout_s = max((s.config.connect_timeout_s for s in self.states.values()), default=0.0) + 1.0
        with trio.move_on_after(timeout_s):
            for state in self.states.values():
                await state.settled.wait()

    def tools(self) -> dict[str, Tool]:
        """Model-facing name -> :class:`~roost.tools.Tool` for every tool of every server that
        has listed its tools (a server that never connected has none yet)."""
        out: dict[str, Tool] = {}
        for state in self.states.values():
            for spec in state.tools:
                tool = _mcp_tool(state, spec)
                out[tool.name] = tool
        return out

    def attach(self, tools: dict[str, Tool]) -> None:
        """Keep ``tools`` (a runtime's tool dict, ``Services.tools``) holding every server's tools:
        added now, and again each time a server connects, so a server that was down at start-up
        has its tools offered to the turns that start after it connected."""
        tools.update(self.tools())

        def refresh(status: dict[str, Any]) -> None:
            if status["state"] == "connected":
                tools.update(self.tools())

        self.add_listener(refresh)

    def groups(self) -> dict[str, tuple[str, ...]]:
        """Server name -> its tools' model-facing names: a ``Plugins`` entry naming a server
        gives the agent all of its tools."""
        return {
            name: tuple(mcp_tool_name(name, spec.name) for spec in state.tools) for name, state in self.states.items()
        }

    def plugins(self) -> list[dict[str, Any]]:
        """``roost plugins`` items (wire-protocol.md "Plugin"): ``{name, source: "mcp", functions}``,
        plus the server's ``status`` (``mcp/status/updated``'s shape) as of its last finished
        attempt: a server ``connecting`` again after a failure is listed ``failed`` with that
        error, so ``error`` is only ever set with ``failed``."""
        return [
            {
                "name": name,
                "source": "mcp",
                "functions": [
                    {"name": mcp_tool_name(name, spec.name), "description": spec.description or spec.name}
                    for spec in state.tools
                ],
                "status": _settled_status(state),
            }
            for name, state in self.states.items()
        ]


def _settled_status(state: McpServerState) -> dict[str, Any]:
    """``state.status()``, with ``connecting`` after a failure (an error kept) reported ``failed``."""
    status = state.status()
    if status["state"] == "connecting" and status.get("error"):
        status["state"] = "failed"
    return status


def _is_read_only(config: McpServerConfig, spec: Any) -> bool:
    annotations = getattr(spec, "annotations", None)
    hint = bool(getattr(annotations, "read_only_hint", False)) if annotations is not None else False
    return config.read_only or spec.name in config.read_only_tools or hint


def _mcp_tool(state: McpServerState, spec: Any) -> Tool:
    """A :class:`~roost.tools.Tool` calling ``spec`` (an ``mcp_types.Tool``) of ``state``'s server."""
    config = state.config
    tool_name = spec.name
    parameters = dict(spec.input_schema or {"type": "object", "properties": {}})
    parameters.setdefault("type", "object")

    async def run(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        ref = state.ref
        if ref is None:
            raise state.unavailable()
        try:
            result = await ref.ask(CallTool(tool_name, args), timeout=config.timeout_s + PING_TIMEOUT_S + 5.0)
        except MailboxFull:
            raise McpUnavailable(
                f"MCP server {config.name!r} is busy (too many calls waiting); try again later"
            ) from None
        except MailboxClosed:
            raise state.unavailable() from None
        except AskTimeout:
            raise McpCallTimeout(f"MCP server {config.name!r} did not answer {tool_name!r} in time") from None
        return _result(config.name, tool_name, result)

    async def approval_fields(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        detail = dumps(args).decode("utf-8", "replace")
        if len(detail) > _DETAIL_CHARS:
            detail = detail[:_DETAIL_CHARS] + "..."
        return {"plugin": config.name, "action": tool_name, "detail": detail}

    description = spec.description or f"The {tool_name} tool of the MCP server {config.name}."
    return Tool(
        name=mcp_tool_name(config.name, tool_name),
        description=description,
        parameters=parameters,
        mutating=not _is_read_only(config, spec),
        run=run,
        approval_kind="tool_action",
        approval_fields=approval_fields,
    )


def _result(server: str, tool: str, result: Any) -> ToolResult:
    """A ``CallToolResult`` as the model's :class:`~roost.tools.ToolResult` (text parts joined)."""
    parts: list[str] = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '')}]")
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource: {resource.uri}]")
        else:
            parts.append(f"[{kind or 'content'}]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(dumps(structured).decode())
    metadata: dict[str, Any] = {"mcp_server": server, "mcp_tool": tool}
    if structured is not None:
        metadata["structured_content"] = structured
    text = "\n".join(parts)
    if result.is_error:
        return ToolResult.error(f"MCP tool {tool!r} of {server!r} reported an error: {text}", **metadata)
    return ToolResult(output=text, metadata=metadata)


@asynccontextmanager
async def open_mcp_host(
    configs: Iterable[McpServerConfig], *, wait: bool = True, on_status: Callable[[dict[str, Any]], None] | None = None
) -> AsyncIterator[McpHost]:
    """Start a connection actor per server under the ``mcp`` supervisor; yield the :class:`McpHost`.

    Args:
        configs: the servers (none: nothing starts, the host has no tools).
        wait: first wait for every server's first attempt to settle (see
            :meth:`McpHost.wait_settled`), so their tools are known; a server that fails to start
            does not stop this (it is ``failed`` and retried in the background).
        on_status: a first status listener (see :meth:`McpHost.add_listener`).

    Cancellation: leaving the block stops every connection (stdio servers are terminated).
    """
    host = McpHost(configs)
    if on_status is not None:
        host.add_listener(on_status)
    if not host.states:
        yield host
        return
    async with trio.open_nursery() as nursery:
        await nursery.start(host.supervisor.run)
        if wait:
            await host.wait_settled()
        try:
            yield host
        finally:
            nursery.cancel_scope.cancel()
