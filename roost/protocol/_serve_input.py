"""Input lines of the serve socket and ``/attach`` (wire-protocol.md "Input"; docs/wire.md,
"Input lines (client to Roost)"): a plain text line is a task; a JSON object line is an input
message (``user_input``, ``approval_response``, ``question_response``, ``interrupt``, ``status``).
Errors are ``error`` events with a code; nothing malformed becomes a task.
"""

from __future__ import annotations

from typing import Any

from roost._faults import fault_point
from roost._json import JSONDecodeError, loads
from roost.actors import ConnectionActor
from roost.errors import RoostError, ServerOverloaded
from roost.protocol._errors import to_protocol_error
from roost.protocol._framing import FrameError
from roost.protocol._serve_prompts import answer_value

__all__ = ["handle_line", "error_event"]


async def handle_line(daemon: Any, conn: ConnectionActor, line: str | FrameError) -> None:
    """Handle one input line: plain text is a task; a line starting with ``{`` or ``[`` must be
    a JSON object input message, and is not queued otherwise: one that does not parse gets a
    ``parse_error`` error, valid JSON that is not an object an ``invalid_request`` error (the
    app-server's codes for the same lines). An oversized or undecodable line (a
    :class:`FrameError` of the framing) gets a ``parse_error`` error and never becomes input."""
    fault_point("connection")
    if isinstance(line, FrameError):
        conn.send(error_event(line.message, line.code))
        return
    text = line.strip()
    if not text:
        return
    if not text.startswith(("{", "[")):  # a plain text line is a task
        await _dispatch(daemon, conn, text)
        return
    try:
        message = loads(text)
    except (JSONDecodeError, ValueError) as exc:  # the app-server's code for it (docs/app-server.md)
        conn.send(
            error_event(
                f"invalid JSON line ({exc}): the line starts like JSON but does not parse; send a JSON "
                "input message or plain text (not starting with '{' or '[')",
                "parse_error",
            )
        )
        return
    if not isinstance(message, dict):
        conn.send(
            error_event(
                "the line is JSON but not a JSON object; send a JSON input message or plain text "
                "(not starting with '{' or '[')",
                "invalid_request",
            )
        )
        return
    kind = message.get("type")
    if kind == "user_input":
        if message.get("images"):
            conn.send(error_event("images aren't supported on the serve socket", "unsupported"))
            return
        body = message.get("text")
        if not isinstance(body, str) or not body.strip():
            conn.send(error_event("user_input needs a non-empty text", "invalid_params"))
            return
        await _dispatch(daemon, conn, body)
    elif kind in ("approval_response", "question_response"):
        _answer(conn, "approval" if kind == "approval_response" else "question", message)
    elif kind == "interrupt":
        if conn.read_only:
            conn.send(error_event("a read-only client cannot interrupt", "read_only"))
        elif not await daemon.queue.interrupt_everywhere(conn.client.key):
            conn.send(error_event("none of your tasks is running", "invalid_request"))
    elif kind == "status":  # additive (issue 17): see roost.protocol._serve_status
        from roost.protocol._serve_status import status_snapshot

        # ``countSelf: false`` (roost status): the asking connection only asks; leave it out
        conn.send(status_snapshot(daemon, asker=None if message.get("countSelf", True) is not False else conn))
    elif "type" not in message:  # {} or {"text": ...}: name the missing field, not a type None
        conn.send(error_event(f'the input object has no "type" field; {_EXPECTED}', "invalid_request"))
    else:
        conn.send(error_event(f"unknown input type {kind!r}; {_EXPECTED}", "invalid_request"))


#: The input types of the serve socket (wire-protocol.md "Input", and ``status``: issue 17).
_EXPECTED = "expected one of user_input, approval_response, question_response, interrupt, status"


async def _dispatch(daemon: Any, conn: ConnectionActor, text: str) -> None:
    if conn.read_only:
        conn.send(error_event("this client attached with a read token: it cannot dispatch tasks", "read_only"))
        return
    try:
        task_id = await daemon.queue.dispatch(text, client_id=conn.client.key, source="client")
    except ServerOverloaded as exc:
        conn.send(error_event(str(exc), exc.code))
        return
    except RoostError as exc:
        error = to_protocol_error(exc, context="serve dispatch")  # the same table as the app-server
        conn.send(error_event(f"the task could not be queued: {error.message}", error.code))
        return
    conn.send({"type": "queued", "sessionId": task_id, "position": daemon.queue.position(task_id) or 0})


def _answer(conn: ConnectionActor, kind: str, message: dict) -> None:
    client = conn.client
    pending = client.pending
    if pending is None or pending.done or pending.asked is None or pending.kind != kind:
        conn.send(error_event(f"no {kind} is pending", "invalid_request"))
        return
    pending.answer, pending.done = answer_value(kind, message), True
    client.notify()


def error_event(text: str, code: str) -> dict:
    """A daemon ``error`` event: ``{"type": "error", "text", "code"}`` (docs/wire.md)."""
    return {"type": "error", "text": text, "code": code}
