"""``roost repl --vscode``: one chat per process over stdio (wire-protocol.md, "Live sessions").

The chat is a Roost thread of kind ``chat``; ``--resume ID`` continues one. The process speaks the
stdio chat dialect: JSONL events on stdout (``ready`` first, ``session_end`` last), JSONL input on
stdin (``user_input``, ``approval_response``, ``question_response``, ``interrupt``).

Data flow: the ThreadActor's hub delivers app-server-shaped notification lines to
:class:`ReplSession` (a hub subscriber); :class:`~roost.protocol._repl_events.ChatTranslator`
turns them into stdio events, which go through the bounded :class:`~roost.protocol._outbox.Outbox`
to stdout. Prompts (approvals, questions) go through the same outbox, so every event keeps the
order in which it happened.

Behaviour:

* ``user_input`` while idle starts a turn (text, optional images ``{name, data}`` with ``data`` a
  base64 ``data:`` URL). While a reply streams it is steered into the running turn
  (``interjection {status: joined}`` once the model sees it); if the turn ends first, it starts
  the next turn (``interjection {status: carried}``, and that turn's ``turn_start.text`` is it).
* A slash command: ``/help``, ``/status``, ``/title <text>``, ``/copy [N]``, ``/compact
  [instructions]``, ``/exit`` (``/quit``).
  Mid-turn commands (``ready.midTurnCommands``) answer with ``applied``; while idle a command ends
  with ``message_end`` (``toolCalls: []``, ``turnIndex`` the chat's last turn, -1 before the first)
  so the client re-enables its input, like fuseraft.
  ``/copy`` sends ``copy {text}``: the last assistant reply (``/copy N``: the Nth-last).
* ``/compact [instructions]`` (not mid-turn): the model summarises the chat and the summary
  replaces the history it sees (a compaction turn, :mod:`roost.actors._compact`; the transcript
  keeps every message). While it runs the chat is busy (``interrupt`` cancels it, input is
  steered and starts the next turn afterwards); it ends with ``compacted`` then ``message_end``
  (``toolCalls: []``), or ``error`` (nothing to compact, the model call failed) / ``cancelled``.
* ``!command`` (the user's own action, so no approval): ``/bin/sh -c command`` in the chat's
  directory, sent as ``shell_start {command}``, ``shell_output {text}`` chunks (stdout and stderr
  merged, at most 100,000 characters, then a truncation notice) and ``shell_end {exitCode,
  truncated, interrupted}``, then ``message_end``. Refused (``error``) while a reply streams; while
  it runs, other input is refused except ``/exit``.
* ``interrupt`` (or SIGINT) cancels the running turn only: the turn ends ``cancelled`` and the
  process lives on. A running ``!command`` is stopped instead (its whole process group): it ends
  with ``shell_end`` and ``cancelled``. With nothing running it answers ``cancelled`` at once.
* End of input (or ``/exit``): a running turn is interrupted and persisted (bounded wait), a
  running ``!command`` is stopped, then ``session_end`` is sent and the process exits 0.
* A line that is not JSON, not an object, or of an unknown type gets an ``error`` event; the chat
  goes on.
* Subagents: a worker's tool calls are sent as ``tool_call`` with ``agent`` (its name); they are
  not counted in the chat's ``message_end.toolCalls``. Their approvals come to this client too.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import trio

from roost._json import dumps_line, loads
from roost.errors import RoostError
from roost.protocol._framing import FrameError
from roost.protocol._outbox import Outbox
from roost.protocol._repl_events import ChatTranslator, assistant_replies
from roost.protocol._repl_prompts import PromptBroker
from roost.protocol._repl_shell import ShellEscape
from roost.protocol._repl_switch import fork_chat, switch_chat
from roost.protocol._repl_taps import WorkerTaps

__all__ = ["ReplSession", "PROTOCOL_VERSION", "MID_TURN_COMMANDS"]

log = logging.getLogger("roost.repl")

#: wire-protocol.md, "Versioning".
PROTOCOL_VERSION = 1
#: Slash commands that may be sent while a reply is still streaming.
MID_TURN_COMMANDS = ("/help", "/status", "/title")
#: Seconds a running turn may take to persist after end of input or ``/exit``.
_SHUTDOWN_GRACE = 15.0
#: Default context window in tokens for ``status.context`` (``ROOST_CONTEXT_WINDOW`` overrides).
_CONTEXT_WINDOW = 128_000
_DATA_URL = re.compile(r"^data:(image/[A-Za-z0-9.+-]+);base64,(.*)$", re.DOTALL)
_HELP = """**Commands**

- `/status`: status-line numbers (model, turn, context use, tokens)
- `/title <text>`: name this chat
- `/copy [N]`: copy the last (or the Nth-last) assistant reply
- `/compact [instructions]`: replace the conversation the model sees with a summary of it
- `/switch <id>`: continue another chat (its earlier turns are replayed)
- `/fork [switch]`: copy this chat into a new one (and continue in the copy with `switch`)
- `!<command>`: run a shell command in the chat's directory (no approval; `interrupt` stops it)
- `/exit`: end the chat

Mid-turn: `/help`, `/status`, `/title`. Interrupt a reply with `interrupt` (or SIGINT)."""


def decode_images(images: Any) -> tuple:
    """Wire images ``[{name, data: "data:image/...;base64,..."}]`` -> Roost image dicts.

    Returns:
        ``({"media_type", "data", "original"?}, ...)`` validated like the app-server's images.

    Raises:
        InvalidParams: not a list, a missing or non-``data:`` URL, bad base64, too large.
    """
    from roost.errors import InvalidParams
    from roost.protocol._as_turns import check_images

    if images is None:
        return ()
    if not isinstance(images, list):
        raise InvalidParams("images must be a list of {name, data}")
    out = []
    for index, image in enumerate(images):
        data = image.get("data") if isinstance(image, dict) else None
        match = _DATA_URL.match(data) if isinstance(data, str) else None
        if match is None:
            raise InvalidParams(f"images[{index}].data must be a base64 data URL (data:image/...;base64,...)")
        entry = {"media_type": match.group(1), "data": "".join(match.group(2).split())}
        if isinstance(image.get("name"), str):
            entry["original"] = image["name"]
        out.append(entry)
    return check_images(out)


class ReplSession:
    """One stdio chat: the hub subscriber, the input dispatcher and the prompt broker's owner.

    Args:
        actor: the chat's ThreadActor (subscribed by :func:`serve_repl`).
        outbox: where every event line goes (bounded; drained by the writer task).
        broker: the prompt broker (approvals, questions).
        model: the model name shown in ``ready`` and ``status``.
        questions: whether ``ask_user`` is offered.
        turn_index: the number of turns the chat already has.
        engines: the :class:`~roost.protocol._engines.EngineCatalog` (whether the chat's model
            takes images); None: every model is taken to.
    """

    def __init__(
        self,
        actor: Any,
        outbox: Outbox,
        broker: PromptBroker,
        *,
        model: str,
        questions: bool,
        turn_index: int = 0,
        registry: Any = None,
        engines: Any = None,
    ) -> None:
        from roost.actors import Origin

        self.actor = actor
        self.outbox = outbox
        self.broker = broker
        self.model = model
        self.questions = questions
        self.translator = ChatTranslator(cwd=actor.facts().cwd, turn_index=turn_index)
        # ask_user asks through the origin, with the call's id: its tool_call goes out first
        self.origin = Origin(
            client_id="repl", request_approval=broker.request_approval, ask_question=broker.ask if questions else None
        )
        self.nursery: trio.Nursery | None = None
        self.exit_requested = False
        self.first_prompt: str | None = None
        self.registry = registry
        self.engines = engines
        self.taps = WorkerTaps(self)  # the subagents this chat follows
        self._shell: ShellEscape | None = None  # the running ``!command``, if any

    # -- output ---------------------------------------------------------------------------------

    def emit(self, event: dict) -> None:
        """Queue one event line (never blocks; once the bounded outbox is full, lines are dropped
        and a slow-consumer warning is logged)."""
        self.outbox.deliver(dumps_line(event))

    def deliver(self, line: bytes) -> None:
        """Hub subscriber: translate one notification line and queue its events."""
        message = loads(line)
        method = message.get("method") or ""
        params = message.get("params") or {}
        if method == "item/completed" and self.first_prompt is None:
            item = params.get("item") or {}
            if item.get("type") == "user_message" and not str(item.get("source_id") or "").startswith("roost:"):
                self.first_prompt = item.get("text") or ""
        if method == "agent/updated":
            self.taps.follow(params.get("agent") or {})
        terminal = method in ("turn/completed", "turn/error")
        was_busy = self.translator.busy
        for event in self.translator.translate(method, params):
            self.emit(event)
        if terminal and was_busy and not self.translator.busy:
            status = self.status_event()
            self.emit(status)
            if status["level"] != "ok":  # the user should know before the context runs out
                self.emit({"type": "warning", "text": f"The context is {round(status['context'] * 100)}% full."})
            self._after_turn(params.get("turn") or {})

    def announce_tool_call(self, item_id: Any) -> None:
        """Send the pending ``tool_call`` of ``item_id`` (before its ``approval_request``)."""
        for event in self.translator.announce_tool_call(item_id):
            self.emit(event)
        self.taps.announce(item_id)

    def untap_workers(self) -> None:
        """Stop following subagents (the chat is ending)."""
        self.taps.clear()

    def status_event(self) -> dict:
        """The ``status`` event: model, turn, context use (0-1), level, modes, token totals."""
        t = self.translator
        try:
            window = int(os.environ.get("ROOST_CONTEXT_WINDOW") or _CONTEXT_WINDOW)
        except ValueError:
            window = _CONTEXT_WINDOW
        context = min(1.0, t.last_input_tokens / window) if window > 0 else 0.0
        level = "ok" if context < 0.75 else "warning" if context < 0.9 else "critical"
        modes = [self.actor.facts().thread.permission_mode or "standard"] + (["questions"] if self.questions else [])
        return {
            "type": "status",
            "model": self.model,
            "turn": t.turn_index,
            "context": round(context, 4),
            "level": level,
            "modes": modes,
            "input": t.input_tokens,
            "output": t.output_tokens,
            "cached": t.cached_tokens,
        }

    def title_event(self) -> dict:
        thread = self.actor.facts().thread
        return {
            "type": "title",
            "sessionId": thread.id,
            "title": thread.title,
            "autoTitle": (thread.metadata or {}).get("auto_title"),
        }

    def ready_event(self) -> dict:
        thread = self.actor.facts().thread
        return {
            "type": "ready",
            "protocolVersion": PROTOCOL_VERSION,
            "sessionId": thread.id,
            "model": self.model,
            "title": thread.title,
            "autoTitle": (thread.metadata or {}).get("auto_title"),
            "midTurnCommands": list(MID_TURN_COMMANDS),
        }

    def _after_turn(self, turn: dict) -> None:
        """After a turn's terminal events: carry unadmitted mid-turn input; name the chat."""
        held, self.translator.held = self.translator.held, []
        if self.nursery is None:
            return
        if held and not self.exit_requested:
            # Busy from now on, so input read meanwhile joins the carried turn instead of racing it.
            self.translator.expect_turn(carried_text="\n\n".join(str(h.get("prompt") or "") for h in held))
            self.nursery.start_soon(self._carry, held)
        elif (
            turn.get("status") == "completed"
            and self.first_prompt
            and not (self.actor.facts().thread.metadata or {}).get("auto_title")
        ):
            self.nursery.start_soon(self._auto_title, self.first_prompt)

    async def _carry(self, held: list[dict]) -> None:
        """Start the next turn with the messages the last turn never admitted."""
        from roost.actors import SteerInput

        self.emit({"type": "interjection", "status": "carried", "count": len(held)})
        try:
            first = await self.actor.ref.ask(SteerInput(input_id=held[0]["id"], origin=self.origin))
            turn_id = (first.get("turn") or {}).get("id")
            for entry in held[1:]:
                await self.actor.ref.ask(SteerInput(input_id=entry["id"], expected_turn_id=turn_id, origin=self.origin))
        except RoostError as exc:
            if not self.translator.turn_id:
                self.translator.abandon_turn()
            self.emit({"type": "error", "text": f"could not carry the message over: {exc}"})

    async def _auto_title(self, prompt: str) -> None:
        from roost.actors import UpdateThread

        first = (prompt.strip().splitlines() or [""])[0]
        auto = first if len(first) <= 60 else first[:59] + "…"
        metadata = dict(self.actor.facts().thread.metadata or {}, auto_title=auto)
        try:
            await self.actor.ref.ask(UpdateThread(changes={"metadata": metadata}))
        except RoostError as exc:
            log.warning("could not store the chat's auto title: %s", exc)
            return
        self.emit(self.title_event())

    # -- input ----------------------------------------------------------------------------------

    def interrupt(self, reason: str = "interrupted") -> None:
        """Stop a running ``!command``, else cancel the running turn; with neither, answer
        ``cancelled`` at once."""
        from roost.actors import InterruptTurn

        if self._shell is not None:
            self._shell.stop()  # its task sends shell_end, then cancelled
            return
        if not self.translator.busy:
            self.emit({"type": "cancelled"})
            return
        try:
            self.actor.ref.tell(InterruptTurn(reason=reason))
        except RoostError as exc:
            self.emit({"type": "error", "text": f"could not interrupt: {exc}"})

    async def handle(self, frame: Any) -> None:
        """Dispatch one decoded input line (or a :class:`FrameError`)."""
        if isinstance(frame, FrameError):
            self.emit(
                {
                    "type": "error",
                    "text": f"invalid input line ({frame.message}); expected one JSON object",
                    "code": frame.code,  # additive, as on the serve socket: parse_error
                }
            )
            return
        if not isinstance(frame, dict):
            self.emit(
                {"type": "error", "text": "an input line must be a JSON object with a type", "code": "invalid_request"}
            )
            return
        kind = frame.get("type")
        await self._recover_actor()
        if kind == "user_input":
            await self._user_input(frame)
        elif kind == "interrupt":
            self.interrupt()
        elif kind in ("approval_response", "question_response"):
            if not self.broker.answer(frame):
                what = "approval_request" if kind == "approval_response" else "question"
                self.emit({"type": "error", "text": f"{kind} ignored: no {what} is pending"})
        elif "type" not in frame:  # as on the serve socket: name the missing field, not a type None
            self.emit({"type": "error", "text": 'the input object has no "type" field', "code": "invalid_request"})
        else:
            self.emit({"type": "error", "text": f"unknown input type {kind!r}", "code": "invalid_request"})

    async def _recover_actor(self) -> None:
        """After a crash of the chat's thread actor, go on with its restarted successor.

        Issue 18, finding 4: the crash ends the work it interrupted (an ``error`` event; a turn
        in progress is over), and the chat keeps working. The thread supervisor restarts the actor
        (transient child); :meth:`ThreadRegistry.get` returns that one, or loads the thread anew,
        and subscriptions live in the registry, so events keep coming.
        """
        actor = self.actor
        if not actor.facts().stopped or self.registry is None:
            return
        try:
            fresh = await self.registry.get(actor.thread_id)
        except RoostError as exc:
            log.warning("the chat's thread could not be reloaded after a crash: %s", exc)
            return
        if fresh is actor:
            return
        self.actor = fresh
        if self.translator.busy:
            self.translator.abandon_turn()
        log.warning("the chat's thread actor stopped unexpectedly; going on with a fresh one")
        self.emit(
            {
                "type": "error",
                "text": "the chat's runtime part stopped unexpectedly and was restarted; "
                "the turn in progress (if any) ended",
            }
        )

    async def _user_input(self, frame: dict) -> None:
        from roost.errors import InvalidParams

        text = frame.get("text")
        if text is not None and not isinstance(text, str):
            self.emit({"type": "error", "text": "user_input.text must be a string"})
            return
        text = text or ""
        try:
            images = decode_images(frame.get("images"))
        except InvalidParams as exc:
            self.emit({"type": "error", "text": str(exc)})
            return
        refusal = self.engines.image_refusal(self.actor.facts().thread) if images and self.engines is not None else None
        if refusal is not None:
            self.emit({"type": "error", "text": refusal})
            return
        line = text.strip()
        if self._shell is not None and line.split(" ")[0].lower() not in ("/exit", "/quit"):
            self.emit({"type": "error", "text": "a shell command (!) is running; send interrupt to stop it"})
            return
        if line.startswith("!") and not images:
            self._shell_escape(line[1:].strip())
            return
        if line.startswith("/") and not images:
            await self._command(line)
            return
        if not text.strip() and not images:
            self.emit({"type": "error", "text": "user_input needs text (or images)"})
            return
        if self.translator.busy:
            await self._steer(text, images)
        else:
            await self._start(text, images)

    async def _start(self, text: str, images: tuple) -> None:
        from roost.actors import StartTurn

        self.translator.expect_turn()
        try:
            await self.actor.ref.ask(StartTurn(prompt=text or None, images=images, origin=self.origin))
        except RoostError as exc:
            if self.translator.turn_id is None:
                self.translator.abandon_turn()
            self.emit({"type": "error", "text": f"{type(exc).__name__}: {exc}"})

    async def _steer(self, text: str, images: tuple) -> None:
        from roost.actors import SteerInput

        try:
            reply = await self.actor.ref.ask(SteerInput(prompt=text, images=images, origin=self.origin))
        except RoostError as exc:
            self.emit({"type": "error", "text": f"{type(exc).__name__}: {exc}"})
            return
        if reply.get("delivery") == "queued":  # the turn had just ended: this started a new one
            self.translator.busy = True

    def _shell_escape(self, command: str) -> None:
        """``!command``: run ``command`` in the background as a :class:`ShellEscape`.

        Refused with an ``error`` event while a reply streams or without a command. When it ends,
        ``message_end`` follows its ``shell_end`` (``cancelled`` when it was interrupted).
        """
        if self.translator.busy:
            self.emit(
                {
                    "type": "error",
                    "text": "!commands cannot be used while a reply is streaming; "
                    f"mid-turn commands: {', '.join(MID_TURN_COMMANDS)}",
                }
            )
            return
        if not command:
            self.emit({"type": "error", "text": "usage: !<shell command>"})
            return
        if self.nursery is None:
            self.emit({"type": "error", "text": "the chat is not accepting commands"})
            return
        self._shell = ShellEscape(command, cwd=self.actor.facts().cwd, emit=self.emit)
        self.nursery.start_soon(self._run_shell, self._shell)

    async def _run_shell(self, escape: ShellEscape) -> None:
        """Run ``escape``; then end it like a command: ``message_end`` (``cancelled`` if stopped)."""
        try:
            ran = await escape.run()
        finally:
            self._shell = None
        if ran and not self.exit_requested:
            self.emit({"type": "cancelled"} if escape.interrupted else self._command_end())

    async def _reply_to_copy(self, arg: str) -> str | None:
        """The text ``/copy [N]`` copies: the Nth-last assistant reply (default the last).

        Returns:
            The reply's text, or None after sending an ``error`` event (a bad N, too few replies,
            the snapshot failed).
        """
        from roost.actors import Snapshot

        if arg and not (arg.isdecimal() and int(arg) >= 1):
            self.emit({"type": "error", "text": "usage: /copy [N] (N >= 1: the Nth-last reply)"})
            return None
        nth = int(arg) if arg else 1
        try:
            replies = assistant_replies(await self.actor.ref.ask(Snapshot()))
        except RoostError as exc:
            self.emit({"type": "error", "text": f"could not read the chat: {exc}"})
            return None
        if len(replies) < nth:
            have = f"only {len(replies)} repl{'y' if len(replies) == 1 else 'ies'}" if replies else "no reply yet"
            self.emit({"type": "error", "text": f"nothing to copy: the chat has {have}"})
            return None
        return replies[-nth]

    async def _compact(self, instructions: str) -> None:
        """``/compact [instructions]``: start a compaction turn (the chat is busy until it ends).

        Its events come through the translator: ``compacted`` and ``message_end`` when it
        completes, ``error`` when it fails, ``cancelled`` when interrupted. Refused at once
        (``error``) when there is nothing to compact or the thread is busy.
        """
        from roost.actors import Compact

        self.translator.expect_compaction()
        try:
            await self.actor.ref.ask(Compact(instructions=instructions or None, origin=self.origin))
        except RoostError as exc:
            if self.translator.turn_id is None:
                self.translator.abandon_turn()
            self.emit({"type": "error", "text": f"could not compact: {exc}"})

    async def _command(self, line: str) -> None:
        from roost.actors import UpdateThread

        command, _, arg = line.partition(" ")
        command, arg = command.lower(), arg.strip()
        mid_turn = self.translator.busy
        if mid_turn and command not in MID_TURN_COMMANDS and command not in ("/exit", "/quit"):
            self.emit(
                {
                    "type": "error",
                    "text": f"{command} cannot be used while a reply is streaming; "
                    f"mid-turn commands: {', '.join(MID_TURN_COMMANDS)}",
                }
            )
            return
        message = ""
        if command in ("/exit", "/quit"):
            self.exit_requested = True
            return
        if command == "/help":
            self.emit({"type": "text", "text": _HELP})
            message = "help shown"
        elif command == "/status":
            self.emit(self.status_event())
            message = "status sent"
        elif command == "/title":
            if not arg:
                self.emit({"type": "error", "text": "usage: /title <text>"})
                return
            try:
                await self.actor.ref.ask(UpdateThread(changes={"title": arg}))
            except RoostError as exc:
                self.emit({"type": "error", "text": f"could not set the title: {exc}"})
                return
            self.emit(self.title_event())
            message = f"title set to {arg!r}"
            self.emit({"type": "info", "text": f"Title set to {arg!r}."})
        elif command == "/compact":
            await self._compact(arg)
            return  # compacted and message_end follow from the compaction turn's events
        elif command == "/switch":
            if not await switch_chat(self, arg):
                return
            message = f"switched to {arg}"
        elif command == "/fork":
            forked = await fork_chat(self, arg)
            if forked is None:
                return
            message = f"forked as {forked}"
        elif command == "/copy":
            text = await self._reply_to_copy(arg)
            if text is None:
                return
            self.emit({"type": "copy", "text": text})
            message = "reply copied"
        else:
            self.emit({"type": "error", "text": f"unknown command {command}; try /help"})
            return
        if mid_turn:
            self.emit({"type": "applied", "command": command, "message": message})
        else:
            self.emit(self._command_end())

    def _command_end(self) -> dict:
        """The ``message_end`` that ends an idle command or ``!command``: no turn ran, so its
        ``turnIndex`` is the chat's last turn (-1 before the first), never the next turn's."""
        return {"type": "message_end", "turnIndex": self.translator.turn_index - 1, "toolCalls": []}

    async def shutdown(self) -> None:
        """Stop a running ``!command``; interrupt a running turn (reason ``shutdown``) and wait,
        bounded, for each to end (the turn to persist)."""
        from roost.actors import InterruptTurn

        self.exit_requested = True
        shell = self._shell
        if shell is not None:
            shell.stop()
            with trio.move_on_after(_SHUTDOWN_GRACE):
                await shell.done.wait()
        if self.translator.busy or self.actor.facts().running:
            try:
                self.actor.ref.tell(InterruptTurn(reason="shutdown"))
            except RoostError:
                log.debug("could not interrupt the turn at shutdown", exc_info=True)
            with trio.move_on_after(_SHUTDOWN_GRACE):
                await self.actor.wait_idle()
        self.broker.close()
