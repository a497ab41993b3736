"""App-server turn methods (app-server-protocol.md, "Turns and execution runs", "Explicit
continuation without new input", "Attachments", "Input Content Parts", "Interruption").

``turn/start`` admits a turn (or answers ``thread_busy``); ``turn/queue``, ``turn/update-queued``,
``turn/dequeue``, ``turn/steer`` and ``turn/unsteer`` manage pending user input, which the
ThreadActor commits to SQLite before the response; ``turn/interrupt`` cancels the active turn.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any

from roost.actors import Dequeue, InterruptTurn, QueueInput, StartTurn, SteerInput, Unsteer, UpdateQueued
from roost.errors import InvalidParams, Unsupported
from roost.protocol._appserver import AppServerSession, immediate, method
from roost.protocol._as_common import check_writable, forwarded, thread_actor
from roost.protocol._params import BOOL, DICT, LIST, STR, check_params

__all__ = ["check_images", "check_files", "check_documents", "check_content_parts", "MAX_ATTACHMENT_BYTES"]

_INPUT = {
    "thread_id": (STR, True),
    "prompt": (STR, False),
    "images": (LIST, False),
    "files": (LIST, False),
    "content_parts": (LIST, False),
    "client_id": (STR, False),
    "active_document": (DICT, False),
    "permission_mode": (STR, False),
}

#: Decoded bytes one image or file attachment may have.
MAX_ATTACHMENT_BYTES = 20 * 2**20
#: File media types the built-in engines read (as UTF-8 text inlined into the user message).
_TEXT_MEDIA = (
    "text/",
    "application/json",
    "application/xml",
    "application/yaml",
    "application/x-yaml",
    "application/toml",
    "application/javascript",
    "application/x-sh",
    "application/sql",
)
#: The flattened text of a response_selection part begins with this (spec: "Input Content Parts").
_QUOTE_PREFIX = "Quoted assistant response (JSON):\n"


def _decode_base64(data: str, where: str) -> bytes:
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParams(f"{where}.data is not valid base64") from None
    if len(raw) > MAX_ATTACHMENT_BYTES:
        raise InvalidParams(f"{where} is {len(raw)} bytes; the limit is {MAX_ATTACHMENT_BYTES} bytes")
    return raw


def check_images(images: Any) -> tuple:
    """Validate ``images``: each ``{media_type: "image/...", data: base64, original?: str}``.

    Returns:
        The images as a tuple of dicts with only those fields, plus ``sha256`` (of the decoded
        bytes: the address of the stored blob, for ``thread/attachment/read``).

    Raises:
        InvalidParams: naming the first bad image.
    """
    out = []
    for index, image in enumerate(images or ()):
        where = f"images[{index}]"
        if (
            not isinstance(image, dict)
            or not isinstance(image.get("media_type"), str)
            or not isinstance(image.get("data"), str)
        ):
            raise InvalidParams(f"{where} must have string media_type and base64 data")
        unknown = set(image) - {"media_type", "data", "original"}
        if unknown:
            raise InvalidParams(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        if not image["media_type"].startswith("image/"):
            raise InvalidParams(f"{where}.media_type must be an image type")
        digest = hashlib.sha256(_decode_base64(image["data"], where)).hexdigest()
        out.append(
            {
                "media_type": image["media_type"],
                "data": image["data"],
                "sha256": digest,
                **({"original": image["original"]} if isinstance(image.get("original"), str) else {}),
            }
        )
    return tuple(out)


#: File media types the provider itself reads (sent as the provider's file input, not inlined).
_DOCUMENT_MEDIA = ("application/pdf",)


def check_files(files: Any) -> tuple[list[dict], list[dict]]:
    """Validate ``files``: each ``{media_type, data: base64, filename?}`` (spec "Attachments").

    Text files are decoded as UTF-8 and inlined into the user message (:func:`inline_files`).
    PDFs (``application/pdf``, checked for the ``%PDF-`` signature) travel to the provider as
    files (Anthropic ``document`` blocks, OpenAI ``input_file`` / ``file`` parts); whether the
    thread's engine takes them is checked at admission (:func:`check_documents`). Video and other
    binary files are refused.

    Returns:
        ``(text_files, documents)``: ``[{"filename", "media_type", "text"}]`` and
        ``[{"media_type", "data", "filename", "sha256"}]``.

    Raises:
        InvalidParams: a malformed entry, bad base64, too large, not UTF-8 text, or a "PDF"
            without the PDF signature.
        Unsupported: another binary media type (video...).
    """
    texts, documents = [], []
    for index, entry in enumerate(files or ()):
        where = f"files[{index}]"
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("media_type"), str)
            or not isinstance(entry.get("data"), str)
        ):
            raise InvalidParams(f"{where} must have string media_type and base64 data")
        unknown = set(entry) - {"media_type", "data", "filename"}
        if unknown:
            raise InvalidParams(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        name = entry.get("filename")
        if name is not None and not isinstance(name, str):
            raise InvalidParams(f"{where}.filename must be a string")
        media = entry["media_type"].split(";")[0].strip().lower()
        raw = _decode_base64(entry["data"], where)
        if media in _DOCUMENT_MEDIA:
            if not raw.startswith(b"%PDF-"):
                raise InvalidParams(f"{where} is not a PDF (its bytes do not begin with %PDF-)")
            document = {"media_type": media, "data": entry["data"], "sha256": hashlib.sha256(raw).hexdigest()}
            documents.append({**document, **({"filename": name} if name else {})})
            continue
        if not media.startswith(_TEXT_MEDIA):
            raise Unsupported(
                f"{where}: {media} attachments are not supported by Roost's engines; "
                "attach text files or PDFs in files, or images in images"
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidParams(f"{where} ({media}) is not UTF-8 text") from None
        texts.append({"filename": name or f"attachment-{index + 1}", "media_type": media, "text": text})
    return texts, documents


def check_documents(session: AppServerSession, actor: Any, attachments: tuple) -> None:
    """Refuse PDFs in ``attachments`` when the thread's engine cannot send them to its model.

    Raises:
        Unsupported: the engine (the scripted one, or an engine without file input) takes no PDFs.
        InvalidParams: the thread's engine cannot be opened.
    """
    kinds = {a["media_type"] for a in attachments if not a["media_type"].startswith("image/")}
    if not kinds:
        return
    thread = actor.facts().thread
    engine = session.engines.engine_for(thread)
    accepted: frozenset[str] = getattr(engine, "document_types", frozenset())
    refused = sorted(kinds - accepted)
    if refused:
        raise Unsupported(
            f"the {getattr(engine, 'name', 'selected')} engine of thread {thread.id} cannot send "
            f"{', '.join(refused)} files to its model; choose a provider that takes PDFs "
            "(anthropic, openai, openai-responses)"
        )


def inline_files(prompt: str, files: list[dict]) -> str:
    """The model-visible message: ``prompt`` followed by each text file in an ``<attachment>`` block."""
    blocks = [
        f"<attachment filename={json.dumps(f['filename'])} media_type={json.dumps(f['media_type'])}>\n"
        f"{f['text']}\n</attachment>"
        for f in files
    ]
    return "\n\n".join([prompt, *blocks]) if prompt else "\n\n".join(blocks)


def _str(d: Any, key: str, optional: bool = False) -> bool:
    value = d.get(key) if isinstance(d, dict) else None
    return (optional and value is None) or isinstance(value, str)


def _int(d: dict, key: str) -> bool:
    value = d.get(key)
    return isinstance(value, int) and not isinstance(value, bool)


def _valid_file_selection(part: dict) -> bool:
    source = part.get("source")
    if not (
        isinstance(source, dict)
        and part.get("intent") in ("comment", "edit", "quote")
        and _str(part, "id")
        and _str(part, "comment", True)
    ):
        return False
    if not all(_str(source, k) for k in ("workspace", "path", "quote", "revision")):
        return False
    coords = ("start_line", "start_column", "end_line", "end_column")
    if not all(_int(source, k) for k in coords):
        return False
    pdf = source.get("pdf")
    if pdf is not None:
        if not isinstance(pdf, dict) or any(source[k] != 0 for k in coords):
            return False
        if not (_int(pdf, "start_page") and _int(pdf, "end_page") and 1 <= pdf["start_page"] <= pdf["end_page"]):
            return False
        if not all(_str(pdf, k, True) for k in ("artifact_uri", "artifact_sha256", "artifact_thread_id")):
            return False
        return pdf.get("artifact_sha256") is None or source["revision"] == f"sha256:{pdf['artifact_sha256']}"
    if any(source[k] < 1 for k in coords):
        return False
    return (source["start_line"], source["start_column"]) <= (source["end_line"], source["end_column"])


def _valid_response_selection(part: dict) -> bool:
    selection = part.get("selection")
    if not (
        isinstance(selection, dict)
        and _str(selection, "id")
        and _str(selection, "text")
        and _str(selection, "comment", True)
    ):
        return False
    source = selection.get("source")
    if not (
        isinstance(source, dict)
        and all(_str(source, k) for k in ("thread_id", "turn_id", "item_id"))
        and _int(source, "start_offset")
        and _int(source, "end_offset")
        and _str(source, "range_text", True)
    ):
        return False
    if not 0 <= source["start_offset"] <= source["end_offset"]:
        return False
    text = part["text"]
    if not (text.startswith(_QUOTE_PREFIX) and text.endswith("\n")):
        return False
    try:
        quoted = json.loads(text[len(_QUOTE_PREFIX) :])
    except ValueError:
        return False
    return (
        isinstance(quoted, dict)
        and quoted.get("text") == selection["text"]
        and (quoted.get("comment") or "") == (selection.get("comment") or "")
    )


_VALIDATORS = {
    "text": lambda part: True,
    "pasted_text": lambda part: _str(part, "title", True),
    "file_selection": _valid_file_selection,
    "response_selection": _valid_response_selection,
}


def check_content_parts(parts: Any, prompt: str | None) -> list | None:
    """The presentation metadata to keep for ``prompt`` (app-server-protocol.md, "Input Content Parts").

    The texts of the parts, concatenated in order, must equal ``prompt`` after outer-whitespace
    trimming, or all metadata is discarded (the prompt is unchanged either way). Unknown part types
    and invalid parts (missing fields, bad intent, non-positive or unordered coordinates, a
    response quote that does not match its selection) are discarded one by one.

    Returns:
        The valid parts, or None when nothing is kept.
    """
    if not parts or not isinstance(parts, list):
        return None
    texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
    if "".join(texts).strip() != (prompt or "").strip():
        return None
    kept = [
        p
        for p in parts
        if isinstance(p, dict)
        and isinstance(p.get("text"), str)
        and p.get("type") in _VALIDATORS
        and _VALIDATORS[p["type"]](p)
    ]
    return kept or None


def _check_permission(actor: Any, p: dict) -> None:
    mode = p.get("permission_mode")
    if mode is not None and mode != (actor.facts().thread.permission_mode or "standard"):
        raise InvalidParams("permission_mode must match the thread's selection (change it with config/model/update)")


def _input(p: dict) -> tuple[str, tuple, list | None]:
    """(model-visible prompt, images, content_parts) of an input request."""
    images = check_images(p.get("images"))
    files, documents = check_files(p.get("files"))
    prompt = p.get("prompt") or ""
    if not prompt.strip():
        prompt = ""  # a blank prompt is no input
    parts = check_content_parts(p.get("content_parts"), prompt)
    if files:
        prompt = inline_files(prompt, files)
    # PDFs travel with the images (one attachment tuple); the user item lists them in ``files``
    return prompt, images + tuple(documents), parts


@method("turn/start")
async def turn_start(session: AppServerSession, params: Any) -> dict:
    """``turn/start``: admit a turn with a prompt and/or attachments, or continue without input.

    ``client_id`` becomes the user item's ``source_id``; one the thread already consumed (also
    before a restart) or that pending or held input carries is refused (``invalid_params``), so a
    retried turn/start never runs its input twice. ``resume_after_turn_id`` (and no input)
    continues after the thread's latest turn: a stale or already continued id is ``stale_turn``,
    an unknown one ``turn_not_found``. Result: ``{turn}``; then turn/started, item and terminal
    notifications follow.

    Raises:
        ThreadBusy: a turn is running (here, or in another process under the lease).
        ReadOnly: the thread is archived. InvalidParams, Unsupported: bad input.
    """
    p = check_params("turn/start", params, {**_INPUT, "resume_after_turn_id": (STR, False)})
    prompt, images, parts = _input(p)
    if "resume_after_turn_id" in p and (prompt or images):
        raise InvalidParams("resume_after_turn_id continues without new input: omit prompt and attachments")
    if "resume_after_turn_id" not in p and not prompt and not images:
        raise InvalidParams("prompt is required")
    actor = await thread_actor(session, p["thread_id"])
    check_writable(actor)
    _check_permission(actor, p)
    session.ensure_engine(actor.facts().thread)
    check_documents(session, actor, images)
    ack = session.after_response()
    turn = await actor.ref.ask(
        StartTurn(
            ack=ack,
            prompt=prompt or None,
            images=images,
            client_id=p.get("client_id"),
            content_parts=parts,
            check_client_id=True,
            resume_after_turn_id=p.get("resume_after_turn_id"),
            origin=session.origin(),
        )
    )
    return {"turn": turn}


@method("turn/interrupt")
async def turn_interrupt(session: AppServerSession, params: Any) -> dict:
    """``turn/interrupt``: cancel the active turn (only if it is ``turn_id``, when given).

    Idempotent: a turn already ended (or interrupting) is reported with ``interrupted: false``.
    Result: ``{thread_id, turn, interrupted}``; it is sent before the interrupted turn's terminal
    notification (which waits for it, bounded). Raises TurnNotFound for an unknown ``turn_id``.
    A turn running in another app-server on the store is interrupted there (over the node bus).
    """
    p = check_params("turn/interrupt", params, {"thread_id": (STR, True), "turn_id": (STR, False)})
    actor = await thread_actor(session, p["thread_id"])
    remote = await forwarded(session, actor, "interrupt", {"turn_id": p.get("turn_id")})
    if remote is not None:
        return remote
    return await actor.ref.ask(InterruptTurn(turn_id=p.get("turn_id"), ack=session.after_response()))


@immediate("turn/interrupt")
def turn_interrupt_now(session: AppServerSession, params: Any) -> dict | None:
    """``turn/interrupt`` applied by the reader (control before data, issue 19): when the thread
    is loaded, this session follows it and the turn meant is active, cancel it now and answer as
    :func:`turn_interrupt` would; otherwise None (the ordinary handler answers).

    Raises:
        InvalidParams: malformed params (the ordinary handler then reports them).
    """
    p = check_params("turn/interrupt", params, {"thread_id": (STR, True), "turn_id": (STR, False)})
    if p["thread_id"] not in session.subscribed:
        return None
    return session.runtime.registry.interrupt_now(p["thread_id"], p.get("turn_id"))


@method("turn/queue")
async def turn_queue(session: AppServerSession, params: Any) -> dict:
    """``turn/queue``: input for the next turn (``hold: true``: held work, never dispatched).

    Committed before the response. A retry with the same ``client_id`` returns the pending input;
    a ``client_id`` already consumed by a turn is refused (``invalid_params``).
    Result: ``{input}``; emits turn/queued (or turn/held). For a thread executing in another
    app-server on the store the input is queued there (over the node bus), by the same rules.
    """
    p = check_params("turn/queue", params, {**_INPUT, "hold": (BOOL, False)})
    prompt, images, parts = _input(p)
    if not prompt:
        raise InvalidParams("prompt is required")
    actor = await thread_actor(session, p["thread_id"])
    check_writable(actor)
    _check_permission(actor, p)
    check_documents(session, actor, images)
    if not p.get("hold"):
        wire = {"prompt": prompt, "client_id": p.get("client_id"), "images": list(images), "content_parts": parts}
        remote = await forwarded(session, actor, "queue", wire)
        if remote is not None:
            return remote
    entry = await actor.ref.ask(
        QueueInput(
            prompt=prompt,
            hold=bool(p.get("hold")),
            client_id=p.get("client_id"),
            images=images,
            content_parts=parts,
            origin=session.origin(),
        )
    )
    return {"input": entry}


@method("turn/update-queued")
async def turn_update_queued(session: AppServerSession, params: Any) -> dict:
    """``turn/update-queued``: replace the prompt (and content_parts) of pending or held input."""
    p = check_params(
        "turn/update-queued",
        params,
        {"thread_id": (STR, True), "input_id": (STR, True), "prompt": (STR, True), "content_parts": (LIST, False)},
    )
    if not p["prompt"].strip():
        raise InvalidParams("prompt must not be empty; use turn/dequeue to withdraw input")
    actor = await thread_actor(session, p["thread_id"])
    check_writable(actor)
    parts = check_content_parts(p.get("content_parts"), p["prompt"])
    if not _knows_input(actor, p["input_id"]):
        wire = {"input_id": p["input_id"], "prompt": p["prompt"], "content_parts": parts}
        remote = await forwarded(session, actor, "update_queued", wire)
        if remote is not None:
            return remote
    return {"input": await actor.ref.ask(UpdateQueued(input_id=p["input_id"], prompt=p["prompt"], content_parts=parts))}


def _knows_input(actor: Any, input_id: str) -> bool:
    """Whether ``input_id`` is this process's own pending or held input of ``actor``'s thread (not
    input of an execution in another process, which that process manages)."""
    return input_id in actor.facts().local_input_ids


@method("turn/dequeue")
async def turn_dequeue(session: AppServerSession, params: Any) -> dict:
    """``turn/dequeue``: withdraw pending or held input. Result ``{input}``; emits turn/dequeued."""
    p = check_params("turn/dequeue", params, {"thread_id": (STR, True), "input_id": (STR, True)})
    actor = await thread_actor(session, p["thread_id"])
    if not _knows_input(actor, p["input_id"]):
        remote = await forwarded(session, actor, "dequeue", {"input_id": p["input_id"]})
        if remote is not None:
            return remote
    return {"input": await actor.ref.ask(Dequeue(input_id=p["input_id"]))}


@method("turn/steer")
async def turn_steer(session: AppServerSession, params: Any) -> dict:
    """``turn/steer``: add input to the active turn, admitted before its next model request.

    ``expected_turn_id`` fences the steer to that turn (``stale_turn`` otherwise). ``input_id``
    sends held input. On an idle thread (without ``expected_turn_id``) the input starts a turn.
    Result: ``{thread_id, delivery: active_turn|queued, turn_id|turn, input?}``. A turn running in
    another app-server on the store is steered there (over the node bus), by the same rules.
    """
    p = check_params("turn/steer", params, {**_INPUT, "expected_turn_id": (STR, False), "input_id": (STR, False)})
    prompt, images, parts = _input(p)
    if not prompt and not p.get("input_id"):
        raise InvalidParams("prompt (or input_id of held input) is required")
    actor = await thread_actor(session, p["thread_id"])
    check_writable(actor)
    _check_permission(actor, p)
    wire = {
        "prompt": prompt or None,
        "expected_turn_id": p.get("expected_turn_id"),
        "client_id": p.get("client_id"),
        "input_id": p.get("input_id"),
        "images": list(images),
        "content_parts": parts,
    }
    remote = await forwarded(session, actor, "steer", wire)
    if remote is not None:
        return remote
    facts = actor.facts()
    if not facts.running:
        session.ensure_engine(facts.thread)
    check_documents(session, actor, images)
    return await actor.ref.ask(
        SteerInput(
            prompt=prompt or None,
            expected_turn_id=p.get("expected_turn_id"),
            client_id=p.get("client_id"),
            input_id=p.get("input_id"),
            images=images,
            content_parts=parts,
            origin=session.origin(),
        )
    )


@method("turn/unsteer")
async def turn_unsteer(session: AppServerSession, params: Any) -> dict:
    """``turn/unsteer``: withdraw a steer not yet admitted. Result ``{input}``; emits turn/unsteered."""
    p = check_params("turn/unsteer", params, {"thread_id": (STR, True), "input_id": (STR, True)})
    actor = await thread_actor(session, p["thread_id"])
    if not _knows_input(actor, p["input_id"]):
        remote = await forwarded(session, actor, "unsteer", {"input_id": p["input_id"]})
        if remote is not None:
            return remote
    return {"input": await actor.ref.ask(Unsteer(input_id=p["input_id"]))}
