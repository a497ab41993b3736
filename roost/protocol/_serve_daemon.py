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
import struct
import time
from pathlib import Path
from typing import Any, AsyncIterator

import attrs
import trio

from roost._json import JSONDecodeError, dumps_line, loads
from roost._paths import run_dir
from roost.actors._connection import CLOSE_NORMAL, ConnectionActor
from roost.actors._taskqueue import QueuedTask, TaskQueue
from roost.errors import ConfigError, RoostError, ServerOverloaded
from roost.protocol._coalesce import WIRE_TOKENS
from roost.protocol._outbox import DEFAULT_OUTBOX_LINES, Outbox, stall_timeout_from_env
from roost.protocol._serve_auth import ServeAuth, bearer_token, parse_client_id
from roost.protocol._errors import to_protocol_error
from roost.protocol._serve_events import TaskEventTranslator, approval_event, result_event

__all__ = ["ServeOptions", "ServeDaemon", "DaemonRunning", "SocketPathTaken", "default_socket_path", "claim_socket_path",
           "PROTOCOL_VERSION"]

log = logging.getLogger("roost.serve")

PROTOCOL_VERSION = 1
#: Longest input line accepted on the Unix socket (bytes), as the JSONL framing (DESIGN.md section 5).
MAX_LINE_BYTES = 64 << 20
_anon = itertools.count(1)


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
        raise SocketPathTaken(f"{path} exists and is a {kind}, not a socket; not removing it. "
                              "Move it away or give another path with --socket")
    if mode is not None:
        probe = stdsocket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
        probe.settimeout(2.0)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink(missing_ok=True)   # stale: its daemon is dead (we hold the lock)
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


@attrs.define(eq=False)
class _Pending:
    """An approval waiting for its client."""

    event: dict
    asked: Any = None        # the connection last asked
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

    def __init__(self, runtime: Any, options: ServeOptions, *, provider: str | None, model: str | None,
                 engines: Any = None) -> None:
        self.runtime = runtime
        self.options = options
        #: set by ``roost serve`` when its Scheduler runs (``TaskOutcomes`` of roost.actors._scheduler)
        self.outcomes: Any = None
        self.queue = TaskQueue(runtime, self, provider=provider, model=model,
                               max_concurrent=options.max_concurrent, max_queued=options.max_queued,
                               unattended_policy=options.unattended_policy,
                               permission_mode=options.permission_mode, default_work_dir=str(options.work_dir),
                               default_config=options.config, engines=engines)
        self.clients: dict[str, ClientState] = {}
        self.connections: set[ConnectionActor] = set()
        self._translators: dict[str, TaskEventTranslator] = {}
        self._resume_told: set[str] = set()
        self.nursery: trio.Nursery | None = None
        self.http_port: int | None = None
        self.events_broadcast = 0
        self.max_line_bytes = MAX_LINE_BYTES

    # -- running ------------------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Restore tasks, start the runners and the listeners; serve until cancelled.

        ``task_status.started()`` is called once both listeners accept connections.
        """
        options = self.options
        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            await sock.bind(str(options.socket_path))
        finally:
            os.umask(old)
        os.chmod(options.socket_path, 0o600)
        sock.listen(512)
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                await self.queue.restore()
                await nursery.start(self.queue.run)
                await nursery.start(trio.serve_listeners, self._serve_unix, [trio.SocketListener(sock)])
                if options.http_port is not None:
                    try:
                        from roost.protocol._serve_http import serve_http
                    except ImportError:
                        serve_http = None
                    if serve_http is not None:
                        self.http_port = await nursery.start(functools_partial(
                            serve_http, self, options.host, options.http_port, options.ssl_context))
                    else:   # without the mcp SDK: the WebSocket alone, on trio-websocket's own server
                        from trio_websocket import serve_websocket

                        server = await nursery.start(functools_partial(
                            serve_websocket, self.serve_websocket_request, options.host, options.http_port,
                            options.ssl_context, handler_nursery=nursery, max_message_size=MAX_LINE_BYTES))
                        self.http_port = server.port
                task_status.started()
        finally:
            try:
                if stat.S_ISSOCK(os.lstat(options.socket_path).st_mode):
                    options.socket_path.unlink(missing_ok=True)
            except FileNotFoundError:
                pass
            except OSError:
                log.warning("could not remove the socket %s", options.socket_path, exc_info=True)

    # -- transports ---------------------------------------------------------------------------------

    async def _serve_unix(self, stream: trio.SocketStream) -> None:
        async def close(code: int, reason: str) -> None:
            await stream.aclose()

        await self._attach(_unix_lines(stream), stream, close, scope="unix", client_id=None, read_only=False)

    async def serve_websocket_request(self, request: Any) -> None:
        """Serve one WebSocket handshake (``/attach``): Origin, token and client-id checks, then attach."""
        from trio_websocket import ConnectionClosed

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        path = request.path.split("?", 1)[0]
        if path != "/attach":
            await request.reject(404, body=b"not found: the WebSocket endpoint is /attach\n")
            return
        if "origin" in headers:
            await request.reject(403, body=b"refused: a handshake with an Origin header is not accepted\n")
            return
        grant = self.options.auth.check(bearer_token(headers.get("authorization")))
        if grant is None:
            await request.reject(401, extra_headers=[(b"WWW-Authenticate", b"Bearer")],
                                 body=b"unauthorized: send Authorization: Bearer <token>\n")
            return
        try:
            client_id = parse_client_id(headers.get("fuseraft-client-id"))
        except ValueError as exc:
            await request.reject(400, body=f"{exc}\n".encode())
            return
        try:
            ws = await request.accept()
        except (ConnectionClosed, trio.BrokenResourceError, OSError):
            return

        async def frames() -> AsyncIterator[str]:
            while True:
                try:
                    message = await ws.get_message()
                except ConnectionClosed:
                    return
                text = message.decode("utf-8", "replace") if isinstance(message, bytes) else message
                for line in text.split("\n"):
                    yield line

        async def close(code: int, reason: str) -> None:
            await ws.aclose(code=code, reason=reason[:120])

        await self._attach(frames(), _WebSocketLines(ws), close, scope=grant.scope, client_id=client_id,
                           read_only=grant.read_only)

    # -- clients ------------------------------------------------------------------------------------

    def _client(self, key: str, client_id: str | None = None, *, anonymous: bool | None = None) -> ClientState:
        client = self.clients.get(key)
        if client is None:
            anon = ("/conn-" in key) if anonymous is None else anonymous
            client = self.clients[key] = ClientState(key=key, client_id=client_id, anonymous=anon)
        return client

    async def _attach(self, frames: AsyncIterator[str], stream: Any, close: Any, *, scope: str,
                      client_id: str | None, read_only: bool) -> None:
        key = f"{scope}/{client_id}" if client_id else f"{scope}/conn-{next(_anon)}"
        client = self._client(key, client_id, anonymous=client_id is None)
        holder: list[ConnectionActor] = []
        outbox = Outbox(self.options.outbox_lines, coalesce=WIRE_TOKENS, stall_timeout_s=stall_timeout_from_env(),
                        on_overflow=lambda: holder[0].kick(f"slow consumer: {outbox.reason}"))
        conn = ConnectionActor(outbox=outbox, handle_line=self._handle, close=close,
                               kick_grace=self.options.kick_grace, client=client, read_only=read_only)
        holder.append(conn)
        for old in list(client.conns):
            old.kick("replaced by a newer connection with the same client id", code=CLOSE_NORMAL)
        client.conns.append(conn)
        self.connections.add(conn)
        self._hello(conn, client_id=client_id)
        client.notify()
        try:
            await conn.run(frames, stream)
        except Exception:
            # A bug in serving one client must not take the daemon (and every other client) down.
            log.exception("serve: connection %s failed", conn.id)
        finally:
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
            first = {"sessionId": task.id, "task": task.task, "status": task.status,
                     "position": self.queue.position(task.id)}
        done = self.queue.uncollected(key)
        conn.send({"type": "hello", "protocolVersion": PROTOCOL_VERSION, "clientId": client_id,
                   "readOnly": conn.read_only, "inFlight": first, "pendingResults": [t.id for t in done]})
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

    async def _handle(self, conn: ConnectionActor, line: str) -> None:
        """Handle one input line: plain text is a task; a line starting with ``{`` or ``[`` must be
        a JSON object input message (anything else there gets an ``invalid_request`` error and is
        not queued)."""
        text = line.strip()
        if not text:
            return
        if not text.startswith(("{", "[")):   # a plain text line is a task
            await self._dispatch(conn, text)
            return
        message = _json_object(text)
        if message is None:
            conn.send(_error("the line starts like JSON but is not a JSON object; send a JSON input "
                             "message or plain text (not starting with '{' or '[')", "invalid_request"))
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
            elif not self.queue.interrupt(conn.client.key):
                conn.send(_error("none of your tasks is running", "invalid_request"))
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
            error = to_protocol_error(exc, context="serve dispatch")   # the same table as the app-server
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
            translator = self._translators[task.id] = TaskEventTranslator(
                task.id, self.options.agent_name, warn_threshold=self.options.warn_threshold,
                orchestrated=task.orchestrated)
        return translator

    def task_started(self, task: QueuedTask) -> None:
        self._translator(task)
        if task.resumed:
            owner = self.clients.get(task.client_id or "")
            if owner is not None and owner.live() is not None:
                self._resume_told.add(task.id)
            self.broadcast({"type": "task_resumed", "sessionId": task.id, "task": task.task})

    def task_notification(self, task: QueuedTask, method: str, params: dict) -> None:
        for event in self._translator(task).translate(method, params):
            self.broadcast(event)

    def task_event(self, task: QueuedTask, event: dict) -> None:
        """Broadcast the daemon events of an orchestrated task's run event (see
        :meth:`TaskEventTranslator.run_event`: ``agent_starting`` and ``token_budget_warning``)."""
        for out in self._translator(task).run_event(event):
            self.broadcast(out)

    async def request_approval(self, task: QueuedTask, params: dict) -> bool | None:
        """Ask the task's client (see the module doc); None = nobody answered (unattended policy).

        A tool approval (with an ``item_id``) first announces its tool call (``tool_calling``); a
        route approval has no tool call, so nothing is announced for it.
        """
        item_id = params.get("item_id")
        if item_id is not None:
            for event in self._translator(task).announce(item_id):
                self.broadcast(event)
        if task.client_id is None:
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
        self._translators.pop(task.id, None)
        self._resume_told.discard(task.id)
        client = self.clients.get(task.client_id or "")
        conn = client.live() if client is not None else None
        if conn is not None:
            conn.send(self._result(task))
            self._spawn(self.queue.mark_collected, task.id)
        elif task.client_id is None or (client is not None and client.anonymous) or "/conn-" in (task.client_id or ""):
            self._spawn(self.queue.mark_collected, task.id)   # nobody can ever collect it

    def result_of(self, task: QueuedTask) -> dict:
        """The ``result`` event of a finished task."""
        return self._result(task)

    def _result(self, task: QueuedTask) -> dict:
        result = task.result or {}
        return result_event(session_id=task.id, task=task.task, succeeded=bool(result.get("succeeded")),
                            error_message=result.get("errorMessage"), last_agent=result.get("lastAgent"),
                            last_message=result.get("lastMessage"))


class _WebSocketLines:
    """A SendStream-like adapter: each line of the outbox's writes becomes one text message.

    A burst of lines (the outbox writer coalesces them) is framed here and written with one
    ``send_all`` under trio-websocket's stream lock, instead of one ``send_message`` (one wsproto
    round and one write) per line: with many clients attached this is the daemon's hot path. Each
    line is one complete, unmasked, uncompressed text frame (RFC 6455 section 5.2; server frames are
    never masked and no extension is negotiated), sent only while the connection is OPEN, so
    wsproto's state (which only control frames and the close handshake change) stays right. It
    relies on ``WebSocketConnection._wsproto/_stream/_stream_lock`` (trio-websocket 0.12) and falls
    back to ``send_message`` when they are missing.
    """

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self._fast = all(hasattr(ws, name) for name in ("_wsproto", "_stream", "_stream_lock"))

    async def send_all(self, data: bytes) -> None:
        from trio_websocket import ConnectionClosed

        ws = self.ws
        lines = [line for line in data.split(b"\n") if line]
        if not self._fast:
            try:
                for line in lines:
                    await ws.send_message(line.decode("utf-8"))
            except ConnectionClosed:
                raise trio.BrokenResourceError("the WebSocket is closed") from None
            return
        from wsproto.connection import ConnectionState

        if ws.closed is not None or ws._wsproto.state is not ConnectionState.OPEN:
            raise trio.BrokenResourceError("the WebSocket is closed")
        frames = b"".join(_text_frame(line) for line in lines)
        async with ws._stream_lock:
            await ws._stream.send_all(frames)


def _text_frame(payload: bytes) -> bytes:
    """One final, unmasked text frame carrying ``payload`` (UTF-8), RFC 6455 section 5.2."""
    size = len(payload)
    if size < 126:
        return bytes((0x81, size)) + payload
    if size < 1 << 16:
        return struct.pack("!BBH", 0x81, 126, size) + payload
    return struct.pack("!BBQ", 0x81, 127, size) + payload


async def _unix_lines(stream: trio.abc.ReceiveStream) -> AsyncIterator[str]:
    """Input lines of a byte stream (UTF-8, up to 64 MiB each); ends at end of file."""
    buffer = bytearray()
    while True:
        try:
            data = await stream.receive_some(1 << 16)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if not data:
            if buffer:
                yield buffer.decode("utf-8", "replace")
            return
        buffer += data
        while True:
            index = buffer.find(b"\n")
            if index < 0:
                if len(buffer) > MAX_LINE_BYTES:
                    buffer.clear()   # an oversized line is dropped
                break
            line = bytes(buffer[:index])
            del buffer[: index + 1]
            yield line.decode("utf-8", "replace")


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


def functools_partial(fn: Any, *args: Any, **kwargs: Any) -> Any:
    import functools

    return functools.partial(fn, *args, **kwargs)
