"""``roost serve``: the daemon front door (Unix socket + WebSocket ``/attach``), daemon events.

wire-protocol.md, "Live sessions" (serve socket and serve WebSocket), "Handshake events" (``hello``),
"Input", "Prompts" and "Daemon events (serve socket)". One :class:`ServeDaemon` owns

* the :class:`~roost.actors._taskqueue.TaskQueue` (durable FIFO, ``max_concurrent`` runners),
* the attached clients: a :class:`ClientState` per client key (``<token scope>/<client id>``, or
  one per connection without an id) and a :class:`~roost.actors._connection.ConnectionActor` per
  connection, each with its own bounded :class:`~roost.protocol._outbox.Outbox`,
* approval routing: an ``approval_request`` goes only to the dispatching client's newest connection;
  when that connection drops, the daemon waits ``reconnect_grace`` seconds for the next connection
  with the same key and asks it instead; with nobody back, the unattended policy answers (an
  ``ask_user`` ``question`` follows the same rules, :mod:`roost.protocol._serve_prompts`),
* result routing: a task's ``result`` goes to its client, or waits (durably) for its next ``hello``.

Progress events (``agent_starting``, ``tool_calling``, ``token_budget_warning``, ``task_resumed``,
and the additive ``token``) are broadcast to every attached client, encoded once.
A task with an orchestration config (its own, or ``roost serve -c``) is run by that team of agents:
its ``agent_starting`` events name each agent in turn, and its keyword routes' ``route_approval``
prompts go to the dispatching client like tool approvals.

With ``--http-port``, :func:`roost.protocol._serve_http.serve_http` owns the TCP port and serves
``/attach`` (trio-websocket) and ``/mcp`` (the MCP tools) on it; without the ``mcp`` SDK installed
the daemon falls back to trio-websocket's own server for ``/attach`` alone.

Around it: the single-daemon rule for the socket path (:class:`DaemonRunning`, re-exported here)
is :mod:`roost.protocol._serve_socket`; :class:`ServeOptions` and :class:`ClientState` are
:mod:`roost.protocol._serve_state`; input lines are handled by :mod:`roost.protocol._serve_input`.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

import roost.orchestration
from roost._json import dumps_line
from roost.actors import CLOSE_NORMAL, ConnectionActor, QueuedTask, TaskQueue
from roost.errors import ChildNotFound, LifecycleError, RoostError
from roost.protocol._coalesce import WIRE_TOKENS
from roost.protocol._framing import FrameError, LineDecoder, line_limit, read_frames
from roost.protocol._outbox import Outbox, stall_timeout_from_env
from roost.protocol._serve_auth import bearer_token, parse_client_id
from roost.protocol._serve_events import TaskEventTranslator, approval_event, result_event
from roost.protocol._serve_input import handle_line
from roost.protocol._serve_listeners import run_http_listener, run_unix_listener
from roost.protocol._serve_prompts import prompt_client, question_event
from roost.protocol._serve_socket import DaemonRunning, SocketPathTaken, claim_socket_path, default_socket_path
from roost.protocol._serve_state import ClientState, ServeOptions
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
#: Makes this process's anonymous client keys (``<scope>/conn-<nonce>-<n>``) its own: tasks are
#: stored with their client's key, and neither a node of the cluster nor this daemon restarted
#: may take another process's anonymous client for one of its own (its inFlight, approvals, result).
_ANON_NONCE = secrets.token_hex(4)
#: Tasks whose approval records (:meth:`ServeDaemon.approvals_of`) are kept.
_APPROVALS_KEPT = 1000


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
        #: set by ``roost serve --a2a``: the ``A2AHost`` of roost.protocol._a2a_host (``/a2a/``)
        self.a2a: Any = None
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
        key = f"{scope}/{client_id}" if client_id else f"{scope}/conn-{_ANON_NONCE}-{next(_anon)}"
        client = self._client(key, client_id, anonymous=client_id is None)
        if client_id:  # its tasks of other nodes of the cluster (the hello's inFlight, pendingResults)
            await self.queue.adopt_client(key)
        holder: list[ConnectionActor] = []
        outbox = Outbox(
            self.options.outbox_lines,
            coalesce=WIRE_TOKENS,
            stall_timeout_s=stall_timeout_from_env(),
            on_overflow=lambda: holder[0].kick(f"slow consumer: {outbox.reason}"),
        )
        conn = ConnectionActor(
            frames=frames,
            stream=stream,
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
            await conn.run()
        except Exception:
            # A bug in serving one client ends that connection only: the crash goes to the
            # connections supervisor (a temporary child, logged and not restarted).
            log.exception("serve: connection %s failed", conn.id)
            raise
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
        """Queue ``event`` for every attached client (encoded once, not at all with none attached;
        never blocks)."""
        if not self.connections:
            return
        if self.options.stamp_events:
            event["t"] = time.time()
        line = dumps_line(event)
        self.events_broadcast += 1
        for conn in list(self.connections):
            conn.send_line(line)

    # -- input --------------------------------------------------------------------------------------

    async def _handle(self, conn: ConnectionActor, line: str | FrameError) -> None:
        """Handle one input line of ``conn`` (:func:`roost.protocol._serve_input.handle_line`)."""
        await handle_line(self, conn, line)

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
        if self.options.headless:
            # a worker of roost serve --workers has no clients: the front door renders the
            # relayed notifications (each token's translation was 5 % of a worker's CPU)
            return
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
        if task.foreign and task.client_id is not None:
            # dispatched on another node: its client is asked there (over the bus)
            return await self.queue.ask_dispatcher(task, params)
        answer = await self._prompt(task, approval_event(task.id, params), "approval")
        return None if answer is None else answer is True

    async def _prompt(self, task: QueuedTask, event: dict, kind: str) -> Any:
        """Ask ``event`` of the task's client (None at once for a task without one here, and for
        a question of a task another node dispatched: questions are not forwarded over the bus)."""
        if task.client_id is None or task.foreign or self.options.headless:
            return None
        client = self._client(task.client_id)
        return await prompt_client(client, event, kind, grace=self.options.reconnect_grace, task_id=task.id)

    async def ask_question(self, task: QueuedTask, params: dict) -> str | None:
        """A task's ``ask_user`` question, asked of its client with the approvals' grace and
        unattended rules (:mod:`roost.protocol._serve_prompts`); None: skipped or unanswered."""
        for event in self._translator(task).announce(params.get("item_id")):
            self.broadcast(event)
        answer = await self._prompt(task, question_event(task.id, params), "question")
        log.info(
            "task %s question %s",
            task.id,
            "answered" if answer is not None else "skipped or unanswered",
            extra={"event": "question_answered", "task_id": task.id, "client": task.client_id},
        )
        return answer if isinstance(answer, str) else None

    def task_finished(self, task: QueuedTask) -> None:
        if self.outcomes is not None:  # the scheduler waits on the runs it started
            self.outcomes.finished_task(task)
        if self.metrics is not None:
            self.metrics.task_finished(task)
        self._translators.pop(task.id, None)
        self._resume_told.discard(task.id)
        if self.options.headless:  # a worker of roost serve --workers has no clients
            return
        client = self.clients.get(task.client_id or "")
        if task.foreign and client is not None and client.anonymous:
            client = None  # anonymous keys are per node: another node's client of the same key
        conn = client.live() if client is not None else None
        if conn is not None:  # (a foreign task's: its named client reconnected here)
            conn.send(self._result(task))
            self._spawn(self.queue.mark_collected, task.id)
        elif task.foreign:  # its client is told by the node it attaches to (each follows the row)
            return
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


async def _logged(fn: Any, *args: Any) -> None:
    try:
        await fn(*args)
    except RoostError:
        log.exception("serve: background step failed")


_connection_numbers = itertools.count(1)
