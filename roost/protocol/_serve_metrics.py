"""Prometheus metrics of ``roost serve``: ``GET /metrics`` on the daemon's HTTP port (issue 17).

Exposition format: the Prometheus text format 0.0.4 (``prometheus_client.generate_latest``), from
a registry of this daemon alone (a per-daemon ``CollectorRegistry``, not the process-global one).

Metrics (all prefixed ``roost_``):

=================================== ========= ====================================================
name                                type      meaning
=================================== ========= ====================================================
``tasks_accepted_total{source}``    counter   tasks queued (``client``, ``schedule``, ``mcp``)
``tasks_finished_total{outcome}``   counter   tasks ended (``succeeded``, ``failed``, ``interrupted``)
``turns_total{status}``             counter   turns ended (``completed``, ``failed``, ``interrupted``)
``tokens_total{kind}``              counter   model tokens of ended turns (``input``, ``output``, ``cached``)
``provider_request_seconds``        histogram one model call, from request to its last event
``{provider}``
``provider_errors_total{provider}`` counter   model calls that failed (``EngineFailure``)
``queue_depth``                     gauge     tasks queued, not yet running
``tasks_running``                   gauge     tasks running now
``connections``                     gauge     client connections attached now
``supervisor_restarts``             gauge     child restarts in the live supervision tree
=================================== ========= ====================================================

Access follows the daemon's bearer-token rules (the same ``ServeAuth.check`` as ``/attach`` and
``/mcp``): with a token configured a request needs ``Authorization: Bearer <token>`` (a read
token is enough: metrics change nothing); a request with an ``Origin`` header is refused.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

__all__ = ["DaemonMetrics", "metrics_app"]


class _Gauges:
    """A custom collector reading the daemon's live state at scrape time."""

    def __init__(self, metrics: DaemonMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        from roost.protocol._serve_status import count_restarts

        daemon = self.metrics.daemon
        if daemon is None:
            return
        tasks = list(daemon.queue.tasks.values())
        values = {
            "queue_depth": ("Tasks queued, not yet running.", sum(t.status == "queued" for t in tasks)),
            "tasks_running": ("Tasks running now.", sum(t.status == "running" for t in tasks)),
            "connections": ("Client connections attached now.", len(daemon.connections)),
            "supervisor_restarts": (
                "Child restarts in the live supervision tree.",
                count_restarts(getattr(daemon.runtime, "root", None)),
            ),
        }
        for name, (doc, value) in values.items():
            yield GaugeMetricFamily(f"roost_{name}", doc, value=value)


class DaemonMetrics:
    """The metrics of one daemon (see the module docstring), in their own ``CollectorRegistry``.

    Call :meth:`bind` with the daemon once it exists; the daemon calls :meth:`task_accepted`,
    :meth:`task_finished` and :meth:`notification`; :meth:`meter` wraps the runtime's
    ``engine_for`` so model calls are timed.
    """

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.daemon: Any = None
        r = self.registry
        self.accepted = Counter("roost_tasks_accepted", "Tasks queued.", ["source"], registry=r)
        self.finished = Counter("roost_tasks_finished", "Tasks ended.", ["outcome"], registry=r)
        self.turns = Counter("roost_turns", "Turns ended.", ["status"], registry=r)
        self.tokens = Counter("roost_tokens", "Model tokens of ended turns.", ["kind"], registry=r)
        self.latency = Histogram(
            "roost_provider_request_seconds",
            "One model call, request to last event.",
            ["provider"],
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, float("inf")),
        )
        self.errors = Counter("roost_provider_errors", "Model calls that failed.", ["provider"], registry=r)
        r.register(_Gauges(self))

    def bind(self, daemon: Any) -> None:
        """Read the live gauges from ``daemon`` (a ServeDaemon) from now on."""
        self.daemon = daemon

    def task_accepted(self, source: str) -> None:
        self.accepted.labels(source=source or "client").inc()

    def task_finished(self, task: Any) -> None:
        result = getattr(task, "result", None) or {}
        if result.get("succeeded"):
            outcome = "succeeded"
        else:
            outcome = "interrupted" if getattr(task, "interrupted", False) else "failed"
        self.finished.labels(outcome=outcome).inc()

    def notification(self, method: str, params: dict) -> None:
        """Count an ended turn and its tokens (``turn/completed`` / ``turn/error``)."""
        if method not in ("turn/completed", "turn/error"):
            return
        turn = params.get("turn") or {}
        self.turns.labels(status=str(turn.get("status") or ("failed" if method == "turn/error" else "completed"))).inc()
        usage = turn.get("usage") or {}
        for kind in ("input", "output", "cached"):
            value = usage.get(f"{kind}_tokens") or 0
            if isinstance(value, (int, float)) and value > 0:
                self.tokens.labels(kind=kind).inc(value)

    def meter(self, engine_for: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``engine_for`` whose engines time each ``stream()`` call and count its failures."""
        wrapped: dict[int, _MeteredEngine] = {}

        def metered(thread: Any) -> Any:
            engine = engine_for(thread)
            proxy = wrapped.get(id(engine))
            if proxy is None or proxy.inner is not engine:
                proxy = wrapped[id(engine)] = _MeteredEngine(engine, self)
            return proxy

        return metered

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class _MeteredEngine:
    """An engine proxy: ``stream()`` is timed into ``provider_request_seconds``; an
    ``EngineFailure`` counts in ``provider_errors_total``. Everything else is the engine's own."""

    def __init__(self, inner: Any, metrics: DaemonMetrics) -> None:
        self.inner = inner
        self.metrics = metrics
        self.provider = str(getattr(inner, "name", None) or type(inner).__name__)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @contextlib.asynccontextmanager
    async def stream(self, request: Any) -> AsyncIterator[Any]:
        from roost.errors import EngineFailure

        began = time.monotonic()
        try:
            async with self.inner.stream(request) as events:
                yield events
        except EngineFailure:
            self.metrics.errors.labels(provider=self.provider).inc()
            raise
        finally:
            self.metrics.latency.labels(provider=self.provider).observe(time.monotonic() - began)


async def _respond(send: Any, status: int, content_type: str, body: bytes, *extra: tuple[bytes, bytes]) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def metrics_app(daemon: Any, scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answer one ASGI HTTP request for ``/metrics`` (:mod:`roost.protocol._serve_http` routes
    every request of a connection by its own path, so this is one request of a keep-alive one).

    Args:
        daemon: the ServeDaemon (its ``metrics`` and ``options.auth``).
        scope: the request's ASGI scope: ``GET``/``HEAD`` (others get 405; ``HEAD`` gets the
            headers of the ``GET`` answer, no body), its headers the token and Origin checks.
        receive: the ASGI receive callable (a body is read and dropped).
        send: the ASGI send callable.
    """
    from roost.protocol._serve_auth import bearer_token, drain_body

    await drain_body(scope, receive)  # a body (none is expected) read first: keep-alive serves on
    headers = {bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1") for k, v in scope.get("headers") or ()}
    method = scope.get("method") or "GET"
    if "origin" in headers:
        await _respond(send, 403, "text/plain", b"refused: a request with an Origin header is not accepted\n")
        return
    if daemon.options.auth.check(bearer_token(headers.get("authorization"))) is None:
        body = b"unauthorized: send Authorization: Bearer <token>\n"
        await _respond(send, 401, "text/plain", body, (b"www-authenticate", b"Bearer"))
        return
    if method not in ("GET", "HEAD"):
        await _respond(send, 405, "text/plain", b"use GET /metrics\n", (b"allow", b"GET"))
        return
    metrics = getattr(daemon, "metrics", None)
    if metrics is None:
        await _respond(send, 404, "text/plain", b"metrics are not enabled on this daemon\n")
        return
    from prometheus_client import CONTENT_TYPE_LATEST

    body = metrics.exposition()
    start = [(b"content-type", CONTENT_TYPE_LATEST.encode()), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": start})
    await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})
