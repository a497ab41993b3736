"""``roost exec PROMPT``: run one turn on a new thread and print its notifications.

The turn runs in this process through the same runtime as ``roost app-server`` (the root
supervision tree, a ThreadActor, the execution lease, the store), so the thread it creates can be
resumed later by any client unless ``--ephemeral`` is given.

Output:

* ``--json``: one app-server notification per line on stdout (``thread/started``, ``turn/started``,
  ``item/*``, ``turn/usage``, ``turn/completed`` or ``turn/error``), exactly as ``roost app-server``
  sends them; ``item/reasoning/*`` is omitted (app-server-protocol.md, "Notifications").
* otherwise readable text: the agent's text streamed to stdout, each tool call as a
  ``$ name {arguments}`` line, errors and interruptions on stderr.

Exit status: 0 when the turn completed, 1 when it failed or was interrupted (also when stdout's
reader went away, e.g. ``| head``: the turn is then interrupted and stored with reason
``output_closed``), 130 after SIGINT
(the first SIGINT interrupts the turn, which is persisted as ``interrupted``; a second one stops at
once), 2 when no model provider is configured (the message names the settings), on a usage error,
or when ROOST_HOME or its database is unusable (a read-only one included: exec must write its thread).
Nobody is asked for approvals: the permission mode and the unattended policy (deny) decide.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import click
import trio

from roost._json import dumps, dumps_line, loads
from roost.cli._appserver import setup_logging
from roost.cli._engine_options import EngineFlags, engine_options
from roost.errors import ConfigError, RoostError

__all__ = ["exec_command", "TURN_TERMINAL_EVENTS"]

TURN_TERMINAL_EVENTS = ("turn/completed", "turn/error")
#: Notification lines that may wait for the printer (bounded; the printer is the only consumer).
_QUEUE_LINES = 65536
#: Seconds the interrupted turn may take to persist before ``roost exec`` gives up waiting.
_INTERRUPT_GRACE = 15.0


class _Sink:
    """A hub subscriber: queues each encoded notification line for the printer without blocking."""

    def __init__(self) -> None:
        self.send, self.receive = trio.open_memory_channel[bytes](_QUEUE_LINES)
        self.dropped = 0

    def deliver(self, line: bytes) -> None:
        try:
            self.send.send_nowait(line)
        except trio.WouldBlock:
            self.dropped += 1


class JsonPrinter:
    """Writes notification lines unchanged (minus ``item/reasoning/*``) to a binary stream."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out

    def handle(self, message: dict, line: bytes) -> None:
        if message.get("method", "").startswith("item/reasoning/"):
            return
        self.out.write(line)
        self.out.flush()

    def finish(self) -> None:
        self.out.flush()


class TextPrinter:
    """Renders notifications for a person: agent text streamed, ``$ tool args`` lines, errors to stderr."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out = out
        self.err = err
        self.at_line_start = True

    def _end_line(self) -> None:
        if not self.at_line_start:
            self.out.write("\n")
            self.at_line_start = True

    def handle(self, message: dict, line: bytes) -> None:
        method = message.get("method")
        params = message.get("params") or {}
        if method == "item/agentMessage/delta":
            delta = params.get("delta") or ""
            if delta:
                self.out.write(delta)
                self.at_line_start = delta.endswith("\n")
        elif method == "item/agentMessage/replace":  # the stream was retried: the reply starts over
            self._end_line()
            self.out.flush()
            self.err.write("roost exec: the model stream was retried after partial output; the reply starts again\n")
            if params.get("text"):
                self.out.write(params["text"])
                self.at_line_start = params["text"].endswith("\n")
        elif method == "item/completed":
            item = params.get("item") or {}
            if item.get("type") == "agent_message":
                self._end_line()
            elif item.get("type") == "tool_call":
                self._end_line()
                arguments = dumps(item.get("arguments") or {}).decode()
                self.out.write(f"$ {item.get('name')} {arguments}\n")
                if item.get("is_error") and item.get("output"):
                    self.out.flush()
                    first = str(item["output"]).strip().splitlines()[0] if str(item["output"]).strip() else ""
                    self.err.write(f"  ! {first}\n")
        elif method in TURN_TERMINAL_EVENTS:
            self._end_line()
            turn = params.get("turn") or {}
            error = turn.get("error") or {}
            if turn.get("status") == "failed":
                self.out.flush()
                self.err.write(f"error: {error.get('category', 'error')}: {error.get('message', 'the turn failed')}\n")
            elif turn.get("status") == "interrupted":
                self.out.flush()
                text = str(error.get("message") or "interrupted")
                self.err.write(f"{text}\n" if text.startswith("interrupted") else f"interrupted: {text}\n")
        self.out.flush()
        self.err.flush()

    def finish(self) -> None:
        self._end_line()
        self.out.flush()


async def run_exec(
    prompt: str,
    *,
    settings: Any,
    as_json: bool,
    cwd: Path,
    ephemeral: bool,
    permission_mode: str,
    out: BinaryIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run one turn on a new thread and print its notifications; return the exit status.

    Args:
        prompt: the user prompt.
        settings: resolved :class:`roost.engines.ProviderSettings`.
        as_json: JSONL notifications instead of readable text.
        cwd: the thread's working directory (absolute).
        ephemeral: keep the thread in memory only.
        permission_mode: ``read_only``, ``standard`` or ``unconfined``.
        out, err: binary stdout and text stderr (default: the process's).

    Returns:
        0 completed, 1 failed or interrupted, 2 the engine cannot be opened (a missing or broken
        scripted ``--script``), 130 after SIGINT.

    Cancellation: the first SIGINT interrupts the turn and waits (at most 15 s) for it to persist;
    a second SIGINT cancels everything at once.
    """
    from roost.config import configured_mcp_servers
    from roost.plugins import open_mcp_host
    from roost.protocol import EngineCatalog
    from roost.supervisor import open_runtime
    from roost.tools import builtin_tools

    out = out if out is not None else sys.stdout.buffer
    err = err if err is not None else sys.stderr
    printer: JsonPrinter | TextPrinter = JsonPrinter(out) if as_json else TextPrinter(_text_stream(out), err)
    try:
        servers = configured_mcp_servers()
    except ConfigError as exc:
        err.write(f"roost exec: error: {exc}\n")
        err.flush()
        return 2
    engines = EngineCatalog(settings)
    if engines.default is None:  # e.g. a missing or broken --script: the same error as run/repl/app-server
        err.write(f"roost exec: error: {engines.setup_error or 'no model provider is configured'}\n")
        err.flush()
        return 2
    state: dict[str, Any] = {"signals": 0, "actor": None, "turn_id": None, "status": None, "closed": False}
    try:
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async with trio.open_nursery() as main:
                main.start_soon(_watch_signals, signals, state, err, main.cancel_scope)
                async with (
                    open_mcp_host(servers) as mcp,
                    open_runtime(engine_for=engines.engine_for, tools=builtin_tools(), writes_required=True) as runtime,
                ):
                    mcp.attach(runtime.services.tools)
                    thread = _new_thread(cwd, settings, permission_mode)
                    await _exec_turn(runtime, thread, prompt, ephemeral, printer, state, main.cancel_scope)
                main.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await engines.aclose()
        try:
            printer.finish()
        except (OSError, ValueError):
            pass
    if state["signals"]:
        return 130
    return 0 if state["status"] == "completed" and not state["closed"] else 1


async def _watch_signals(signals: Any, state: dict[str, Any], err: TextIO, scope: trio.CancelScope) -> None:
    """The first SIGINT interrupts the running turn and gives it ``_INTERRUPT_GRACE`` seconds to
    persist (``scope``'s deadline); a second one (or one before the turn exists) cancels ``scope``."""
    from roost.actors import InterruptTurn

    async for _ in signals:
        state["signals"] += 1
        actor = state["actor"]
        if state["signals"] == 1 and actor is not None and state["turn_id"] is not None:
            err.write("roost exec: interrupting (press Ctrl-C again to stop at once)\n")
            err.flush()
            try:
                actor.ref.tell(InterruptTurn(turn_id=state["turn_id"], reason="SIGINT"))
            except RoostError:
                scope.cancel()
            scope.deadline = min(scope.deadline, trio.current_time() + _INTERRUPT_GRACE)
        else:
            scope.cancel()


def _new_thread(cwd: Path, settings: Any, permission_mode: str) -> Any:
    """The chat :class:`~roost.model.Thread` row of ``roost exec``'s new thread."""
    from roost.model import Thread
    from roost.storage import new_id, utc_now

    now = utc_now()
    return Thread(
        id=new_id("thr"),
        kind="chat",
        cwd=str(cwd),
        provider=settings.provider,
        model=settings.model,
        permission_mode=permission_mode,
        created_at=now,
        updated_at=now,
    )


async def _exec_turn(
    runtime: Any,
    thread: Any,
    prompt: str,
    ephemeral: bool,
    printer: JsonPrinter | TextPrinter,
    state: dict[str, Any],
    scope: trio.CancelScope,
) -> None:
    """Create ``thread``, run one turn of ``prompt`` on it and print its notifications until the
    turn ends (its status in ``state["status"]``); a SIGINT seen meanwhile interrupts it."""
    from roost.actors import InterruptTurn, Origin, StartTurn, Subscribe

    actor = await runtime.registry.create(thread, ephemeral=ephemeral)
    sink = _Sink()
    await actor.ref.ask(Subscribe(sink))
    started = {"method": "thread/started", "params": {"thread": actor.view()}}
    if not _show(printer, started, dumps_line(started), state):
        return  # nobody reads stdout: no turn is started (exit status 1)
    if state["signals"]:
        scope.cancel()
    state["actor"] = actor
    turn = await actor.ref.ask(StartTurn(prompt=prompt, origin=Origin(client_id="exec")))
    state["turn_id"] = turn["id"]
    if state["signals"]:
        actor.ref.tell(InterruptTurn(turn_id=turn["id"], reason="SIGINT"))
    async for line in sink.receive:
        message = loads(line)
        if not state["closed"] and not _show(printer, message, line, state):
            # the reader of stdout went away (``| head``): interrupt the turn so that it is stored
            # as interrupted with reason ``output_closed``, and wait (bounded) for it to settle
            actor.ref.tell(InterruptTurn(turn_id=turn["id"], reason="output_closed"))
            scope.deadline = min(scope.deadline, trio.current_time() + _INTERRUPT_GRACE)
        params = message.get("params") or {}
        if message.get("method") in TURN_TERMINAL_EVENTS and (params.get("turn") or {}).get("id") == turn["id"]:
            state["status"] = params["turn"].get("status")
            break


def _show(printer: JsonPrinter | TextPrinter, message: dict, line: bytes, state: dict[str, Any]) -> bool:
    """Print one notification; False (and ``state["closed"]`` set, stdout pointed at /dev/null)
    when stdout's reader has gone away."""
    from roost.protocol import silence_stdout

    try:
        printer.handle(message, line)
    except BrokenPipeError:
        state["closed"] = True
        silence_stdout()
        return False
    return True


def _text_stream(out: BinaryIO) -> TextIO:
    import io

    if out is getattr(sys.stdout, "buffer", None):
        return sys.stdout
    return io.TextIOWrapper(out, encoding="utf-8", write_through=True)


@click.command("exec", short_help="Run PROMPT as one turn on a new thread; print what happens.")
@engine_options
@click.argument("prompt")
@click.option("--json", "as_json", is_flag=True, help="Print app-server notifications as JSONL.")
@click.option(
    "--cwd",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Working directory of the thread (default: the current directory).",
)
@click.option("--ephemeral", is_flag=True, help="Keep the thread in memory only (not resumable).")
@click.option(
    "--permission-mode",
    type=click.Choice(["read_only", "standard", "unconfined"]),
    default="standard",
    show_default=True,
    help="What tools may do; approvals cannot be asked, so 'standard' denies mutations.",
)
@click.option("-v", "--verbose", is_flag=True, help="Log debug output to stderr.")
def exec_command(
    engine_flags: EngineFlags,
    prompt: str,
    as_json: bool,
    cwd: Path | None,
    ephemeral: bool,
    permission_mode: str,
    verbose: bool,
) -> None:
    """Run PROMPT as one turn on a new thread and print what happens.

    PROMPT "-" reads the prompt from standard input. With --json, stdout carries app-server
    notifications (one JSON object per line); otherwise the agent's reply is streamed as text and
    tool calls are shown as "$ name args" lines. Errors go to stderr.

    Exit status: 0 completed, 1 failed or interrupted, 2 no model provider configured (or its
    script is missing or broken) or ROOST_HOME or its database unusable (read-only: one line
    saying what to make writable), 130 SIGINT.
    """
    setup_logging(verbose)
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise click.UsageError("PROMPT is empty")
    try:
        settings = engine_flags.resolve()
    except ConfigError as exc:
        click.echo(f"roost exec: error: {exc}", err=True)
        sys.exit(2)
    directory = (cwd or Path(os.getcwd())).resolve()
    from roost.cli._runner import run_main

    code = run_main(
        lambda: run_exec(
            prompt,
            settings=settings,
            as_json=as_json,
            cwd=directory,
            ephemeral=ephemeral,
            permission_mode=permission_mode,
        ),
        command="exec",
    )
    sys.exit(code)
