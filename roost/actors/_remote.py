"""Input and control for a thread that executes on another node, delivered there over the bus.

A thread executes on the node that holds its execution lease. When a client asks node A to
interrupt, steer or queue input for a thread whose live lease another node B holds, A forwards the
request to B (:meth:`ThreadRemote.forward`, a :class:`~roost.actors.NodeBus` request of kind
``thread.input``). B applies it through its ThreadActor exactly as local input (the same
messages, so the same ``client_id`` dedupe rules, fences and errors) and answers; A answers its
client with B's result or B's error (same code).

Notifications come back the same way: the forwarding subscribes a *relay* for node A to the
thread's event hub on B (:class:`_Relay`); it posts the thread's notifications to A in batches
(kind ``thread.events``, in order), and A hands them to the clients subscribed to that thread on A.
Streaming deltas (``item/*/delta``, ``item/toolCall/outputDelta``) are not relayed; every
``item/started``/``item/completed``, turn, pending-input (turn/steered, turn/queued, turn/dequeued,
turn/held, ...) and thread notification is. A relay lives :data:`RELAY_S` seconds after the last
forwarded input (renewed by each). A client that subscribes on A to a thread B executes at that
moment (``thread/resume``...) gets a relay too (:meth:`ThreadRemote.follow`, ``thread.follow``).

Order of a forwarded interrupt's answer: docs/app-server.md sends the ``turn/interrupt`` answer
before the ``turn/completed`` it causes. The relayed notifications and B's answer travel as two
bus messages, so A holds the relayed notifications of that thread while the request is in
flight, until its answer is queued for the asking client (:meth:`ThreadRemote.hold`, at most
:data:`HOLD_S`), and then hands them on in order.

Approvals: input forwarded from A carries its client's origin (``{node, session}``); a turn that
input starts on B asks its approvals of that client, as an ``approval.request`` back to A
(:meth:`_ask_approval`), and the answer goes back to B. If A is gone, nobody can be asked and the
unattended policy decides, as for a client that disconnected.

If the lease owner is not on the bus (not a registered node, its heartbeat stale, or a dead
process of this host) nothing is forwarded and the local rules apply (held input, thread_busy);
if it does not take the request in time the request is withdrawn unclaimed (it will never run
there) and the local rules apply too, so input is never lost.
"""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any

import trio

from roost._json import dumps_line, loads
from roost.actors._messages import (
    Dequeue,
    InterruptTurn,
    Origin,
    QueueInput,
    Snapshot,
    SteerInput,
    Subscribe,
    Unsteer,
    Unsubscribe,
    UpdateQueued,
)
from roost.actors._thread_store import live_elsewhere
from roost.errors import InvalidParams, NodeUnreachable
from roost.storage import leases, new_id

__all__ = ["ThreadRemote", "RELAY_S"]

log = logging.getLogger("roost.remote")

#: Seconds a relay of a thread's notifications to another node lives after the last forwarded input.
RELAY_S = 600.0
#: Most notifications a relay keeps waiting to be posted (beyond: dropped, logged).
RELAY_BUFFER = 4096
#: Seconds a ``thread.follow`` may wait to be claimed (after that the follower simply misses it).
CLAIM_TTL = 10.0
#: Most seconds relayed notifications of a thread wait for a forwarded interrupt's answer (then they go on).
HOLD_S = 30.0
#: Forwarded ops whose actor reply is the input view (answered as ``{input}``).
_INPUT_REPLIES = frozenset({"queue", "dequeue", "unsteer", "update_queued"})


def _relayed(method: str) -> bool:
    """Whether notification ``method`` is relayed to other nodes (everything but streaming deltas)."""
    return not (method.endswith("/delta") or method.endswith("Delta"))


class _Relay:
    """A subscriber of one thread's hub on the executing node that posts its notifications to ``node``."""

    def __init__(self, remote: ThreadRemote, thread_id: str, node: str) -> None:
        self.remote, self.thread_id, self.node = remote, thread_id, node
        self.send, self.recv = trio.open_memory_channel[bytes](RELAY_BUFFER)
        self.until = trio.current_time() + RELAY_S
        self.dropped = 0
        self.actor: Any = None  # the ThreadActor it is subscribed to

    def deliver(self, line: bytes) -> None:
        try:
            self.send.send_nowait(line)
        except trio.WouldBlock:
            self.dropped += 1

    async def run(self) -> None:
        """Post batches of notifications until :attr:`until`; then unsubscribe."""
        try:
            while True:
                with trio.move_on_at(self.until):
                    line = await self.recv.receive()
                    batch = [line]
                    while True:
                        try:
                            batch.append(self.recv.receive_nowait())
                        except trio.WouldBlock:
                            break
                    events = [e for e in map(loads, batch) if _relayed(str(e.get("method")))]
                    if events:
                        await self.remote.bus.send(
                            self.node, "thread.events", {"thread_id": self.thread_id, "events": events}
                        )
                    continue
                if trio.current_time() >= self.until:
                    return
        finally:
            self.remote.relays.pop((self.thread_id, self.node), None)
            with trio.move_on_after(2, shield=True):
                try:
                    await self.actor.ref.ask(Unsubscribe(self))
                except Exception as exc:  # the actor stopped: its hub is gone with it
                    log.debug("relay of %s: unsubscribe skipped (%s)", self.thread_id, exc)
            if self.dropped:
                log.warning("relay of %s to %s dropped %d notifications", self.thread_id, self.node, self.dropped)


class ThreadRemote:
    """Cross-node delivery of thread input and control (see the module doc).

    Args:
        bus: this node's :class:`~roost.actors.NodeBus` (its handlers are registered here).
        registry: the :class:`~roost.actors.ThreadRegistry`.
        services: the process's :class:`~roost.actors.Services`.

    Attributes:
        relays: ``(thread_id, node) -> relay`` of the threads this node relays to other nodes.
    """

    def __init__(self, bus: Any, registry: Any, services: Any) -> None:
        self.bus, self.registry, self.services = bus, registry, services
        self.relays: dict[tuple[str, str], _Relay] = {}
        self._sessions: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._keys: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        #: thread_id -> [holders, relayed notifications waiting] (see :meth:`hold`)
        self._held: dict[str, tuple[list[int], list[dict]]] = {}
        bus.on("thread.input", self._on_input)
        bus.on("thread.events", self._on_events, inline=True)
        bus.on("approval.request", self._on_approval)
        bus.on("thread.follow", self._on_follow)

    # -- the asking node ------------------------------------------------------------------------

    async def executing_node(self, thread_id: str) -> str | None:
        """The node that executes ``thread_id`` now, if it is another node on the bus; else None.

        A live lease of an owner that is not on the bus (e.g. ``roost exec``), or no live lease
        of another owner, gives None: the local rules apply.
        """
        store = self.services.store

        def read() -> dict | None:
            with store.read() as conn:
                return store.get_lease(conn, leases.thread_lease_key(thread_id))

        lease = await trio.to_thread.run_sync(read)
        if not live_elsewhere(lease, self.services.owner):
            return None
        assert lease is not None
        owner = str(lease["owner"])
        return owner if await self.bus.node_alive(owner) else None

    async def forward(self, node: str, op: str, thread_id: str, params: dict, *, session: Any = None) -> Any:
        """Apply ``op`` (``interrupt``, ``steer``, ``queue``, ``dequeue``, ``unsteer``,
        ``update_queued``) with ``params`` to ``thread_id`` on ``node``; return the result its
        ThreadActor gave (the input-view ops as ``{input}``, like the app-server methods).

        ``session``: the asking client (approvals of a turn the input starts are asked of it).

        Raises:
            ProtocolError: the executing node's error (ThreadBusy, StaleTurn, InvalidParams...).
            NodeUnreachable: ``delivered`` False: withdrawn unclaimed, apply the local rules;
                True: it took the input and stopped answering.
        """
        if op not in _BUILDERS:
            raise InvalidParams(f"cannot forward {op!r}")
        origin = {"node": self.bus.node_id, "session": self._session_key(session), "client_id": _client_id(session)}
        no_approver = getattr(session.origin(), "no_approver", None) if session is not None else None
        if no_approver:
            origin["no_approver"] = no_approver
        body = {"op": op, "thread_id": thread_id, "params": params, "origin": origin}
        return await self.bus.request(node, "thread.input", body)

    async def follow(self, thread_id: str) -> None:
        """Ask the node that executes ``thread_id`` now (if another node on the bus) to relay its
        notifications of it here (a one-way ``thread.follow``; nothing happens when none does)."""
        node = await self.executing_node(thread_id)
        if node is not None:
            await self.bus.send(node, "thread.follow", {"thread_id": thread_id}, ttl=CLAIM_TTL)

    def hold(self, thread_id: str, until: trio.Event) -> None:
        """Keep the notifications relayed here for ``thread_id`` until ``until`` is set (at most
        :data:`HOLD_S` seconds), then hand them on in order: the answer of a forwarded
        ``turn/interrupt`` (queued before ``until`` is set) goes out before the ``turn/completed``
        it causes, as in one process (docs/app-server.md). Holds nest.

        Raises:
            LifecycleError: the bus loop is not running.
        """
        count, _ = self._held.setdefault(thread_id, ([0], []))
        count[0] += 1
        self.bus.spawn(self._release, thread_id, until)

    async def _release(self, thread_id: str, until: trio.Event) -> None:
        try:
            with trio.move_on_after(HOLD_S):
                await until.wait()
        finally:
            count, events = self._held[thread_id]
            count[0] -= 1
            if count[0] == 0:
                del self._held[thread_id]
                self._hand_on(thread_id, events)

    def _session_key(self, session: Any) -> str | None:
        """A key naming ``session`` on this node, if it can answer approvals (else None)."""
        if session is None or getattr(session.origin(), "request_approval", None) is None:
            return None
        key = self._keys.get(session)
        if key is None:
            key = new_id("sess")
            self._keys[session] = key
            self._sessions[key] = session
        return key

    def _on_events(self, message: Any) -> None:
        """Hand relayed notifications to this node's clients subscribed to the thread (in order)."""
        data = message.body.get("data") or {}
        thread_id, events = str(data.get("thread_id")), list(data.get("events") or ())
        held = self._held.get(thread_id)
        if held is not None:
            held[1].extend(events)  # a forwarded interrupt's answer goes first (see hold)
            return
        self._hand_on(thread_id, events)

    def _hand_on(self, thread_id: str, events: list[dict]) -> None:
        actor = next((a for a in self.registry.loaded() if a.thread.id == thread_id), None)
        if actor is None:
            return  # nobody here follows the thread any more
        targets = [s for s in actor.hub.subscribers if not isinstance(s, _Relay)]
        for event in events:
            line = dumps_line(event)
            for subscriber in targets:
                try:
                    subscriber.deliver(line)
                except Exception:
                    log.exception("a subscriber failed to take a relayed notification")

    async def _on_approval(self, message: Any) -> dict:
        """An executing node asks one of this node's clients to approve (its answer, or None)."""
        data = message.body.get("data") or {}
        session = self._sessions.get(str(data.get("session")))
        if session is None:
            return {"approved": None}
        return {"approved": await session.request_approval(data.get("params") or {})}

    # -- the executing node ---------------------------------------------------------------------

    async def _on_input(self, message: Any) -> Any:
        """Apply forwarded input through the thread's actor, as local input; relay its notifications."""
        data = message.body.get("data") or {}
        op, params = data.get("op"), data.get("params") or {}
        build = _BUILDERS.get(str(op))
        if build is None or not isinstance(params, dict):
            raise InvalidParams(f"thread.input: unknown op {op!r}")
        actor = await self.registry.get(str(data.get("thread_id")))
        await self._relay(actor, message.sender)
        if params.get("input_id"):
            await actor.ref.ask(Snapshot(0))  # merges held work the asking node added to the store
        reply = await actor.ref.ask(build(params, self._origin(data.get("origin") or {})))
        return {"input": reply} if op in _INPUT_REPLIES else reply

    async def _on_follow(self, message: Any) -> None:
        """Another node's client follows a thread this node executes: relay its notifications."""
        data = message.body.get("data") or {}
        await self._relay(await self.registry.get(str(data.get("thread_id"))), message.sender)

    async def _relay(self, actor: Any, node: str) -> None:
        """Relay ``actor``'s notifications to ``node`` (start, or renew an existing relay; a
        thread actor restarted since then gets the relay subscribed again: idempotent)."""
        key = (actor.thread.id, node)
        relay = self.relays.get(key)
        if relay is None:
            relay = self.relays[key] = _Relay(self, actor.thread.id, node)
            relay.actor = actor
            self.bus.spawn(relay.run)
        relay.until = trio.current_time() + RELAY_S
        relay.actor = actor
        await actor.ref.ask(Subscribe(relay))

    def _origin(self, wire: dict) -> Origin:
        """The Origin of forwarded input: approvals go back to the asking client on its node."""
        node, key = wire.get("node"), wire.get("session")
        ask = functools.partial(self._ask_approval, str(node), str(key)) if node and key else None
        no_approver = wire.get("no_approver")
        return Origin(
            client_id=str(wire.get("client_id") or "remote"),
            request_approval=ask,
            no_approver=str(no_approver) if no_approver and ask is None else None,
        )

    async def _ask_approval(self, node: str, session_key: str, params: dict) -> bool | None:
        """Ask the client ``session_key`` on ``node`` (None when it cannot be asked)."""
        try:
            reply = await self.bus.request(node, "approval.request", {"session": session_key, "params": params})
        except NodeUnreachable:
            return None
        approved = reply.get("approved") if isinstance(reply, dict) else None
        return approved if isinstance(approved, bool) else None


def _client_id(session: Any) -> str:
    return str(getattr(session, "client_name", None) or "remote")


def _queue(p: dict, origin: Origin) -> QueueInput:
    return QueueInput(
        prompt=p.get("prompt") or "",
        hold=bool(p.get("hold")),
        client_id=p.get("client_id"),
        images=tuple(p.get("images") or ()),
        content_parts=p.get("content_parts"),
        origin=origin,
    )


def _steer(p: dict, origin: Origin) -> SteerInput:
    return SteerInput(
        prompt=p.get("prompt"),
        expected_turn_id=p.get("expected_turn_id"),
        client_id=p.get("client_id"),
        input_id=p.get("input_id"),
        images=tuple(p.get("images") or ()),
        content_parts=p.get("content_parts"),
        origin=origin,
    )


#: op -> the ThreadActor message that applies it (built from the forwarded params and origin).
_BUILDERS: dict[str, Any] = {
    "interrupt": lambda p, origin: InterruptTurn(turn_id=p.get("turn_id")),
    "queue": _queue,
    "steer": _steer,
    "dequeue": lambda p, origin: Dequeue(input_id=str(p.get("input_id"))),
    "unsteer": lambda p, origin: Unsteer(input_id=str(p.get("input_id"))),
    "update_queued": lambda p, origin: UpdateQueued(
        input_id=str(p.get("input_id")), prompt=str(p.get("prompt") or ""), content_parts=p.get("content_parts")
    ),
}
