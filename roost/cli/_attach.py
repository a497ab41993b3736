"""``roost attach``: a terminal client of ``roost serve`` (Unix socket or ``ws://`` WebSocket).

wire-protocol.md, "Live sessions" (serve socket, serve WebSocket), "Handshake events" (``hello``),
"Input", "Prompts" and "Daemon events". Two modes:

* readable (default): daemon events are rendered as text on stdout (``hello``, ``queued``
  positions, ``agent_starting`` / ``tool_calling`` / ``token`` progress, ``result``); each
  non-blank stdin line is sent as a task (``user_input``). An ``approval_request`` is shown with its
  kind and fields (a ``file_write`` as a unified diff) followed by ``approve? [y/N]``; the next stdin
  line answers it: ``y``/``yes`` approves, anything else denies (never auto-approved).
  When stdin is not a terminal (piped or a file, read ahead of the events), lines are *held* while
  this client has a task in flight (from sending it until its ``result``): each ``approval_request``
  takes the next held (or next read) line as its answer, and the lines still held when the task
  finishes become the next tasks, one at a time, in order. So piping the lines ``task`` and ``y``
  runs ``task`` and approves its first approval. On a terminal every line typed while no approval is
  asked is sent as a task at once.
* ``--json``: every line from the daemon is written to stdout unchanged, and every stdin line is
  forwarded to the daemon unchanged.

In both modes the command ends when stdin reaches end of file and every task this client dispatched
(plus the ``inFlight`` task its ``hello`` announced) has its ``result``. An approval that arrives
after stdin has ended cannot be answered by anyone, so it is denied (``approval_response`` with
``approved: false``) rather than left to hang.

Exit status: 0 after end of stdin and the last result; 1 when the daemon is unreachable (refused,
missing socket, failed WebSocket handshake) or closes the connection while tasks are outstanding;
2 on usage errors (click); 130 on Ctrl-C.
"""

from __future__ import annotations

import difflib
import json
import os
import sys
from collections import deque
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import click
import trio

from roost.errors import RoostError

__all__ = ["attach_command", "run_attach"]

#: Longest line accepted from the daemon (bytes), as the JSONL framing (DESIGN.md section 5).
MAX_LINE_BYTES = 64 << 20
#: ``error`` codes the daemon answers a dispatch (``user_input`` / plain text) with.
_DISPATCH_ERROR_CODES = frozenset({"unsupported", "invalid_params", "read_only", "server_overloaded",
                                   "internal_error"})


class DaemonUnreachable(RoostError):
    """The daemon could not be reached at the target (socket path or URL)."""


# -- transports ---------------------------------------------------------------------------------------


class _Link:
    """One connection to the daemon: ``send`` a line, iterate received lines, ``close_reason``."""

    close_reason: str | None = None

    async def send(self, line: str) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def lines(self) -> AsyncIterator[str]:  # pragma: no cover - interface
        raise NotImplementedError


class _UnixLink(_Link):
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream

    async def send(self, line: str) -> None:
        await self.stream.send_all(line.encode("utf-8") + b"\n")

    async def lines(self) -> AsyncIterator[str]:
        buffer = bytearray()
        while True:
            try:
                data = await self.stream.receive_some(1 << 16)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self.close_reason = f"connection lost ({exc})"
                return
            if not data:
                if buffer:
                    yield buffer.decode("utf-8", "replace")
                self.close_reason = "the daemon closed the connection"
                return
            buffer += data
            while (index := buffer.find(b"\n")) >= 0:
                line = bytes(buffer[:index])
                del buffer[: index + 1]
                yield line.decode("utf-8", "replace")
            if len(buffer) > MAX_LINE_BYTES:
                buffer.clear()


class _WsLink(_Link):
    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def send(self, line: str) -> None:
        from trio_websocket import ConnectionClosed

        try:
            await self.ws.send_message(line)
        except ConnectionClosed as exc:
            raise trio.BrokenResourceError(f"the WebSocket is closed ({exc.reason})") from None

    async def lines(self) -> AsyncIterator[str]:
        from trio_websocket import ConnectionClosed

        while True:
            try:
                message = await self.ws.get_message()
            except ConnectionClosed as exc:
                reason = exc.reason
                text = f" {reason.reason}" if reason is not None and reason.reason else ""
                code = f" (code {reason.code})" if reason is not None else ""
                self.close_reason = f"the daemon closed the connection{code}{text}"
                return
            text = message.decode("utf-8", "replace") if isinstance(message, bytes) else message
            for line in text.split("\n"):
                yield line


@asynccontextmanager
async def open_link(target: str, *, token: str | None, client_id: str | None) -> AsyncIterator[_Link]:
    """Connect to the daemon at ``target`` (a Unix socket path or a ``ws://``/``wss://`` URL).

    Args:
        target: socket path, or ``ws://host:port/attach`` URL.
        token: bearer token sent as ``Authorization: Bearer`` (WebSocket only).
        client_id: sent as ``Fuseraft-Client-Id`` (WebSocket only).

    Raises:
        DaemonUnreachable: connect refused, socket missing, or the WebSocket handshake failed.

    Cancellation: cancelling while connecting leaves nothing open; on exit the connection is closed.
    """
    async with AsyncExitStack() as stack:
        if target.startswith(("ws://", "wss://")):
            from trio_websocket import open_websocket_url

            headers: list[tuple[bytes, bytes]] = []
            if token:
                headers.append((b"Authorization", f"Bearer {token}".encode("latin-1")))
            if client_id:
                headers.append((b"Fuseraft-Client-Id", client_id.encode("ascii")))
            context = None
            if target.startswith("wss://"):
                import ssl

                context = ssl.create_default_context()
            try:
                ws = await stack.enter_async_context(open_websocket_url(
                    target, context, extra_headers=headers, max_message_size=MAX_LINE_BYTES,
                    connect_timeout=30, disconnect_timeout=5))
            except Exception as exc:   # HandshakeError, ConnectionRejected, OSError, internal errors
                raise DaemonUnreachable(f"cannot attach to the daemon at {target}: {_describe(exc)}") from exc
            link: _Link = _WsLink(ws)
        else:
            try:
                stream = await trio.open_unix_socket(target)
            except OSError as exc:
                raise DaemonUnreachable(
                    f"cannot connect to the daemon at {target}: {exc.strerror or exc} "
                    "(is `roost serve` running for this directory?)") from exc
            await stack.enter_async_context(stream)
            link = _UnixLink(stream)
        yield link


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    if status is not None:
        body = getattr(exc, "body", None) or b""
        detail = body.decode("utf-8", "replace").strip() if isinstance(body, bytes) else str(body)
        return f"HTTP {status}" + (f": {detail}" if detail else "")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if str(exc):
        return str(exc)
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc:   # trio-websocket's HandshakeError wraps the OSError
        return _describe(cause)
    return type(exc).__name__


# -- readable rendering -------------------------------------------------------------------------------


class Renderer:
    """Renders daemon events as text lines on ``write`` (pure: events in, text out).

    Streamed ``token`` text is written inline after a ``[sid] agent:`` prefix; any other line first
    ends an open token line.
    """

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self._open: str | None = None     # the sessionId whose token line is open, or _PROMPT

    def line(self, text: str) -> None:
        self._close()
        self.write(text + "\n")

    def _close(self) -> None:
        if self._open is not None:
            self._open = None
            self.write("\n")

    def event(self, event: dict, *, where: str) -> None:
        kind = event.get("type")
        sid = _sid(event.get("sessionId"))
        if kind == "hello":
            flags = [f"protocol {event.get('protocolVersion')}"]
            if event.get("clientId"):
                flags.append(f"client id {event.get('clientId')}")
            flags.append("read-only" if event.get("readOnly") else "read-write")
            self.line(f"attached to {where} ({', '.join(flags)})")
            flight = event.get("inFlight")
            if isinstance(flight, dict):
                self.line(f"in flight: [{_sid(flight.get('sessionId'))}] {flight.get('task')!r} "
                          f"({flight.get('status')}, position {flight.get('position')})")
            pending = event.get("pendingResults") or []
            if pending:
                self.line("results from while you were away: " + ", ".join(_sid(p) for p in pending))
        elif kind == "queued":
            self.line(f"[{sid}] queued, position {event.get('position')}")
        elif kind == "agent_starting":
            self.line(f"[{sid}] {event.get('agent')} is starting")
        elif kind == "tool_calling":
            self.line(f"[{sid}] {event.get('agent')} calls {event.get('tool')}: {event.get('argsSummary')}")
        elif kind == "token":
            text = event.get("text") or ""
            if self._open != event.get("sessionId"):
                self._close()
                self.write(f"[{sid}] {event.get('agent')}: ")
                self._open = event.get("sessionId")
            self.write(text)
        elif kind == "token_budget_warning":
            self.line(f"[{sid}] warning: {event.get('agent')} used {event.get('inputTokens')} input tokens "
                      f"(threshold {event.get('warnThreshold')})")
        elif kind == "task_resumed":
            self.line(f"[{sid}] resumed after a daemon restart: {event.get('task')!r}")
        elif kind == "auto_dispatched":
            self.line(f"[{sid}] dispatched by the daemon (objective {event.get('objectiveId')}): "
                      f"{event.get('task')!r}")
        elif kind == "a2a_call":
            self.line(f"[{sid}] A2A call to {event.get('agent')}")
        elif kind == "result":
            state = "succeeded" if event.get("succeeded") else "failed"
            self.line(f"[{sid}] result: {state} ({event.get('task')!r})")
            if event.get("errorMessage"):
                self.line(f"  error: {event.get('errorMessage')}")
            if event.get("lastMessage"):
                agent = event.get("lastAgent") or "agent"
                self.line(f"  {agent}: " + str(event.get("lastMessage")).replace("\n", "\n  "))
        elif kind == "error":
            self.line(f"error: {event.get('text')} ({event.get('code')})")
        elif kind == "approval_request":
            self.approval(event)
        # other event types are ignored (wire-protocol.md: clients ignore what they don't know)

    def approval(self, event: dict) -> None:
        """Show an ``approval_request`` and the ``approve? [y/N]`` prompt (no newline after it)."""
        kind = event.get("kind")
        self.line(f"[{_sid(event.get('sessionId'))}] approval needed: {kind}")
        if kind == "shell_command":
            self.line(f"  command: {event.get('command')}")
        elif kind == "tool_action":
            self.line(f"  {event.get('plugin')}.{event.get('action')}: {event.get('detail')}")
        elif kind == "file_write":
            self.line(f"  {event.get('plugin')}.{event.get('action')} {event.get('path')}")
            diff = difflib.unified_diff(str(event.get("oldContent") or "").splitlines(),
                                        str(event.get("newContent") or "").splitlines(),
                                        f"a/{event.get('path')}", f"b/{event.get('path')}", lineterm="")
            for row in diff:
                self.line(f"  {row}")
        elif kind == "route_approval":
            self.line(f"  {event.get('sourceAgent')} -> {event.get('targetAgent')} "
                      f"(keyword {event.get('keyword')!r})")
        else:   # an unknown kind: show the raw event, ask, never auto-approve
            self.line("  " + json.dumps(event, ensure_ascii=False))
        self.write("approve? [y/N] ")
        self._open = _PROMPT

    def answer(self, text: str) -> None:
        """Echo the answer to the prompt: on the prompt's line while nothing was printed after it."""
        if self._open == _PROMPT:
            self._open = None
            self.write(text + "\n")
        else:
            self.line(text)


_PROMPT = "\0prompt"


def _sid(session_id: Any) -> str:
    """The session id as shown: whole, so it can be pasted into ``roost sessions --show``."""
    return str(session_id) if session_id else "-"


# -- the client ---------------------------------------------------------------------------------------


class AttachClient:
    """The attached session: routes daemon lines to stdout and stdin lines to the daemon.

    Args:
        link: the connection.
        json_mode: pass lines through unchanged instead of rendering.
        where: the target, as shown to the user.
        write: writes text to stdout (and flushes).
    """

    def __init__(self, link: _Link, *, json_mode: bool, where: str, write: Callable[[str], None],
                 hold_lines: bool = False) -> None:
        self.link = link
        self.json_mode = json_mode
        self.where = where
        self.write = write
        self.hold_lines = hold_lines and not json_mode
        self.renderer = Renderer(write)
        self.acks = 0                       # dispatches sent, awaiting ``queued`` or an ``error``
        self.waiting: set[str] = set()      # our sessionIds awaiting their ``result``
        self.held: deque[str] = deque()     # stdin lines read while a task was in flight (hold_lines)
        self.approval_pending = False
        self.stdin_done = False
        self.closed = False
        self.hello_seen = False
        self.done = trio.Event()            # stdin ended and nothing is outstanding

    def in_flight(self) -> bool:
        """A task of this client is being queued, is queued or is running (no ``result`` yet)."""
        return self.acks > 0 or bool(self.waiting)

    def _check_done(self) -> None:
        if self.stdin_done and self.hello_seen and not self.in_flight() and not self.held \
                and not self.approval_pending:
            self.done.set()

    async def _send(self, line: str) -> None:
        try:
            await self.link.send(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass   # the receive side reports the close

    async def receive(self) -> None:
        """Handle daemon lines until the connection ends."""
        async for line in self.link.lines():
            event: Any = None
            stripped = line.strip()
            if stripped.startswith("{"):
                try:
                    event = json.loads(stripped)
                except ValueError:
                    event = None
            if self.json_mode:
                self.write(line + "\n")
            elif isinstance(event, dict):
                self.renderer.event(event, where=self.where)
            if isinstance(event, dict):
                await self._track(event)
        self.closed = True

    async def _track(self, event: dict) -> None:
        kind = event.get("type")
        if kind == "hello":
            self.hello_seen = True
            if event.get("protocolVersion") != 1:
                _warn(f"the daemon speaks protocol version {event.get('protocolVersion')}; "
                      "this client was built for 1")
            flight = event.get("inFlight")
            if isinstance(flight, dict) and flight.get("sessionId"):
                self.waiting.add(flight["sessionId"])
        elif kind == "queued":
            self.acks -= 1
            if event.get("sessionId"):
                self.waiting.add(event["sessionId"])
        elif kind == "error" and event.get("code") in _DISPATCH_ERROR_CODES and self.acks > 0:
            self.acks -= 1
        elif kind == "result":
            self.waiting.discard(event.get("sessionId"))
        elif kind == "approval_request":
            self.approval_pending = True
            if self.held:         # a line read ahead (piped stdin) answers it
                await self._answer_with(self.held.popleft())
            elif self.stdin_done:   # nobody is left to answer: deny, never approve
                if not self.json_mode:
                    self.renderer.answer("n (stdin is closed: denied)")
                await self._answer(False)
        await self._release_held()
        self._check_done()

    async def _release_held(self) -> None:
        """With no task in flight, send the next held non-blank line as the next task."""
        while self.held and not self.in_flight() and not self.approval_pending:
            line = self.held.popleft()
            if line.strip():
                await self._dispatch(line)

    async def _dispatch(self, text: str) -> None:
        self.acks += 1
        await self._send(json.dumps({"type": "user_input", "text": text}))

    async def _answer_with(self, raw: str) -> None:
        """Answer the pending approval with stdin line ``raw``: ``y``/``yes`` approves, else deny."""
        approved = raw.strip().lower() in ("y", "yes")
        self.renderer.answer("approved" if approved else "denied")
        await self._answer(approved)

    async def _answer(self, approved: bool) -> None:
        self.approval_pending = False
        await self._send(json.dumps({"type": "approval_response", "approved": approved}))

    async def stdin_line(self, raw: str) -> None:
        """Handle one stdin line (without its newline)."""
        if self.json_mode:
            stripped = raw.strip()
            if stripped:
                message: Any = None
                if stripped.startswith(("{", "[")):
                    try:
                        message = json.loads(stripped)
                    except ValueError:
                        message = None
                kind = message.get("type") if isinstance(message, dict) else None
                # plain text is a task; a broken JSON line is refused by the daemon (no queued)
                if not stripped.startswith(("{", "[")) or kind == "user_input":
                    self.acks += 1
                elif kind == "approval_response":
                    self.approval_pending = False
            await self._send(raw)
            return
        if self.approval_pending:
            await self._answer_with(raw)
            return
        if self.hold_lines and self.in_flight():
            self.held.append(raw)     # the answer to an approval to come, or the next task
            return
        if raw.strip():
            await self._dispatch(raw)

    async def stdin_ended(self) -> None:
        """Stdin reached end of file: deny a pending approval (nobody is left to answer it)."""
        self.stdin_done = True
        if self.approval_pending:
            if not self.json_mode:
                self.renderer.answer("(stdin is closed: denied)")
            await self._answer(False)
        self._check_done()


async def _read_stdin(client: AttachClient) -> None:
    """Feed stdin lines to ``client`` one at a time (a worker thread reads; works for ttys, pipes, files).

    The thread is abandoned when the connection ends; it reads with ``os.read`` (see
    :mod:`roost.cli._stdin`), so the process still exits cleanly while it blocks.
    """
    from roost.cli._stdin import StdinLines

    stdin = StdinLines()
    while True:
        data = await stdin.readline()
        if not data:
            break
        await client.stdin_line(data.rstrip("\r\n"))
    await client.stdin_ended()


async def run_attach(target: str, *, token: str | None, client_id: str | None, json_mode: bool) -> int:
    """Attach to the daemon at ``target`` until stdin ends and the last result arrives.

    Returns:
        The exit status: 0 done, 1 the connection closed while tasks were outstanding.

    Raises:
        DaemonUnreachable: see :func:`open_link`.
    """
    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    async with open_link(target, token=token, client_id=client_id) as link:
        client = AttachClient(link, json_mode=json_mode, where=target, write=write,
                              hold_lines=not _stdin_is_tty())
        async with trio.open_nursery() as nursery:
            async def receive() -> None:
                await client.receive()
                nursery.cancel_scope.cancel()

            async def finish() -> None:
                await client.done.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(receive)
            nursery.start_soon(_read_stdin, client)
            nursery.start_soon(finish)
    if client.done.is_set():
        return 0
    if not json_mode:
        client.renderer._close()
    _warn(f"{link.close_reason or 'the connection closed'} ({target})")
    return 0 if client.stdin_done and not client.waiting and client.acks <= 0 else 1


def _stdin_is_tty() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):   # closed or replaced stdin
        return False


def _warn(text: str) -> None:
    sys.stdout.flush()
    click.echo(f"roost attach: {text}", err=True)


@click.command("attach")
@click.argument("target", required=False)
@click.option("--token", envvar=["FUSERAFT_SERVE_TOKEN", "ROOST_SERVE_TOKEN"], default=None,
              help="Bearer token for ws:// (default: $FUSERAFT_SERVE_TOKEN, the wire protocol's name, "
                   "or its Roost twin $ROOST_SERVE_TOKEN).")
@click.option("--client-id", default=None,
              help="Sent as the Fuseraft-Client-Id header (the wire protocol's name; 1-64 of A-Z a-z 0-9 - _) "
                   "to keep your tasks across reconnects (ws://).")
@click.option("--json", "json_mode", is_flag=True,
              help="Pass every daemon line through to stdout and every stdin line to the daemon unchanged.")
def attach_command(target: str | None, token: str | None, client_id: str | None, json_mode: bool) -> None:
    """Attach to a running `roost serve`: TARGET is its socket path or ws://HOST:PORT/attach.

    Without TARGET, the daemon of the current directory ($ROOST_HOME/run/<hash>.sock). Events are
    rendered readably; each stdin line is sent as a task; an approval is asked as `approve? [y/N]`
    and answered by the next stdin line (y/yes approves, anything else denies).

    With stdin piped (not a terminal), lines read while your task is in flight (sent, until its
    result) are held: each approval takes the next held line as its answer, and lines left when
    the task finishes are sent as the next tasks, one at a time. E.g. piping the three lines
    "fix the bug", "y", "n" runs the task, approves its first approval and denies the second. An
    approval with no line left to answer it at end of stdin is denied.

    Exits 0 at end of stdin after the last result, 1 when the daemon is unreachable, 2 on usage
    errors.
    """
    from roost.protocol import parse_client_id
    from roost.protocol import default_socket_path

    if client_id is not None:
        try:
            parse_client_id(client_id)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--client-id") from None
    if target is None:
        target = str(default_socket_path(Path(os.getcwd())))
    elif "://" in target and not target.startswith(("ws://", "wss://")):
        raise click.BadParameter("expected a socket path or a ws:// (wss://) URL", param_hint="TARGET")
    elif not target.startswith(("ws://", "wss://")) and client_id is not None:
        _warn("--client-id is only sent over ws://; the Unix socket has no client ids")
        client_id = None
    try:
        code = trio.run(lambda: run_attach(target, token=token, client_id=client_id, json_mode=json_mode))
    except DaemonUnreachable as exc:
        click.echo(f"roost attach: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(code)
