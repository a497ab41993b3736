"""``roost run``: run (or resume) an orchestration session.

* ``--bridge``: the run bridge (wire-protocol.md, "Run events (run bridge)"): JSONL events on
  stdout, ``approval_response`` / ``interrupt`` on stdin; see :mod:`roost.protocol._bridge`.
* otherwise a readable transcript: each agent's messages and tool calls, and a progress line
  (``[turn N, agent X, T tokens, S s]``) before each agent turn; approvals cannot be asked, so
  mutating tools and routes needing approval are denied. ``--json`` prints only the ``result``
  object at the end (one line).
* ``--hitl`` (human in the loop, not with ``--bridge``): after each agent turn the run pauses and
  reads one line from stdin: an empty line goes on, ``/stop`` (or end of input) stops the run
  (``--resume`` continues it), anything else is a message from the human that the next agent
  receives as input. Approvals are asked on the terminal too (``y`` approves; anything else
  denies). Prompts go to stderr, so stdout stays the transcript (or the ``--json`` result).

Exit status: the result's ``exitCode`` (0 completed, 1 failed or could not start, 130
interrupted); 2 on a usage error (e.g. ``--hitl`` with ``--bridge``).
"""

from __future__ import annotations

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
    """Prints run events for a person (the non-bridge mode)."""

    def __init__(self, out: Any, *, quiet: bool) -> None:
        self.out = out
        self.quiet = quiet
        self.turns = 0
        self.tokens = 0
        self.started = None

    def emit(self, event: dict) -> None:
        kind = event.get("type")
        if self.quiet:
            if kind == "result":
                self.out.write(dumps(event).decode() + "\n")
                self.out.flush()
            return
        now = trio.current_time()
        self.started = self.started if self.started is not None else now
        if kind == "ready":
            verb = "resuming" if event.get("resumed") else "starting"
            self.out.write(f"{verb} session {event['sessionId']}: {event['task']}\n"
                           f"agents: {', '.join(event['agents'])}\n")
        elif kind == "agent_starting":
            self.turns += 1
            self.out.write(f"\n[turn {self.turns} · {event['agent']} · {self.tokens} tokens · "
                           f"{now - self.started:.1f} s]\n")
        elif kind == "tool_calling":
            self.out.write(f"  $ {event['tool']} {event['argsSummary']}\n")
        elif kind == "token_budget_warning":
            self.out.write(f"  ! token budget: {event['inputTokens']} tokens used "
                           f"(warning at {event['warnThreshold']})\n")
        elif kind == "agent_message":
            m = event["message"]
            self.tokens += (m.get("inputTokens") or 0) + (m.get("outputTokens") or 0)
            self.out.write(f"{m['agentName']}: {m['content']}\n")
        elif kind == "result":
            state = "completed" if event["succeeded"] else f"did not complete: {event.get('errorMessage')}"
            session = event.get("sessionId")
            self.out.write(f"\nsession {session} {state} ({event['turns']} turns, "
                           f"{event['inputTokens']}+{event['outputTokens']} tokens, {event['elapsedSeconds']} s)\n")
            if session and not event["succeeded"]:
                self.out.write(f"resume with: roost run --resume {session}\n")
        self.out.flush()


class _HumanInTheLoop:
    """``--hitl``: pauses after agent turns and asks approvals, reading lines from stdin.

    stdin is read in a worker thread that is abandoned on cancellation (SIGINT), so an interrupt
    never waits for a line.
    """

    def __init__(self, err: Any) -> None:
        self.err = err
        self.eof = False

    async def _ask(self, prompt: str) -> str | None:
        if self.eof:
            return None
        self.err.write(prompt)
        self.err.flush()
        line = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        if not line:
            self.eof = True
            return None
        return line.rstrip("\r\n")

    async def after_turn(self, agent: str, text: str) -> Any:
        from roost.orchestration._run import STOP

        line = await self._ask(f"[{agent} is done] Enter: continue · a message: send it to the next agent · "
                               "/stop: stop (resumable)\n> ")
        if line is None or line.strip() == "/stop":
            return STOP
        return line.strip() or None

    async def approve(self, params: dict) -> bool | None:
        kind = params.get("kind")
        detail = {k: v for k, v in params.items() if k not in ("kind", "item_id") and v not in (None, "")}
        summary = ", ".join(f"{k}: {v}" for k, v in detail.items())
        line = await self._ask(f"approve {kind} ({summary[:300]})? [y/N] ")
        return None if line is None else line.strip().lower() in ("y", "yes")


async def _run_plain(*, config: str | None, task: str | None, resume_id: str | None, settings: Any,
                     cwd: Path, as_json: bool, hitl: bool = False) -> int:
    from roost.protocol._bridge import run_session

    printer = _Transcript(sys.stdout, quiet=as_json)
    holder: dict[str, Any] = {"orch": None, "sigint": False}
    human = _HumanInTheLoop(sys.stderr) if hitl else None

    async def nobody(params: dict) -> None:
        return None  # nobody to ask: the unattended policy (deny) decides

    def on_orchestrator(orch: Any) -> None:
        holder["orch"] = orch
        if holder["sigint"]:
            orch.interrupt("SIGINT")

    async with trio.open_nursery() as nursery:
        async def sigint() -> None:
            with trio.open_signal_receiver(signal.SIGINT) as signals:
                async for _ in signals:
                    holder["sigint"] = True
                    if holder["orch"] is not None:
                        holder["orch"].interrupt("SIGINT")

        nursery.start_soon(sigint)
        result = await run_session(config_path=config, task=task, resume_id=resume_id, settings=settings, cwd=cwd,
                                   emit=printer.emit, request_approval=human.approve if human else nobody,
                                   on_orchestrator=on_orchestrator, after_turn=human.after_turn if human else None)
        nursery.cancel_scope.cancel()
    return int(result["exitCode"])


@click.command("run")
@engine_options
@click.argument("task", required=False)
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), default=None,
              help="The orchestration config (YAML).")
@click.option("--resume", "resume_id", metavar="ID", default=None, help="Continue an interrupted session.")
@click.option("--bridge", is_flag=True, help="Speak the run bridge protocol (JSONL) on stdio.")
@click.option("--hitl", is_flag=True, help="Human in the loop: pause after each agent turn for Enter, a "
              "message to the next agent, or /stop; ask approvals on the terminal (not with --bridge).")
@click.option("--json", "as_json", is_flag=True, help="Print one summary object (the result) at the end.")
@click.option("-v", "--verbose", is_flag=True, help="Log debug output to stderr.")
def run_command(engine_flags: EngineFlags, task: str | None, config: str | None, resume_id: str | None,
                bridge: bool, hitl: bool, as_json: bool, verbose: bool) -> None:
    """Run TASK with the team of agents in the orchestration config (-c), or --resume a session.

    With --bridge, stdout carries wire-protocol run events (ready first, result last) and stdin
    takes approval_response and interrupt lines. Exit status: the result's exitCode (0
    completed, 1 failed, 130 interrupted).
    """
    from roost.cli._appserver import setup_logging

    if hitl and bridge:
        raise click.UsageError("--hitl can't be combined with --bridge (the bridge never pauses after a turn)")
    if resume_id is None and (not config or not task or not task.strip()):
        raise click.UsageError("give -c CONFIG and a TASK, or --resume ID")
    if resume_id is not None and task:
        raise click.UsageError("--resume continues the session's own task; don't give a TASK")
    setup_logging(verbose)
    try:
        settings = engine_flags.resolve()
    except ConfigError as exc:
        if bridge:
            from roost.protocol._bridge import failed_result

            sys.stdout.write(dumps(failed_result(str(exc), task=task, config=config)).decode() + "\n")
            sys.stdout.flush()
            sys.exit(1)
        click.echo(f"roost run: {exc}", err=True)
        sys.exit(2)
    cwd = Path(os.getcwd()).resolve()
    config_path = str(Path(config).expanduser().resolve()) if config else None
    from roost.cli._runner import run_main

    if bridge:
        from roost.protocol._bridge import run_bridge
        from roost.protocol._framing import open_stdio_stream

        async def main() -> int:
            stream = open_stdio_stream()
            async with stream:
                return await run_bridge(config_path=config_path, task=task, resume_id=resume_id, settings=settings,
                                        cwd=cwd, receive=stream.receive_stream, send=stream.send_stream)

        code = run_main(main, command="run")
    else:
        code = run_main(lambda: _run_plain(config=config_path, task=task, resume_id=resume_id, settings=settings,
                                           cwd=cwd, as_json=as_json, hitl=hitl), command="run")
    sys.exit(code)
