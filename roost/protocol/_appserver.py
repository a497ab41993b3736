"""The app-server dialect (app-server-protocol.md): one JSONL session over a byte stream.

Requests ``{id, method, params}`` are answered ``{id, result}`` or ``{id, error: {code, message}}``
with the string codes of :mod:`roost.errors`. Requests for one thread (or one run) are handled in
arrival order, so a ``turn/interrupt`` is never overtaken by an earlier ``turn/start``; requests for
different threads run concurrently, so one busy thread never delays another's interrupt. Requests
naming no thread keep their order among themselves; ``initialize`` and ``shutdown`` wait for
everything before them. None waits for a turn to end, so reading never stops while turns run; at
most :data:`MAX_IN_FLIGHT` requests are handled at once (past that, reading pauses:
backpressure). Notifications from every thread this session touched are interleaved with
responses. Server-initiated requests (``approval/request``) are sent only if the client listed
them in ``initialize.params.capabilities.reverse_rpc.methods``.

Method handlers live in ``_as_*`` modules and register themselves with :func:`method`.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from roost import _trace
from roost._json import dumps_line
from roost.actors import Origin, Subscribe
from roost.errors import (
    InvalidRequest,
    MethodNotFound,
    ProtocolError,
    RoostError,
    Unsupported,
)
from roost.protocol._as_early import PROTOCOL_VERSION
from roost.protocol._coalesce import APP_SERVER_DELTAS, app_server_thread_of
from roost.protocol._errors import to_protocol_error, wire_error
from roost.protocol._framing import FrameError
from roost.protocol._outbox import Outbox

__all__ = ["AppServerSession", "method", "immediate", "PROTOCOL_VERSION", "METHODS", "IMMEDIATE"]

log = logging.getLogger("roost.appserver")

Handler = Callable[["AppServerSession", Any], Awaitable[Any]]
#: Requests handled at once per session; past that the reader waits (backpressure on the client).
MAX_IN_FLIGHT = 1024
#: Methods that wait for every earlier request and hold later ones until they finish.
_BARRIERS = frozenset({"initialize", "shutdown"})
#: The acknowledgement events of the request being handled (see :meth:`AppServerSession.after_response`).
_ACKS: contextvars.ContextVar[list] = contextvars.ContextVar("roost_request_acks")
#: The unattended denial's reason for a turn of a client without the ``approval/request`` opt-in.
_NOT_OPTED_IN = (
    "the client that started this turn does not accept approval requests (to be asked, it must list "
    '"approval/request" in initialize capabilities.reverse_rpc.methods; or use permission_mode unconfined)'
)
#: Notifications about the process (not a thread) that only a front process sends (``_as_workers``).
_PROCESS_NOTICES = frozenset({"config/changed", "config/error", "mcp/status/updated"})
#: method name -> handler, filled by the ``_as_*`` modules.
METHODS: dict[str, Handler] = {}
#: A synchronous handler the reader may call as it reads a request: its result, or None to leave
#: the request to the method's ordinary handler (:func:`immediate`).
ImmediateHandler = Callable[["AppServerSession", Any], "dict | None"]
#: method name -> its immediate handler (control before data: see :func:`immediate`).
IMMEDIATE: dict[str, ImmediateHandler] = {}


def method(name: str) -> Callable[[Handler], Handler]:
    """Register ``fn`` as the handler of app-server method ``name``."""

    def register(fn: Handler) -> Handler:
        METHODS[name] = fn
        return fn

    return register


def immediate(name: str) -> Callable[[ImmediateHandler], ImmediateHandler]:
    """Register ``fn`` as the immediate handler of method ``name`` (control before data, issue 19).

    The reader calls it (not a checkpoint) as it reads a ``name`` request, when no earlier request
    with the same ordering key is still being handled, and answers at once with what it returns;
    it returns None (or raises) to leave the request to the ordinary handler, which then runs as
    usual (and reports any error). Under saturation this saves the request task, the thread
    actor's mailbox and the reply: each a whole scheduling batch.
    """

    def register(fn: ImmediateHandler) -> ImmediateHandler:
        IMMEDIATE[name] = fn
        return fn

    return register


class AppServerSession:
    """One client of the app-server.

    Args:
        runtime: the running :class:`~roost.supervisor.Runtime`.
        settings: the default ProviderSettings, or None when no engine is configured.
        setup_issues: why no engine is usable (reported by ``initialize`` as ``needs_setup``).
        host: hosted mode's ``{kind, instance_id, workspace_id}`` (app-server-protocol.md,
            "Hosted processes"), reported by ``initialize``; None for a local server.
    """

    def __init__(self, runtime: Any, *, engines: Any, host: dict | None = None) -> None:
        self.runtime = runtime
        self.engines = engines
        #: hosted mode's identity ``{kind: "cloud", instance_id, workspace_id}``; None when local
        self.host = dict(host) if host else None
        self.settings = engines.default
        self.setup_issues = [engines.setup_error] if engines.setup_error else []
        #: why the store refuses writes (a read-only home, found at start-up): an ``initialize`` issue
        self.store_issue: str | None = getattr(runtime, "read_only", None)
        self.outbox = Outbox(on_overflow=self._on_overflow, coalesce=APP_SERVER_DELTAS, lanes=app_server_thread_of)
        self.capabilities: dict = {}
        #: config/workspace/update defaults (``effort``, ``permission_mode``) of this connection
        self.workspace_defaults: dict[str, Any] = {}
        #: whether an `initialize` was answered (a repeated one keeps what it does not name)
        self.initialized = False
        self.reverse_methods: set[str] = set()
        self._reverse: dict[str, trio.MemorySendChannel] = {}
        self._reverse_counter = 0
        self.subscribed: set[str] = set()
        self.shutdown_requested = False
        self.closed = trio.Event()
        #: set once the first ``initialize`` response is queued
        self.answered_initialize = trio.Event()
        self.nursery: trio.Nursery | None = None
        self.client_name = "client"
        self._chains: dict[str | None, trio.Event] = {}  # ordering key -> done event of its latest request
        self._in_flight = trio.Semaphore(MAX_IN_FLIGHT)
        self._idle = trio.Event()
        self._idle.set()
        self._active_requests = 0
        self._requests: trio.Nursery | None = None  # where request tasks run while reading
        #: the process's :class:`roost.plugins.McpHost` (None: no MCP servers configured)
        self.mcp: Any = None
        #: the first ``initialize`` was answered before the event loop (roost.protocol._as_early)
        self.answered_early = False
        #: the MCP statuses are due once serving starts (after an early answer)
        self.announce_pending = False
        #: the :class:`~roost.protocol._as_workers.WorkerRouter` of this session's worker processes
        self.router: Any = None
        #: whether this session is a worker process's (it sends no process-wide notifications)
        self.worker = False

    def after_response(self) -> trio.Event:
        """An event set right after the current request's response is queued (or its error)."""
        event = trio.Event()
        acks = _ACKS.get(None)
        if acks is None:
            event.set()
        else:
            acks.append(event)
        return event

    def ensure_engine(self, thread: Any) -> None:
        """Fail fast (``invalid_params`` naming the settings) when no engine can serve ``thread``."""
        self.engines.settings_for(thread)

    # -- the Subscriber protocol ----------------------------------------------------------------

    def deliver(self, line: bytes) -> None:
        if self.capabilities.get("deferred_notification_content") is True:
            from roost.protocol._as_content import defer_line  # large content as references

            line = defer_line(line)
        self.outbox.deliver(line)

    def _on_overflow(self) -> None:
        self.closed.set()

    # -- outgoing -------------------------------------------------------------------------------

    def send(self, obj: Any) -> None:
        self.outbox.deliver(dumps_line(obj))

    def notify(self, method_name: str, params: dict) -> None:
        if self.worker and method_name in _PROCESS_NOTICES:
            return  # the front process sends these
        self.deliver(dumps_line({"method": method_name, "params": params}))  # deferral applies

    def on_mcp_status(self, status: dict) -> None:
        """``mcp/status/updated`` with ``status`` (sent once the client has initialized)."""
        if self.initialized:
            self.notify("mcp/status/updated", status)

    def announce_mcp(self, after: trio.Event) -> None:
        """After ``after`` (the first ``initialize`` response), send each MCP server's current status."""
        mcp = self.mcp
        if mcp is None or self.nursery is None:
            return

        async def send() -> None:
            await after.wait()
            for status in mcp.statuses():
                self.notify("mcp/status/updated", status)

        self.nursery.start_soon(send)

    async def subscribe(self, actor: Any) -> None:
        """Receive ``actor``'s notifications from now on (idempotent); for a thread another node
        on the store executes now, that node's notifications of it too (relayed over the bus)."""
        if actor.thread_id not in self.subscribed:
            self.subscribed.add(actor.thread_id)
            await actor.ref.ask(Subscribe(self))
            remote = self.runtime.services.remote
            facts = actor.facts()
            if remote is not None and not facts.ephemeral and not facts.running:
                await remote.follow(actor.thread_id)

    def origin(self) -> Origin:
        """The Origin of work this session starts: approvals come back here (unless the client did
        not opt in to ``approval/request``: then the denial says so, and how to opt in)."""
        if "approval/request" in self.reverse_methods:
            return Origin(client_id=self.client_name, request_approval=self.request_approval)
        return Origin(client_id=self.client_name, no_approver=_NOT_OPTED_IN)

    def next_reverse_id(self) -> str:
        """A new id for a server-initiated request (``roost-N``), unique in this session."""
        self._reverse_counter += 1
        return f"roost-{self._reverse_counter}"

    async def request_approval(self, params: dict) -> bool | None:
        """Send ``approval/request`` and wait for ``{result: {approved: bool}}``.

        Returns:
            The decision; None if the session closed before answering (nobody to ask). A malformed
            answer counts as denied.
        """
        if self.closed.is_set():
            return None
        rid = self.next_reverse_id()
        send, recv = trio.open_memory_channel[Any](1)
        self._reverse[rid] = send
        self.send({"id": rid, "method": "approval/request", "params": params})
        reply: Any = None
        try:
            async with trio.open_nursery() as nursery:

                async def watch_close() -> None:
                    await self.closed.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch_close)
                reply = await recv.receive()
                nursery.cancel_scope.cancel()
        finally:
            self._reverse.pop(rid, None)
        if reply is None:
            return None
        result = reply.get("result") if isinstance(reply, dict) else None
        return bool(isinstance(result, dict) and result.get("approved") is True)

    def _on_reply(self, frame: dict, rid: Any) -> None:
        """Hand the client's answer to a server-initiated request to its waiter. An answer nobody
        waits for gets no reply (it is itself a response: app-server-protocol.md "Server-initiated
        requests" only asks the client to answer), but it is logged with its id: at warning level
        for an id this session never sent (a client bug an operator should see), at debug level
        for a late or repeated answer to one it did (the request was answered, or its turn ended)."""
        channel = self._reverse.get(str(rid))
        if channel is None:
            if self._issued(rid):
                log.debug("app-server: dropped an answer to server request %r: it is no longer pending", rid)
            else:
                log.warning("app-server: dropped an answer to server request %r: no such request was sent", rid)
            return
        try:
            channel.send_nowait(frame)
        except trio.WouldBlock:
            log.debug("app-server: dropped a second answer to server request %r", rid)

    def _issued(self, rid: Any) -> bool:
        """Whether ``rid`` is an id :meth:`next_reverse_id` handed out in this session."""
        text = str(rid)
        number = text.removeprefix("roost-")
        return text.startswith("roost-") and number.isdigit() and 0 < int(number) <= self._reverse_counter

    # -- serving (the frames of :class:`~roost.protocol._as_connection.StdioConnection`) ----------

    def serve_in(self, nursery: trio.Nursery) -> None:
        """Run request tasks and the session's background work in ``nursery`` from now on."""
        self.nursery = self._requests = nursery
        if self.announce_pending:  # initialize was answered before the event loop started
            self.announce_pending = False
            answered = trio.Event()
            answered.set()
            self.announce_mcp(answered)

    async def handle_frame(self, frame: Any) -> None:
        """Take one input frame (a request, a reverse-request reply, or a framing error): answer
        it at once, or start its request task (waiting while ``MAX_IN_FLIGHT`` run, or, for
        ``initialize`` and ``shutdown``, until every earlier request finished)."""
        await self._on_frame(frame)

    async def wait_idle(self) -> None:
        """Wait until no request task is running."""
        await self._idle.wait()

    async def interrupt_all(self) -> None:
        """Interrupt every running turn and wait (at most 15 s) for them to persist; then mark the
        session closed."""
        await self._interrupt_all()

    def input_ended(self) -> None:
        """The client's input ended (end of file, or stdin closed). In a worker process, without
        ``shutdown``, that means the front process went away: the worker ends at once
        (:func:`roost.protocol._as_workers.front_gone`, which does not return)."""
        if self.worker and not self.shutdown_requested:
            from roost.protocol._as_workers import front_gone

            front_gone()

    async def _on_frame(self, frame: Any) -> None:
        if isinstance(frame, FrameError):
            self.send({"id": None, "error": {"code": "parse_error", "message": frame.message}})
            return
        if not isinstance(frame, dict):
            self.send({"id": None, "error": InvalidRequest("a request must be a JSON object").to_wire()})
            return
        rid = frame.get("id")
        name = frame.get("method")
        if name == "turn/interrupt" and _trace.enabled():
            params = frame.get("params")
            _trace.hop("interrupt_read", params.get("turn_id") if isinstance(params, dict) else None)
        if name is None and rid is not None and ("result" in frame or "error" in frame):
            if self.router is None or not self.router.reply(frame):
                self._on_reply(frame, rid)
            return
        if rid is not None and not isinstance(rid, (str, int)) or isinstance(rid, bool):
            self.send({"id": None, "error": InvalidRequest("id must be a string or an integer").to_wire()})
            return
        if not isinstance(name, str) or not name:
            self.send({"id": rid, "error": InvalidRequest("method must be a non-empty string").to_wire()})
            return
        if rid is None:  # app-server-protocol.md: requests carry an id, and the response echoes it
            self.send({"id": None, "error": InvalidRequest(f"{name}: id is required").to_wire()})
            return
        extra = set(frame) - {"id", "method", "params", "jsonrpc"}
        if extra:
            self.send(
                {"id": rid, "error": InvalidRequest(f"unknown envelope field(s): {', '.join(sorted(extra))}").to_wire()}
            )
            return
        if self.router is not None and self.router.route(rid, name, frame.get("params"), frame):
            return
        handler = METHODS.get(name)
        if handler is None and name in UNSUPPORTED_METHODS:
            handler = _unsupported(name)
        params = frame.get("params")
        if name in _BARRIERS or self._requests is None:
            await self._idle.wait()
            await self._run_request(rid, name, handler, params, None, None)
            return
        key = _ordering_key(params)
        if name in IMMEDIATE and key not in self._chains and self._answer_now(rid, name, params):
            return
        try:  # a free slot is taken without a checkpoint: a burst of lines costs no batch per line
            self._in_flight.acquire_nowait()
        except trio.WouldBlock:
            await self._in_flight.acquire()
        previous = self._chains.get(key)
        done = trio.Event()
        self._chains[key] = done
        self._active_requests += 1
        if self._idle.is_set():
            self._idle = trio.Event()
        self._requests.start_soon(self._run_request, rid, name, handler, params, previous, done, key)

    def _answer_now(self, rid: Any, name: str, params: Any) -> bool:
        """Answer request ``rid`` with ``name``'s immediate handler; False: it did not answer."""
        try:
            result = IMMEDIATE[name](self, params)
        except Exception:
            log.debug("%s: left to its ordinary handler", name, exc_info=True)
            return False
        if result is None:
            return False
        self.send({"id": rid, "result": result})
        return True

    async def _run_request(
        self,
        rid: Any,
        name: str,
        handler: Any,
        params: Any,
        previous: trio.Event | None,
        done: trio.Event | None,
        key: str | None = None,
    ) -> None:
        acks: list[trio.Event] = []
        token = _ACKS.set(acks)
        try:
            if previous is not None:
                await previous.wait()
            await self._handle(rid, name, handler, params)
        finally:
            _ACKS.reset(token)
            for ack in acks:
                ack.set()
            if done is not None:
                done.set()
                if self._chains.get(key) is done:
                    del self._chains[key]
                self._in_flight.release()
                self._active_requests -= 1
                if self._active_requests == 0:
                    self._idle.set()

    async def _handle(self, rid: Any, name: str, handler: Any, params: Any) -> None:
        try:
            if handler is None:
                raise MethodNotFound(f"unknown method {name!r}")
            result = await handler(self, params)
        except Exception as exc:
            error = wire_error(exc, context=name)  # the one table (roost.protocol._errors)
        else:
            if rid is not None:
                self.send({"id": rid, "result": result})
            if name == "initialize":
                self.answered_initialize.set()
            return
        self.send({"id": rid, "error": error})

    async def _interrupt_all(self) -> None:
        """End of input: interrupt every running turn and wait (bounded) for them to persist."""
        from roost.actors import InterruptTurn

        actors = [actor for actor in self.runtime.registry.loaded() if actor.facts().running]
        for actor in actors:
            try:
                actor.ref.tell(InterruptTurn(reason="shutdown"))
            except RoostError:
                log.debug("could not interrupt a turn at shutdown", exc_info=True)
        if self.router is not None:
            await self.router.aclose()  # the workers interrupt theirs; their last lines copied
        with trio.move_on_after(15):
            for actor in actors:
                await actor.wait_idle()
        # Only now: a pending approval/request is ended by its turn's interrupt (so the turn settles
        # as interrupted), not answered "nobody to ask" while the turn could still go on.
        self.closed.set()


#: Methods of app-server-protocol.md for product features Roost does not have (spec/README.md:
#: they answer ``unsupported`` rather than ``method_not_found``).
#: Each names the feature it belongs to in its ``unsupported`` message.
_UNSUPPORTED_FEATURES = {
    "engine/update": "external engines (Codex, Claude Code, OpenCode, ACP agents); Roost runs only its built-in engine",
    "engine/auth/methods": "sign-in of external ACP engines; Roost runs only its built-in engine",
    "engine/authenticate": "sign-in of external ACP engines; Roost runs only its built-in engine",
    "engine/auth/cancel": "sign-in of external ACP engines; Roost runs only its built-in engine",
}
UNSUPPORTED_METHODS = frozenset(_UNSUPPORTED_FEATURES)


def _unsupported(name: str) -> Any:
    """The handler of unsupported method ``name``: raises Unsupported naming the missing feature."""

    async def handler(session: AppServerSession, params: Any) -> Any:
        raise Unsupported(f"{name} is not supported: it belongs to {_UNSUPPORTED_FEATURES[name]} (see README.md)")

    return handler


def _ordering_key(params: Any) -> str:
    """The key whose requests must keep their order: the thread (or run) a request names."""
    if isinstance(params, dict):
        for field, prefix in (("thread_id", "thread:"), ("session_id", "thread:"), ("run_id", "run:")):
            value = params.get(field)
            if isinstance(value, str):
                return prefix + value
    return "session"


def max_line_bytes() -> int:
    """The longest request line accepted, in bytes: :func:`roost.protocol._framing.line_limit`."""
    from roost.protocol._framing import line_limit

    return line_limit()


def _map_error(exc: RoostError) -> ProtocolError:
    """Kept for callers of the old name: :func:`roost.protocol._errors.to_protocol_error`."""
    return to_protocol_error(exc)


def initialize_result(session: AppServerSession) -> dict:
    """The ``initialize`` result (docs/app-server.md, "Initialization"):
    :func:`roost.protocol._as_early.server_description` of the session's settings, host and
    runtime owner (``runtime_host.instance_id`` of a local server)."""
    from roost.protocol._as_early import server_description

    return server_description(
        settings=session.settings,
        host=session.host,
        owner=session.runtime.services.owner,
        setup_issues=session.setup_issues,
        config_error=getattr(session.engines, "config_error", None),
        store_issue=session.store_issue,
    )
