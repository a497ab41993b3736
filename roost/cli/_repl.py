"""``roost repl --vscode``: one chat per process as JSONL over stdio (wire-protocol.md, "Live sessions")."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, TextIO

import click
import trio

from roost.cli._appserver import _engines, setup_logging
from roost.cli._engine_options import EngineFlags, engine_options

__all__ = ["repl_command"]


@click.command("repl", short_help="Chat with the agent: one chat thread per process.")
@engine_options
@click.option(
    "--vscode",
    is_flag=True,
    help="Speak the stdio chat protocol (JSONL events on stdout); without it, a readable chat.",
)
@click.option("--no-banner", is_flag=True, help="Accepted for compatibility; --vscode never prints a banner.")
@click.option("--resume", "resume", metavar="ID", default=None, help="Continue the chat with this session id.")
@click.option(
    "--cwd",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Working directory of a new chat (default: the current directory).",
)
@click.option(
    "--permission-mode",
    type=click.Choice(["read_only", "standard", "unconfined"]),
    default="standard",
    show_default=True,
    help="What tools may do in a new chat; 'standard' asks approval_request for mutations.",
)
@click.option("-v", "--verbose", is_flag=True, help="Log debug output to stderr.")
def repl_command(
    engine_flags: EngineFlags,
    vscode: bool,
    no_banner: bool,
    resume: str | None,
    cwd: Path | None,
    permission_mode: str,
    verbose: bool,
) -> None:
    """Chat with the agent: one chat (a Roost thread of kind chat) per process.

    With --vscode, stdin takes JSONL input lines (user_input, approval_response, question_response,
    interrupt) and stdout carries JSONL events only: ready first, session_end last. SIGINT (or an
    interrupt line) cancels the running turn only. These are the wire protocol's stdio events
    (docs/wire.md). FUSERAFT_VSCODE_QUESTIONS=1 (the wire protocol's name; ROOST_VSCODE_QUESTIONS=1
    is Roost's twin) offers the model the ask_user tool. --resume ID re-sends the chat's earlier
    turns as a replay event.

    Without --vscode the same chat is read from the terminal and rendered as text: type a message
    (or a slash command, or !command to run a shell command); answer approvals with y/N and
    questions with a line.

    Exit status: 0 after end of input or /exit, 1 when the chat cannot be opened, 2 when no model
    provider is configured.
    """
    from roost.protocol import open_stdio_stream, questions_enabled, serve_repl

    setup_logging(verbose)
    engines = _engines(engine_flags)
    if not vscode and engines.default is None:  # as exec/run: one line, exit status 2
        click.echo(f"roost repl: error: {engines.setup_error or 'no model provider is configured'}", err=True)
        sys.exit(2)
    directory = (cwd or Path(os.getcwd())).resolve()

    async def main() -> int:
        if not vscode:
            return await run_text_repl(engines=engines, cwd=directory, resume=resume, permission_mode=permission_mode)
        stream = open_stdio_stream()
        return await serve_repl(
            stream.receive_stream,
            stream.send_stream,
            engines=engines,
            cwd=directory,
            resume=resume,
            permission_mode=permission_mode,
            questions=questions_enabled(),
        )

    sys.exit(trio.run(main))


def _plain_markdown(text: str) -> str:
    """``text`` (Markdown) rendered for a terminal by ``rich`` without colours: headings and
    emphasis without their markers, bullets as ``•`` (issue 17: ``/help`` printed raw Markdown)."""
    import io

    from rich.console import Console
    from rich.markdown import Markdown

    buffer = io.StringIO()
    Console(file=buffer, width=100, color_system=None, force_terminal=False, highlight=False, emoji=False).print(
        Markdown(text)
    )
    return "\n".join(line.rstrip() for line in buffer.getvalue().rstrip("\n").splitlines())


class TextFrontEnd:
    """Renders stdio chat events readably and turns typed lines into input lines.

    While an ``approval_request`` is pending, the next typed line answers it (``y``/``yes``
    approves, anything else denies); while a ``question`` is pending, it is the answer (an empty
    line skips). Any other line is a ``user_input`` (slash commands included).
    """

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out = out
        self.err = err
        self.pending: str | None = None
        self.in_text = False
        #: set when the chat waits for the user: after ready, a turn's end, or a prompt
        self.may_read = trio.Event()

    def _line(self, text: str, *, stream: TextIO | None = None) -> None:
        if self.in_text:
            self.out.write("\n")
            self.in_text = False
        (stream or self.out).write(text + "\n")

    def render(self, event: dict) -> None:
        kind = event.get("type")
        if kind in ("ready", "message_end", "cancelled", "error", "approval_request", "question"):
            self.may_read.set()
        if kind == "ready":
            self._line(
                f"roost chat {event.get('sessionId')} ({event.get('model')}); /help for commands, Ctrl-D to leave"
            )
        elif kind == "token":
            self.out.write(event.get("text") or "")
            self.in_text = True
        elif kind == "tool_call":
            agent = f"[{event['agent']}] " if event.get("agent") else ""
            self._line(f"$ {agent}{event.get('summary')}")
        elif kind == "tool_result" and not event.get("ok"):
            first = (str(event.get("output") or "").strip().splitlines() or [""])[0]
            self._line(f"  ! {first}")
        elif kind == "file_changed":
            self._line(f"  {event.get('sigil')} {event.get('path')} (+{event.get('added')} -{event.get('removed')})")
        elif kind == "approval_request":
            self.pending = "approval"
            fields = {
                k: v
                for k, v in event.items()
                if k not in ("type", "kind", "oldContent", "newContent", "sessionId") and v not in (None, "")
            }
            detail = ", ".join(f"{k}: {v}" for k, v in fields.items())
            self._line(f"approve {event.get('kind')} ({detail[:300]})? [y/N]")
        elif kind == "question":
            self.pending = "question"
            options = ", ".join(event.get("options") or [])
            self._line(f"? {event.get('question')}" + (f" ({options})" if options else ""))
        elif kind == "message_end":
            if self.in_text:
                self.out.write("\n")
                self.in_text = False
        elif kind == "status" and self.pending is None and not self.in_text:
            self._line(
                f"[{event.get('model')} · turn {event.get('turn')} · context {event.get('context', 0):.0%} · "
                f"{event.get('input')} in / {event.get('output')} out tokens]"
            )
        elif kind == "title":
            self._line(f"(title: {event.get('title') or event.get('autoTitle')})")
        elif kind == "cancelled":
            self._line("(cancelled)")
        elif kind in ("error", "warning"):
            self._line(f"{kind}: {event.get('text')}", stream=self.err)
        elif kind == "text":  # Markdown (the stdio events carry it for editors): shown as text
            self._line(_plain_markdown(str(event.get("text") or "")))
        elif kind == "info":
            self._line(str(event.get("text") or ""))
        elif kind == "replay":
            for turn in event.get("turns") or []:
                self._line(f"you> {turn.get('user')}")
                self._line(str(turn.get("assistant") or ""))
        elif kind == "interjection":
            self._line(f"(your message was {event.get('status')})")
        elif kind in ("shell_start", "shell_output", "shell_end"):
            self._render_shell(event)
        elif kind == "copy":  # no clipboard here: show the text to copy
            self._line(f"(to copy)\n{event.get('text') or ''}")
        self.out.flush()
        self.err.flush()

    def _render_shell(self, event: dict) -> None:
        """A ``!command``: ``! command``, its output as it comes, then how it ended (if not 0)."""
        kind = event["type"]
        if kind == "shell_start":
            self._line(f"! {event.get('command')}")
        elif kind == "shell_output":
            text = str(event.get("text") or "")
            if text:
                self.out.write(text)
                self.in_text = not text.endswith("\n")  # so the next line starts on its own
        elif event.get("interrupted"):
            self._line("(shell command stopped)")
        elif event.get("exitCode") not in (0, None):
            self._line(f"(exit code {event.get('exitCode')})")

    def input_line(self, typed: str) -> dict:
        """The input line for one typed line (see the class docstring)."""
        typed = typed.rstrip("\n")
        pending, self.pending = self.pending, None
        if pending is not None:
            self.may_read = trio.Event()  # the turn goes on: wait for its end or the next prompt
        if pending == "approval":
            return {"type": "approval_response", "approved": typed.strip().lower() in ("y", "yes")}
        if pending == "question":
            return {"type": "question_response", "answer": typed if typed.strip() else None}
        if typed.strip():
            self.may_read = trio.Event()  # wait for the reply before reading on
        return {"type": "user_input", "text": typed}


async def run_text_repl(*, engines: Any, cwd: Path, resume: str | None, permission_mode: str) -> int:
    """``roost repl`` without --vscode: the same chat, read from a terminal and rendered as text.

    Returns:
        The exit status of :func:`roost.protocol._repl.serve_repl`.
    """
    from roost._json import dumps_line, loads
    from roost.protocol import questions_enabled, serve_repl

    front = TextFrontEnd(sys.stdout, sys.stderr)
    import trio.testing  # in-process stream pair for the readable chat

    to_chat_send, to_chat_receive = trio.testing.memory_stream_one_way_pair()
    from_chat_send, from_chat_receive = trio.testing.memory_stream_one_way_pair()
    code = 0
    async with trio.open_nursery() as nursery:

        async def chat() -> None:
            nonlocal code
            code = await serve_repl(
                to_chat_receive,
                from_chat_send,
                engines=engines,
                cwd=cwd,
                resume=resume,
                permission_mode=permission_mode,
                questions=questions_enabled(),
            )
            await from_chat_send.aclose()

        async def render() -> None:
            buf = b""
            while data := await from_chat_receive.receive_some(1 << 16):
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    front.render(loads(line))
            nursery.cancel_scope.cancel()

        async def read_terminal() -> None:
            from roost.cli._stdin import StdinLines

            stdin = StdinLines()  # os.read: an abandoned read never blocks the exit (see _stdin)
            while True:
                await front.may_read.wait()
                typed = await stdin.readline()
                if not typed:
                    break
                await to_chat_send.send_all(dumps_line(front.input_line(typed)))
            await to_chat_send.aclose()

        nursery.start_soon(chat)
        nursery.start_soon(render)
        nursery.start_soon(read_terminal)
    return code
