"""App-server turn methods (app-server-protocol.md, "Turns and execution runs", "Interruption")."""

from __future__ import annotations

from typing import Any

from roost.actors._messages import (
    Dequeue, InterruptTurn, QueueInput, StartTurn, SteerInput, Unsteer, UpdateQueued,
)
from roost.errors import InvalidParams
from roost.protocol._appserver import AppServerSession, method
from roost.protocol._params import ANY, BOOL, DICT, LIST, STR, check_params

_INPUT = {
    "thread_id": (STR, True), "prompt": (STR, False), "images": (LIST, False), "files": (LIST, False),
    "content_parts": (LIST, False), "client_id": (STR, False), "active_document": (DICT, False),
    "permission_mode": (STR, False),
}


def check_images(images: Any) -> tuple:
    """Validate ``images``: each ``{media_type, data (base64), original?}``."""
    out = []
    for index, image in enumerate(images or ()):
        if not isinstance(image, dict) or not isinstance(image.get("media_type"), str) \
                or not isinstance(image.get("data"), str):
            raise InvalidParams(f"images[{index}] must have string media_type and base64 data")
        if not image["media_type"].startswith("image/"):
            raise InvalidParams(f"images[{index}].media_type must be an image type")
        out.append({"media_type": image["media_type"], "data": image["data"],
                    **({"original": image["original"]} if isinstance(image.get("original"), str) else {})})
    return tuple(out)


def check_content_parts(parts: Any, prompt: str | None) -> Any:
    """Keep ``content_parts`` only if their texts concatenate to the prompt (outer whitespace trimmed).

    app-server-protocol.md, "Input Content Parts": a mismatch, or unknown or invalid parts, discard
    the presentation metadata without changing the prompt.
    """
    if not parts:
        return None
    known = {"text", "pasted_text", "file_selection", "response_selection"}
    if not all(isinstance(p, dict) and p.get("type") in known and isinstance(p.get("text"), str) for p in parts):
        return None
    joined = "".join(p["text"] for p in parts)
    if joined.strip() != (prompt or "").strip():
        return None
    return parts


async def _thread(session: AppServerSession, thread_id: str) -> Any:
    actor = await session.runtime.registry.get(thread_id)
    await session.subscribe(actor)
    return actor


def _check_permission(actor: Any, p: dict) -> None:
    mode = p.get("permission_mode")
    if mode is not None and mode != (actor.thread.permission_mode or "standard"):
        raise InvalidParams("permission_mode must match the thread's selection (change it with config/model/update)")


@method("turn/start")
async def turn_start(session: AppServerSession, params: Any) -> dict:
    p = check_params("turn/start", params, {**_INPUT, "resume_after_turn_id": (STR, False)})
    if p.get("files"):
        raise InvalidParams("files are not supported by the built-in engine yet; send text or images")
    images = check_images(p.get("images"))
    if "resume_after_turn_id" in p and (p.get("prompt") or images):
        raise InvalidParams("resume_after_turn_id continues without new input: omit prompt and attachments")
    if "resume_after_turn_id" not in p and not p.get("prompt") and not images:
        raise InvalidParams("prompt is required")
    actor = await _thread(session, p["thread_id"])
    _check_permission(actor, p)
    session.ensure_engine(actor.thread)
    ack = session.after_response()
    turn = await actor.ref.ask(StartTurn(ack=ack, 
        prompt=p.get("prompt"), images=images, client_id=p.get("client_id"),
        content_parts=check_content_parts(p.get("content_parts"), p.get("prompt")),
        resume_after_turn_id=p.get("resume_after_turn_id"), origin=session.origin(),
    ))
    return {"turn": turn}


@method("turn/interrupt")
async def turn_interrupt(session: AppServerSession, params: Any) -> dict:
    p = check_params("turn/interrupt", params, {"thread_id": (STR, True), "turn_id": (STR, False)})
    actor = await _thread(session, p["thread_id"])
    return await actor.ref.ask(InterruptTurn(turn_id=p.get("turn_id")))


@method("turn/queue")
async def turn_queue(session: AppServerSession, params: Any) -> dict:
    p = check_params("turn/queue", params, {**_INPUT, "hold": (BOOL, False)})
    if not p.get("prompt"):
        raise InvalidParams("prompt is required")
    actor = await _thread(session, p["thread_id"])
    entry = await actor.ref.ask(QueueInput(prompt=p["prompt"], hold=bool(p.get("hold")),
                                           client_id=p.get("client_id"), images=check_images(p.get("images")),
                                           origin=session.origin()))
    return {"input": entry}


@method("turn/update-queued")
async def turn_update_queued(session: AppServerSession, params: Any) -> dict:
    p = check_params("turn/update-queued", params, {"thread_id": (STR, True), "input_id": (STR, True),
                                                    "prompt": (STR, True), "content_parts": (LIST, False)})
    actor = await _thread(session, p["thread_id"])
    return {"input": await actor.ref.ask(UpdateQueued(input_id=p["input_id"], prompt=p["prompt"]))}


@method("turn/dequeue")
async def turn_dequeue(session: AppServerSession, params: Any) -> dict:
    p = check_params("turn/dequeue", params, {"thread_id": (STR, True), "input_id": (STR, True)})
    actor = await _thread(session, p["thread_id"])
    return {"input": await actor.ref.ask(Dequeue(input_id=p["input_id"]))}


@method("turn/steer")
async def turn_steer(session: AppServerSession, params: Any) -> dict:
    p = check_params("turn/steer", params, {**_INPUT, "expected_turn_id": (STR, False), "input_id": (STR, False)})
    if not p.get("prompt") and not p.get("input_id"):
        raise InvalidParams("prompt (or input_id of held input) is required")
    actor = await _thread(session, p["thread_id"])
    return await actor.ref.ask(SteerInput(prompt=p.get("prompt"), expected_turn_id=p.get("expected_turn_id"),
                                          client_id=p.get("client_id"), input_id=p.get("input_id"),
                                          origin=session.origin()))


@method("turn/unsteer")
async def turn_unsteer(session: AppServerSession, params: Any) -> dict:
    p = check_params("turn/unsteer", params, {"thread_id": (STR, True), "input_id": (STR, True)})
    actor = await _thread(session, p["thread_id"])
    return {"input": await actor.ref.ask(Unsteer(input_id=p["input_id"]))}
