"""``roost run``: run (or resume) an orchestration session.

* ``--bridge``: the run bridge (wire-protocol.md, "Run events (run bridge)"): JSONL events on
  stdout, ``approval_response`` / ``interrupt`` on stdin; see :mod:`roost.protocol._bridge`.
* otherwise a readable transcript: each agent's text streamed as it arrives, its tool calls, and
  a progress line (``[turn N, agent X, T tokens, S s]``) before each agent turn; on a terminal a
  spinner shows while a model or a tool works. Approvals (``--permission-mode standard``, the
  default) are asked on the terminal when stdin and stderr are one; otherwise the
  ``--unattended-policy`` answers (``deny`` by default). Each denial is shown and counted in the
  result (:mod:`roost.cli._run_terminal`). ``--json`` prints only the ``result`` object at the
  end (one line).
* ``--hitl`` (human in the loop, not with ``--bridge``): after each agent turn the run pauses and
  reads one line from stdin: an empty line goes on, ``/stop`` (or end of input) stops the run
  (``--resume`` continues it), anything else is a message from the human that the next agent
  receives as input. Approvals are asked on the terminal too (``y`` approves; anything else
  denies). Prompts go to stderr, so stdout stays the transcript (or the ``--json`` result).

Exit status: the result's ``exitCode`` (0 completed, 1 failed or could not start, 3 completed
but every action it asked approval for was denied (not with ``--bridge``), 130 interrupted by an
interrupt line, SIGINT or SIGTERM; either way ``--resume`` continues it); 1 when stdout's reader
went away (the run is interrupted, resumably); 2 on a usage or set-up error (e.g. ``--hitl`` with
``--bridge``, no model provider configured, an unusable ``$ROOST_HOME``).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click
import trio

from roost._json import dumps
from roost.cli._engine_options import EngineFlags, engine_options
from roost.errors import ConfigError

__all__ = ["run_command"]


class _Transcript:
    """Prints run events for a person (the non-bridge mode).

    A run that fails before it starts (``result`` with ``sessionId`` null) is reported on stderr
    as ``roost run: error: ...``. When stdout's reader goes away (``| head``), ``on_broken`` is
    called once (the run is interrupted, resumably) and nothing more is written.
    """

    def __init__(
        self, out: Any, *, quiet: bool, on_broken: Any = None, reason: Any = None, spinner: Any = None
    ) -> None:
        from roost.cli._run_terminal import LiveText, Spinner

        self.out = out
        self.quiet = quiet
        self.on_broken = on_broken
        self.reason = reason or (lambda: None)  # why a completed run stopped (its termination)
        self.broken = False
        self.turns = 0
        self.tokens = 0
        self.started: float | None = None
        self.agent: str | None = None
        self.spinner = spinner or Spinner(enabled=False)
        self.denials: Any = None  # the run's Approvals (adds denial counts to the result)
        self.live = LiveText(self.write, lambda: self.agent, self.spinner)
        self._status: str | None = None  # the spinner's text after this event's output

    def emit(self, event: dict) -> None:
        if event.get("type") == "result":
            self.spinner.pause()
            if self.denials is not None:
                self.denials.finish(event)
        if event.get("type") == "result" and event.get("sessionId") is None:
            click.echo(f"roost run: error: {event.get('errorMessage')}", err=True)
            return
        self._status = None
        text = self._render(event)
        if text:
            self.write(text, summary=self.quiet)
        if self._status is not None and not self.broken:
            self.spinner.show(self._status)  # after the text: the status line sits below it

    def write(self, text: str, *, summary: bool = False) -> None:
        """Write transcript text (nothing once stdout's reader went away; with --json only the
        ``summary``, the result line)."""
        if self.broken or (self.quiet and not summary):
            return
        try:
            self.spinner.pause()
            self.out.write(text)
            self.out.flush()
        except (BrokenPipeError, ValueError):  # ValueError: stdout was closed
            self.broken = True
            from roost.protocol import silence_stdout

            silence_stdout()
            if self.on_broken is not None:
                self.on_broken()

    def _render(self, event: dict) -> str:
        kind = event.get("type")
        if self.quiet:
            return dumps({"protocolVersion": 1, **event}).decode() + "\n" if kind == "result" else ""
        now = trio.current_time()
        self.started = self.started if self.started is not None else now
        if kind == "ready":
            verb = "resuming" if event.get("resumed") else "starting"
            return f"{verb} session {event['sessionId']}: {event['task']}\nagents: {', '.join(event['agents'])}\n"
        if kind == "agent_starting":
            self.turns += 1
            self.agent = event["agent"]
            self.live.new_turn()
            self._status = f"{self.agent} is working"
            return (
                f"\n[turn {self.turns} · {event['agent']} · {self.tokens} tokens so far · {now - self.started:.1f} s]\n"
            )
        if kind == "tool_calling":
            self._status = f"{self.agent or 'agent'}: running {event['tool']}"
            return f"{self.live.end_line()}  $ {event['tool']} {event['argsSummary']}\n"
        if kind == "token_budget_warning":
            return f"  ! token budget: {event['inputTokens']} tokens used (warning at {event['warnThreshold']})\n"
        if kind == "agent_message":
            m = event["message"]
            self.tokens += (m.get("inputTokens") or 0) + (m.get("outputTokens") or 0)
            failed = [c["name"] for c in m.get("toolCalls") or [] if not c.get("succeeded")]
            note = f"  ({len(failed)} tool call{_s(len(failed))} failed: {', '.join(failed)})\n" if failed else ""
            if self.live.streamed and m.get("role") == "assistant" and m.get("agentName") == self.agent:
                end = self.live.end_line()  # its text is on the terminal already
                self.live.new_turn()
                return f"{end}{note}"
            return f"{self.live.end_line()}{note}{m['agentName']}: {m['content']}\n"
        if kind == "result":
            why = self.reason()
            state = (
                (f"completed: {why}" if why else "completed")
                if event["succeeded"]
                else f"did not complete: {event.get('errorMessage')}"
            )
            session = event["sessionId"]
            if event.get("allActionsDenied"):
                state = (
                    f"completed, but all {event['deniedActions']} action{_s(event['deniedActions'])} "
                    "it asked for were denied"
                )
            elif event.get("deniedActions"):
                state += f" ({event['deniedActions']} action{_s(event['deniedActions'])} denied)"
            text = (
                f"{self.live.end_line()}\nsession {session} {state} ({event['turns']} turn{_s(event['turns'])}, "
                f"{event['inputTokens']}+{event['outputTokens']} tokens, {event['elapsedSeconds']} s)\n"
            )
            if event.get("allActionsDenied"):
                text += (
                    "nothing it wanted to do was done: approve on a terminal, or use --hitl, --bridge, "
                    "--unattended-policy allow or --permission-mode unconfined\n"
                )
            if not event["succeeded"]:
                text += f"resume with: roost run --resume {session}\n"
            return text
        return ""


def _s(count: int) -> str:
    return "" if count == 1 else "s"


#: approval fields that identify, rather than describe, what is asked (not shown to the human)
_INTERNAL_FIELDS = frozenset({"kind", "item_id", "thread_id", "turn_id", "call_id", "sessionId"})


class _HumanInTheLoop:
    """``--hitl``: pauses after agent turns and asks approvals, reading lines from stdin.

    stdin is read in a worker thread that is abandoned on cancellation (SIGINT), so an interrupt
    never waits for a line; it reads with ``os.read`` (:mod:`roost.cli._stdin`), so the process
    exits cleanly while that thread still blocks.
    """

    def __init__(self, err: Any) -> None:
        from roost.cli._stdin import StdinLines

        self.err = err
        self.eof = False
        self.stdin = StdinLines()

    async def _ask(self, prompt: str) -> str | None:
        if self.eof:
            return None
        self.err.write(prompt)
        self.err.flush()
        line = await self.stdin.readline()
        if not line:
            self.eof = True
            return None
        return line.rstrip("\r\n")

    async def after_turn(self, agent: str, text: str) -> Any:
        from roost.orchestration import STOP

        line = await self._ask(
            f"[{agent} is done] Enter: continue · a message: send it to the next agent · /stop: stop (resumable)\n> "
        )
        if line is None or line.strip() == "/stop":
            return STOP
        return line.strip() or None

    async def approve(self, params: dict) -> bool | None:
        kind = params.get("kind")
        detail = {k: v for k, v in params.items() if k not in _INTERNAL_FIELDS and v not in (None, "")}
        summary = ", ".join(f"{k}: {v}" for k, v in detail.items())
        line = await self._ask(f"approve {kind} ({summary[:300]})? [y/N] ")
        return None if line is None else line.strip().lower() in ("y", "yes")


async def _run_plain(
    *,
    config: str | None,
    task: str | None,
    resume_id: str | None,
    settings: Any,
    cwd: Path,
    as_json: bool,
    hitl: bool = False,
    permission_mode: str = "standard",
    unattended_policy: str = "deny",
    interactive: bool | None = None,
) -> int:
    from roost.cli._run_terminal import Approvals, Spinner
    from roost.protocol import run_session

    holder: dict[str, Any] = {"orch": None, "signal": None}

    def stop(reason: str) -> None:
        holder["signal"] = holder["signal"] or reason
        if holder["orch"] is not None:
            holder["orch"].interrupt(reason)

    def reason() -> str | None:
        outcome = getattr(holder["orch"], "outcome", None)
        return outcome.reason if outcome is not None else None

    if interactive is None:
        interactive = _on_a_terminal()
    spinner = Spinner(enabled=not as_json and _isatty(sys.stderr))
    printer = _Transcript(
        sys.stdout, quiet=as_json, on_broken=lambda: stop("stdout closed"), reason=reason, spinner=spinner
    )
    human = _HumanInTheLoop(sys.stderr) if hitl or interactive else None
    approvals = Approvals(
        ask=human.approve if human else None, policy=unattended_policy, report=printer.write, spinner=spinner
    )
    printer.denials = approvals

    def on_orchestrator(orch: Any) -> None:
        holder["orch"] = orch
        printer.turns = orch.progress.iterations  # a resumed run goes on counting
        if holder["signal"]:
            orch.interrupt(holder["signal"])

    async with trio.open_nursery() as nursery:

        async def sigint() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    stop(signal.Signals(signum).name)

        nursery.start_soon(sigint)
        try:
            result = await run_session(
                config_path=config,
                task=task,
                resume_id=resume_id,
                settings=settings,
                cwd=cwd,
                emit=printer.emit,
                request_approval=approvals.request,
                on_orchestrator=on_orchestrator,
                after_turn=human.after_turn if human and hitl else None,
                subscriber=printer.live,
                permission_mode=permission_mode,
            )
        finally:
            spinner.pause()
        nursery.cancel_scope.cancel()
    if printer.broken:
        return 1 if result["exitCode"] == 0 else int(result["exitCode"])
    return int(result["exitCode"])


def _resumed_flags(flags: EngineFlags, session_id: str) -> EngineFlags:
    """The flags of a resumed run: the session's own model settings (kept in its metadata when it
    started), each overridden by a flag given now. A flag naming another provider drops the
    stored settings (they belong to the stored provider). A session that kept none (older, or
    unknown: reported later by the run) leaves the flags as they are."""
    from roost.cli._res_common import open_cli_store
    from roost.errors import NotFound, StoreError
    from roost.storage import get_thread

    try:
        with open_cli_store() as store, store.read() as conn:
            thread = get_thread(conn, session_id)
    except (NotFound, StoreError):
        return flags
    stored = (thread.metadata or {}).get("engine") or {}
    if not stored or (flags.provider is not None and flags.provider != stored.get("provider")):
        return flags
    merged = {
        k: getattr(flags, k) if getattr(flags, k) is not None else stored.get(k)
        for k in ("provider", "base_url", "model", "script", "api_key_env")
    }
    return EngineFlags(**merged)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _on_a_terminal() -> bool:
    """Whether a person can be asked: stdin and stderr are terminals."""
    return _isatty(sys.stdin) and _isatty(sys.stderr)


@click.command("run", short_help="Run TASK with a team of agents, or --resume a session.")
@engine_options
@click.argument("task", required=False)
@click.option(
    "-c", "--config", "config", type=click.Path(dir_okay=False), default=None, help="The orchestration config (YAML)."
)
@click.option("--resume", "resume_id", metavar="ID", default=None, help="Continue an interrupted session.")
@click.option("--bridge", is_flag=True, help="Speak the run bridge protocol (JSONL) on stdio.")
@click.option(
    "--hitl",
    is_flag=True,
    help="Human in the loop: pause after each agent turn for Enter, a "
    "message to the next agent, or /stop; ask approvals on the terminal (not with --bridge).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one summary object (the result) at the end.")
@click.option(
    "--permission-mode",
    type=click.Choice(["read_only", "standard", "unconfined"]),
    default="standard",
    show_default=True,
    help="What the agents' tools may do in a new session: read_only refuses "
    "writes and commands, standard asks approval for them, unconfined never asks.",
)
@click.option(
    "--unattended-policy",
    type=click.Choice(["deny", "allow"]),
    default="deny",
    show_default=True,
    help="Answer to an approval when nobody can be asked (stdin or stderr is not a terminal, "
    "no --hitl). Not with --bridge, whose client answers.",
)
@click.option("-v", "--verbose", is_flag=True, help="Log debug output to stderr.")
def run_command(
    engine_flags: EngineFlags,
    task: str | None,
    config: str | None,
    resume_id: str | None,
    bridge: bool,
    hitl: bool,
    as_json: bool,
    permission_mode: str,
    unattended_policy: str,
    verbose: bool,
) -> None:
    """Run TASK with the team of agents in the orchestration config (-c), or --resume a session.

    The readable transcript streams each agent's text and tool calls. On a terminal each
    approval is asked there (y approves); otherwise --unattended-policy answers (deny by
    default). Every denied action is shown and counted in the result.

    With --bridge, stdout carries wire-protocol run events (ready first, result last) and stdin
    takes approval_response and interrupt lines.

    \b
    Exit status:
      0    the run completed
      1    it failed or could not start (bad config, unknown session)
      2    usage or set-up error (bad options, no model provider, unusable ROOST_HOME)
      3    it completed, but every action it asked approval for was denied (not --bridge)
      130  interrupted (interrupt line, Ctrl-C, SIGTERM); --resume ID continues it
    """
    from roost.cli._appserver import setup_logging

    _check_run_options(task, config, resume_id, bridge=bridge, hitl=hitl, as_json=as_json, policy=unattended_policy)
    setup_logging(verbose)
    try:
        if resume_id is not None:
            engine_flags = _resumed_flags(engine_flags, resume_id)
        settings = engine_flags.resolve()
    except ConfigError as exc:
        if bridge:
            from roost.protocol import failed_result

            sys.stdout.write(dumps(failed_result(str(exc), task=task, config=config)).decode() + "\n")
            sys.stdout.flush()
            sys.exit(1)
        click.echo(f"roost run: error: {exc}", err=True)
        sys.exit(2)
    cwd = Path(os.getcwd()).resolve()
    config_path = str(Path(config).expanduser().resolve()) if config else None
    from roost.cli._runner import run_main

    if bridge:
        code = run_main(
            functools.partial(_run_bridged, config_path, task, resume_id, settings, cwd, permission_mode),
            command="run",
        )
    else:
        code = run_main(
            lambda: _run_plain(
                config=config_path,
                task=task,
                resume_id=resume_id,
                settings=settings,
                cwd=cwd,
                as_json=as_json,
                hitl=hitl,
                permission_mode=permission_mode,
                unattended_policy=unattended_policy,
            ),
            command="run",
        )
    sys.exit(code)


def _check_run_options(
    task: str | None, config: str | None, resume_id: str | None, *, bridge: bool, hitl: bool, as_json: bool, policy: str
) -> None:
    """Refuse option combinations that make no sense (click.UsageError: exit 2)."""
    if as_json and bridge:
        raise click.UsageError("--json has no effect with --bridge (the bridge already speaks JSONL)")
    if hitl and bridge:
        raise click.UsageError("--hitl can't be combined with --bridge (the bridge never pauses after a turn)")
    if bridge and policy != "deny":
        raise click.UsageError("--unattended-policy has no effect with --bridge (its client answers approvals)")
    if resume_id is None and (not config or not task or not task.strip()):
        raise click.UsageError("give -c CONFIG and a TASK, or --resume ID")
    if resume_id is not None and task:
        raise click.UsageError("--resume continues the session's own task; don't give a TASK")


async def _run_bridged(
    config_path: str | None, task: str | None, resume_id: str | None, settings: Any, cwd: Path, permission_mode: str
) -> int:
    """``roost run --bridge``: the run bridge on stdin/stdout (:func:`roost.protocol.run_bridge`)."""
    from roost.protocol import open_stdio_stream, run_bridge

    stream = open_stdio_stream()
    async with stream:
        return await run_bridge(
            config_path=config_path,
            task=task,
            resume_id=resume_id,
            settings=settings,
            cwd=cwd,
            receive=stream.receive_stream,
            send=stream.send_stream,
            permission_mode=permission_mode,
        )
