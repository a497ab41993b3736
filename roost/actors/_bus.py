"""The node bus: messages between the processes (nodes) that share one store.

Each process that serves clients (``roost app-server``, ``roost serve``) is a node named by its
lease owner id (``services.owner``, ``"<host>:<pid>:<nonce>"``). A message to another node is a row
of the store's ``bus_messages`` table (:class:`roost.storage.BusStore`, SQL only in storage) plus a
wake-up:

* **PostgreSQL**: the insert also sends ``NOTIFY roost_bus`` (ids only); the receiving node's
  listener connection (``LISTEN``) wakes its loop at once.
* **SQLite** (and PostgreSQL as the fallback): a bounded, adaptive poll, a cheap indexed read
  every :data:`POLL_MIN` seconds while there is traffic, backing off to :data:`POLL_MAX` when idle.
  So a lost notification delays a message by at most ``POLL_MAX``, never loses it.

The receiver claims its rows (``pending -> claimed`` in one write: exactly once), runs the handler
registered for the message's ``kind`` and acknowledges (``claimed -> done``). A request's reply is a
message back (``reply_to`` = the request's id), written in the same transaction as the ack. A
requester that times out withdraws a row nobody claimed yet (``pending -> cancelled``), so a late
node never acts on it and the caller may safely fall back to local rules.

The bus is generic: handlers are registered by kind with :meth:`NodeBus.on`. The thread input
delivery (:mod:`roost.actors._remote`) is its first user; front-door traffic of ``roost serve
--workers`` may be another. :meth:`NodeBus.serve` is a supervised child of the root (restartable:
handlers and waiting requests live on the NodeBus object and survive a restart of its loop).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from roost.errors import LifecycleError, NodeUnreachable, ProtocolError, RoostError
from roost.storage import new_id
from roost.storage.leases import owner_is_dead

__all__ = ["NodeBus", "error_from_wire", "POLL_MIN", "POLL_MAX"]

log = logging.getLogger("roost.bus")

#: Seconds between polls while messages flow (or a request waits for its reply).
POLL_MIN = 0.05
#: Most seconds between polls of an idle node (the bound on a lost notification's delay).
POLL_MAX = 0.2
#: Seconds between heartbeats of a node (``bus_nodes.heartbeat_at``).
HEARTBEAT_S = 2.0
#: A node whose heartbeat is older than this many seconds (database clock) is not on the bus.
NODE_HORIZON_S = 10.0
#: A node's row is deleted once its heartbeat is this many seconds old (it died without its
#: clean stop); a node that comes back registers again.
NODE_RETENTION_S = 10 * NODE_HORIZON_S
#: Seconds a request may wait unclaimed before it is withdrawn.
CLAIM_TIMEOUT = 5.0
#: Seconds between deletions of old handled messages.
PRUNE_EVERY_S = 60.0

Handler = Callable[[Any], Awaitable[Any]]


def error_from_wire(error: Any) -> ProtocolError:
    """The :class:`ProtocolError` leaf whose ``code`` is ``error["code"]``, with its message and data.

    An unknown code becomes an ``internal_error`` carrying the original code in its message.
    """
    error = error if isinstance(error, dict) else {}
    code, message = str(error.get("code") or "internal_error"), str(error.get("message") or "")
    stack: list[type[ProtocolError]] = [ProtocolError]
    while stack:
        cls = stack.pop()
        if cls.__dict__.get("code") == code and not cls.__subclasses__():
            return cls(message, data=error.get("data"))
        stack.extend(cls.__subclasses__())
    from roost.errors import InternalError

    return InternalError(f"{code}: {message}", data=error.get("data"))


class NodeBus:
    """This process's end of the node bus.

    Args:
        store: the open store (a :class:`roost.storage.StoreBackend`; its writer runs).
        node_id: this node's id (the lease owner id).
        kind: ``app-server`` or ``serve`` (listed by :meth:`nodes`).
        poll_min, poll_max: the poll interval's bounds, seconds.

    Attributes:
        node_id, kind: as given. stats: counters (``sent``, ``received``, ``replies``, ``withdrawn``).
    """

    def __init__(
        self, store: Any, node_id: str, kind: str, *, poll_min: float = POLL_MIN, poll_max: float = POLL_MAX
    ) -> None:
        self.store = store
        self.node_id = node_id
        self.kind = kind
        self.poll_min, self.poll_max = poll_min, poll_max
        self._handlers: dict[str, tuple[Any, bool]] = {}
        self._waiters: dict[str, trio.MemorySendChannel[Any]] = {}
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._listener: Any = None  # PostgreSQL's LISTEN connection (None on SQLite)
        self._listens = True  # until the store says it has no listener (SQLite)
        self.stats = {"sent": 0, "received": 0, "replies": 0, "withdrawn": 0}

    # -- registering handlers -------------------------------------------------------------------

    def on(self, kind: str, handler: Callable[[Any], Any], *, inline: bool = False) -> None:
        """Handle messages of ``kind`` with ``handler(message)`` (a :class:`roost.storage.BusMessage`).

        ``inline``: a plain (non-blocking) function run in the loop, in claim order (for streams
        whose order matters, e.g. relayed events); otherwise an async function run as its own task.
        A request's reply is the handler's return value (``{"ok": value}``) or its ProtocolError
        (``{"error": wire}``); any other exception is logged and answered ``internal_error``.
        """
        self._handlers[kind] = (handler, inline)

    # -- sending --------------------------------------------------------------------------------

    async def send(self, target: str, kind: str, data: Any, *, ttl: float = 60.0) -> str:
        """Post a one-way message of ``kind`` to node ``target``; return its id (committed)."""
        message_id = await self._post(target, kind, {"data": data, "reply": False}, ttl=ttl)
        return message_id

    async def request(
        self, target: str, kind: str, data: Any, *, timeout: float | None = None, claim_timeout: float = CLAIM_TIMEOUT
    ) -> Any:
        """Send a request to node ``target`` and return its handler's result.

        Args:
            claim_timeout: seconds to wait for the node to claim it; then it is withdrawn.
            timeout: seconds to wait for the answer once claimed (None: while the node lives).

        Raises:
            ProtocolError: the handler's error, as the remote node raised it (same code).
            NodeUnreachable: not claimed in time (``delivered`` False: it will never run), or the
                node stopped answering after claiming it (``delivered`` True).
        """
        send, recv = trio.open_memory_channel[Any](1)
        message_id = new_id("msg")
        self._waiters[message_id] = send
        try:
            await self._post(target, kind, {"data": data, "reply": True}, ttl=claim_timeout, id=message_id)
            reply = await self._await_reply(target, message_id, recv, timeout, claim_timeout)
        finally:
            self._waiters.pop(message_id, None)
        if isinstance(reply, dict) and "error" in reply:
            raise error_from_wire(reply["error"])
        return reply.get("ok") if isinstance(reply, dict) else None

    async def _await_reply(
        self, target: str, message_id: str, recv: Any, timeout: float | None, claim_timeout: float
    ) -> Any:
        with trio.move_on_after(claim_timeout):
            return await recv.receive()
        if await self.store.writer.submit(self.store.cancel_message, message_id):
            self.stats["withdrawn"] += 1
            raise NodeUnreachable(f"node {target} did not take the request within {claim_timeout:g} s")
        deadline = trio.current_time() + timeout if timeout is not None else float("inf")
        while trio.current_time() < deadline:
            with trio.move_on_after(min(HEARTBEAT_S, deadline - trio.current_time())):
                return await recv.receive()
            if not await self.node_alive(target):
                break
        raise NodeUnreachable(f"node {target} took the request and stopped answering", delivered=True)

    async def _post(
        self, target: str, kind: str, body: Any, *, ttl: float, reply_to: str | None = None, **kw: Any
    ) -> str:
        message_id = await self.store.writer.submit(
            _post,
            self.store,
            target=target,
            sender=self.node_id,
            kind=kind,
            body=body,
            reply_to=reply_to,
            ttl=ttl,
            **kw,
        )
        self.stats["sent"] += 1
        if target == self.node_id:
            self._wake.set()
        return message_id

    # -- nodes ----------------------------------------------------------------------------------

    async def nodes(self) -> list[Any]:
        """The registered nodes (:class:`roost.storage.BusNode`), oldest first."""
        return await self._read(self.store.list_bus_nodes)

    async def node_alive(self, node_id: str) -> bool:
        """Whether ``node_id`` is on the bus now: registered, its last heartbeat less than
        :data:`NODE_HORIZON_S` seconds old on the database's clock (``BusNode.age``; this host's
        clock is not consulted, so skewed clocks of hosts do not matter), and not a dead process
        of this host."""
        if node_id == self.node_id:
            return self._nursery is not None
        node = await self._read(self.store.get_bus_node, node_id)
        if node is None or owner_is_dead(node_id):
            return False
        return bool(node.age < NODE_HORIZON_S)

    async def _read(self, fn: Callable[..., Any], *args: Any) -> Any:
        store = self.store

        def run() -> Any:
            with store.read() as conn:
                return fn(conn, *args)

        return await trio.to_thread.run_sync(run)

    # -- the loop (a supervised child) ----------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        """Register this node, then claim and dispatch its messages until cancelled.

        Store errors (a busy, read-only or unreachable database) never end the loop: they are
        logged and the loop retries every :data:`POLL_MAX` x 10 seconds, so a node whose store
        cannot take writes still serves its own clients.

        Cancellation: ends the loop; handlers still running are cancelled; the node is removed
        from ``bus_nodes`` (best effort, shielded and bounded).
        """
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._housekeeping)
                task_status.started(self)
                await self._loop()
        finally:
            self._nursery = None
            self._close_listener()
            with trio.move_on_after(2, shield=True):
                try:
                    await self.store.writer.submit(self.store.remove_bus_node, self.node_id)
                except RoostError as exc:  # the store is closing: the heartbeat ages out instead
                    log.debug("node %s: bus row not removed (%s); its heartbeat ages out", self.node_id, exc)

    async def _loop(self) -> None:
        interval, failing = self.poll_min, ""
        while True:
            try:
                if self._listener is None and self._listens:
                    self._listener = await trio.to_thread.run_sync(self.store.bus_listener, self.node_id)
                    self._listens = self._listener is not None
                if await self._poll_once():
                    interval, failing = self.poll_min, ""
                    continue
                interval = self.poll_min if self._waiters else min(interval * 2, self.poll_max)
                await self._wait(interval)
            except RoostError as exc:
                if str(exc) != failing:
                    log.warning("bus: %s; retrying", exc)
                failing = str(exc)
                self._close_listener()
                await trio.sleep(self.poll_max * 10)

    async def _wait(self, interval: float) -> None:
        """Until a wake-up (NOTIFY, or a message this node posted to itself) or ``interval`` s."""
        if self._listener is not None:
            await trio.to_thread.run_sync(self._listener.wait, interval, abandon_on_cancel=True)
            return
        with trio.move_on_after(interval):
            await self._wake.wait()
        self._wake = trio.Event()

    def _close_listener(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    async def _poll_once(self) -> bool:
        """Claim and dispatch what waits for this node; return whether anything did."""
        if not await self._read(self.store.has_pending_messages, self.node_id):
            return False
        messages = await self.store.writer.submit(self.store.claim_messages, self.node_id)
        done: list[str] = []
        for message in messages:
            self.stats["received"] += 1
            if self._dispatch(message):
                done.append(message.id)
        if done:
            await self.store.writer.submit(_ack_all, self.store, done)
        return bool(messages)

    def _dispatch(self, message: Any) -> bool:
        """Route one claimed message; return True when it is handled already (ack it now)."""
        body = message.body if isinstance(message.body, dict) else {}
        if message.kind == "reply":
            waiter = self._waiters.get(message.reply_to or "")
            if waiter is not None:
                self.stats["replies"] += 1
                waiter.send_nowait(body)
            return True
        handler, inline = self._handlers.get(message.kind, (None, False))
        if handler is None:
            log.warning("bus: no handler for %r (from %s)", message.kind, message.sender)
            if body.get("reply"):
                self._spawn(self._answer, message, {"error": {"code": "method_not_found", "message": message.kind}})
                return False
            return True
        if inline:
            try:
                handler(message)
            except Exception:
                log.exception("bus: handler of %r failed", message.kind)
            return True
        self._spawn(self._run_handler, handler, message)
        return False

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``fn(*args)`` as a task of the bus loop (it ends when the loop stops or restarts).

        Raises:
            LifecycleError: the loop is not running.
        """
        if self._nursery is None:
            raise LifecycleError("the node bus is not running")
        self._nursery.start_soon(fn, *args)

    _spawn = spawn

    async def _run_handler(self, handler: Handler, message: Any) -> None:
        try:
            reply: Any = {"ok": await handler(message)}
        except ProtocolError as exc:
            reply = {"error": exc.to_wire()}
        except Exception as exc:
            log.exception("bus: handler of %r failed", message.kind)
            reply = {"error": {"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}}
        await self._answer(message, reply)

    async def _answer(self, message: Any, reply: Any) -> None:
        """Acknowledge ``message`` and, for a request, post ``reply`` to its sender, in one write."""
        wants = isinstance(message.body, dict) and message.body.get("reply")
        try:
            await self.store.writer.submit(_reply_and_ack, self.store, message, self.node_id, reply if wants else None)
        except RoostError:
            log.exception("bus: could not answer %s from %s", message.kind, message.sender)
        if wants and message.sender == self.node_id:
            self._wake.set()

    async def _housekeeping(self) -> None:
        """Register, then heartbeat every :data:`HEARTBEAT_S` seconds (registering again when the
        row is gone); delete old handled messages and the rows of long-gone nodes
        (:data:`NODE_RETENTION_S`) now and then."""
        last_prune = 0.0
        try:
            await self.store.writer.submit(self.store.register_bus_node, self.node_id, self.kind)
        except RoostError as exc:
            log.warning("bus: cannot register node %s: %s", self.node_id, exc)
        while True:
            await trio.sleep(HEARTBEAT_S)
            try:
                if not await self.store.writer.submit(self.store.heartbeat_bus_node, self.node_id):
                    await self.store.writer.submit(self.store.register_bus_node, self.node_id, self.kind)
                if trio.current_time() - last_prune >= PRUNE_EVERY_S:
                    last_prune = trio.current_time()
                    await self.store.writer.submit(self.store.prune_messages)
                    await self.store.writer.submit(self.store.prune_bus_nodes, keep=NODE_RETENTION_S)
            except RoostError as exc:
                log.warning("bus: heartbeat failed: %s", exc)


def _post(conn: Any, store: Any, **fields: Any) -> str:
    return store.post_message(conn, **fields)


def _ack_all(conn: Any, store: Any, ids: list[str]) -> None:
    for message_id in ids:
        store.ack_message(conn, message_id)


def _reply_and_ack(conn: Any, store: Any, message: Any, node_id: str, reply: Any) -> None:
    store.ack_message(conn, message.id)
    if reply is not None:
        store.post_message(
            conn, target=message.sender, sender=node_id, kind="reply", body=reply, reply_to=message.id, ttl=120.0
        )
