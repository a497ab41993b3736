"""Sans-IO translation of a chat thread's notifications into wire-protocol stdio chat events.

``roost repl --vscode`` subscribes to its thread's event hub, which carries app-server-shaped
notifications (``{"method", "params"}``, snake_case). :class:`ChatTranslator` turns each into the
stdio events of wire-protocol.md, "Live sessions" ("Turn events (stdio)"), camelCase, one dict per
event with its ``type``. It keeps the little per-turn state the events need (tool names, changed
files, usage) and never touches a stream, so it is tested without I/O.

Mapping (notification -> events):

========================================  =================================================
``turn/started``                          ``turn_start {text}`` (text carried over, else ""),
                                          nothing for a compaction turn
``item/agentMessage/delta``               ``token {text}``
``item/reasoning/delta``                  ``thinking {text}``
``item/toolCall/delta``                   (arguments accumulated for ``tool_call``)
first of: an approval for the call,       ``tool_call {id, name, summary, args?}``
its output streaming, its completion
``item/completed`` (tool_call)            ``tool_result {id, name, ok, output}`` and, for a
                                          successful ``write_file``, ``file_changed {path,
                                          sigil, added, removed}``
``item/completed`` (compaction)           ``compacted`` (the history was replaced by a summary)
``turn/steered``                          ``interjection {status: joined, count: 1}``
``turn/completed`` (completed)            ``file_changes {changes}`` (if any), ``message_end
                                          {turnIndex, toolCalls, inputTokens, outputTokens,
                                          cachedInputTokens, cumulativeCacheReadTokens}``
``turn/completed`` (interrupted)          ``file_changes`` (if any), ``cancelled``
``turn/error`` (failed)                   ``file_changes`` (if any), ``error {text}``
========================================  =================================================

A compaction turn (``/compact``, announced with :meth:`ChatTranslator.expect_compaction`) has no
``turn_start``; it ends like a turn (``message_end`` with ``toolCalls: []``, ``error`` or
``cancelled``) and counts as a turn of the chat (``turnIndex`` advances, as a resume counts it).

Sigils follow the fuseraft client: ``A`` added (created), ``M`` modified.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from roost._json import JSONDecodeError, dumps, loads

__all__ = ["ChatTranslator", "TOOL_OUTPUT_CHARS", "tool_summary", "replay_event", "assistant_replies"]

#: ``tool_result.output`` is capped at this many characters (wire-protocol.md, "Turn events").
TOOL_OUTPUT_CHARS = 100_000
#: Longest ``tool_call.summary``, in characters.
_SUMMARY_CHARS = 120
#: Notifications that end a turn.
_TERMINAL = ("turn/completed", "turn/error")


def plan_events(metadata: dict) -> list[dict]:
    """``plan {steps}`` and ``step_status {step, total, status, stepsLeft}`` for a completed
    ``update_plan`` call's result metadata (:func:`roost.tools.plan_tool`)."""
    events: list[dict] = []
    if isinstance(metadata.get("plan"), list):
        events.append({"type": "plan", "steps": [str(s) for s in metadata["plan"]]})
    status = metadata.get("step_status")
    if isinstance(status, dict):
        events.append(
            {
                "type": "step_status",
                "step": status.get("step"),
                "total": status.get("total"),
                "status": status.get("status"),
                "stepsLeft": status.get("steps_left"),
            }
        )
    return events


def tool_summary(name: str, args: Any) -> str:
    """A one-line human summary of a tool call: ``shell: ls -la``, ``write_file: src/a.py``.

    Args:
        name: the tool name.
        args: the decoded arguments (a dict), or anything else (ignored).

    Returns:
        At most 120 characters, never containing a newline.
    """
    detail = ""
    if isinstance(args, dict):
        for key in ("command", "path", "question", "name", "pattern", "prompt"):
            value = args.get(key)
            if isinstance(value, str) and value:
                detail = value
                break
        else:
            if args:
                detail = dumps(args).decode("utf-8", "replace")
    text = f"{name}: {detail}" if detail else name
    text = " ".join(text.split())
    return text if len(text) <= _SUMMARY_CHARS else text[: _SUMMARY_CHARS - 1] + "…"


def _turn_summary(turn: dict) -> tuple[dict, bool]:
    """One turn of a snapshot as ``({user, assistant, toolCalls}, compacted)``.

    ``user`` is the turn's first user message text (Roost's own synthetic messages skipped),
    ``assistant`` its agent messages joined by blank lines, ``toolCalls`` the names of its tool calls
    in order; ``compacted`` is True when the turn holds a compaction item.
    """
    user, assistant, calls = None, [], []
    compacted = False
    for item in turn.get("items") or []:
        kind = item.get("type")
        if kind == "user_message" and user is None and not str(item.get("source_id") or "").startswith("roost:"):
            user = item.get("text") or ""
        elif kind == "agent_message" and item.get("text"):
            assistant.append(item["text"])
        elif kind == "tool_call":
            calls.append(item.get("name"))
        elif kind == "compaction":
            compacted = True
    return {"user": user or "", "assistant": "\n\n".join(assistant), "toolCalls": calls}, compacted


def replay_event(snapshot: dict, *, limit: int = 100) -> dict:
    """The ``replay`` event of a resumed chat from a ThreadActor snapshot.

    Args:
        snapshot: the reply to :class:`roost.actors._messages.Snapshot` (``turns`` with ``items``).
        limit: at most this many of the latest turns are re-sent; ``total`` counts all of them.

    Returns:
        ``{"type": "replay", "total", "compacted", "turns": [{user, assistant, toolCalls}]}``:
        ``user`` is the turn's first user message text, ``assistant`` its agent messages joined by
        blank lines, ``toolCalls`` the names of its tool calls in order.
    """
    turns = snapshot.get("turns") or []
    out = []
    compacted = False
    for turn in turns[-limit:] if limit else []:
        summary, turn_compacted = _turn_summary(turn)
        compacted = compacted or turn_compacted
        out.append(summary)
    return {"type": "replay", "total": len(turns), "compacted": compacted, "turns": out}


def assistant_replies(snapshot: dict) -> list[str]:
    """The chat's assistant replies, oldest first, for ``/copy``.

    Args:
        snapshot: the reply to :class:`roost.actors._messages.Snapshot` (``turns`` with ``items``).

    Returns:
        One string per turn that has agent text: its agent messages joined by blank lines (as
        ``replay`` shows them). Turns without any agent text (e.g. interrupted before the model
        spoke) are left out.
    """
    replies = []
    for turn in snapshot.get("turns") or []:
        text = _turn_summary(turn)[0]["assistant"]
        if text:
            replies.append(text)
    return replies


class ChatTranslator:
    """Turns one chat thread's notifications into stdio chat events (see the module docstring).

    Args:
        cwd: the chat's working directory (``file_changed`` paths are shown relative to it).
        turn_index: the index the next turn gets (0 for a new chat, the number of turns so far
            for a resumed one); it advances when a turn ends (also interrupted or failed).

    Attributes:
        busy: True from :meth:`expect_turn` (or ``turn/started``) until the turn's terminal event.
        held: input ids the last turn left as held work (mid-turn messages it never admitted).
        input_tokens, output_tokens, cached_tokens: the session's cumulative usage, in tokens.
        last_input_tokens: input tokens of the latest turn (for the status line's context use).
    """

    def __init__(self, *, cwd: Path, turn_index: int = 0) -> None:
        self.cwd = cwd
        self.turn_index = turn_index
        self.busy = False
        self.carried_text = ""
        self.held: list[dict] = []
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached_tokens = 0
        self.last_input_tokens = 0
        self._tool_names: list[str] = []
        self._changes: dict[str, str] = {}
        self._calls: dict[str | None, dict] = {}  # item id -> {name, args_json, announced}
        self._turn_id: str | None = None
        self._compacting = False  # the current (or expected) turn is a compaction

    @property
    def turn_id(self) -> str | None:
        """The id of the turn being translated (from its ``turn/started``), or None between turns."""
        return self._turn_id

    # -- state the session drives ---------------------------------------------------------------

    def expect_turn(self, carried_text: str = "") -> None:
        """A turn is being started: mark busy; its ``turn_start`` will carry ``carried_text``."""
        self.busy = True
        self.carried_text = carried_text

    def expect_compaction(self) -> None:
        """A compaction turn is being started (``/compact``): mark busy; it gets no ``turn_start``."""
        self.expect_turn()
        self._compacting = True

    def abandon_turn(self) -> None:
        """The turn could not start (admission failed): not busy any more."""
        self.busy = False
        self.carried_text = ""
        self._compacting = False

    # -- translation ----------------------------------------------------------------------------

    def translate(self, method: str, params: dict) -> list[dict]:
        """Return the stdio events for one notification (often none).

        Args:
            method: the notification method (``item/agentMessage/delta``...).
            params: its params.
        """
        if method == "item/agentMessage/delta":
            return [{"type": "token", "text": params.get("delta") or ""}]
        if method == "item/reasoning/delta":
            return [{"type": "thinking", "text": params.get("delta") or ""}]
        if method == "item/toolCall/delta":
            call = self._calls.get(params.get("item_id"))
            if call is not None:
                call["args_json"] += params.get("delta") or ""
            return []
        if method == "item/toolCall/outputDelta":
            return self.announce_tool_call(params.get("item_id"))
        if method == "item/started":
            item = params.get("item") or {}
            if item.get("type") == "tool_call":
                self._calls[item["id"]] = {
                    "name": item.get("name") or "tool",
                    "args_json": "",
                    "announced": False,
                    "args": item.get("arguments"),
                }
            return []
        if method == "item/completed":
            item = params.get("item") or {}
            if item.get("type") == "tool_call":
                return self._tool_completed(item)
            if item.get("type") == "compaction" and item.get("status") == "completed":
                return [{"type": "compacted"}]
            return []
        if method == "turn/started":
            return self._turn_started(params)
        if method == "turn/steered":
            if params.get("state") == "pending":  # accepted, not yet in the turn
                return []
            return [{"type": "interjection", "status": "joined", "count": 1}]
        if method == "turn/held":
            entry = params.get("input") or {}
            if self.busy and entry.get("id"):
                self.held.append(entry)
            return []
        if method == "turn/usage":
            return []
        if method == "turn/event" and (params.get("event") or {}).get("type") == "retrying":
            event = params["event"]  # wire-protocol.md: retrying {attempt, max}
            return [{"type": "retrying", "attempt": event.get("attempt"), "max": event.get("max_attempts")}]
        if method in _TERMINAL:
            return self._turn_ended(params.get("turn") or {})
        return []

    def announce_tool_call(self, item_id: Any) -> list[dict]:
        """The ``tool_call`` event of call ``item_id`` if it was not sent yet (else nothing)."""
        call = self._calls.get(item_id) if isinstance(item_id, str) else None
        if call is None or call["announced"]:
            return []
        call["announced"] = True
        args = call.get("args")
        if args is None and call["args_json"]:
            try:
                args = loads(call["args_json"])
            except (JSONDecodeError, ValueError):
                args = None
        self._tool_names.append(call["name"])
        event: dict[str, Any] = {
            "type": "tool_call",
            "id": item_id,
            "name": call["name"],
            "summary": tool_summary(call["name"], args),
        }
        if isinstance(args, dict) and args:
            event["args"] = args
        return [event]

    def announce_running(self) -> list[dict]:
        """The ``tool_call`` of the call running now, if not sent yet (the turn's tools run in
        order, so it is the first call without a result). Used when a running call shows signs
        of life another way (e.g. the subagent it spawned starts working)."""
        for item_id, call in self._calls.items():
            if not call.get("done"):
                return self.announce_tool_call(item_id)
        return []

    def _turn_started(self, params: dict) -> list[dict]:
        turn = params.get("turn") or {}
        self._turn_id = turn.get("id")
        self.busy = True
        self.held = []
        self._tool_names = []
        self._changes = {}
        self._calls = {}
        text, self.carried_text = self.carried_text, ""
        return [] if self._compacting else [{"type": "turn_start", "text": text}]

    def _tool_completed(self, item: dict) -> list[dict]:
        item_id = item.get("id")
        if item_id not in self._calls:
            self._calls[item_id] = {
                "name": item.get("name") or "tool",
                "args_json": "",
                "announced": False,
                "args": item.get("arguments"),
            }
        call = self._calls[item_id]
        call["done"] = True
        if call.get("args") is None:
            call["args"] = item.get("arguments")
        events = self.announce_tool_call(item_id)
        output = str(item.get("output") or "")
        ok = not item.get("is_error")
        events.append(
            {"type": "tool_result", "id": item_id, "name": call["name"], "ok": ok, "output": output[:TOOL_OUTPUT_CHARS]}
        )
        metadata = item.get("metadata") or {}
        if ok and call["name"] == "update_plan":
            events.extend(plan_events(metadata))
        if ok and call["name"] == "write_file" and isinstance(metadata.get("path"), str):
            path = self._display(metadata["path"])
            sigil = "A" if metadata.get("created") else "M"
            if self._changes.get(path) == "A":
                sigil = "A"  # created earlier in this turn: still an addition
            self._changes[path] = sigil
            events.append(
                {
                    "type": "file_changed",
                    "path": path,
                    "sigil": sigil,
                    "added": int(metadata.get("added") or 0),
                    "removed": int(metadata.get("removed") or 0),
                }
            )
        return events

    def _display(self, path: str) -> str:
        try:
            return str(Path(path).relative_to(self.cwd))
        except ValueError:
            return path

    def _turn_ended(self, turn: dict) -> list[dict]:
        if self._turn_id is not None and turn.get("id") not in (None, self._turn_id):
            return []  # not this chat's current turn
        events: list[dict] = []
        # Calls that never ran (interrupted before their result): announce them anyway.
        for item_id in list(self._calls):
            events.extend(self.announce_tool_call(item_id))
        if self._changes:
            events.append(
                {"type": "file_changes", "changes": [{"sigil": s, "path": p} for p, s in self._changes.items()]}
            )
        usage = turn.get("usage") or {}
        inp, out, cached = (int(usage.get(k) or 0) for k in ("input_tokens", "output_tokens", "cached_tokens"))
        self.input_tokens += inp
        self.output_tokens += out
        self.cached_tokens += cached
        status = turn.get("status")
        if self._compacting and status == "completed":
            # The next request holds about the summary instead of the whole history.
            self.last_input_tokens = out
        elif inp:
            self.last_input_tokens = inp
        if status == "completed":
            events.append(
                {
                    "type": "message_end",
                    "turnIndex": self.turn_index,
                    "toolCalls": list(self._tool_names),
                    "inputTokens": inp or None,
                    "outputTokens": out or None,
                    "cachedInputTokens": cached,
                    "cumulativeCacheReadTokens": self.cached_tokens,
                }
            )
        elif status == "failed":
            error = turn.get("error") or {}
            category = error.get("category") or "error"
            events.append({"type": "error", "text": f"{category}: {error.get('message') or 'the turn failed'}"})
        else:
            events.append({"type": "cancelled"})
        self.turn_index += 1  # every admitted turn is a turn of the thread (as a resume counts them)
        self.busy = False
        self._compacting = False
        self._turn_id = None
        self._calls = {}
        return events
