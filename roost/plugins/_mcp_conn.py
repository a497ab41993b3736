"""One MCP server connection as a supervised actor, on the official ``mcp`` client (anyio, so trio).

Each instance of :class:`McpConnection` is one connection's life: it (re)starts the server (stdio)
or opens the session (streamable HTTP), performs the MCP handshake, lists the tools, then serves
:class:`CallTool` messages from its bounded :class:`~roost.actors.Mailbox` (several calls at once,
each under its timeout) and pings the server between calls. When the connection breaks (the
server fails to start, exits, closes the stream, or stops answering pings) the instance fails
every call it holds with :class:`~roost.errors.McpUnavailable` and raises :class:`_ConnectionLost`;
its supervisor (``restart=permanent``) starts a fresh instance, which first waits the backoff
delay of :attr:`McpServerState.failures` (``ROOST_MCP_BACKOFF_S`` doubling up to
``ROOST_MCP_BACKOFF_MAX_S``). :class:`McpServerState` is what survives restarts: the status, the
last tool list and the failure count. A call that times out is answered with
:class:`~roost.errors.McpCallTimeout` and makes the actor ping the server at once: a server that
does not answer the ping either is hung, and its connection is restarted.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from roost._paths import positive_env
from roost.actors import Envelope, Mailbox, Ref, ReplySlot
from roost.errors import McpCallTimeout, McpUnavailable, RoostError
from roost.plugins._mcp_config import McpServerConfig
from roost.plugins._mcp_stdio import StdioProcess, open_stdio

__all__ = ["McpServerState", "McpConnection", "CallTool", "MAILBOX_CAPACITY", "check_tunables"]

log = logging.getLogger("roost.plugins")

#: Calls that may wait in one server's mailbox; one more is refused (``MailboxFull``).
MAILBOX_CAPACITY = 64
#: Seconds a ping may take before the server counts as hung.
PING_TIMEOUT_S = 5.0
#: A connection up this long (seconds) resets the backoff when it breaks.
_HEALTHY_S = 10.0


def _backoff_s() -> tuple[float, float]:
    """``(first delay, longest delay)`` in seconds: ``ROOST_MCP_BACKOFF_S`` (0.5), ``ROOST_MCP_BACKOFF_MAX_S`` (30)."""
    return (
        positive_env("ROOST_MCP_BACKOFF_S", 0.5, unit="seconds"),
        positive_env("ROOST_MCP_BACKOFF_MAX_S", 30.0, unit="seconds"),
    )


def check_tunables() -> None:
    """Read ``ROOST_MCP_BACKOFF_S``, ``ROOST_MCP_BACKOFF_MAX_S`` and ``ROOST_MCP_PING_S`` once.

    Raises:
        ConfigError: one is set but is not a positive number.
    """
    _backoff_s()
    positive_env("ROOST_MCP_PING_S", 10.0, unit="seconds")


class _ConnectionLost(RoostError):
    """This connection instance ended abnormally; the supervisor restarts it (after the backoff)."""


@attrs.frozen
class CallTool:
    """Call the server's tool ``name`` with ``arguments``; the reply is the ``CallToolResult``."""

    name: str
    arguments: dict[str, Any]


@attrs.define(eq=False)
class McpServerState:
    """One server's status across its connection actor's restarts.

    Attributes:
        config: the server's settings.
        on_status: called with :meth:`status` on every change (app-server ``mcp/status/updated``);
            must not block.
        state: ``configured`` (not tried yet), ``connecting``, ``connected`` or ``failed``.
        error: why it is not connected (``failed``; also kept while ``connecting`` again).
        tools: the server's tools (``mcp_types.Tool``) as last listed.
        failures: consecutive failed or short-lived connections (the backoff exponent).
        ref: the live connection's mailbox ref while ``connected``.
        settled: set once the first connection attempt has finished (connected or failed).
        noise: the first stdout line of this attempt that was not JSON-RPC (``repr``, shortened).
    """

    config: McpServerConfig
    on_status: Callable[[dict[str, Any]], None] | None = None
    state: str = "configured"
    error: str | None = None
    tools: list[Any] = attrs.field(factory=list)
    failures: int = 0
    ref: Ref | None = None
    settled: trio.Event = attrs.field(factory=trio.Event)
    connected_at: float | None = None
    noise: str | None = None

    def status(self) -> dict[str, Any]:
        """``{name, state, connected, tool_count, error?}`` (app-server ``mcp/status/updated``)."""
        out: dict[str, Any] = {
            "name": self.config.name,
            "state": self.state,
            "connected": self.state == "connected",
            "tool_count": len(self.tools),
        }
        if self.error:
            out["error"] = self.error
        return out

    def set_state(self, state: str, error: str | None = None) -> None:
        """Change the state (``error`` kept while reconnecting); tell :attr:`on_status`."""
        self.state = state
        if error is not None or state == "connected":
            self.error = error
        if state in ("connected", "failed"):
            self.settled.set()
        if self.on_status is not None:
            try:
                self.on_status(self.status())
            except Exception:
                log.exception("MCP status listener failed")

    def next_delay(self) -> float:
        """Seconds to wait before the next connection attempt (0 before the first)."""
        if self.failures == 0:
            return 0.0
        first, longest = _backoff_s()
        return min(first * 2 ** (self.failures - 1), longest)

    def unavailable(self) -> McpUnavailable:
        """The error a call gets while the server is not connected."""
        why = f": {self.error}" if self.error else ""
        return McpUnavailable(
            f"MCP server {self.config.name!r} is not connected ({self.state}{why}); it is being reconnected"
        )


@asynccontextmanager
async def _open_client(
    config: McpServerConfig, proc: StdioProcess, on_noise: Callable[[str], None]
) -> AsyncIterator[Any]:
    """The connected ``mcp.Client`` of ``config`` (stdio subprocess, see :mod:`._mcp_stdio`, or
    streamable HTTP)."""
    from mcp import Client

    target: Any
    if config.transport == "stdio":
        target = open_stdio(config, proc, on_noise)
    elif config.headers:
        target = _http_transport(str(config.url), dict(config.headers))
    else:
        target = str(config.url)
    async with Client(target, cache=None) as client:
        yield client


@asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """A streamable HTTP transport whose requests carry ``headers``."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    timeout = httpx2.Timeout(30.0, read=300.0)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


def _describe(exc: BaseException) -> str:
    """A one-line reason for ``exc`` (the first leaf of an exception group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename:
        text = f"{exc.strerror or text}: {exc.filename}"
    return text


class McpConnection:
    """One instance of a server's connection actor; see the module docstring.

    Args:
        state: the server's :class:`McpServerState` (shared by every instance).
        capacity: the mailbox's bound (calls waiting or running).
    """

    def __init__(self, state: McpServerState, *, capacity: int = MAILBOX_CAPACITY) -> None:
        self.state = state
        self._proc = StdioProcess()
        self.mailbox: Mailbox[CallTool] = Mailbox(capacity)
        self._lost: str | None = None
        self._logged = False
        self._check_now = trio.Event()
        #: calls running at once; more wait in the mailbox (bounded too)
        self._slots = trio.Semaphore(capacity)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Connect (after the backoff delay), serve calls until the connection breaks, then raise.

        Reports ``self`` started at once: connecting happens in the supervised instance.

        Raises:
            _ConnectionLost: the server failed to start, died, closed the connection or hung.

        Cancellation: stops the server (stdio: :func:`~roost.plugins._mcp_stdio.open_stdio`); calls still
        held get :class:`~roost.errors.McpUnavailable`.
        """
        task_status.started(self)
        state = self.state
        name = state.config.name
        delay = state.next_delay()
        if delay:
            await trio.sleep(delay)
        state.noise = None
        state.set_state("connecting")
        began = trio.current_time()
        try:
            await self._connect_and_serve()
        except Exception as exc:
            up = state.connected_at is not None and state.connected_at >= began
            why = _describe(exc)
            reason = self._lost or (f"the connection broke: {why}" if up else self._connect_failure(why))
        else:
            reason = self._lost or "the connection ended"
        finally:
            state.ref = None
            pending = self.mailbox.close()
            for env in pending:
                if env.reply is not None:
                    env.reply.set_exception(state.unavailable())
        up = state.connected_at is not None and state.connected_at >= began
        healthy = up and trio.current_time() - (state.connected_at or 0.0) >= _HEALTHY_S
        state.failures = 1 if healthy else state.failures + 1
        if self._lost is None:
            state.set_state("failed", reason)
        if not self._logged:
            log.warning("MCP server %s: %s; reconnecting in %.1f s", name, reason, state.next_delay())
        raise _ConnectionLost(f"MCP server {name!r}: {reason}")

    async def _connect_and_serve(self) -> None:
        state = self.state
        config = state.config
        async with trio.open_nursery() as nursery:
            connected = trio.Event()
            nursery.start_soon(self._connect_deadline, connected, nursery.cancel_scope)
            client = await nursery.start(self._hold_client)
            tools = await _list_tools(client)
            connected.set()
            state.tools = tools
            state.connected_at = trio.current_time()
            state.ref = Ref(f"mcp:{config.name}", self.mailbox)
            state.set_state("connected")
            log.info("MCP server %s connected (%d tools)", config.name, len(tools))
            nursery.start_soon(self._health, client, nursery.cancel_scope)
            while True:
                await self._slots.acquire()
                env = await self.mailbox.get()
                nursery.start_soon(self._call, client, env, nursery.cancel_scope)

    async def _connect_deadline(self, connected: trio.Event, scope: trio.CancelScope) -> None:
        """Fail the attempt once ``connect_timeout`` passes without ``connected``: the state is
        ``failed`` at that moment, and a stdio server that never started is killed at once
        rather than given its grace period (``roost plugins`` waits at most ``connect_timeout``)."""
        timeout = self.state.config.connect_timeout_s
        with trio.move_on_after(timeout):
            await connected.wait()
            return
        reason = self._connect_failure(f"it did not finish starting within {timeout:g} s")
        self._proc.kill_now = True  # it never started: no grace period, the command waits no longer
        self._lose(reason, scope)
        self._logged = True  # now, not after the server's shutdown (the command may end first)
        log.warning("MCP server %s: %s; stopping it", self.state.config.name, reason)

    def _connect_failure(self, why: str) -> str:
        """The reason of a failed attempt; names the server's non-JSON-RPC stdout, if it wrote any,
        and the last line of its stderr (a stdio server that died at start: its error)."""
        if self.state.noise is not None:
            why = f"it wrote a line that is not JSON-RPC on stdout ({self.state.noise}); {why}"
        last = self._proc.last_error_line()
        if last is not None:
            why = f"{why}; its stderr ended: {last}"
        return f"could not connect: {why}"

    def _noise(self, line: str) -> None:
        """A stdout line that is not JSON-RPC: the first of the attempt is one WARNING, and kept
        (shortened) in :attr:`McpServerState.noise` for the attempt's failure reason."""
        first = self.state.noise is None
        text = repr(line)
        self.state.noise = text if len(text) <= 120 else text[:117] + "..."
        if first:
            log.warning(
                "MCP server %s wrote a line that is not JSON-RPC on stdout (ignored): %s",
                self.state.config.name,
                self.state.noise,
            )

    async def _hold_client(self, *, task_status: Any) -> None:
        """Keep the client open (in the actor's nursery) until the actor's nursery is cancelled."""
        async with _open_client(self.state.config, self._proc, self._noise) as client:
            task_status.started(client)
            await trio.sleep_forever()

    def _lose(self, reason: str, scope: trio.CancelScope) -> None:
        """The connection is broken: refuse new calls and say so at once, then end this instance."""
        if self._lost is None:
            self._lost = reason
            self.state.ref = None
            self.state.set_state("failed", reason)
        scope.cancel()

    async def _call(self, client: Any, env: Envelope, scope: trio.CancelScope) -> None:
        """Run one call and answer its reply slot; a call cut off by a lost connection is answered
        :class:`~roost.errors.McpUnavailable`."""
        msg: CallTool = env.message
        reply = env.reply
        assert reply is not None
        try:
            await self._call_once(client, msg, reply, scope)
        finally:
            self._slots.release()
            if not reply.done:
                reply.set_exception(
                    McpUnavailable(
                        f"MCP server {self.state.config.name!r} was lost during {msg.name!r}; it is being reconnected"
                    )
                )

    async def _call_once(self, client: Any, msg: CallTool, reply: ReplySlot, scope: trio.CancelScope) -> None:
        """One ``tools/call`` under the server's timeout; its outcome goes to ``reply``."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        config = self.state.config
        try:
            with trio.fail_after(config.timeout_s):
                result = await client.call_tool(msg.name, msg.arguments)
        except trio.TooSlowError:
            reply.set_exception(
                McpCallTimeout(f"MCP server {config.name!r} did not answer {msg.name!r} within {config.timeout_s:g} s")
            )
            self._check_now.set()  # a hung server is restarted; a slow tool is not
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                reply.set_exception(
                    McpUnavailable(f"MCP server {config.name!r} died during {msg.name!r}; it is being reconnected")
                )
                self._lose("the server closed the connection (it exited or crashed)", scope)
            else:
                reply.set_exception(McpUnavailable(f"MCP server {config.name!r} refused {msg.name!r}: {exc}"))
        except Exception as exc:
            reason = f"the connection broke: {_describe(exc)}"
            reply.set_exception(McpUnavailable(f"MCP server {config.name!r}: {reason} during {msg.name!r}"))
            self._lose(reason, scope)
        else:
            reply.set_result(result)

    async def _health(self, client: Any, scope: trio.CancelScope) -> None:
        """Probe the server every ``ROOST_MCP_PING_S`` seconds (10), and at once after a timeout.

        The probe is ``tools/list`` (``ping`` is gone from newer MCP revisions); any answer, even an
        error, shows the server alive, and a listing refreshes :attr:`McpServerState.tools`.
        """
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        interval = positive_env("ROOST_MCP_PING_S", 10.0, unit="seconds")
        while True:
            with trio.move_on_after(interval):
                await self._check_now.wait()
            self._check_now = trio.Event()
            try:
                with trio.fail_after(PING_TIMEOUT_S):
                    tools = await _list_tools(client)
            except trio.TooSlowError:
                self._lose(f"the server stopped answering (no reply to a probe within {PING_TIMEOUT_S:g} s)", scope)
                return
            except MCPError as exc:
                if exc.code == CONNECTION_CLOSED:
                    self._lose("the server closed the connection (it exited or crashed)", scope)
                    return
            except Exception as exc:
                self._lose(f"the connection broke: {_describe(exc)}", scope)
                return
            else:
                self.state.tools = tools


async def _list_tools(client: Any) -> list[Any]:
    """Every tool of the server (all pages of ``tools/list``)."""
    tools: list[Any] = []
    cursor: str | None = None
    for _ in range(1000):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools
