"""The A2A endpoint of ``roost serve --a2a`` on the official ``a2a-sdk`` (A2A spec 0.3, JSON-RPC).

wire-protocol.md, appendix "A2A (``serve --a2a``)": agent cards, ``message/send``,
``message/stream``, ``tasks/get`` and ``tasks/cancel`` beside MCP on the daemon's HTTP port. Per
hosted agent ``NAME`` (see :func:`roost.protocol._a2a_host.install_a2a`)::

    GET  /a2a/NAME/.well-known/agent-card.json   its agent card (also at .../agent.json, the
                                                 path of spec 0.2 that RemoteAgent configs read)
    POST /a2a/NAME/                              JSON-RPC 2.0: message/send, message/stream (SSE),
                                                 tasks/get, tasks/cancel, tasks/resubscribe
    GET  /.well-known/agent-card.json            the default agent's card (also /.well-known/agent.json)

Why this integration: Roost runs on trio, and the SDK's *default* request handler
(``DefaultRequestHandler`` with its ``EventQueue`` / ``QueueManager`` / ``AgentExecutor``) is built
on asyncio queues and tasks, so it cannot run in a trio process. The SDK's HTTP application
(``A2AStarletteApplication``: card routes, JSON-RPC parsing and validation into the SDK's pydantic
models, method dispatch, SSE via sse-starlette) is built on Starlette, which is anyio-based and
runs on trio unchanged, and it takes any implementation of the SDK's public ``RequestHandler``
interface. So Roost implements ``RequestHandler`` (:class:`DaemonRequestHandler`) natively on
trio, backed by the daemon's task queue (each call is a daemon task: queue, lease, persistence,
restart resume, unattended approvals), and serves the SDK's app with Hypercorn's trio worker,
like ``/mcp``. The alternative, an asyncio loop in a thread bridged with ``trio.from_thread``,
would need two event loops, thread-safe hand-offs for every event, and the SDK's own in-memory
task store that a daemon restart loses; this way there is one loop and one source of truth (the
``daemon_tasks`` rows). Only public SDK names are used (``a2a.server.apps``,
``a2a.server.request_handlers.RequestHandler``, ``a2a.types``, ``a2a.utils.errors.ServerError``).

Authentication (each request on its own, :class:`A2AAuth`): with daemon tokens every request needs
``Authorization: Bearer <token>`` (401 otherwise); a read token may read agent cards and call
``tasks/get`` and ``tasks/resubscribe``, anything else is refused with 403; a request with an
``Origin`` header is refused with 403 (as ``/mcp``). Each refusal's body is a JSON-RPC error
(-32600), its HTTP status kept. A task belongs to the full token that sent it
(:meth:`DaemonRequestHandler._task`): another full token is answered TaskNotFound. Then
every POST body is checked before the SDK sees it (:mod:`roost.protocol._a2a_gate`: the
``ROOST_MAX_LINE_BYTES`` bound, malformed requests, push notification methods).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any
from urllib.parse import quote

import trio
from a2a.server.apps import A2AStarletteApplication, CallContextBuilder
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import RequestHandler
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentSkill,
    Artifact,
    HTTPAuthSecurityScheme,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    Message,
    MessageSendParams,
    Part,
    PushNotificationNotSupportedError,
    Role,
    SecurityScheme,
    Task,
    TaskArtifactUpdateEvent,
    TaskIdParams,
    TaskNotCancelableError,
    TaskNotFoundError,
    TaskQueryParams,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
    TextPart,
)
from a2a.utils.errors import ServerError
from starlette.applications import Starlette
from starlette.routing import Mount

from roost.errors import InvalidParams, RoostError
from roost.protocol._a2a_gate import QuietSdkErrors, check_request, read_body, refusal, request_of, too_large
from roost.protocol._a2a_host import TERMINAL, A2AHost, HostedAgent
from roost.protocol._framing import line_limit
from roost.protocol._serve_auth import ServeAuth, bearer_token, drain_body

__all__ = ["build_a2a_app", "DaemonRequestHandler", "A2AAuth", "a2a_task", "READ_METHODS"]

#: JSON-RPC methods a read token may call.
READ_METHODS = frozenset({"tasks/get", "tasks/resubscribe"})
#: Seconds ``tasks/cancel`` waits for the interrupted task to end before answering its state.
CANCEL_WAIT = 30.0


class _QuietLegacyCardPath(logging.Filter):
    """Drop the SDK's warning on each read of ``/.well-known/agent.json``: the wire spec names that
    path for ``RemoteAgent`` cards, so every proxy call would log it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Deprecated agent card endpoint")


def build_a2a_app(daemon: Any) -> Any:
    """The A2A ASGI app of ``daemon`` (its ``a2a`` host set by ``install_a2a``): every hosted
    agent's card and JSON-RPC routes (see the module doc), behind :class:`A2AAuth`."""
    sdk_log = logging.getLogger("a2a.server.apps.jsonrpc.jsonrpc_app")
    sdk_log.addFilter(_QuietLegacyCardPath())
    sdk_log.addFilter(QuietSdkErrors())
    limit = line_limit()
    host: A2AHost = daemon.a2a
    routes: list[Any] = []
    for index, agent in enumerate(host.agents):
        app = A2AStarletteApplication(
            agent_card=_card(daemon, agent),
            http_handler=DaemonRequestHandler(host, agent),
            context_builder=_GrantContext(daemon.options.auth),
            max_content_length=limit,
        )
        agent_routes = app.routes()
        routes.append(Mount(f"/a2a/{agent.name}", routes=agent_routes))
        if index == 0:
            routes.extend(r for r in agent_routes if getattr(r, "path", "").startswith("/.well-known/"))
    return A2AAuth(Starlette(routes=routes), daemon.options.auth, limit)


class _GrantContext(CallContextBuilder):
    """The call context of a JSON-RPC request: ``state["grant"]``, its token's
    :class:`~roost.protocol._serve_auth.Grant` (None: refused), for the handler's own check."""

    def __init__(self, auth: ServeAuth) -> None:
        self.auth = auth

    def build(self, request: Any) -> ServerCallContext:
        return ServerCallContext(state={"grant": self.auth.check(bearer_token(request.headers.get("authorization")))})


def _card(daemon: Any, agent: HostedAgent) -> AgentCard:
    options = daemon.options
    host = options.host if options.host not in ("0.0.0.0", "::", "") else socket.gethostname()
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if options.ssl_context is not None else "http"
    card: dict[str, Any] = {
        "name": agent.name,
        "description": agent.description,
        "url": f"{scheme}://{host}:{daemon.http_port}/a2a/{quote(agent.name)}/",
        "version": _version(),
        "capabilities": AgentCapabilities(streaming=True, push_notifications=False),
        "default_input_modes": ["text/plain"],
        "default_output_modes": ["text/plain"],
        "skills": [AgentSkill(id="task", name="task", description=agent.description, tags=["roost"])],
        "preferred_transport": "JSONRPC",
    }
    if options.auth.required:
        card["security_schemes"] = {"bearer": SecurityScheme(root=HTTPAuthSecurityScheme(scheme="bearer"))}
        card["security"] = [{"bearer": []}]
    return AgentCard(**card)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("roost")
    except PackageNotFoundError:
        return "0"


# -- tasks as A2A objects ----------------------------------------------------------------------------


def _state(task: Any, host: A2AHost) -> TaskState:
    if task.status == "queued":
        return TaskState.submitted
    if task.status == "running":
        return TaskState.working
    result = task.result or {}
    if result.get("succeeded"):
        return TaskState.completed
    if host.was_cancelled(task.id) or "interrupted" in (result.get("errorMessage") or ""):
        return TaskState.canceled
    return TaskState.failed


def _text_message(text: str, role: Role, task: Any, suffix: str) -> Message:
    return Message(
        role=role,
        parts=[Part(root=TextPart(text=text))],
        message_id=f"{task.id}-{suffix}",
        task_id=task.id,
        context_id=task.thread,
    )


def a2a_task(task: Any, host: A2AHost) -> Task:
    """The A2A ``Task`` of a daemon task: id its ``sessionId``, contextId its thread's id (the id
    of the context's first task, see :meth:`A2AHost._context`); state ``submitted``
    (queued), ``working`` (running), ``completed``, ``canceled`` or ``failed``; the status message
    the agent's last message (or the error); the ``result`` artifact the last message of a
    completed task; history the caller's message (A2A 0.3 ``Task.history`` is the messages of this task,
    not of its context: the SDK's ``TaskManager`` keeps them so too); metadata ``agent`` and ``lastAgent``."""
    state = _state(task, host)
    result = task.result or {}
    last = result.get("lastMessage")
    text = last if state == TaskState.completed else result.get("errorMessage")
    status = TaskStatus(state=state, message=_text_message(text, Role.agent, task, "status") if text else None)
    artifacts = None
    if state == TaskState.completed and last:
        artifacts = [Artifact(artifact_id=f"{task.id}-result", name="result", parts=[Part(root=TextPart(text=last))])]
    return Task(
        id=task.id,
        context_id=task.thread,
        status=status,
        history=[_text_message(task.task, Role.user, task, "task")],
        artifacts=artifacts,
        metadata={"agent": host.agent_of(task.id), "lastAgent": result.get("lastAgent")},
    )


def _check_history_length(length: int | None) -> None:
    """Raises ServerError (InvalidParams) when a ``historyLength`` is negative."""
    if length is not None and length < 0:
        raise ServerError(InvalidParamsError(message="historyLength must be 0 or more"))


def _history(task: Task, length: int | None) -> Task:
    """``task`` with only its last ``length`` history messages (None: all; 0: none).

    Raises:
        ServerError: InvalidParams, ``length`` is negative.
    """
    _check_history_length(length)
    if length is None:
        return task
    history = task.history or []
    return task.model_copy(update={"history": history[len(history) - length :] if length < len(history) else history})


# -- the SDK's RequestHandler, on the daemon's task queue ---------------------------------------------


class DaemonRequestHandler(RequestHandler):
    """The SDK ``RequestHandler`` of one hosted agent: each message is a daemon task (see the module doc).

        Errors (JSON-RPC, A2A spec 0.3 section 8): a message without text, one continuing a task
        (``taskId`` set: every message starts a new task), or a ``contextId`` that cannot be used
        (another caller's, malformed, its previous task still running: see
        :meth:`A2AHost._context`) -> InvalidParams (-32602); a send with a
        read token -> InvalidRequest (-32600; :class:`A2AAuth` refuses it with 403 first); a full
        queue or a store failure -> InternalError (-32603); an unknown task, or one another full
    token sent -> TaskNotFound (-32001); a negative ``historyLength`` -> InvalidParams (-32602);
        cancelling a finished task -> TaskNotCancelable (-32002); push notifications ->
        PushNotificationNotSupported (-32003; :mod:`roost.protocol._a2a_gate` answers these methods
        first, since the SDK's own capability check would answer ``.../set`` -32603).
    """

    def __init__(self, host: A2AHost, agent: HostedAgent) -> None:
        self.host = host
        self.agent = agent

    async def _start(self, params: MessageSendParams, context: ServerCallContext | None) -> str:
        message = params.message
        if message.task_id:
            raise ServerError(InvalidParamsError(message="each message starts a new task: do not set taskId"))
        text = "\n".join(p.root.text for p in message.parts if isinstance(p.root, TextPart)).strip()
        if not text:
            raise ServerError(InvalidParamsError(message="the message needs a non-empty text part"))
        grant = context.state.get("grant") if context is not None else None
        if grant is None or grant.read_only:
            raise ServerError(
                InvalidRequestError(
                    message="message/send and message/stream need a full token (a read token cannot call them)"
                )
            )
        try:
            return await self.host.call(self.agent.name, text, grant.scope, message.context_id, message.message_id)
        except InvalidParams as exc:
            raise ServerError(InvalidParamsError(message=str(exc))) from None
        except RoostError as exc:
            raise ServerError(InternalError(message=f"the task could not be queued: {exc}")) from None

    async def _task(self, task_id: str, context: ServerCallContext | None) -> Any:
        """The A2A call's task ``task_id`` when the request's token may see it, else None (the
        caller is answered TaskNotFound, as for an unknown id). With daemon tokens a full token
        sees the tasks it sent (their client key is in its scope, as contexts are), a read token
        every task (it sees every task's events on ``/attach`` too); without tokens every caller
        sees every task."""
        task = await self.host.lookup(task_id)
        grant = context.state.get("grant") if context is not None else None
        if task is None or grant is None:
            return None
        if grant.read_only or not self.host.daemon.options.auth.required:
            return task
        return task if (task.client_id or "").startswith(f"{grant.scope}/") else None

    async def on_message_send(self, params: MessageSendParams, context: ServerCallContext | None = None) -> Task:
        """``message/send``: the finished task (``configuration.blocking: false``: the task as
        queued), its history the last ``configuration.historyLength`` messages (all without it)."""
        history_length = params.configuration.history_length if params.configuration else None
        _check_history_length(history_length)  # refused before the task is queued
        session_id = await self._start(params, context)
        blocking = params.configuration is None or params.configuration.blocking is not False
        task = await (self.host.wait_finished(session_id) if blocking else self.host.lookup(session_id))
        if task is None:
            raise ServerError(TaskNotFoundError())
        return _history(a2a_task(task, self.host), history_length)

    async def on_message_send_stream(
        self, params: MessageSendParams, context: ServerCallContext | None = None
    ) -> AsyncGenerator[Any]:
        """``message/stream``: the Task, then a status update per state change (with the task's
        ``metadata``) and the reply text as it streams (artifact ``stream``, appended chunks); at
        the end the ``result`` artifact (a completed task) and the final status update (``final: true``)."""
        session_id = await self._start(params, context)
        async for event in self._follow(session_id):
            yield event

    async def on_resubscribe_to_task(
        self, params: TaskIdParams, context: ServerCallContext | None = None
    ) -> AsyncGenerator[Any]:
        """``tasks/resubscribe``: the same events as ``message/stream`` from the task's current state."""
        if await self._task(params.id, context) is None:
            raise ServerError(TaskNotFoundError())
        async for event in self._follow(params.id):
            yield event

    async def _follow(self, session_id: str) -> AsyncGenerator[Any]:
        # Followed from before the first yield: no reply text streams unseen (the task's runner
        # cannot start before this generator's first checkpoint after the call was queued).
        with self.host.following(session_id) as chunks:
            task = await self.host.lookup(session_id)
            if task is None:
                raise ServerError(TaskNotFoundError())
            current = a2a_task(task, self.host)
            yield current
            state = current.status.state
            sent = 0
            while True:
                if len(chunks) > sent:  # the reply text streamed since the last event
                    text, append, sent = "".join(chunks[sent:]), sent > 0, len(chunks)
                    yield self._chunk(current, text, append)
                if task.status in TERMINAL:
                    break
                task = await self.host.wait_change(session_id, task.status)
                if task is None:
                    raise ServerError(TaskNotFoundError())
                current = a2a_task(task, self.host)
                if current.status.state != state and task.status not in TERMINAL:
                    state = current.status.state
                    yield self._status(current, final=False)
        for artifact in current.artifacts or []:
            yield TaskArtifactUpdateEvent(
                task_id=session_id, context_id=current.context_id, artifact=artifact, last_chunk=True
            )
        yield self._status(current, final=True)

    @staticmethod
    def _chunk(current: Task, text: str, append: bool) -> TaskArtifactUpdateEvent:
        artifact = Artifact(artifact_id=f"{current.id}-stream", name="stream", parts=[Part(root=TextPart(text=text))])
        return TaskArtifactUpdateEvent(
            task_id=current.id, context_id=current.context_id, artifact=artifact, append=append, last_chunk=False
        )

    @staticmethod
    def _status(current: Task, *, final: bool) -> TaskStatusUpdateEvent:
        return TaskStatusUpdateEvent(
            task_id=current.id,
            context_id=current.context_id,
            status=current.status,
            final=final,
            metadata=current.metadata,
        )

    async def on_get_task(self, params: TaskQueryParams, context: ServerCallContext | None = None) -> Task | None:
        """``tasks/get``: the task (also one finished before a daemon restart), its history the
        last ``historyLength`` messages (all without it); None: TaskNotFound."""
        _check_history_length(params.history_length)  # refused before any lookup
        task = await self._task(params.id, context)
        return _history(a2a_task(task, self.host), params.history_length) if task is not None else None

    async def on_cancel_task(self, params: TaskIdParams, context: ServerCallContext | None = None) -> Task | None:
        """``tasks/cancel``: a queued task is withdrawn and answered ``canceled`` at once; a running
        one is interrupted and answered once it ended (at most :data:`CANCEL_WAIT` s later)."""
        task = await self._task(params.id, context)
        if task is None:
            return None
        if task.status in TERMINAL:
            raise ServerError(TaskNotCancelableError(message=f"task {params.id} already ended"))
        deadline = trio.current_time() + CANCEL_WAIT
        await self.host.cancel(task, limit=CANCEL_WAIT)
        task = await self.host.wait_finished(params.id, limit=max(0.0, deadline - trio.current_time()))
        return a2a_task(task, self.host) if task is not None else None

    async def on_set_task_push_notification_config(self, params: Any, context: Any = None) -> Any:
        raise ServerError(PushNotificationNotSupportedError())

    async def on_get_task_push_notification_config(self, params: Any, context: Any = None) -> Any:
        raise ServerError(PushNotificationNotSupportedError())

    async def on_list_task_push_notification_config(self, params: Any, context: Any = None) -> Any:
        raise ServerError(PushNotificationNotSupportedError())

    async def on_delete_task_push_notification_config(self, params: Any, context: Any = None) -> None:
        raise ServerError(PushNotificationNotSupportedError())


# -- authentication ----------------------------------------------------------------------------------

Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]


class A2AAuth:
    """ASGI middleware: the daemon's bearer and read tokens on every A2A request (see the module
    doc), then the body checks of :mod:`roost.protocol._a2a_gate` on every POST (its size bound,
    malformed requests, push notification methods) before the SDK's app.

    Args:
        app: the A2A Starlette app.
        auth: the daemon's tokens.
        limit: the largest request body accepted, in bytes (``ROOST_MAX_LINE_BYTES``).
    """

    def __init__(self, app: Any, auth: ServeAuth, limit: int) -> None:
        self.app = app
        self.auth = auth
        self.limit = limit
        self.router = getattr(app, "router", None)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        raw = scope.get("headers") or ()
        headers = {bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1") for k, v in raw}
        grant = self.auth.check(bearer_token(headers.get("authorization")))
        if "origin" in headers or grant is None:
            await drain_body(scope, receive)  # so that the connection serves on (keep-alive)
            if "origin" in headers:
                await _refuse(send, 403, refusal("Forbidden: a request with an Origin header is not accepted"))
            else:
                await _refuse(send, 401, refusal("Unauthorized: send Authorization: Bearer <token>"))
            return
        if scope.get("method") == "POST":
            body, receive = await read_body(scope, receive, self.limit)
            if body is None:
                await _refuse(send, 413, too_large(self.limit))
                return
            method, request_id = request_of(body)
            if grant.read_only and method not in READ_METHODS:
                await _refuse(send, 403, refusal(_read_only(method or "a request that names no method"), request_id))
                return
            answer = check_request(body)
            if answer is not None:
                await _refuse(send, 200, answer)
                return
        elif grant.read_only and scope.get("method") != "GET":
            await drain_body(scope, receive)
            await _refuse(send, 403, refusal(_read_only(f"HTTP {scope.get('method')}")))
            return
        await self.app(scope, receive, send)


def _read_only(what: str) -> str:
    return f"Forbidden: a read token may read agent cards, tasks/get and tasks/resubscribe, not {what}"


async def _refuse(send: Send, status: int, body: bytes, content_type: bytes = b"application/json") -> None:
    extra = [(b"www-authenticate", b"Bearer")] if status == 401 else []
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *extra],
        }
    )
    await send({"type": "http.response.body", "body": body})
