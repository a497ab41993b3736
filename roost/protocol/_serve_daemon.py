"""``roost serve``: the daemon front door (Unix socket + WebSocket ``/attach``), daemon events.

wire-protocol.md, "Live sessions" (serve socket and serve WebSocket), "Handshake events" (``hello``),
"Input", "Prompts" and "Daemon events (serve socket)". One :class:`ServeDaemon` owns

* the :class:`~roost.actors._taskqueue.TaskQueue` (durable FIFO, ``max_concurrent`` runners),
* the attached clients: a :class:`ClientState` per client key (``<token scope>/<client id>``, or
  one per connection without an id) and a :class:`~roost.actors._connection.ConnectionActor` per
  connection, each with its own bounded :class:`~roost.protocol._outbox.Outbox`,
* approval routing: an ``approval_request`` goes only to the dispatching client's newest connection;
  when that connection drops, the daemon waits ``reconnect_grace`` seconds for the next connection
  with the same key and asks it instead; with nobody back, the unattended policy answers,
* result routing: a task's ``result`` goes to its client, or waits (durably) for its next ``hello``.

Progress events (``agent_starting``, ``tool_calling``, ``token_budget_warning``, ``task_resumed``,
and the additive ``token``) are broadcast to every attached client, encoded once.
A task with an orchestration config (its own, or ``roost serve -c``) is run by that team of agents:
its ``agent_starting`` events name each agent in turn, and its keyword routes' ``route_approval``
prompts go to the dispatching client like tool approvals.

With ``--http-port``, :func:`roost.protocol._serve_http.serve_http` owns the TCP port and serves
``/attach`` (trio-websocket) and ``/mcp`` (the MCP tools) on it; without the ``mcp`` SDK installed
the daemon falls back to trio-websocket's own server for ``/attach`` alone.

The single-daemon rule for the socket path: the daemon holds an exclusive ``flock`` on
``<socket>.lock`` for its lifetime. A second daemon fails to take it and exits non-zero
(:class:`DaemonRunning`); the holder removes a socket file only while holding the lock (so the file
is stale: its daemon is dead) and only after a connect attempt is refused.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import logging
import os
import socket as stdsocket
import ssl
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import trio

import roost.orchestration
from roost._faults import fault_point
from roost._json import JSONDecodeError, dumps_line, loads
from roost._paths import run_dir
from roost.actors import CLOSE_NORMAL, ConnectionActor, QueuedTask, TaskQueue
from roost.errors import ChildNotFound, ConfigError, LifecycleError, RoostError, ServerOverloaded
from roost.protocol._coalesce import WIRE_TOKENS
from roost.protocol._errors import to_protocol_error
from roost.protocol._framing import FrameError, LineDecoder, line_limit, read_frames
from roost.protocol._outbox import DEFAULT_OUTBOX_LINES, Outbox, stall_timeout_from_env
from roost.protocol._serve_auth import ServeAuth, bearer_token, parse_client_id
from roost.protocol._serve_events import TaskEventTranslator, approval_event, result_event
from roost.protocol._serve_listeners import run_http_listener, run_unix_listener
from roost.protocol._websocket import ServerWebSocket, accept_websocket, read_request, reject_websocket
from roost.supervisor import ChildSpec, Restart, Supervisor

__all__ = [
    "ServeOptions",
    "ServeDaemon",
    "DaemonRunning",
    "SocketPathTaken",
    "default_socket_path",
    "claim_socket_path",
    "PROTOCOL_VERSION",
]

log = logging.getLogger("roost.serve")

PROTOCOL_VERSION = 1
#: Longest input line accepted on the Unix socket (bytes), as the JSONL framing (DESIGN.md section 5).
MAX_LINE_BYTES = 64 << 20
_anon = itertools.count(1)
#: Tasks whose approval records (:meth:`ServeDaemon.approvals_of`) are kept.
_APPROVALS_KEPT = 1000


class DaemonRunning(ConfigError):
    """Another live ``roost serve`` owns this socket path."""


class SocketPathTaken(DaemonRunning):
    """Something that is not a socket (a regular file, a directory, a symlink) is at the socket path."""


def default_socket_path(work_dir: Path) -> Path:
    """``$ROOST_HOME/run/<first 16 hex digits of sha256(work dir)>.sock``."""
    digest = hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:16]
    return run_dir() / f"{digest}.sock"


def claim_socket_path(path: Path) -> int:
    """Take the single-daemon lock of ``path`` and remove a stale socket file; return the lock fd.

    Raises:
        DaemonRunning: another daemon holds the lock, or something accepts connections on ``path``.
        SocketPathTaken: ``path`` exists and is not a socket (it is left untouched).
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise DaemonRunning(f"another roost serve is already running on {path}") from None
        raise
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISSOCK(mode):
        # Issue 18, finding 7: only a socket is ever removed; a file, directory or symlink at the
        # path is somebody's data.
        os.close(fd)
        kind = "directory" if stat.S_ISDIR(mode) else "symbolic link" if stat.S_ISLNK(mode) else "file"
        raise SocketPathTaken(
            f"{path} exists and is a {kind}, not a socket; not removing it. "
            "Move it away or give another path with --socket"
        )
    if mode is not None:
        probe = stdsocket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
        probe.settimeout(2.0)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink(missing_ok=True)  # stale: its daemon is dead (we hold the lock)
        else:
            os.close(fd)
            raise DaemonRunning(f"a daemon is accepting connections on {path}; not displacing it")
        finally:
            probe.close()
    return fd


@attrs.define(kw_only=True)
class ServeOptions:
    """The daemon's settings (see ``roost serve --help`` for each)."""

    socket_path: Path
    work_dir: Path
    http_port: int | None = None
    host: str = "127.0.0.1"
    ssl_context: ssl.SSLContext | None = None
    auth: ServeAuth = attrs.field(factory=ServeAuth)
    reconnect_grace: float = 30.0
    unattended_policy: str = "deny"
    max_concurrent: int = 1
    max_queued: int = 1000
    outbox_lines: int = DEFAULT_OUTBOX_LINES
    kick_grace: float = 10.0
    permission_mode: str = "standard"
    warn_threshold: int | None = None
    agent_name: str = "assistant"
    #: the orchestration config (absolute path) of tasks dispatched without one (``-c``); None: one agent
    config: str | None = None
    #: add ``"t"`` (unix seconds, float) to each broadcast event when it is emitted (benchmarks)
    stamp_events: bool = False
    #: a headless worker of ``roost serve --workers`` (no listeners, no clients; ``--worker``)
    headless: bool = False
    #: whether this process's runners claim tasks (hidden ``--no-claim``: a front door only)
    claims: bool = True


@attrs.define(eq=False)
class _Pending:
    """An approval waiting for its client."""

    event: dict
    asked: Any = None  # the connection last asked
    answer: bool | None = None
    done: bool = False


@attrs.define(eq=False)
class ClientState:
    """One client: every connection with its key (the newest is the live one), its approvals."""

    key: str
    client_id: str | None
    anonymous: bool
    conns: list = attrs.field(factory=list)
    approval_lock: trio.Lock = attrs.field(factory=trio.Lock)
    pending: _Pending | None = None
    changed: trio.Event = attrs.field(factory=trio.Event)

    def live(self) -> ConnectionActor | None:
        for conn in reversed(self.conns):
            if conn.alive:
                return conn
        return None

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


class ServeDaemon:
    """The daemon: clients, broadcast, approval and result routing, listeners (see the module doc)."""

    def __init__(
        self, runtime: Any, options: ServeOptions, *, provider: str | None, model: str | None, engines: Any = None
    ) -> None:
        self.runtime = runtime
        self.options = options
        #: set by ``roost serve`` when its Scheduler runs (``TaskOutcomes`` of roost.actors._scheduler)
        self.outcomes: Any = None
        #: set by ``roost serve``: the ``DaemonMetrics`` of roost.protocol._serve_metrics (``/metrics``)
        self.metrics: Any = None
        self.queue = TaskQueue(
            runtime,
            self,
            provider=provider,
            model=model,
            max_concurrent=options.max_concurrent,
            max_queued=options.max_queued,
            unattended_policy=options.unattended_policy,
            permission_mode=options.permission_mode,
            default_work_dir=str(options.work_dir),
            default_config=options.config,
            engines=engines,
            orchestrations=roost.orchestration,
        )
        self.queue.claims = options.claims
        #: the front door's :class:`roost.cli._serve_workers.WorkerPool` (``--workers``), else None
        self.workers: Any = None
        self.clients: dict[str, ClientState] = {}
        self.connections: set[ConnectionActor] = set()
        self._translators: dict[str, TaskEventTranslator] = {}
        self._resume_told: set[str] = set()
        self.nursery: trio.Nursery | None = None
        #: the running ``connections`` supervisor (a fresh one after each restart)
        self.connection_supervisor: Supervisor | None = None
        self.http_port: int | None = None
        self.events_broadcast = 0
        self.max_line_bytes = line_limit()
        self._approvals: dict[str, list[dict]] = {}

    # -- running ------------------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Restore tasks, then add the daemon's children to the root supervisor; serve until cancelled.

        The children (DESIGN.md section 2), each restarted as a fresh instance after a crash:
        ``task_queue`` (permanent; rebuilds from the store), ``connections`` (permanent
        supervisor of one temporary child per attached client), ``listener:unix`` and, with
        ``--http-port``, ``listener:http`` (permanent; a restart binds the same path / port
        again and leaves the attached clients alone). ``task_status.started()`` is called once
        the listeners accept connections; on exit the children are stopped in reverse order.
        """
        root = self.runtime.root
        added: list[str] = []
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                await self.queue.restore()
                for spec in self._child_specs():
                    await root.start_child(spec)
                    added.append(spec.id)
                task_status.started()
                await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                for child_id in reversed(added):
                    try:
                        await root.terminate_child(child_id)
                    except ChildNotFound:
                        pass
            try:
                if not self.options.headless and stat.S_ISSOCK(os.lstat(self.options.socket_path).st_mode):
                    self.options.socket_path.unlink(missing_ok=True)
            except FileNotFoundError:
                pass
            except OSError:
                log.warning("could not remove the socket %s", self.options.socket_path, exc_info=True)

    def _child_specs(self) -> list[ChildSpec]:
        specs = [ChildSpec("task_queue", self.queue.run, restart=Restart.PERMANENT, shutdown_timeout=15)]
        if self.options.headless:  # a worker of ``roost serve --workers``: no clients
            return specs
        specs += [
            ChildSpec.of_factory("connections", self._new_connections, restart=Restart.PERMANENT, shutdown_timeout=15),
            ChildSpec("listener:unix", self._run_unix_listener, restart=Restart.PERMANENT, shutdown_timeout=5),
        ]
        if self.options.http_port is not None:
            specs.append(
                ChildSpec("listener:http", self._run_http_listener, restart=Restart.PERMANENT, shutdown_timeout=5)
            )
        return specs

    def _new_connections(self) -> Supervisor:
        supervisor = Supervisor(name="connections", intensity=1000, period=1, stop_together=True)
        self.connection_supervisor = supervisor
        return supervisor

    def start_connection(self, serve: Callable[[], Awaitable[None]], stream: trio.abc.AsyncResource) -> None:
        """Run ``serve()`` as a temporary child ``connection:<n>`` of the connections supervisor;
        ``stream`` is closed when it ends (at once, when that supervisor is not running)."""
        number = next(_connection_numbers)

        async def start(*, task_status: Any) -> None:
            task_status.started()
            try:
                await serve()
            finally:
                await trio.aclose_forcefully(stream)

        spec = ChildSpec(f"connection:{number}", start, restart=Restart.TEMPORARY, shutdown_timeout=10)
        try:
            if self.connection_supervisor is None:
                raise LifecycleError("no connections supervisor")
            self.connection_supervisor.start_child_soon(spec)
        except LifecycleError:
            log.warning("serve: connection refused while the connections supervisor restarts")
            if self.nursery is not None:
                self.nursery.start_soon(trio.aclose_forcefully, stream)

    async def _run_unix_listener(self, *, task_status: Any) -> None:
        await run_unix_listener(self, task_status=task_status)

    async def _run_http_listener(self, *, task_status: Any) -> None:
        await run_http_listener(self, task_status=task_status)

    # -- transports ---------------------------------------------------------------------------------

    async def serve_unix(self, stream: trio.SocketStream) -> None:
        """Serve one accepted Unix-socket client until it leaves."""

        async def close(code: int, reason: str) -> None:
            await stream.aclose()

        await self._attach(
            _unix_lines(stream, self.max_line_bytes), stream, close, scope="unix", client_id=None, read_only=False
        )

    async def serve_attach(self, stream: trio.abc.Stream, head: bytes) -> None:
        """Serve one WebSocket handshake (``/attach``) read as ``head`` from ``stream`` (wsproto,
        see :mod:`roost.protocol._websocket`): Origin, token and client-id checks, then attach."""
        ws, request = read_request(head)
        if request is None:
            await reject_websocket(stream, ws, 400, b"bad request: expected a WebSocket handshake\n")
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.extra_headers}
        if request.target.split("?", 1)[0] != "/attach":
            await reject_websocket(stream, ws, 404, b"not found: the WebSocket endpoint is /attach\n")
            return
        if "origin" in headers:
            await reject_websocket(stream, ws, 403, b"refused: a handshake with an Origin header is not accepted\n")
            return
        grant = self.options.auth.check(bearer_token(headers.get("authorization")))
        if grant is None:
            await reject_websocket(
                stream,
                ws,
                401,
                b"unauthorized: send Authorization: Bearer <token>\n",
                headers=[(b"WWW-Authenticate", b"Bearer")],
            )
            return
        try:
            client_id = parse_client_id(headers.get("fuseraft-client-id"))
        except ValueError as exc:
            await reject_websocket(stream, ws, 400, f"{exc}\n".encode())
            return
        try:
            socket = await accept_websocket(stream, ws, max_message_bytes=MAX_LINE_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return

        async def frames() -> AsyncIterator[str | FrameError]:
            # each message is exactly one line (docs/wire.md): one terminator at its end is allowed,
            # a newline inside it is a parse_error and nothing of it becomes input
            decoder = LineDecoder(max_line_bytes=self.max_line_bytes, parse=False, strict_utf8=True)
            async for message in socket.messages():
                line = message[:-1] if message.endswith(b"\n") else message
                if b"\n" in line:
                    yield FrameError("a WebSocket message is one line: it must not contain a newline")
                    continue
                for frame in decoder.feed(line + b"\n"):
                    yield frame

        await self._attach(
            frames(),
            _WebSocketLines(socket),
            socket.aclose,
            scope=grant.scope,
            client_id=client_id,
            read_only=grant.read_only,
        )

    # -- clients ------------------------------------------------------------------------------------

    def _client(self, key: str, client_id: str | None = None, *, anonymous: bool | None = None) -> ClientState:
        client = self.clients.get(key)
        if client is None:
            anon = ("/conn-" in key) if anonymous is None else anonymous
            client = self.clients[key] = ClientState(key=key, client_id=client_id, anonymous=anon)
        return client

    async def _attach(
        self,
        frames: AsyncIterator[str | FrameError],
        stream: Any,
        close: Any,
        *,
        scope: str,
        client_id: str | None,
        read_only: bool,
    ) -> None:
        key = f"{scope}/{client_id}" if client_id else f"{scope}/conn-{next(_anon)}"
        client = self._client(key, client_id, anonymous=client_id is None)
        holder: list[ConnectionActor] = []
        outbox = Outbox(
            self.options.outbox_lines,
            coalesce=WIRE_TOKENS,
            stall_timeout_s=stall_timeout_from_env(),
            on_overflow=lambda: holder[0].kick(f"slow consumer: {outbox.reason}"),
        )
        conn = ConnectionActor(
            outbox=outbox,
            handle_line=self._handle,
            close=close,
            kick_grace=self.options.kick_grace,
            client=client,
            read_only=read_only,
        )
        holder.append(conn)
        for old in list(client.conns):
            old.kick("replaced by a newer connection with the same client id", code=CLOSE_NORMAL)
        client.conns.append(conn)
        self.connections.add(conn)
        self._hello(conn, client_id=client_id)
        client.notify()
        log.info(
            "client %s connected (%s)",
            key,
            scope,
            extra={"event": "client_connected", "client": key, "conn": str(conn.id), "read_only": read_only},
        )
        try:
            await conn.run(frames, stream)
        except Exception:
            # A bug in serving one client must not take the daemon (and every other client) down.
            log.exception("serve: connection %s failed", conn.id)
        finally:
            log.info("client %s dropped", key, extra={"event": "client_dropped", "client": key, "conn": str(conn.id)})
            self.connections.discard(conn)
            if conn in client.conns:
                client.conns.remove(conn)
            client.notify()
            if client.anonymous and not client.conns and client.pending is None:
                self.clients.pop(key, None)

    def _hello(self, conn: ConnectionActor, *, client_id: str | None) -> None:
        key = conn.client.key
        in_flight = self.queue.in_flight(key)
        first = None
        if in_flight:
            task = in_flight[0]
            first = {
                "sessionId": task.id,
                "task": task.task,
                "status": task.status,
                "position": self.queue.position(task.id),
            }
        done = self.queue.uncollected(key)
        conn.send(
            {
                "type": "hello",
                "protocolVersion": PROTOCOL_VERSION,
                "clientId": client_id,
                "readOnly": conn.read_only,
                "inFlight": first,
                "pendingResults": [t.id for t in done],
            }
        )
        for task in done:
            conn.send(self._result(task))
            self._spawn(self.queue.mark_collected, task.id)
        for task in in_flight:
            if task.resumed and task.status == "running" and task.id not in self._resume_told:
                self._resume_told.add(task.id)
                conn.send({"type": "task_resumed", "sessionId": task.id, "task": task.task})

    def _spawn(self, fn: Any, *args: Any) -> None:
        if self.nursery is not None:
            self.nursery.start_soon(_logged, fn, *args)

    def broadcast(self, event: dict) -> None:
        """Queue ``event`` for every attached client (encoded once; never blocks)."""
        if self.options.stamp_events:
            event["t"] = time.time()
        line = dumps_line(event)
        self.events_broadcast += 1
        for conn in list(self.connections):
            conn.send_line(line)

    # -- input --------------------------------------------------------------------------------------

    async def _handle(self, conn: ConnectionActor, line: str | FrameError) -> None:
        """Handle one input line: plain text is a task; a line starting with ``{`` or ``[`` must be
        a JSON object input message (anything else there gets an ``invalid_request`` error and is
        not queued). An oversized or undecodable line (a :class:`FrameError` of the framing) gets
        a ``parse_error`` error and never becomes input."""
        fault_point("connection")
        if isinstance(line, FrameError):
            conn.send(_error(line.message, line.code))
            return
        text = line.strip()
        if not text:
            return
        if not text.startswith(("{", "[")):  # a plain text line is a task
            await self._dispatch(conn, text)
            return
        message = _json_object(text)
        if message is None:
            conn.send(
                _error(
                    "the line starts like JSON but is not a JSON object; send a JSON input "
                    "message or plain text (not starting with '{' or '[')",
                    "invalid_request",
                )
            )
            return
        kind = message.get("type")
        if kind == "user_input":
            if message.get("images"):
                conn.send(_error("images aren't supported on the serve socket", "unsupported"))
                return
            body = message.get("text")
            if not isinstance(body, str) or not body.strip():
                conn.send(_error("user_input needs a non-empty text", "invalid_params"))
                return
            await self._dispatch(conn, body)
        elif kind == "approval_response":
            self._answer(conn, message.get("approved") is True)
        elif kind == "interrupt":
            if conn.read_only:
                conn.send(_error("a read-only client cannot interrupt", "read_only"))
            elif not await self.queue.interrupt_everywhere(conn.client.key):
                conn.send(_error("none of your tasks is running", "invalid_request"))
        elif kind == "status":  # additive (issue 17): see roost.protocol._serve_status
            from roost.protocol._serve_status import status_snapshot

            conn.send(status_snapshot(self))
        elif kind == "question_response":
            conn.send(_error("no question is pending", "invalid_request"))
        else:
            conn.send(_error(f"unknown input type {kind!r}", "invalid_request"))

    async def _dispatch(self, conn: ConnectionActor, text: str) -> None:
        if conn.read_only:
            conn.send(_error("this client attached with a read token: it cannot dispatch tasks", "read_only"))
            return
        try:
            task_id = await self.queue.dispatch(text, client_id=conn.client.key, source="client")
        except ServerOverloaded as exc:
            conn.send(_error(str(exc), exc.code))
            return
        except RoostError as exc:
            error = to_protocol_error(exc, context="serve dispatch")  # the same table as the app-server
            conn.send(_error(f"the task could not be queued: {error.message}", error.code))
            return
        conn.send({"type": "queued", "sessionId": task_id, "position": self.queue.position(task_id) or 0})

    def _answer(self, conn: ConnectionActor, approved: bool) -> None:
        client = conn.client
        pending = client.pending
        if pending is None or pending.done or pending.asked is None:
            conn.send(_error("no approval is pending", "invalid_request"))
            return
        pending.answer, pending.done = approved, True
        client.notify()

    # -- TaskListener -------------------------------------------------------------------------------

    def _translator(self, task: QueuedTask) -> TaskEventTranslator:
        translator = self._translators.get(task.id)
        if translator is None:
            threshold = self.options.warn_threshold
            if task.orchestrated and threshold is not None and _config_budget(task.config) is not None:
                threshold = None  # the config's own token budget warns instead
            translator = self._translators[task.id] = TaskEventTranslator(
                task.id, self.options.agent_name, warn_threshold=threshold, orchestrated=task.orchestrated
            )
        return translator

    def task_started(self, task: QueuedTask) -> None:
        self._translator(task)
        if task.resumed:
            owner = self.clients.get(task.client_id or "")
            if owner is not None and owner.live() is not None:
                self._resume_told.add(task.id)
            self.broadcast({"type": "task_resumed", "sessionId": task.id, "task": task.task})

    def task_notification(self, task: QueuedTask, method: str, params: dict) -> None:
        if self.metrics is not None:
            self.metrics.notification(method, params)
        for event in self._translator(task).translate(method, params):
            self.broadcast(event)

    def task_event(self, task: QueuedTask, event: dict) -> None:
        """Broadcast the daemon events of an orchestrated task's run event (see
        :meth:`TaskEventTranslator.run_event`: ``agent_starting`` and ``token_budget_warning``)."""
        for out in self._translator(task).run_event(event):
            self.broadcast(out)

    async def request_approval(self, task: QueuedTask, params: dict) -> bool | None:
        """:meth:`_ask_client`, recording who answered for :meth:`approvals_of` (MCP ``get_result``)."""
        answer = await self._ask_logged(task, params)
        record = {
            "kind": params.get("kind"),
            "approved": answer if answer is not None else self.options.unattended_policy == "allow",
            "answeredBy": "client" if answer is not None else "unattended",
        }
        self._approvals.setdefault(task.id, []).append(record)
        while len(self._approvals) > _APPROVALS_KEPT:
            self._approvals.pop(next(iter(self._approvals)))
        return answer

    def approvals_of(self, task_id: str) -> list[dict]:
        """``[{kind, approved, answeredBy: "client" | "unattended"}]`` of a task's approvals, in
        order (kept in memory for the latest tasks only; empty after a daemon restart)."""
        return list(self._approvals.get(task_id, []))

    async def _ask_logged(self, task: QueuedTask, params: dict) -> bool | None:
        """Ask the task's client (see the module doc); None = nobody answered (unattended policy).

        A tool approval (with an ``item_id``) first announces its tool call (``tool_calling``); a
        route approval has no tool call, so nothing is announced for it.
        """
        item_id = params.get("item_id")
        if item_id is not None:
            for event in self._translator(task).announce(item_id):
                self.broadcast(event)
        log.info(
            "task %s asks approval: %s",
            task.id,
            params.get("kind") or params.get("tool") or "approval",
            extra={
                "event": "approval_asked",
                "task_id": task.id,
                "client": task.client_id,
                "kind": params.get("kind"),
                "tool": params.get("tool") or params.get("name"),
            },
        )
        answer = await self._ask_client(task, params)
        log.info(
            "task %s approval %s",
            task.id,
            "unanswered (unattended policy decides)" if answer is None else "approved" if answer else "denied",
            extra={"event": "approval_answered", "task_id": task.id, "client": task.client_id, "approved": answer},
        )
        return answer

    async def _ask_client(self, task: QueuedTask, params: dict) -> bool | None:
        if task.client_id is None or task.foreign or self.options.headless:
            # a task dispatched on another node of the cluster: its client is not attached here
            # (client ids are per node; its relay asked there first); the unattended policy decides
            return None
        client = self._client(task.client_id)
        async with client.approval_lock:
            pending = client.pending = _Pending(event=approval_event(task.id, params))
            deadline: float | None = None
            try:
                while not pending.done:
                    conn = client.live()
                    if conn is None:
                        if client.anonymous:
                            return None
                        if deadline is None:
                            deadline = trio.current_time() + self.options.reconnect_grace
                        if trio.current_time() >= deadline:
                            log.info("task %s: no client back within the grace; unattended policy", task.id)
                            return None
                        changed = client.changed
                        with trio.move_on_at(deadline):
                            await changed.wait()
                        continue
                    deadline = None
                    if pending.asked is not conn:
                        pending.asked = conn
                        conn.send(pending.event)
                    await client.changed.wait()
                return pending.answer
            finally:
                client.pending = None

    def task_finished(self, task: QueuedTask) -> None:
        if self.outcomes is not None:  # the scheduler waits on the runs it started
            self.outcomes.finished_task(task)
        if self.metrics is not None:
            self.metrics.task_finished(task)
        self._translators.pop(task.id, None)
        self._resume_told.discard(task.id)
        if task.foreign or self.options.headless:  # its dispatching node tells its client
            return
        client = self.clients.get(task.client_id or "")
        conn = client.live() if client is not None else None
        if conn is not None:
            conn.send(self._result(task))
            self._spawn(self.queue.mark_collected, task.id)
        elif task.client_id is None or (client is not None and client.anonymous) or "/conn-" in (task.client_id or ""):
            self._spawn(self.queue.mark_collected, task.id)  # nobody can ever collect it

    def result_of(self, task: QueuedTask) -> dict:
        """The ``result`` event of a finished task."""
        return self._result(task)

    def _result(self, task: QueuedTask) -> dict:
        result = task.result or {}
        return result_event(
            session_id=task.id,
            task=task.task,
            succeeded=bool(result.get("succeeded")),
            error_message=result.get("errorMessage"),
            last_agent=result.get("lastAgent"),
            last_message=result.get("lastMessage"),
        )


class _WebSocketLines:
    """A SendStream-like adapter: each line of the outbox's writes becomes one text message.

    A burst of lines (the outbox writer coalesces them) is sent as one write of frames encoded by
    wsproto (:func:`roost.protocol._websocket.text_frame`, encoded once for every client).
    """

    def __init__(self, socket: ServerWebSocket) -> None:
        self.socket = socket

    async def send_all(self, data: bytes) -> None:
        await self.socket.send_lines(line for line in data.split(b"\n") if line)


async def _unix_lines(stream: trio.abc.ReceiveStream, limit: int) -> AsyncIterator[str | FrameError]:
    """Input lines of a byte stream (the framing's text mode: UTF-8, at most ``limit`` bytes each,
    an oversized or invalid line as a :class:`FrameError`); ends at end of file."""
    try:
        async for frame in read_frames(stream, LineDecoder(max_line_bytes=limit, parse=False, strict_utf8=True)):
            yield frame
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return


def _config_budget(path: str | None) -> int | None:
    """The ``token_budget`` of the orchestration config at ``path`` (None: none, or unreadable:
    the task then fails on its own when it loads the config)."""
    if not path:
        return None
    try:
        return roost.orchestration.token_budget(roost.orchestration.load_config_file(path).termination)
    except (RoostError, OSError):
        log.debug("no token budget from %s (the task reports the config itself)", path, exc_info=True)
        return None


def _json_object(text: str) -> dict | None:
    """``text`` parsed as a JSON object, or None when it is not valid JSON or not an object."""
    try:
        message = loads(text)
    except (JSONDecodeError, ValueError):
        return None
    return message if isinstance(message, dict) else None


def _error(text: str, code: str) -> dict:
    return {"type": "error", "text": text, "code": code}


async def _logged(fn: Any, *args: Any) -> None:
    try:
        await fn(*args)
    except RoostError:
        log.exception("serve: background step failed")


_connection_numbers = itertools.count(1)
