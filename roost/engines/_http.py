"""The HTTP side shared by the provider adapters: one streaming POST with retries, SSE, error mapping.

Each adapter supplies the URL, headers and body for a request and a *parser* (sans-IO: SSE events
in, normalized events out). This module owns the I/O: ``httpx.AsyncClient`` streaming, SSE framing
(:mod:`roost.engines._sse`), retries (before the first streamed event, and of a stream that failed
after partial output: :class:`RetryPolicy`), translation of httpx errors and HTTP statuses to
:class:`roost.errors.EngineFailure`, and closing the response at once when the consumer leaves
(including when it is cancelled).
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager
from typing import Any, Protocol

import attrs
import httpx
import trio

from roost._json import JSONDecodeError, dumps, loads
from roost.engines._body import HEAD_BYTES, BodyReader, close
from roost.engines._settings import ProviderSettings
from roost.engines._types import (
    DOCUMENT_TYPES,
    EngineEvent,
    EngineRequest,
    ModelInfo,
    Retrying,
    TextDelta,
    UserMessage,
)
from roost.errors import EngineFailure, new_operation_id

_log = logging.getLogger("roost.engines.http")

__all__ = ["RetryPolicy", "StreamParser", "HttpEngine", "failure_from_response", "failure_from_transport"]

#: Bytes of an error response body read for its message.
ERROR_BODY_LIMIT = 64 * 1024


@attrs.define(kw_only=True)
class RetryPolicy:
    """When and how long to wait before sending a model call again.

    Retried failures: connection errors, 408, 409, 429 and 5xx before the stream starts; and, once
    the server answered 200, a stream that fails in a way its provider documents as transient: the
    connection dropped or stalled mid-stream, the stream ended without its terminal marker, or an
    error event inside the stream that is retryable (Anthropic ``overloaded_error`` / ``api_error``
    / ``rate_limit_error``, OpenAI ``server_error`` / ``rate_limit_exceeded``). Re-sending a model
    call is safe for Roost: no tool runs before its stream has ended; the failed attempt may still
    be billed. A retry after streamed events yields :class:`Retrying` with ``restart=True``: the
    consumer discards what that attempt streamed (app-server-protocol.md: ``item/removed``,
    ``item/agentMessage/replace``). Every attempt counts against ``max_attempts``. The delay
    honours ``retry-after-ms`` / ``retry-after`` (seconds or an HTTP date, RFC 9110 section
    10.2.3) up to ``max_retry_after``; otherwise it is exponential backoff with jitter:
    ``base_delay * 2**(attempt-1)``, capped at ``max_delay``, scaled by a random factor in [0.5, 1).

    Attributes:
        max_attempts: attempts per call, including the first (>= 1).
        retry_after_output: also retry a stream that failed after the server answered 200 (else
            such a failure ends the call, ``stop_reason`` ``replay_unsafe``).
        base_delay, max_delay, max_retry_after: seconds.
        sleep: the sleep function (tests inject a zero-sleep).
        random: returns a float in [0, 1) for jitter.
    """

    max_attempts: int = 4
    base_delay: float = 0.5
    max_delay: float = 20.0
    max_retry_after: float = 60.0
    retry_after_output: bool = True
    sleep: Callable[[float], Awaitable[None]] = trio.sleep
    random: Callable[[], float] = random.random

    def delay(self, attempt: int, response_headers: httpx.Headers | None) -> float:
        """Return the seconds to wait after failed attempt number ``attempt`` (1-based)."""
        hinted = _retry_after(response_headers) if response_headers is not None else None
        if hinted is not None:
            return max(0.0, min(hinted, self.max_retry_after))
        backoff = min(self.max_delay, self.base_delay * (2 ** (attempt - 1)))
        return backoff * (0.5 + self.random() / 2)


def _retry_after(headers: httpx.Headers) -> float | None:
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return float(raw_ms) / 1000.0
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return when.timestamp() - time.time()


class StreamParser(Protocol):
    """Sans-IO mapping of one provider stream: SSE events in, normalized events out."""

    #: True once the provider's terminal marker was seen; the engine stops reading.
    done: bool

    def feed(self, event: str, data: str) -> list[EngineEvent]:
        """Map one SSE event (non-empty ``data``). Raises EngineFailure for error events."""
        ...

    def finish(self) -> list[EngineEvent]:
        """Return the closing events. Raises EngineFailure if no terminal marker was seen."""
        ...


def _error_details(body: bytes) -> tuple[str | None, str | None, str | None]:
    """Return (message, code, type) from an OpenAI or Anthropic error body."""
    try:
        doc = loads(body)
    except (JSONDecodeError, ValueError):
        text = body.decode("utf-8", "replace").strip()
        return (text[:500] or None, None, None)
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        code = err.get("code")
        return (err.get("message"), str(code) if code is not None else None, err.get("type"))
    if isinstance(err, str):
        return (err, None, None)
    if isinstance(doc, dict) and isinstance(doc.get("message"), str):
        return (doc["message"], None, doc.get("type"))
    return (None, None, None)


_CONTEXT_HINTS = (
    "context_length",
    "context length",
    "context window",
    "maximum context",
    "prompt is too long",
    "too many tokens",
)


def failure_from_response(status: int, headers: httpx.Headers, body: bytes, *, provider: str) -> EngineFailure:
    """Translate a non-200 HTTP response into an :class:`EngineFailure`.

    401/403 -> ``auth``; 429 -> ``rate_limit`` (retryable unless the code says the quota is
    exhausted); 408/409/5xx/529 -> ``provider`` or ``network``, retryable; other 4xx ->
    ``invalid_request``, or ``context_length`` when the provider's code or message says so.
    """
    message, code, etype = _error_details(body)
    provider_code = code or etype
    text = f"{provider} returned HTTP {status}" + (f": {message}" if message else "")
    lowered = " ".join(filter(None, (message, code, etype))).lower()
    if status in (401, 403):
        return EngineFailure(text, category="auth", provider_code=provider_code, http_status=status)
    if status == 429:
        retryable = code != "insufficient_quota"
        return EngineFailure(
            text, category="rate_limit", retryable=retryable, provider_code=provider_code, http_status=status
        )
    if status == 408:
        return EngineFailure(text, category="network", retryable=True, provider_code=provider_code, http_status=status)
    if status == 409 or status >= 500:
        return EngineFailure(text, category="provider", retryable=True, provider_code=provider_code, http_status=status)
    if any(hint in lowered for hint in _CONTEXT_HINTS):
        return EngineFailure(text, category="context_length", provider_code=provider_code, http_status=status)
    return EngineFailure(text, category="invalid_request", provider_code=provider_code, http_status=status)


def failure_from_transport(exc: httpx.HTTPError, *, provider: str) -> EngineFailure:
    """Translate an httpx transport error (connect, read, write, timeout, protocol) to ``network``."""
    kind = type(exc).__name__
    detail = str(exc) or kind
    return EngineFailure(
        f"{provider}: network error ({kind}): {detail}", category="network", retryable=True, provider_code=kind
    )


class HttpEngine:
    """Base of the provider adapters: settings, the shared ``httpx.AsyncClient``, streaming.

    Subclasses set ``name`` and implement ``_url``, ``_headers``, ``_body``, ``_parser`` and
    ``_models_url`` / ``_parse_models``.

    Args:
        settings: the resolved provider settings.
        client: an ``httpx.AsyncClient`` to use (the engine does not close a client it was given).
        retry: the retry policy (default: ``RetryPolicy(max_attempts=settings.max_attempts)``).
    """

    name = "http"
    #: Media types of :class:`~roost.engines.Document` attachments this adapter sends (PDFs:
    #: each provider's documented file input). A model or server that still refuses one answers
    #: 4xx: the failure then says that the request carried a file.
    document_types: frozenset[str] = DOCUMENT_TYPES

    def __init__(
        self,
        settings: ProviderSettings,
        *,
        client: httpx.AsyncClient | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.settings = settings
        self.retry = retry or RetryPolicy(max_attempts=settings.max_attempts)
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(settings.read_timeout, connect=settings.connect_timeout),
            follow_redirects=False,
            # Connections are reused (roost.engines._body drains a body's end); without TCP_NODELAY
            # a request's headers and body, written separately, wait for the server's delayed ACK
            # (about 40 ms) on a reused one.
            transport=httpx.AsyncHTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]),
        )

    # -- subclass hooks ----------------------------------------------------------------------

    def _url(self) -> str:
        raise NotImplementedError

    def _headers(self) -> dict[str, str]:
        raise NotImplementedError

    def _body(self, request: EngineRequest) -> dict[str, Any]:
        raise NotImplementedError

    def _encode_body(self, request: EngineRequest) -> bytes:
        """The request body as sent (an adapter may encode parts of it once and reuse them)."""
        return dumps(self._body(request))

    def _parser(self, request: EngineRequest) -> StreamParser:
        """The parser of one attempt's stream; ``request`` gives the call ids already in use."""
        raise NotImplementedError

    def _models_url(self) -> str:
        raise NotImplementedError

    def _model(self, request: EngineRequest) -> str:
        model = request.model or self.settings.model
        if not model:
            raise EngineFailure(
                f"{self.name}: no model selected; pass --model or set ROOST_MODEL",
                category="invalid_request",
            )
        return model

    # -- public API ----------------------------------------------------------------------------

    @asynccontextmanager
    async def stream(self, request: EngineRequest) -> AsyncIterator[AsyncIterator[EngineEvent]]:
        """Open a model call; yields the async iterator of its events.

        Raises:
            EngineFailure: while iterating, in place of the remaining events; carries the
                recovery facts (attempts, retries, submissions, stop reason).

        Cancellation:
            Leaving the context closes the HTTP response (and its connection) in a shielded
            clean-up bounded by ``CLOSE_GRACE`` seconds. Left by cancellation (an interrupt), the
            context does not wait for that: a system task closes the response (bounded the same
            way), so the interrupted turn settles at once (issue 19: closing a connection cut
            mid-body takes several checkpoints of httpcore's pool, each a scheduler batch under
            saturation, about 8 ms at p50 of an interrupt's 20). The body is read by a task of its
            own (:class:`roost.engines._body.BodyReader`), so an interrupt never lands inside
            httpcore's read, whose own shielded clean-up would run first.
        """
        async with aclosing(self._events(request)) as events:
            yield events

    async def list_models(self) -> list[ModelInfo]:
        """Return the provider's models (``GET .../v1/models``); the configured model is current.

        Raises:
            EngineFailure: the request failed (network, auth, provider).
        """
        try:
            response = await self._client.get(self._models_url(), headers=self._headers())
        except httpx.HTTPError as exc:
            raise failure_from_transport(exc, provider=self.name) from exc
        if response.status_code != 200:
            raise failure_from_response(response.status_code, response.headers, response.content, provider=self.name)
        try:
            doc = loads(response.content)
        except (JSONDecodeError, ValueError) as exc:
            raise EngineFailure(f"{self.name}: model list is not JSON", category="provider") from exc
        ids = sorted({str(m["id"]) for m in doc.get("data", []) if isinstance(m, dict) and "id" in m})
        return [ModelInfo(i, i == self.settings.model) for i in ids]

    async def aclose(self) -> None:
        """Close the HTTP client if the engine created it. Idempotent."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> HttpEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the stream ------------------------------------------------------------------------------

    async def _events(self, request: EngineRequest) -> AsyncGenerator[EngineEvent, None]:
        body = self._encode_body(request)
        url = self._url()
        headers = {"content-type": "application/json", "accept": "text/event-stream", **self._headers()}
        policy = self.retry
        max_attempts = max(1, policy.max_attempts)
        attempt = 0
        partial: list[str] = []
        operation_id = new_operation_id()  # app-server-protocol.md: error.recovery.operation_id
        while True:
            attempt += 1
            _log.debug("%s %s: attempt %d of %d", self.name, operation_id, attempt, max_attempts)
            accepted = False  # a 200 arrived: the request was taken (and may be billed)
            streamed = False  # this attempt yielded events (a retry then restarts the response)
            retry_headers: httpx.Headers | None = None
            response: httpx.Response | None = None
            reader: BodyReader | None = None
            try:
                try:
                    response = await self._client.send(
                        self._client.build_request("POST", url, content=body, headers=headers), stream=True
                    )
                    if response.status_code != 200:
                        retry_headers = response.headers
                        raise failure_from_response(
                            response.status_code,
                            response.headers,
                            await _read_limited(response),
                            provider=self.name,
                        )
                    accepted = True
                    await self._check_event_stream(response)
                    parser = self._parser(request)
                    received = 0
                    last: tuple[str, str] | None = None
                    head = bytearray()  # the body's first bytes, named when it carried no events
                    reader = BodyReader(response, head)  # owns the response from here on
                    async for batch in reader:
                        for last in batch:
                            received += 1
                            for event in parser.feed(last[0], last[1]):
                                if type(event) is TextDelta:
                                    partial.append(event.text)
                                streamed = True
                                yield event
                            if parser.done:
                                break
                        if parser.done:
                            break
                    reader.finish()
                    await reader.wait_closed()  # the rest read: the connection is back in the pool
                    for event in _finish(parser, received, last, head):
                        yield event
                    return
                except httpx.HTTPError as exc:
                    lost = failure_from_transport(exc, provider=self.name)
                    if accepted:
                        lost.message = f"{lost.message} (after the server accepted the request with HTTP 200)"
                        lost.args = (lost.message,)
                    raise lost from exc
            except EngineFailure as failure:
                # the delay before the next attempt; raises ``failure`` when there is none
                delay = self._retry_delay(failure, request, attempt, accepted, retry_headers, operation_id, partial)
                await _close_attempt(response, reader)
                _log.info("%s %s: attempt %d failed (%s), retrying", self.name, operation_id, attempt, failure)
                # restart: what this attempt streamed is void; the next one starts the response over
                yield Retrying(attempt, max_attempts, delay, failure.category, restart=streamed)
                partial.clear()
                await policy.sleep(delay)
                continue
            finally:
                if reader is not None:
                    reader.abandon()  # (nothing left to do after finish); it closes the response
                elif trio.current_effective_deadline() == -math.inf:
                    _close_soon(response)  # cancelled (an interrupt): the turn settles meanwhile
                else:
                    await close(response)

    def _retry_delay(
        self,
        failure: EngineFailure,
        request: EngineRequest,
        attempt: int,
        accepted: bool,
        retry_headers: httpx.Headers | None,
        operation_id: str,
        partial: list[str],
    ) -> float:
        """Seconds to wait before attempt ``attempt + 1`` after ``failure`` (the retry policy:
        retryable, replayable, attempts left); otherwise ``failure`` is raised, completed with its
        operation id, a PDF hint and its recovery record (app-server-protocol.md: error.recovery)."""
        policy = self.retry
        max_attempts = max(1, policy.max_attempts)
        replayable = not accepted or policy.retry_after_output
        if failure.retryable and replayable and attempt < max_attempts:
            return policy.delay(attempt, retry_headers)
        failure.operation_id = operation_id
        if failure.category == "invalid_request" and _has_documents(request):
            failure.message += " (the request carried a PDF file: this model or server may not accept files)"
            failure.args = (failure.message,)
        _log.info("%s %s failed after %d attempt(s): %s", self.name, operation_id, attempt, failure.message)
        _record_recovery(failure, attempt, max_attempts, accepted=accepted and not replayable, partial=partial)
        raise failure

    async def _check_event_stream(self, response: httpx.Response) -> None:
        """Fail (non-retryable) when a 200 reply is not ``text/event-stream``.

        A proxy's HTML error page, a JSON error body or a non-streamed completion are named in the
        message (content type, and the error's message or the start of the body).
        """
        content_type = response.headers.get("content-type", "")
        if "text/event-stream" in content_type.partition(";")[0].lower():
            return
        body = await _read_limited(response)
        message, code, etype = _error_details(body)
        detail = message or "empty body"
        raise EngineFailure(
            f"{self.name}: expected an event stream (text/event-stream) but the server answered HTTP 200 "
            f"with content type {content_type or '(none)'!r}: {detail[:300]}",
            category="provider",
            retryable=False,
            provider_code=code or etype or "unexpected_content_type",
            http_status=200,
        )


def _finish(parser: Any, received: int, last: tuple[str, str] | None, head: bytearray) -> list[EngineEvent]:
    """The parser's closing events at the end of a stream of ``received`` events; a stream that
    ended too early fails naming what arrived, and a body that was no event stream at all (no
    event, some bytes) is not retried (it is no dropped connection)."""
    try:
        return list(parser.finish())
    except EngineFailure as failure:
        failure.message = f"{failure.message} ({_received(received, last, head)})"
        failure.args = (failure.message,)
        if received == 0 and head.strip():
            failure.retryable = False
        raise


def _has_documents(request: EngineRequest) -> bool:
    return any(isinstance(item, UserMessage) and item.documents for item in request.history)


def _record_recovery(
    failure: EngineFailure, attempt: int, max_attempts: int, *, accepted: bool, partial: list[str]
) -> None:
    """Fill the recovery facts of app-server-protocol.md ("Turns and execution runs") on the
    failure that ends the call: attempts, retries, physical submissions, the limit, and why
    recovery stopped (``replay_unsafe``: a server answered 200 and the policy does not re-send
    after that; ``partial_text`` is the text of the last attempt)."""
    failure.partial_text = "".join(partial)
    failure.attempt_count = attempt
    failure.retry_count = attempt - 1
    failure.submission_count = attempt
    failure.max_attempts = max_attempts
    if not failure.retryable:
        failure.stop_reason = "non_retryable"
    elif accepted:
        failure.stop_reason = "replay_unsafe"
    else:
        failure.stop_reason = "retry_limit"


def _received(count: int, last: tuple[str, str] | None, head: bytes | bytearray = b"") -> str:
    """Describe what a stream that ended early delivered: its event count and its last event, or
    the start of its body when it carried no events (a JSON error body sent as an event stream)."""
    if count == 0 or last is None:
        if head.strip():
            return (
                f"the stream carried no events; the body began {bytes(head[:HEAD_BYTES]).decode('utf-8', 'replace')!r}"
            )
        return "the stream carried no events"
    name = f"event {last[0]!r} " if last[0] else ""
    return f"received {count} events; the last: {name}data {last[1][:120]!r}"


async def _read_limited(response: httpx.Response) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size >= ERROR_BODY_LIMIT:
            break
    return b"".join(chunks)


async def _close_attempt(response: httpx.Response | None, reader: BodyReader | None) -> None:
    """After a failed attempt: close its response; once a reader owns it, the reader does (its
    read failed: it has ended, or ends now)."""
    if reader is None:
        await close(response)
    else:
        reader.abandon()
        await reader.wait_closed()


def _close_soon(response: httpx.Response | None) -> None:
    """Close ``response`` in a system task (bounded by CLOSE_GRACE; a failure is logged at debug
    level); not a checkpoint. For a caller that was cancelled and must not wait for the close."""
    if response is None or response.is_closed:
        return
    trio.lowlevel.spawn_system_task(close, response, name="roost.engine-close")
