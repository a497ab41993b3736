"""A thread's pending input: queued turns, steers into the running turn, and held work.

:class:`PendingInputs` is a component of the :class:`~roost.actors._thread.ThreadActor` (its
``inputs``): it owns ``pending`` (input waiting for the next turn, or a steer for the running one)
and ``held`` (durable work that is never re-run by itself). Every method runs inside the
ThreadActor (its mailbox serialises them); what it needs of the thread is the explicit
:class:`InputsHost` protocol. The running turn takes its steers through :meth:`take_steers`.

Notifications (app-server-protocol.md, "Notifications": turn/queued, turn/dequeued, turn/steered,
turn/unsteered, turn/held "update pending input state"): each carries ``input`` and a ``state``
saying which change it reports, so a client can tell them apart:

* ``turn/queued``: ``queued`` (accepted for a later turn) or ``updated`` (turn/update-queued);
* ``turn/steered``: ``pending`` (accepted; the running turn takes it at its next model step,
  ``turn_id`` names that turn) or ``admitted`` (its user item is now in the turn);
* ``turn/dequeued``: ``withdrawn`` (turn/dequeue) or ``dispatched`` (it starts a turn of its own);
* ``turn/unsteered``: ``withdrawn``;
* ``turn/held``: ``held``, with ``reason``: ``requested`` (``hold: true``), ``turn_ended`` (its turn
  ended without completing), ``not_started`` (a queued start failed or was interrupted),
  ``abandoned`` (left by a process that died), ``executing_elsewhere`` (another app-server on the
  same store executes the thread; this process keeps it as held work instead of a queue that
  process cannot see).

Durability (app-server-protocol.md, "Turns and execution runs"): accepted input is committed to
SQLite before the request is answered; a retry with the same ``client_id`` returns the original
input instead of a duplicate, and a consumed ``client_id`` is refused.

Cancellation fences (same section: "Cancellation fences retries in that delivery mode; explicitly
switching between queue and steering supersedes the previous mode's cancellation"): withdrawing
input (``turn/dequeue``: mode ``queue``; ``turn/unsteer``: mode ``steer``) records its
``client_id`` with the mode in the thread's metadata (``withdrawn_client_ids``, committed with the
removal). A later ``turn/queue`` or ``turn/steer`` with that ``client_id`` in the same mode is
refused; in the other mode it is accepted and lifts the fence.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Protocol

import trio

from roost import storage
from roost.actors._messages import Dequeue, QueueInput, StartTurn, SteerInput, Unsteer, UpdateQueued
from roost.actors._thread_store import hold_inputs
from roost.actors._views import attachment_fields, attachments_of
from roost.errors import InvalidParams, LifecycleError, RoostError, StaleTurn, ThreadBusy
from roost.storage import new_id

__all__ = ["PendingInputs", "InputsHost", "public_input", "default_origin"]

log = logging.getLogger("roost.thread")


def public_input(entry: dict) -> dict:
    """An input entry without its private (``_``-prefixed) keys: the wire view."""
    return {k: v for k, v in entry.items() if not k.startswith("_")}


def default_origin() -> Any:
    """The origin of input whose client is gone (the defaults: nobody to ask)."""
    from roost.actors._messages import Origin

    return Origin()


class InputsHost(Protocol):
    """What the pending input uses of its thread (implemented by the ThreadActor).

    Attributes:
        thread: the thread's row (``id``, ``metadata``).
        services: the process's services (the store's writer).
        ephemeral: nothing is written.
        active: the running turn (a :class:`~roost.actors._turn.TurnActor`), or None.
        nursery: the thread actor's nursery (a queued input starts its turn there).
    """

    thread: Any
    services: Any
    ephemeral: bool
    active: Any

    @property
    def nursery(self) -> trio.Nursery: ...

    def emit(self, method: str, params: dict) -> None:
        """Fan a notification out to the thread's subscribers."""

    def consumed(self, client_id: str) -> bool:
        """Whether a user message of the thread came from input with ``client_id``."""

    async def busy_elsewhere(self) -> bool:
        """Whether another process holds the thread's execution lease now (a store read)."""

    async def refresh_if_changed(self) -> None:
        """While idle: reload the thread if another process changed it (a store read)."""

    async def start_turn(self, msg: StartTurn) -> dict:
        """Admit a turn (the ThreadActor's StartTurn handling); its view. Raises ThreadBusy..."""


class PendingInputs:
    """A thread's pending input and held work (a component of the ThreadActor; see the module doc).

    Args:
        host: the thread (an :class:`InputsHost`).

    Attributes:
        pending: input waiting for the next turn (``kind: queue``) or for the running turn
            (``kind: steer``), in order; ``_foreign`` entries belong to an execution in another
            process (shown, never dispatched or admitted here).
        held: durable held work (never run by itself).
        accepting: ids of input whose acceptance write is in flight.
        dispatching: the queued input being started as a turn now, or None.
        dispatch_cancelled: why an interrupt withdrew that start, or None.
    """

    def __init__(self, host: InputsHost) -> None:
        self.host = host
        self.pending: list[dict] = []
        self.held: list[dict] = []
        self.accepting: set[str] = set()
        self.dispatching: dict | None = None
        self.dispatch_cancelled: str | None = None

    def announce(self, method: str, entry: dict, state: str, **extra: Any) -> None:
        """Emit pending-input notification ``method`` for ``entry`` with its ``state`` (see the
        module doc: which change of the input it reports) and ``extra`` fields."""
        self.host.emit(
            method, {"thread_id": self.host.thread.id, "input": public_input(entry), "state": state, **extra}
        )

    async def persist_held(self, entries: list[dict], *, announce: bool = True, reason: str = "turn_ended") -> None:
        """Make ``entries`` (already in :attr:`held`) durable held work, in order; emit turn/held
        (``state: "held"``, with ``reason``)."""
        if not entries:
            return
        if not self.host.ephemeral:
            try:
                await self.host.services.store.writer.submit(hold_inputs, self.host.thread.id, list(entries))
            except RoostError:
                log.exception("thread %s: could not make input held work", self.host.thread.id)
        if announce:
            for entry in entries:
                self.announce("turn/held", entry, "held", reason=reason)

    def take_steers(self) -> list[dict]:
        """Remove and return this process's pending steers, in order (the running turn admits them)."""
        steers = [p for p in self.pending if p["kind"] == "steer" and not p.get("_foreign")]
        for steer in steers:
            self.pending.remove(steer)
        return steers

    def return_steers(self, steers: list[dict]) -> None:
        """Put steers the turn could not admit back in front of the pending input."""
        self.pending[:0] = steers

    def has_steers(self) -> bool:
        """Whether a steer of this process is pending."""
        return any(p["kind"] == "steer" and not p.get("_foreign") for p in self.pending)

    def at_turn_end(self) -> list[dict]:
        """A turn ended without completing: this process's pending input becomes held work,
        steers first; return it (the turn's end makes it durable with :func:`hold_inputs`)."""
        own = [p for p in self.pending if not p.get("_foreign")]
        ordered = [p for p in own if p["kind"] == "steer"] + [p for p in own if p["kind"] != "steer"]
        self.pending = [p for p in self.pending if p.get("_foreign")]
        for entry in ordered:
            entry["held"] = True
            self.held.append(entry)
        return ordered

    def dispatch_next(self) -> None:
        """Start the oldest pending input as a new turn (after a natural end, or queued while idle).

        The start runs as a task of this actor (:meth:`_start_queued`), one at a time; not a checkpoint.
        """
        if self.host.active is not None or self.dispatching is not None:
            return
        queued = [p for p in self.pending if not p.get("_foreign")]
        if not queued:
            return
        entry = queued[0]
        try:
            nursery = self.host.nursery
        except LifecycleError:
            return  # stopping: the input stays in the store and is held at the next load
        self.pending.remove(entry)
        self.dispatching = entry
        self.dispatch_cancelled = None
        self.announce("turn/dequeued", entry, "dispatched")
        nursery.start_soon(self._start_queued, entry)

    async def _start_queued(self, entry: dict) -> None:
        """Start ``entry`` as a turn; if it cannot start, it and the other pending input are held.

        It cannot start when an interrupt withdrew it first (see :meth:`_interrupt`) or admission
        fails (e.g. another process holds the lease: ``thread_busy``). Held input is never lost and
        never re-run automatically.
        """
        try:
            if self.dispatch_cancelled is None:
                await self.host.start_turn(
                    StartTurn(
                        prompt=entry["prompt"],
                        client_id=entry.get("client_id"),
                        images=attachments_of(entry),
                        input_id=entry["id"],
                        content_parts=entry.get("content_parts"),
                        origin=entry.get("_origin") or default_origin(),
                    )
                )
                return
            log.info(
                "thread %s: queued input %s withdrawn by an interrupt (%s)",
                self.host.thread.id,
                entry["id"],
                self.dispatch_cancelled,
            )
        except RoostError as exc:
            log.warning("thread %s: queued input %s could not start a turn: %s", self.host.thread.id, entry["id"], exc)
        finally:
            self.dispatching = None
        own = [p for p in self.pending if not p.get("_foreign")]
        self.pending = [p for p in self.pending if p.get("_foreign")]
        stranded = [entry] + own
        for item in stranded:
            item["held"] = True
            self.held.append(item)
        await self.persist_held(stranded, reason="not_started")

    async def _accept_input(
        self,
        kind: str,
        prompt: str,
        *,
        hold: bool,
        client_id: str | None,
        images: tuple = (),
        origin: Any = None,
        content_parts: Any = None,
    ) -> tuple[dict, bool]:
        """Durably accept pending input; idempotent per client_id (a consumed client_id is refused)."""
        mode = "steer" if kind == "steer" else "queue"
        superseded = False
        if client_id is not None:
            for entry in self.pending + self.held:
                if entry.get("client_id") == client_id:
                    return entry, False
            if self.host.consumed(client_id):
                raise InvalidParams(f"client_id {client_id!r} was already consumed by thread {self.host.thread.id}")
            superseded = self._check_fence(client_id, mode)
        payload: dict[str, Any] = {"prompt": prompt}
        payload.update(attachment_fields(images))
        if content_parts is not None:
            payload["content_parts"] = content_parts
        entry = {"id": new_id("input"), "kind": kind, "held": hold, "client_id": client_id, **payload}
        if not self.host.ephemeral:
            self.accepting.add(entry["id"])
            try:
                row, created = await self.host.services.store.writer.submit(
                    functools.partial(
                        storage.add_held_input,
                        kind=kind,
                        payload=payload,
                        held=hold,
                        client_id=client_id,
                        id=entry["id"],
                    ),
                    self.host.thread.id,
                )
            finally:
                self.accepting.discard(entry["id"])
            if not created:
                return {
                    "id": row.id,
                    "kind": row.kind,
                    "held": row.held,
                    "client_id": row.client_id,
                    **(row.payload or {}),
                }, False
            entry["position"] = row.position
        if origin is not None:
            entry["_origin"] = origin
        (self.held if hold else self.pending).append(entry)
        if superseded and client_id is not None:  # switching mode supersedes the other's withdrawal
            await self._set_fence(client_id, None)
        return entry, True

    def _check_fence(self, client_id: str, mode: str) -> bool:
        """Refuse ``client_id`` in ``mode`` if input with it was withdrawn in that mode; return
        whether a withdrawal in the other mode exists (which this use supersedes).

        Raises:
            InvalidParams: fenced.
        """
        fence = self._fences().get(client_id)
        if fence == mode:
            verb = "turn/unsteer" if mode == "steer" else "turn/dequeue"
            raise InvalidParams(
                f"client_id {client_id!r} was withdrawn with {verb}; a retry in the same "
                "delivery mode is refused (use a new client_id)"
            )
        return fence is not None

    def _fences(self) -> dict[str, str]:
        """``client_id -> mode`` of withdrawn input (see the module doc)."""
        fences = (self.host.thread.metadata or {}).get("withdrawn_client_ids")
        return fences if isinstance(fences, dict) else {}

    async def _set_fence(self, client_id: str, mode: str | None, *, remove_input: str | None = None) -> None:
        """Record (``mode``) or lift (None) the fence of ``client_id``, durably; with
        ``remove_input``, in the same transaction as removing that pending input."""
        fences = dict(self._fences())
        if mode is None:
            fences.pop(client_id, None)
        else:
            fences[client_id] = mode
        metadata = {**(self.host.thread.metadata or {}), "withdrawn_client_ids": fences}
        if not self.host.ephemeral:
            tid = self.host.thread.id

            def write(conn: Any) -> None:
                if remove_input is not None:
                    storage.remove_held_input(conn, remove_input)
                storage.update_thread(conn, tid, metadata=metadata)

            await self.host.services.store.writer.submit(write)
        self.host.thread.metadata = metadata

    async def queue(self, msg: QueueInput) -> dict:
        if not msg.prompt:
            raise InvalidParams("prompt is required")
        await self.host.refresh_if_changed()  # input another process consumed meanwhile counts
        hold, reason = msg.hold, "requested"
        if not hold and self.host.active is None and await self.host.busy_elsewhere():
            # Another process executes the thread: this one cannot start the input, and that one
            # does not see this process's queue. It is kept as visible held work (never lost);
            # send it with turn/steer once the thread is free.
            hold, reason = True, "executing_elsewhere"
        entry, created = await self._accept_input(
            "queue",
            msg.prompt,
            hold=hold,
            client_id=msg.client_id,
            images=msg.images,
            origin=msg.origin,
            content_parts=msg.content_parts,
        )
        if created:
            if hold:
                self.announce("turn/held", entry, "held", reason=reason)
            else:
                self.announce("turn/queued", entry, "queued")
                if self.host.active is None:
                    self.dispatch_next()
        return public_input(entry)

    async def update_queued(self, msg: UpdateQueued) -> dict:
        for entry in self.pending + self.held:
            if entry["id"] == msg.input_id:
                entry["prompt"] = msg.prompt
                entry.pop("content_parts", None)
                if msg.content_parts is not None:
                    entry["content_parts"] = msg.content_parts
                payload = {"prompt": msg.prompt}
                for key in ("images", "files", "content_parts"):
                    if entry.get(key):
                        payload[key] = entry[key]
                if not self.host.ephemeral:
                    await self.host.services.store.writer.submit(
                        functools.partial(storage.update_held_input, payload=payload), msg.input_id
                    )
                self.announce("turn/queued", entry, "updated")
                return public_input(entry)
        raise InvalidParams(f"no pending input {msg.input_id}")

    async def _remove_input(self, input_id: str, kinds: tuple[str, ...], event: str) -> dict:
        for bucket in (self.pending, self.held):
            for entry in bucket:
                if entry["id"] == input_id and entry["kind"] in kinds:
                    bucket.remove(entry)
                    if entry.get("client_id"):  # fence retries in this delivery mode
                        mode = "steer" if event == "turn/unsteered" else "queue"
                        await self._set_fence(entry["client_id"], mode, remove_input=input_id)
                    elif not self.host.ephemeral:
                        await self.host.services.store.writer.submit(storage.remove_held_input, input_id)
                    self.announce(event, entry, "withdrawn")
                    return public_input(entry)
                if entry["id"] == input_id:  # pending, of the other kind: only turn/dequeue takes a queued one
                    raise InvalidParams(f"input {input_id} is queued input, not a steer: withdraw it with turn/dequeue")
        raise InvalidParams(f"no pending input {input_id}")

    async def dequeue(self, msg: Dequeue) -> dict:
        return await self._remove_input(msg.input_id, ("queue", "steer"), "turn/dequeued")

    async def unsteer(self, msg: Unsteer) -> dict:
        return await self._remove_input(msg.input_id, ("steer",), "turn/unsteered")

    async def steer(self, msg: SteerInput) -> dict:
        tid = self.host.thread.id
        await self.host.refresh_if_changed()  # input another process consumed meanwhile counts
        if msg.input_id is not None:
            entry = next((e for e in self.held + self.pending if e["id"] == msg.input_id), None)
            if entry is None:
                raise InvalidParams(f"no held input {msg.input_id}")
            if entry.get("_foreign"):
                raise ThreadBusy(f"input {msg.input_id} belongs to an execution in another process")
            prompt, client_id = entry["prompt"], entry.get("client_id")
            images, parts = attachments_of(entry), entry.get("content_parts")
        else:
            if not msg.prompt:
                raise InvalidParams("prompt (or input_id) is required")
            entry, prompt, client_id = None, msg.prompt, msg.client_id
            images, parts = msg.images, msg.content_parts
        if entry is None and client_id is not None:
            duplicate = next((e for e in self.pending + self.held if e.get("client_id") == client_id), None)
            if duplicate is not None:  # a retry (also after a restart): the original, never a second run
                return self._steer_reply(duplicate)
        if self.host.active is None:
            if msg.expected_turn_id is not None:
                raise StaleTurn(f"turn {msg.expected_turn_id} is not running on thread {tid}")
            # Idle: sending input (or a held item) starts a turn with it. The held item leaves the
            # held list only once the turn is admitted (if admission fails, it stays held).
            superseded = False
            if entry is None and client_id is not None:
                if self.host.consumed(client_id):
                    raise InvalidParams(f"client_id {client_id!r} was already consumed by thread {tid}")
                superseded = self._check_fence(client_id, "steer")
            if superseded and client_id is not None:
                await self._set_fence(client_id, None)
            if entry is None and not self.host.ephemeral and await self.host.busy_elsewhere():
                # Another process executes the thread: keep the input as visible held work.
                entry, _ = await self._accept_input(
                    "steer",
                    prompt,
                    hold=True,
                    client_id=client_id,
                    origin=msg.origin,
                    images=images,
                    content_parts=parts,
                )
                self.announce("turn/held", entry, "held", reason="executing_elsewhere")
                return self._steer_reply(entry)
            if self.host.active is None and self.dispatching is None:  # still idle after those checks
                return await self._steer_starts_turn(msg, entry, prompt, client_id, images, parts)
            # Queued input started a turn while this steer was being checked: steer that turn.
        return await self._steer_active(msg, entry, prompt, client_id, images, parts)

    async def _steer_starts_turn(
        self, msg: SteerInput, entry: dict | None, prompt: str, client_id: str | None, images: tuple, parts: Any
    ) -> dict:
        """Idle thread: the steer (or held item ``entry``) starts a turn with it."""
        tid = self.host.thread.id
        turn = await self.host.start_turn(
            StartTurn(
                prompt=prompt,
                client_id=client_id,
                origin=msg.origin,
                images=images,
                content_parts=parts,
                input_id=entry["id"] if entry else None,
            )
        )
        if entry is not None:
            for bucket in (self.held, self.pending):
                if entry in bucket:
                    bucket.remove(entry)
        # delivery ``queued``: the next-turn path (the spec names two, active_turn and queued); the
        # input is the new turn's own, which ``turn`` (not ``turn_id``) carries
        return {"thread_id": tid, "delivery": "queued", "turn": turn}

    async def _steer_active(
        self, msg: SteerInput, entry: dict | None, prompt: str, client_id: str | None, images: tuple, parts: Any
    ) -> dict:
        """A turn runs (or queued input is starting one): the steer waits for its next model step."""
        active = self.host.active
        if active is None:  # queued input is starting a turn: it takes pending steers when admitted
            if entry is not None:
                raise ThreadBusy(f"thread {self.host.thread.id} is starting a turn with queued input")
            entry, _ = await self._accept_input(
                "steer", prompt, hold=False, client_id=client_id, origin=msg.origin, images=images, content_parts=parts
            )
            self.announce("turn/steered", entry, "pending", turn_id=None)
            return self._steer_reply(entry)
        if msg.expected_turn_id is not None and msg.expected_turn_id != active.id:
            raise StaleTurn(f"expected turn {msg.expected_turn_id}, the active turn is {active.id}")
        if entry is not None:
            (self.held if entry in self.held else self.pending).remove(entry)
            entry["kind"] = "steer"
            entry["held"] = False
            self.pending.append(entry)
            if not self.host.ephemeral:
                await self.host.services.store.writer.submit(
                    functools.partial(storage.update_held_input, kind="steer", held=False), entry["id"]
                )
        else:
            entry, _ = await self._accept_input(
                "steer", prompt, hold=False, client_id=client_id, origin=msg.origin, images=images, content_parts=parts
            )
        if entry in self.pending:  # other clients see the steer waiting for the next model step
            self.announce("turn/steered", entry, "pending", turn_id=active.id)
        if self.host.active is None and entry in self.pending:
            # The turn ended while the steer was being accepted (its end could not see it): a
            # completed turn's steer starts the next turn; after an interrupt it is held work.
            if active.status == "completed":
                self.dispatch_next()
            else:
                self.pending.remove(entry)
                entry["held"] = True
                self.held.append(entry)
                await self.persist_held([entry], reason="turn_ended")
        elif self.host.active is not None:
            self.host.active.cut_for_steer()  # a reply streaming text stops here; the steer goes next
        return self._steer_reply(entry)

    def _steer_reply(self, entry: dict) -> dict:
        """The turn/steer result for accepted input ``entry``: ``delivery`` ``active_turn`` (the
        running turn takes it at its next model step) or ``queued`` (it starts or waits for a
        turn of its own, or is held work: ``input.held``)."""
        tid = self.host.thread.id
        active = self.host.active
        if active is not None and entry in self.pending and entry["kind"] == "steer" and not entry.get("_foreign"):
            return {"thread_id": tid, "delivery": "active_turn", "turn_id": active.id, "input": public_input(entry)}
        return {"thread_id": tid, "delivery": "queued", "input": public_input(entry)}
