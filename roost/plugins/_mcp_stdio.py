"""The stdio transport of an MCP server: its process, its newline-delimited JSON-RPC, its stderr.

Roost's own, over the ``mcp`` SDK's message types (``mcp_types.jsonrpc_message_adapter``,
``mcp.shared.message.SessionMessage``), instead of the SDK's ``stdio_client``, for three things
that one does not give: the server's stderr is streamed to Roost's stderr *and* its last
:data:`STDERR_TAIL_BYTES` are kept (a server that dies at start names its error); a line on
stdout that is not JSON-RPC is reported to the caller (``on_noise``) rather than logged with a
traceback; and a server that never finished starting is killed at once when the caller gives
up (:attr:`StdioProcess.kill_now`), so a command waits at most its ``connect_timeout``.

The shutdown follows the MCP specification (lifecycle, "Shutdown", stdio): close the server's
stdin, wait :data:`GRACE_S` for it to exit, then ``SIGTERM`` its process group, and ``SIGKILL``
after :data:`GRACE_S` more. The server runs in a session of its own (its pid is its group).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import attrs
import trio

from roost.plugins._mcp_config import McpServerConfig

__all__ = ["StdioProcess", "open_stdio", "STDERR_TAIL_BYTES", "GRACE_S"]

#: Bytes of a server's stderr kept for its failure reason (the end of it).
STDERR_TAIL_BYTES = 2048
#: Seconds a server is given to exit after its stdin closes, and again after ``SIGTERM``.
GRACE_S = 2.0
#: Seconds to wait for the rest of a dead server's stderr (a child of it may hold the pipe).
_STDERR_DRAIN_S = 0.5
_CHUNK = 65536


@attrs.define(eq=False)
class StdioProcess:
    """One attempt's server process, as the connection sees it.

    Attributes:
        kill_now: set it (before cancelling the transport) to kill the process at once on
            shutdown instead of giving it :data:`GRACE_S` (it never finished starting).
        tail: the last :data:`STDERR_TAIL_BYTES` of the server's stderr.
    """

    kill_now: bool = False
    tail: bytearray = attrs.field(factory=bytearray)

    def last_error_line(self) -> str | None:
        """The last non-blank line of the stderr tail (at most 200 characters), or None."""
        lines = [line.strip() for line in self.tail.decode("utf-8", "replace").splitlines()]
        last = next((line for line in reversed(lines) if line), None)
        if last is None:
            return None
        return last if len(last) <= 200 else last[:197] + "..."

    def keep(self, chunk: bytes | bytearray) -> None:
        """Append ``chunk`` to the tail, dropping what falls out of its bound."""
        self.tail += chunk
        del self.tail[: max(0, len(self.tail) - STDERR_TAIL_BYTES)]


@asynccontextmanager
async def open_stdio(
    config: McpServerConfig, proc: StdioProcess, on_noise: Callable[[str], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """Start ``config``'s server; yield the ``(read_stream, write_stream)`` pair ``mcp.Client`` takes.

    Raises:
        OSError: the command cannot be started (``filename`` names it).

    Cancellation: leaving the block stops the server (see the module docstring), shielded and
    bounded (6.5 s at most; at once with :attr:`StdioProcess.kill_now`).
    """
    import anyio  # with the SDK, on first use (app-server loads no anyio before a server is configured)
    from mcp.client.stdio import get_default_environment

    assert config.command is not None
    process = await trio.lowlevel.open_process(
        [config.command, *config.args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=get_default_environment() | dict(config.env),
        cwd=config.cwd,
        start_new_session=True,
    )
    to_client, read_stream = anyio.create_memory_object_stream[Any](0)
    write_stream, from_client = anyio.create_memory_object_stream[Any](0)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_stdout, process, to_client, on_noise)
            nursery.start_soon(_write_stdin, process, from_client)
            stderr_done = trio.Event()
            nursery.start_soon(_read_stderr, process, proc, stderr_done)
            try:
                yield read_stream, write_stream
            finally:
                with trio.CancelScope(shield=True):
                    await _stop(process, proc)
                    with trio.move_on_after(_STDERR_DRAIN_S):
                        await stderr_done.wait()
                nursery.cancel_scope.cancel()
    finally:
        for stream in (read_stream, write_stream, to_client, from_client):
            stream.close()
        if process.returncode is None:  # only if the nursery failed before the shutdown ran
            _signal(process, signal.SIGKILL)


async def _read_stdout(process: trio.Process, out: Any, on_noise: Callable[[str], None]) -> None:
    """Each stdout line as a ``SessionMessage`` (or the parse error, as the SDK's transport does);
    once the client closed its stream, the rest is read and dropped."""
    import anyio
    import mcp_types
    from mcp.shared.message import SessionMessage

    assert process.stdout is not None
    buffer = b""
    with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, trio.ClosedResourceError):
        async with out:
            while chunk := await process.stdout.receive_some(_CHUNK):
                *lines, buffer = (buffer + chunk).split(b"\n")
                for raw in lines:
                    line = raw.decode("utf-8", "replace")
                    if not line.strip():
                        continue
                    try:
                        message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                    except ValueError as exc:
                        on_noise(line)
                        await out.send(exc)
                    else:
                        await out.send(SessionMessage(message))
    with suppress(trio.ClosedResourceError, trio.BrokenResourceError, OSError):
        while await process.stdout.receive_some(_CHUNK):  # the client is gone: keep a chatty server
            pass  # from blocking on a full pipe, so it can exit when its stdin closes


async def _write_stdin(process: trio.Process, source: Any) -> None:
    """Each message the client sends, as one JSON line on the server's stdin."""
    import anyio

    assert process.stdin is not None
    with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, trio.BrokenResourceError, OSError):
        async with source:
            async for session_message in source:
                data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await process.stdin.send_all(data.encode() + b"\n")


async def _read_stderr(process: trio.Process, proc: StdioProcess, done: trio.Event) -> None:
    """Copy the server's stderr to Roost's (fd 2, where it went before) and keep its tail."""
    assert process.stderr is not None
    try:
        with suppress(trio.ClosedResourceError, trio.BrokenResourceError, OSError):
            while chunk := await process.stderr.receive_some(_CHUNK):
                proc.keep(chunk)
                with suppress(OSError):
                    os.write(2, chunk)
    finally:
        done.set()


async def _stop(process: trio.Process, proc: StdioProcess) -> None:
    """Close stdin, wait, ``SIGTERM`` the group, wait, ``SIGKILL`` it (at once with ``kill_now``)."""
    assert process.stdin is not None
    with suppress(trio.ClosedResourceError, trio.BrokenResourceError, OSError):
        await process.stdin.aclose()
    steps = [signal.SIGKILL] if proc.kill_now else [signal.SIGTERM, signal.SIGKILL]
    if not proc.kill_now:
        with trio.move_on_after(GRACE_S):
            await process.wait()
    for sig in steps:
        if process.returncode is not None:
            break
        _signal(process, sig)
        with trio.move_on_after(GRACE_S):
            await process.wait()


def _signal(process: trio.Process, sig: int) -> None:
    """Send ``sig`` to the server's process group (its pid: it leads its own session)."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)
