"""Readable rendering of ``roost serve`` daemon events for ``roost attach`` (see :mod:`roost.cli._attach`)."""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from typing import Any

__all__ = ["Renderer", "HELP"]

#: ``/help`` of the readable attach (issue 17: commands start with ``/``; other lines are tasks).
HELP = """commands (any other line is sent to the daemon as a task):
  /help        this list
  /interrupt   interrupt your running task (Ctrl-C does too; Ctrl-C again detaches)
  /status      the daemon's queue, running tasks and attached clients
  /quit        detach (your tasks keep running in the daemon)
  //TEXT       send the task "/TEXT" (a task that starts with /)"""


class Renderer:
    """Renders daemon events as text lines on ``write`` (pure: events in, text out).

    Streamed ``token`` text is written inline after a ``[sid] agent:`` prefix; any other line first
    ends an open token line.
    """

    def __init__(self, write: Callable[[str], None]) -> None:
        self.write = write
        self._open: str | None = None  # the sessionId whose token line is open, or _PROMPT

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
                self.line(
                    f"in flight: [{_sid(flight.get('sessionId'))}] {flight.get('task')!r} "
                    f"({flight.get('status')}, position {flight.get('position')})"
                )
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
            self.line(
                f"[{sid}] warning: {event.get('agent')} used {event.get('inputTokens')} input tokens "
                f"(threshold {event.get('warnThreshold')})"
            )
        elif kind == "task_resumed":
            # (a daemon restart, a killed `serve --workers` worker, a node of a cluster: docs/wire.md)
            self.line(f"[{sid}] resumed (the process that ran it stopped or lost it): {event.get('task')!r}")
        elif kind == "auto_dispatched":
            self.line(f"[{sid}] dispatched by the daemon (objective {event.get('objectiveId')}): {event.get('task')!r}")
        elif kind == "a2a_call":
            self.line(f"[{sid}] A2A call to {event.get('agent')}")
        elif kind == "result":
            error = str(event.get("errorMessage") or "")
            # an interrupted task's errorMessage is its turn's (or run's) "interrupted ..." message
            interrupted = not event.get("succeeded") and error.startswith("interrupted")
            state = "succeeded" if event.get("succeeded") else "interrupted" if interrupted else "failed"
            self.line(f"[{sid}] result: {state} ({event.get('task')!r})")
            if interrupted and error != "interrupted":
                self.line(f"  {error}")
            elif error and not interrupted:
                self.line(f"  error: {error}")
            if event.get("lastMessage"):
                agent = event.get("lastAgent") or "agent"
                self.line(f"  {agent}: " + str(event.get("lastMessage")).replace("\n", "\n  "))
        elif kind == "error":
            self.line(f"error: {event.get('text')} ({event.get('code')})")
        elif kind == "approval_request":
            self.approval(event)
        elif kind == "question":
            options = ", ".join(str(o) for o in event.get("options") or [])
            self.line(f"[{sid}] question: {event.get('question')}" + (f" (options: {options})" if options else ""))
            self.write("answer (an empty line skips): ")
            self._open = _PROMPT
        elif kind == "status":
            self.status(event)
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
            diff = difflib.unified_diff(
                str(event.get("oldContent") or "").splitlines(),
                str(event.get("newContent") or "").splitlines(),
                f"a/{event.get('path')}",
                f"b/{event.get('path')}",
                lineterm="",
            )
            for row in diff:
                self.line(f"  {row}")
        elif kind == "route_approval":
            self.line(f"  {event.get('sourceAgent')} -> {event.get('targetAgent')} (keyword {event.get('keyword')!r})")
        else:  # an unknown kind: show the raw event, ask, never auto-approve
            self.line("  " + json.dumps(event, ensure_ascii=False))
        self.write("approve? [y/N] ")
        self._open = _PROMPT

    def status(self, event: dict) -> None:
        """Show the answer to ``/status`` (the daemon's additive ``status`` event)."""
        running, queued, clients = event.get("running") or [], event.get("queue") or [], event.get("clients") or []
        self.line(
            f"daemon pid {event.get('pid')} in {event.get('workDir')}: running {len(running)}, "
            f"queued {len(queued)}, clients {len(clients)}"
        )
        for t in running:
            self.line(f"  running [{_sid(t.get('sessionId'))}] {t.get('task')!r}")
        for t in queued:
            self.line(f"  queued #{t.get('position')} [{_sid(t.get('sessionId'))}] {t.get('task')!r}")

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
