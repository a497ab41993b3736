"""``roost run`` on a terminal: approvals, denials, streamed agent text and a progress spinner.

Issue 17 ("Approvals on the terminal", "Live progress"):

* :class:`Approvals`: on a terminal (stdin and stderr are TTYs) each approval is asked like
  ``--hitl`` asks it (``y`` approves, anything else denies), without pausing after turns. Without
  a terminal nobody can be asked and the *unattended policy* answers (``--unattended-policy``:
  ``deny``, the default, or ``allow``); the first such denial prints one hint on stderr naming
  the ways to approve. Every denial is reported in the transcript (``  x denied ...``) and counted
  in the result (``deniedActions``, ``approvedActions``); a run that completed although every
  action it asked for was denied gets exit status :data:`EXIT_ALL_DENIED` instead of 0.
* :class:`LiveText`: a thread subscriber that streams agent text deltas as they arrive.
* :class:`Spinner`: a ``rich`` status line on stderr while a model or a tool works (only when
  stderr is a terminal); paused whenever something is written.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

from roost._json import loads

__all__ = ["EXIT_ALL_DENIED", "Approvals", "LiveText", "Spinner", "describe_approval"]

#: Exit status of a run that completed although every action it asked approval for was denied.
EXIT_ALL_DENIED = 3
#: Lines of a tool's output shown in the transcript.
TOOL_LINES = 4

#: approval fields that identify, rather than describe, what is asked (not shown to the human)
_INTERNAL_FIELDS = frozenset({"kind", "item_id", "thread_id", "turn_id", "call_id", "sessionId"})

HINT = (
    "roost run: nobody can approve on this input (not a terminal), so actions needing approval are "
    "denied; run it on a terminal, or use --hitl, --bridge, --unattended-policy allow or "
    "--permission-mode unconfined"
)


def describe_approval(params: dict) -> str:
    """``KIND (field: value, ...)`` of an approval request, for a person (at most ~300 chars)."""
    detail = {k: v for k, v in params.items() if k not in _INTERNAL_FIELDS and v not in (None, "")}
    summary = ", ".join(f"{k}: {v}" for k, v in detail.items())
    return f"{params.get('kind') or 'action'} ({summary[:300]})"


class Spinner:
    """A transient ``rich`` status line on stderr; a no-op unless ``enabled``."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._status: Any = None
        if enabled:
            from rich.console import Console

            self._console = Console(file=sys.stderr, stderr=True)

    def show(self, text: str) -> None:
        """Show (or change) the status line."""
        if not self.enabled:
            return
        if self._status is None:
            self._status = self._console.status(text, spinner="dots")
            self._status.start()
        else:
            self._status.update(text)

    def pause(self) -> None:
        """Remove the status line (before anything else is written)."""
        if self._status is not None:
            self._status.stop()
            self._status = None


class Approvals:
    """The ``request_approval`` of a readable ``roost run`` (see the module docstring).

    Args:
        ask: ``await ask(params) -> bool | None`` asking a person (``--hitl``'s terminal prompt),
            or None when nobody can be asked.
        policy: ``deny`` or ``allow``: the answer when nobody can be asked.
        report: writes one transcript line (a denial).
        spinner: paused while a person is asked.
    """

    def __init__(
        self, *, ask: Any, policy: str, report: Callable[[str], None], spinner: Spinner, err: TextIO | None = None
    ) -> None:
        self.ask = ask
        self.policy = policy
        self.report = report
        self.spinner = spinner
        self.err = err or sys.stderr
        self.approved = 0
        self.denied: list[str] = []
        self._hinted = False

    async def request(self, params: dict) -> bool | None:
        """Answer one approval: ``True`` approves; ``None`` (nobody answered) and ``False`` deny."""
        self.spinner.pause()
        what = describe_approval(params)
        if self.ask is not None:
            answer = await self.ask(params)
            why = "by you" if answer is False else "no answer (end of input)"
        elif self.policy == "allow":
            answer, why = True, ""
        else:
            answer, why = None, "nobody to ask: the unattended policy is deny"
            if not self._hinted:
                self._hinted = True
                self.err.write(HINT + "\n")
                self.err.flush()
        if answer is True:
            self.approved += 1
        else:
            self.denied.append(what)
            self.report(f"  x denied {what}: {why}\n")
        return answer

    def finish(self, result: dict) -> dict:
        """Add ``deniedActions``/``approvedActions`` to a ``result`` event; a completed run whose
        every asked action was denied gets ``exitCode`` :data:`EXIT_ALL_DENIED` and
        ``allActionsDenied: true``."""
        if result.get("sessionId") is None:
            return result
        result["deniedActions"] = len(self.denied)
        result["approvedActions"] = self.approved
        if result.get("exitCode") == 0 and self.denied and not self.approved:
            result["exitCode"] = EXIT_ALL_DENIED
            result["allActionsDenied"] = True
        return result


class LiveText:
    """A thread subscriber writing each agent text delta as it arrives (``item/agentMessage/delta``).

    Args:
        write: writes transcript text (the transcript's, so a closed stdout is handled once).
        agent: returns the name of the agent whose turn runs (the prefix of its line).
        spinner: paused before text is written.
    """

    def __init__(self, write: Callable[[str], None], agent: Callable[[], str | None], spinner: Spinner) -> None:
        self.write = write
        self.agent = agent
        self.spinner = spinner
        self.open = False  # a line of streamed text is open (not yet ended by a newline)
        self.streamed = False  # the running agent turn streamed text

    def deliver(self, line: bytes) -> None:
        if line.startswith(b'{"method":"item/completed"'):
            self._tool_result((loads(line).get("params") or {}).get("item") or {})
            return
        if not line.startswith(b'{"method":"item/agentMessage/delta"'):
            return
        delta = (loads(line).get("params") or {}).get("delta") or ""
        if not delta:
            return
        self.spinner.pause()
        if not self.open:
            self.write(f"{self.agent() or 'agent'}: ")
            self.open = True
        self.streamed = True
        self.write(delta)

    def _tool_result(self, item: dict) -> None:
        """A finished tool call: ``ok``/``failed`` and the first lines of its output (as ``exec``)."""
        if item.get("type") != "tool_call":
            return
        self.spinner.pause()
        lines = str(item.get("output") or "").rstrip().splitlines()
        text = self.end_line() + f"    {'failed' if item.get('is_error') else 'ok'}: {item.get('name')}\n"
        text += "".join(f"    | {row[:200]}\n" for row in lines[:TOOL_LINES])
        if len(lines) > TOOL_LINES:
            text += f"    | ... {len(lines) - TOOL_LINES} more lines\n"
        self.write(text)

    def end_line(self) -> str:
        """The text that ends an open streamed line (``"\\n"``, or ``""`` when none is open)."""
        if self.open:
            self.open = False
            return "\n"
        return ""

    def new_turn(self) -> None:
        self.open = self.streamed = False
