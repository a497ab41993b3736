"""``roost attach``: a terminal client of ``roost serve`` (Unix socket or ``ws://`` WebSocket).

wire-protocol.md, "Live sessions" (serve socket, serve WebSocket), "Handshake events" (``hello``),
"Input", "Prompts" and "Daemon events". Two modes:

* readable (default): daemon events are rendered as text on stdout (``hello``, ``queued``
  positions, ``agent_starting`` / ``tool_calling`` / ``token`` progress, ``result``); each
  non-blank stdin line is sent as a task (``user_input``). An ``approval_request`` is shown with its
  kind and fields (a ``file_write`` as a unified diff) followed by ``approve? [y/N]``; the next stdin
  line answers it: ``y``/``yes`` approves, anything else denies (never auto-approved). A
  ``question`` (an agent's ``ask_user``) is shown with its options; the next stdin line is the
  answer (``question_response``), and an empty line skips it (``answer: null``).
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
``approved: false``) rather than left to hang; a question then is skipped (``answer: null``).

Exit status: 0 after end of stdin and the last result; 1 when the daemon is unreachable (refused,
missing socket, failed WebSocket handshake), refused a task this client sent (e.g. a read-only
token: one line on stderr says why), or closes the connection while tasks are outstanding;
2 on usage errors (click); 130 on Ctrl-C.
"""

from __future__ import annotations

import json
import os
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import trio

from roost.cli._attach_link import DaemonUnreachable, _Link, _wait_connectable, open_link
from roost.cli._attach_render import HELP, Renderer
from roost.cli._params import SECONDS

__all__ = ["attach_command", "run_attach"]

#: ``error`` codes the daemon answers a dispatch (``user_input`` / plain text) with.
_DISPATCH_ERROR_CODES = frozenset({"unsupported", "invalid_params", "read_only", "server_overloaded", "internal_error"})


# -- the client ---------------------------------------------------------------------------------------


class AttachClient:
    """The attached session: routes daemon lines to stdout and stdin lines to the daemon.

    Args:
        link: the connection (None until :func:`run_attach` connects; lines sent meanwhile wait).
        json_mode: pass lines through unchanged instead of rendering.
        where: the target, as shown to the user.
        write: writes text to stdout (and flushes).
    """

    def __init__(
        self, link: _Link | None, *, json_mode: bool, where: str, write: Callable[[str], None], hold_lines: bool = False
    ) -> None:
        self.link: _Link | None = link
        self.json_mode = json_mode
        self.where = where
        self.write = write
        self.hold_lines = hold_lines and not json_mode
        self.renderer = Renderer(write)
        self.acks = 0  # dispatches sent, awaiting ``queued`` or an ``error``
        self.refused: list[str] = []  # why the daemon refused our dispatches (``error`` text), in order
        self.waiting: set[str] = set()  # our sessionIds awaiting their ``result``
        self.held: deque[str] = deque()  # stdin lines read while a task was in flight (hold_lines)
        self.approval_pending = False
        self.question_pending = False
        self.stdin_done = False
        self.closed = False
        self.hello_seen = False
        self.done = trio.Event()  # stdin ended and nothing is outstanding
        self.detach = trio.Event()  # /quit or a second Ctrl-C: leave now
        self.interrupts = 0  # Ctrl-C presses since the last result
        self.connected = trio.Event()  # set while ``link`` is connected

    def in_flight(self) -> bool:
        """A task of this client is being queued, is queued or is running (no ``result`` yet)."""
        return self.acks > 0 or bool(self.waiting)

    def prompt_pending(self) -> bool:
        """An ``approval_request`` or a ``question`` waits for this client's answer."""
        return self.approval_pending or self.question_pending

    def _check_done(self) -> None:
        if self.stdin_done and self.hello_seen and not self.in_flight() and not self.held and not self.prompt_pending():
            self.done.set()

    async def _send(self, line: str) -> None:
        while self.link is None:  # connecting, or reconnecting: the line waits for the link
            await self.connected.wait()
        try:
            await self.link.send(line)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the receive side reports the close

    def connection_lost(self, *, keeps_tasks: bool) -> None:
        """The link closed and a new one is being opened. ``keeps_tasks``: the new link has the
        same client id, so the daemon's next ``hello`` brings back in-flight tasks and results;
        without one, this client's tasks can no longer be followed."""
        self.link = None
        self.connected = trio.Event()
        self.hello_seen = False
        self.approval_pending = self.question_pending = False
        self.acks = 0
        if not keeps_tasks and self.waiting:
            self.renderer.line(
                f"{len(self.waiting)} task(s) keep running in the daemon, but their results "
                "cannot reach this client (attach over ws:// with --client-id to keep them)"
            )
            self.waiting.clear()

    async def command(self, text: str) -> bool:
        """Run a ``/command`` line (see :data:`~roost.cli._attach_render.HELP`); ``False`` when
        ``text`` is a task (no ``/``, or ``//``)."""
        if not text.startswith("/") or text.startswith("//"):
            return False
        name = text.split()[0].lower()
        if name == "/help":
            self.renderer.line(HELP)
        elif name == "/interrupt":
            await self.interrupt()
        elif name == "/status":
            await self._send(json.dumps({"type": "status"}))
        elif name in ("/quit", "/exit", "/detach"):
            self.renderer.line("detached (your tasks keep running in the daemon)")
            self.detach.set()
        else:
            self.renderer.line(f"unknown command {name}; /help lists the commands (//TEXT sends the task /TEXT)")
        return True

    async def interrupt(self) -> None:
        """Ask the daemon to interrupt this client's running task (``interrupt`` input)."""
        self.renderer.line("interrupting your running task")
        await self._send(json.dumps({"type": "interrupt"}))

    async def on_ctrl_c(self) -> None:
        """Ctrl-C: the first interrupts the running task; another (or one with nothing in flight) detaches."""
        self.interrupts += 1
        if self.in_flight() and self.interrupts == 1 and not self.json_mode:
            await self.interrupt()
            self.renderer.line("(Ctrl-C again to detach; the task's result still comes here if you stay)")
            return
        self.renderer.line("detached (your tasks keep running in the daemon)")
        self.detach.set()

    async def receive(self) -> None:
        """Handle daemon lines until the connection ends."""
        assert self.link is not None
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
                _warn(f"the daemon speaks protocol version {event.get('protocolVersion')}; this client was built for 1")
            flight = event.get("inFlight")
            if isinstance(flight, dict) and flight.get("sessionId"):
                self.waiting.add(flight["sessionId"])
        elif kind == "queued":
            self.acks -= 1
            if event.get("sessionId"):
                self.waiting.add(event["sessionId"])
        elif kind == "error" and event.get("code") in _DISPATCH_ERROR_CODES and self.acks > 0:
            self.acks -= 1
            self.refused.append(str(event.get("message") or event.get("text") or event.get("code")))
        elif kind == "result":
            self.waiting.discard(event.get("sessionId"))
            self.interrupts = 0
        elif kind == "approval_request":
            self.approval_pending = True
            if self.held:  # a line read ahead (piped stdin) answers it
                await self._answer_with(self.held.popleft())
            elif self.stdin_done:  # nobody is left to answer: deny, never approve
                if not self.json_mode:
                    self.renderer.answer("n (stdin is closed: denied)")
                await self._answer(False)
        elif kind == "question":
            self.question_pending = True
            if self.held:
                await self._answer_with(self.held.popleft())
            elif self.stdin_done:
                if not self.json_mode:
                    self.renderer.answer("(stdin is closed: skipped)")
                await self._answer_question(None)
        await self._release_held()
        self._check_done()

    async def _release_held(self) -> None:
        """With no task in flight, send the next held non-blank line as the next task."""
        while self.held and not self.in_flight() and not self.prompt_pending():
            line = self.held.popleft()
            if line.strip():
                await self._dispatch(line)

    async def _dispatch(self, text: str) -> None:
        self.acks += 1
        await self._send(json.dumps({"type": "user_input", "text": text}))

    async def _answer_with(self, raw: str) -> None:
        """Answer the pending prompt with stdin line ``raw``: a question's answer (an empty line
        skips it), else the approval: ``y``/``yes`` approves, anything else denies."""
        if self.question_pending:
            answer = raw.strip() or None
            self.renderer.answer(f"answered: {answer}" if answer else "skipped")
            await self._answer_question(answer)
            return
        approved = raw.strip().lower() in ("y", "yes")
        self.renderer.answer("approved" if approved else "denied")
        await self._answer(approved)

    async def _answer(self, approved: bool) -> None:
        self.approval_pending = False
        await self._send(json.dumps({"type": "approval_response", "approved": approved}))

    async def _answer_question(self, answer: str | None) -> None:
        self.question_pending = False
        await self._send(json.dumps({"type": "question_response", "answer": answer}))

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
                elif kind == "question_response":
                    self.question_pending = False
            await self._send(raw)
            return
        if await self.command(raw.strip()):
            return
        if raw.strip().startswith("//"):
            raw = raw.strip()[1:]
        if self.prompt_pending():
            await self._answer_with(raw)
            return
        if self.hold_lines and self.in_flight():
            self.held.append(raw)  # the answer to an approval to come, or the next task
            return
        if raw.strip():
            await self._dispatch(raw)

    async def stdin_ended(self) -> None:
        """Stdin reached end of file: deny a pending approval, skip a pending question (nobody is
        left to answer them)."""
        self.stdin_done = True
        if self.question_pending:
            if not self.json_mode:
                self.renderer.answer("(stdin is closed: skipped)")
            await self._answer_question(None)
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


async def run_attach(
    target: str,
    *,
    token: str | None,
    client_id: str | None,
    json_mode: bool,
    reconnect: float = 0.0,
    work_dir_socket: bool = False,
) -> int:
    """Attach to the daemon at ``target`` until stdin ends and the last result arrives.

    Args:
        reconnect: seconds to keep trying to connect again after the connection was lost (a
            daemon restart); 0: do not.
        work_dir_socket: ``target`` is the current directory's socket (no TARGET was given): see
            :func:`open_link`.

    Returns:
        The exit status: 0 done, 1 the daemon refused a task of this client, or the connection
        closed while tasks were outstanding (and no reconnect succeeded), 130 detached by Ctrl-C
        (or ``/quit``) with tasks outstanding.

    Raises:
        DaemonUnreachable: see :func:`open_link` (the first connection only).
    """

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    client = AttachClient(None, json_mode=json_mode, where=target, write=write, hold_lines=not _stdin_is_tty())
    state: dict[str, Any] = {"error": None, "reason": None}

    async def connections(nursery: trio.Nursery) -> None:
        first = True
        while True:
            try:
                async with open_link(target, token=token, client_id=client_id, work_dir_socket=work_dir_socket) as link:
                    client.link = link
                    client.connected.set()
                    if not first:
                        client.renderer.line(f"reconnected to {target}")
                    await client.receive()
                    state["reason"] = link.close_reason
            except DaemonUnreachable as exc:
                if first:
                    state["error"] = exc
                    break
            first = False
            if client.done.is_set() or reconnect <= 0 or (client.stdin_done and not client.in_flight()):
                break
            client.connection_lost(keeps_tasks=client_id is not None)
            client.renderer.line(
                f"{state['reason'] or 'the connection closed'}; reconnecting for up to {reconnect:g} s (Ctrl-C to stop)"
            )
            if not await _wait_connectable(target, token=token, client_id=client_id, within=reconnect):
                break
        nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(connections, nursery)
        nursery.start_soon(_read_stdin, client)
        nursery.start_soon(_ctrl_c, client)
        nursery.start_soon(_until_done, client, nursery.cancel_scope)
    if state["error"] is not None:
        raise state["error"]
    if client.done.is_set():
        return _refused_status(client)
    if client.detach.is_set():
        return 130 if client.in_flight() else 0
    if not json_mode:
        client.renderer._close()
    _warn(f"{state['reason'] or 'the connection closed'} ({target})")
    return 0 if client.stdin_done and not client.waiting and client.acks <= 0 else 1


def _refused_status(client: AttachClient) -> int:
    """The exit status once done: 1 (with one stderr line) when the daemon refused a task this
    client sent (a task it would not take is a failure, not a success), else 0."""
    if not client.refused:
        return 0
    _warn(f"{len(client.refused)} task(s) refused by the daemon: {client.refused[-1]}")
    return 1


async def _ctrl_c(client: AttachClient) -> None:
    """Each SIGINT: :meth:`AttachClient.on_ctrl_c` (interrupt, then detach)."""
    import signal

    with trio.open_signal_receiver(signal.SIGINT) as received:
        async for _ in received:
            await client.on_ctrl_c()


async def _until_done(client: AttachClient, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` once the client is done (every result arrived) or detaches."""
    async with trio.open_nursery() as inner:

        async def on(event: trio.Event) -> None:
            await event.wait()
            inner.cancel_scope.cancel()

        inner.start_soon(on, client.done)
        inner.start_soon(on, client.detach)
    scope.cancel()


def _stdin_is_tty() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):  # closed or replaced stdin
        return False


def _check_ws_url(target: str) -> None:
    """Refuse a ``ws://``/``wss://`` TARGET that is no URL (``ws://[bad``, a port that is not a
    number, no host) as a usage error (exit status 2), before anything connects.

    Raises:
        click.BadParameter: naming TARGET and what is wrong with it.
    """
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(target)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number in range)
    except ValueError as exc:
        raise click.BadParameter(f"{target!r} is not a valid URL ({exc})", param_hint="TARGET") from None
    if not parts.hostname:
        raise click.BadParameter(f"{target!r} names no host (expected ws://HOST:PORT/attach)", param_hint="TARGET")


def _work_dir_socket(work_dir: Path) -> str:
    """The socket of the daemon serving ``work_dir``: from the registry ``roost status`` reads
    (``$ROOST_HOME/run/daemons``, so a daemon started with ``--socket`` is found), else the
    default path ``$ROOST_HOME/run/<hash>.sock``. Of several daemons of the directory, the one
    on the default path, else the one started last (a stderr line names the others)."""
    from roost._paths import roost_home
    from roost.errors import RoostError
    from roost.protocol import default_socket_path, registered_daemons

    default = str(default_socket_path(work_dir))
    try:
        entries = registered_daemons(roost_home(create=False))
    except (RoostError, OSError):
        return default
    sockets = [str(e.get("socket")) for e in entries if e.get("workDir") == str(work_dir) and e.get("socket")]
    if not sockets:
        return default
    chosen = default if default in sockets else sockets[-1]
    if len(sockets) > 1:
        others = ", ".join(s for s in sockets if s != chosen)
        _warn(f"{len(sockets)} daemons serve {work_dir}; attaching to {chosen} (others: {others})")
    return chosen


def _warn(text: str) -> None:
    sys.stdout.flush()
    click.echo(f"roost attach: {text}", err=True)


@click.command("attach", short_help="Attach to a running `roost serve` (socket or WebSocket).")
@click.argument("target", required=False)
@click.option(
    "--token",
    envvar=["FUSERAFT_SERVE_TOKEN", "ROOST_SERVE_TOKEN"],
    default=None,
    help="Bearer token for ws:// (default: $FUSERAFT_SERVE_TOKEN, the wire protocol's name, "
    "or its Roost twin $ROOST_SERVE_TOKEN).",
)
@click.option(
    "--client-id",
    default=None,
    help="Sent as the Fuseraft-Client-Id header (the wire protocol's name; 1-64 of A-Z a-z 0-9 - _) "
    "to keep your tasks across reconnects (ws://).",
)
@click.option(
    "--json",
    "json_mode",
    is_flag=True,
    help="Pass every daemon line through to stdout and every stdin line to the daemon unchanged.",
)
@click.option(
    "--reconnect",
    type=SECONDS,
    default=None,
    metavar="SECONDS",
    help="After the connection is lost (e.g. a daemon restart), keep trying to attach again "
    "for this long; with --client-id the tasks and results carry over. "
    "Default: 60 with --client-id, else 0 (exit).",
)
def attach_command(
    target: str | None, token: str | None, client_id: str | None, json_mode: bool, reconnect: float | None
) -> None:
    """Attach to a running `roost serve`: TARGET is its socket path or ws://HOST:PORT/attach.

    Without TARGET, the daemon of the current directory: the one `roost status` lists for it (so
    a daemon started with --socket is found), else $ROOST_HOME/run/<hash>.sock. Events are
    rendered readably; each stdin line is sent as a task; an approval is asked as `approve? [y/N]`
    and answered by the next stdin line (y/yes approves, anything else denies).

    With stdin piped (not a terminal), lines read while your task is in flight (sent, until its
    result) are held: each approval takes the next held line as its answer, and lines left when
    the task finishes are sent as the next tasks, one at a time. E.g. piping the three lines
    "fix the bug", "y", "n" runs the task, approves its first approval and denies the second. An
    approval with no line left to answer it at end of stdin is denied.

    Lines that start with / are commands, not tasks: /help lists them, /interrupt interrupts
    your running task, /status shows the daemon's queue, /quit detaches; //TEXT sends the task
    /TEXT. Ctrl-C interrupts your running task; a second Ctrl-C (or one with nothing running)
    detaches, leaving the tasks to the daemon.

    \b
    Exit status:
      0    end of stdin after the last result (or detached with nothing outstanding)
      1    the daemon is unreachable (a socket path that does not exist, a refused
           connection), or closed the connection with tasks outstanding
      2    usage error
      130  detached by Ctrl-C or /quit while a task of yours was outstanding
    """
    from roost.protocol import parse_client_id

    if client_id is not None:
        try:
            parse_client_id(client_id)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--client-id") from None
    work_dir_socket = target is None
    if target is None:
        target = _work_dir_socket(Path(os.getcwd()).resolve())
    elif not target:
        raise click.BadParameter("is empty: give a socket path or a ws:// URL, or no TARGET", param_hint="TARGET")
    elif "://" in target and not target.startswith(("ws://", "wss://")):
        raise click.BadParameter("expected a socket path or a ws:// (wss://) URL", param_hint="TARGET")
    elif target.startswith(("ws://", "wss://")):
        _check_ws_url(target)
    elif not target.startswith(("ws://", "wss://")) and client_id is not None:
        _warn("--client-id is only sent over ws://; the Unix socket has no client ids")
        client_id = None
    window = reconnect if reconnect is not None else (60.0 if client_id else 0.0)
    try:
        code = trio.run(
            lambda: run_attach(
                target,
                token=token,
                client_id=client_id,
                json_mode=json_mode,
                reconnect=window,
                work_dir_socket=work_dir_socket,
            )
        )
    except BaseException as exc:  # an expected end becomes one line; anything else is re-raised
        from roost.cli._runner import leaf_exception

        leaf = leaf_exception(exc)
        if isinstance(leaf, DaemonUnreachable):
            click.echo(f"roost attach: {leaf}", err=True)
            sys.exit(1)
        if isinstance(leaf, KeyboardInterrupt):  # Ctrl-C before the signal handler was installed
            click.echo("roost attach: interrupted", err=True)
            sys.exit(130)
        raise
    sys.exit(code)
