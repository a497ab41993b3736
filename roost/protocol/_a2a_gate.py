"""The checks of an A2A JSON-RPC request body before the ``a2a-sdk`` app sees it (``serve --a2a``).

wire-protocol.md, appendix "A2A (``serve --a2a``)", and docs/wire.md "A2A agents": the body is
bounded by ``ROOST_MAX_LINE_BYTES`` (:func:`roost.protocol._framing.line_limit`, 64 MiB unless
set); a larger one is refused with HTTP 413 and a JSON-RPC ``-32600`` error naming the limit and
the setting. A body that is not JSON (or is empty) is answered ``-32700``, one that is not one
request object (a batch array, no ``method``, no ``id``) ``-32600``, params that are not an
object or do not fit the method's model (strictly: no ``"yes"`` for a boolean) ``-32602``,
and the push notification methods ``-32003`` (PushNotificationNotSupported,
A2A spec 0.3 section 8.2; the agent card says ``pushNotifications: false``). Each message is a
sentence naming the field at fault, without the SDK's raw pydantic data; nothing of it is
logged beyond one line. The rest goes to the SDK unchanged.

Why before the SDK: its JSON-RPC app prints a traceback to stderr for every unparseable body
(``traceback.print_exc``) and logs one for every validation failure, puts pydantic's error list
(with ``errors.pydantic.dev`` URLs) in the reply, and answers ``tasks/pushNotificationConfig/set``
from its own capability check as an unhandled exception (-32603) before the request handler runs.
The request models are the SDK's public ones (``a2a.types.JSONRPCRequest`` and the app's
``METHOD_TO_MODEL``), so what passes here is what the SDK accepts.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from a2a.server.apps import A2AStarletteApplication
from a2a.types import (
    InvalidParamsError,
    InvalidRequestError,
    JSONParseError,
    JSONRPCErrorResponse,
    JSONRPCRequest,
    PushNotificationNotSupportedError,
)
from pydantic import ValidationError

from roost._json import JSONDecodeError, dumps, loads

__all__ = ["check_request", "read_body", "too_large", "refusal", "request_of", "QuietSdkErrors"]

Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]

#: The JSON-RPC methods of push notification configs (none is supported: -32003).
PUSH_PREFIX = "tasks/pushNotificationConfig/"
#: Validation errors named in an error message (the first ones).
_ERRORS_SHOWN = 3


class QuietSdkErrors(logging.Filter):
    """Keep the SDK's JSON-RPC app log records to one line each: the traceback of a request it
    could not parse or validate (any caller can send one) is dropped, the message kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info = None
        record.exc_text = None
        return True


async def read_body(scope: dict[str, Any], receive: Receive, limit: int) -> tuple[bytes | None, Receive]:
    """The request body and a ``receive`` that replays it; the body is None when it is (or its
    ``Content-Length`` says it is) larger than ``limit`` bytes (nothing more is read then)."""
    for key, value in scope.get("headers") or ():
        if bytes(key).lower() == b"content-length":
            try:
                if int(bytes(value)) > limit:
                    return None, receive
            except ValueError:
                pass
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message.get("type") != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None, receive
        chunks.append(chunk)
        more = bool(message.get("more_body"))
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Any:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


def too_large(limit: int) -> bytes:
    """The JSON-RPC ``-32600`` error body of a request over ``limit`` bytes (sent with HTTP 413)."""
    message = f"Invalid request: the request body is larger than {limit} bytes (the limit is ROOST_MAX_LINE_BYTES)"
    return _error(None, InvalidRequestError(message=message))


def check_request(body: bytes) -> bytes | None:
    """The JSON-RPC error response (bytes) for a request body the SDK must not see, or None:
    the body is one valid request of a method other than the push notification ones.

    Codes (JSON-RPC 2.0 section 5.1, A2A spec 0.3 section 8): -32700 not JSON or empty, -32600
    not one request object or one without an ``id`` (a JSON-RPC notification: every A2A method
    has an answer, so a missing id is a caller's mistake, told rather than silently dropped),
    -32602 params that are not an object or do not fit the method's model (validated strictly:
    ``"blocking": "yes"`` is not a boolean), -32003 push notifications. An unknown method with an
    id passes (the SDK answers -32601).
    """
    if not body.strip():
        message = "Parse error: the request body is empty (send one JSON-RPC request)"
        return _error(None, JSONParseError(message=message))
    try:
        request = loads(body)
    except (JSONDecodeError, ValueError) as exc:
        return _error(None, JSONParseError(message=f"Parse error: the request body is not JSON ({exc})"))
    if not isinstance(request, dict):
        message = "Invalid request: the body must be one JSON-RPC request object (batches are not supported)"
        return _error(None, InvalidRequestError(message=message))
    request_id = request.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        request_id = None
    try:
        JSONRPCRequest.model_validate({**request, "params": None})
    except ValidationError as exc:
        return _error(request_id, InvalidRequestError(message=f"Invalid request: {_describe(exc)}"))
    method = request["method"]
    if request.get("id") is None:
        message = (
            f"Invalid request: {method} has no id (every A2A method is answered; "
            "JSON-RPC notifications are not supported)"
        )
        return _error(None, InvalidRequestError(message=message))
    params = request.get("params")
    if params is not None and not isinstance(params, dict):
        message = f"Invalid params of {method}: params must be an object (A2A takes named params, not an array)"
        return _error(request_id, InvalidParamsError(message=message))
    model = A2AStarletteApplication.METHOD_TO_MODEL.get(method)
    if model is None:
        return None
    try:
        model.model_validate_json(body, strict=True)  # strict: "yes" is no boolean, "5" no integer
    except ValidationError as exc:
        return _error(request_id, InvalidParamsError(message=f"Invalid params of {method}: {_describe(exc)}"))
    if method.startswith(PUSH_PREFIX):
        return _error(request_id, PushNotificationNotSupportedError())
    return None


def refusal(message: str, request_id: str | int | None = None) -> bytes:
    """The JSON-RPC ``-32600`` error body of a request refused before the SDK sees it (sent with
    its HTTP status: 401 no or a wrong token, 403 an ``Origin`` header or a read token's call)."""
    return _error(request_id, InvalidRequestError(message=message))


def request_of(body: bytes) -> tuple[str | None, str | int | None]:
    """``(method, id)`` of a JSON-RPC request body, each None when it cannot be read."""
    try:
        request = loads(body)
    except (JSONDecodeError, ValueError):
        return None, None
    if not isinstance(request, dict):
        return None, None
    method, request_id = request.get("method"), request.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        request_id = None
    return (method if isinstance(method, str) else None), request_id


def _describe(exc: ValidationError) -> str:
    """The first validation errors as ``field.path: message``, joined with ``; ``."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    described = []
    for error in errors[:_ERRORS_SHOWN]:
        where = ".".join(str(part) for part in error["loc"]) or "the request"
        described.append(f"{where}: {error['msg']}")
    more = len(errors) - _ERRORS_SHOWN
    return "; ".join(described) + (f" (and {more} more)" if more > 0 else "")


def _error(request_id: str | int | None, error: Any) -> bytes:
    response = JSONRPCErrorResponse(id=request_id, error=error).model_dump(mode="json", exclude_none=True)
    response["id"] = request_id  # JSON-RPC 2.0 section 5: null when the id could not be read
    return dumps(response)
