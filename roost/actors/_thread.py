"""ThreadActor: admission, queue/steer/held input, the event hub, and the turns of one thread.

One ThreadActor per loaded thread, a dynamic child of the ThreadRegistry. It admits at most one
turn at a time, and only under the thread's execution lease, so two processes on one database never
both run a turn of the same thread (the loser gets ``thread_busy``).

Durability (app-server-protocol.md, "Turns and execution runs"): accepted input is committed to
SQLite before the request is answered; a retry with the same ``client_id`` returns the original
input instead of a duplicate.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import trio

from roost.actors._actor import Actor
from roost.actors._hub import EventHub
from roost.actors._messages import (
    Dequeue, InterruptTurn, IsBusy, QueueInput, Snapshot, StartTurn, SteerInput, Subscribe, Unsteer,
    Unsubscribe, UpdateQueued, UpdateThread,
)
from roost.actors._turn import TurnState, run_turn
from roost.actors._views import history_from_items, thread_view
from roost.engines._types import UserMessage
from roost.errors import (
    InvalidParams, LeaseHeld, NotFound, StaleLease, StaleTurn, ThreadBusy, TurnNotFound,
)
from roost.storage import _items, _threads, leases
from roost.storage._rows import new_id, utc_now

__all__ = ["ThreadActor"]

log = logging.getLogger("roost.thread")


class ThreadActor(Actor):
    """The actor of one thread.

    Args:
        thread: the :class:`roost.model.Thread` row.
        services: the process's :class:`~roost.actors.Services`.
        ephemeral: keep everything in memory only (``thread/start`` with ``ephemeral: true``).
    """

    mailbox_size = 512

    def __init__(self, thread: Any, services: Any, *, ephemeral: bool = False) -> None:
        super().__init__(name=f"thread:{thread.id}")
        self.thread = thread
        self.services = services
        self.ephemeral = ephemeral
        self.hub = EventHub()
        self.items: list[dict] = []          # item views in thread order (completed or settled)
        self.turns: list[dict] = []          # turn views, oldest first
        self.pending: list[dict] = []        # pending inputs: {id, kind: steer|queue, prompt, ...}
        self.held: list[dict] = []           # held work (not dispatched automatically)
        self.history: list = []              # engine history
        self.active: TurnState | None = None
        self.agent_name: str | None = None
        self.consumed_turn_ids: set[str] = set()
        self.idle = trio.Event()
        self.idle.set()
        self._turn_ended = trio.Event()

    # -- lifecycle ------------------------------------------------------------------------------

    async def on_start(self) -> None:
        if self.ephemeral:
            return
        store = self.services.store

        def load() -> tuple[list, list, list]:
            with store.read() as conn:
                turns = _threads.list_turns(conn, self.thread.id)
                items = _items.list_items(conn, self.thread.id)
                inputs = _items.list_held_input(conn, self.thread.id)
                return turns, items, inputs

        turns, items, inputs = await trio.to_thread.run_sync(load)
        by_turn: dict[str | None, list[dict]] = {}
        for row in items:
            view = {"id": row.id, "type": row.type, "status": row.status, "turn_id": row.turn_id,
                    "thread_id": row.thread_id, "seq": row.seq, **(row.payload or {})}
            self.items.append(view)
            by_turn.setdefault(row.turn_id, []).append(view)
        for row in turns:
            self.turns.append({
                "id": row.id, "thread_id": row.thread_id, "status": row.status, "run_id": row.run_id,
                "started_at": row.started_at, "completed_at": row.completed_at, "error": row.error,
                "usage": row.usage,
            })
            meta = row.error if isinstance(row.error, dict) else {}
            if meta.get("resume_after_turn_id"):
                self.consumed_turn_ids.add(meta["resume_after_turn_id"])
        for row in inputs:
            view = {"id": row.id, "kind": row.kind, "held": row.held, "client_id": row.client_id,
                    "position": row.position, **(row.payload or {})}
            (self.held if row.held else self.pending).append(view)
        self.history = history_from_items(self.items)

    async def on_stop(self) -> None:
        if self.active is not None:
            await self.active.done.wait()

    # -- helpers used by the turn loop ----------------------------------------------------------

    @property
    def cwd(self) -> Path:
        return Path(self.thread.cwd or ".").resolve()

    def emit(self, method: str, params: dict) -> None:
        self.hub.emit(method, params)

    def view(self) -> dict:
        status = "running" if self.active is not None else "idle"
        return thread_view(self.thread, ephemeral=self.ephemeral, status=status,
                           active_turn_id=self.active.id if self.active else None)

    async def persist(self, turn: TurnState | None, fn: Any, *args: Any) -> Any:
        """Run a storage write for this thread (fenced by the turn's lease token when given).

        Raises:
            StaleLease: the turn's lease was superseded; the write changed nothing.
        """
        if self.ephemeral:
            return None
        if turn is not None and turn.token is not None:
            fn = leases.fenced(leases.thread_lease_key(self.thread.id), turn.token, fn)
        return await self.services.store.writer.submit(fn, *args)

    async def complete_item(self, turn: TurnState, view: dict, open_items: dict[str, dict], *,
                            status: str = "completed") -> None:
        """Persist ``view`` as a settled item and emit item/completed."""
        open_items.pop(view["id"], None)
        view["status"] = status
        payload = {k: v for k, v in view.items() if k not in ("id", "type", "status", "turn_id", "thread_id", "seq")}
        text = view.get("text") if view["type"] in ("agent_message", "user_message") else None
        try:
            row = await self.persist(turn, functools.partial(
                _items.append_item, type=view["type"], payload=payload, text=text, turn_id=turn.id,
                status=status, id=view["id"]), self.thread.id)
        except StaleLease:
            log.warning("thread %s: item %s not persisted, lease lost", self.thread.id, view["id"])
            row = None
        if row is not None:
            view["seq"] = row.seq
        self.items.append(view)
        turn.items.append(view)
        self.emit("item/completed", {"thread_id": self.thread.id, "turn_id": turn.id, "item": view})

    async def request_approval(self, turn: TurnState, item: dict, kind: str, fields: dict) -> bool | None:
        """Ask the client that started ``turn`` (never a bystander); None if it cannot be asked."""
        ask = getattr(turn.origin, "request_approval", None)
        if ask is None:
            return None
        params = {"thread_id": self.thread.id, "turn_id": turn.id, "item_id": item["id"], "kind": kind, **fields}
        return await ask(params)

    async def admit_steers(self, turn: TurnState) -> None:
        """Admit pending steers into the running turn (called before each model request)."""
        steers = [p for p in self.pending if p["kind"] == "steer"]
        for steer in steers:
            self.pending.remove(steer)
            await self._append_user_item(turn, steer["prompt"], source_id=steer.get("client_id"),
                                         images=steer.get("images"), consume_input=steer["id"])
            self.emit("turn/steered", {"thread_id": self.thread.id, "turn_id": turn.id, "input": _public(steer)})

    async def _append_user_item(self, turn: TurnState, prompt: str, *, source_id: str | None,
                                images: Any = None, content_parts: Any = None,
                                consume_input: str | None = None, announce: bool = True) -> dict:
        view = {"id": new_id("item"), "type": "user_message", "status": "completed", "turn_id": turn.id,
                "thread_id": self.thread.id, "text": prompt, "source_id": source_id}
        if images:
            view["images"] = list(images)
        if content_parts is not None:
            view["content_parts"] = content_parts
        payload = {k: v for k, v in view.items() if k not in ("id", "type", "status", "turn_id", "thread_id")}

        def write(conn: Any) -> Any:
            if consume_input is not None:
                try:
                    _items.remove_held_input(conn, consume_input)
                except NotFound:
                    pass
            return _items.append_item(conn, self.thread.id, type="user_message", payload=payload,
                                      text=prompt, turn_id=turn.id, id=view["id"])

        row = await self.persist(turn, write)
        if row is not None:
            view["seq"] = row.seq
        self.items.append(view)
        turn.items.append(view)
        self.history.append(UserMessage(text=prompt))
        if announce:
            self.emit("item/started", {"thread_id": self.thread.id, "turn_id": turn.id, "item": view})
            self.emit("item/completed", {"thread_id": self.thread.id, "turn_id": turn.id, "item": view})
        return view

    async def finish_turn(self, turn: TurnState) -> None:
        """Persist the turn's end, settle pending input, emit the one terminal event."""
        tid = self.thread.id
        view = turn.view()
        view["thread_id"] = tid
        moved: list[dict] = []
        if turn.status != "completed":
            # Pending steers and queued input become durable held work, steers first.
            ordered = [p for p in self.pending if p["kind"] == "steer"] + [p for p in self.pending if p["kind"] == "queue"]
            self.pending = []
            for entry in ordered:
                entry["held"] = True
                self.held.append(entry)
                moved.append(entry)

        def write(conn: Any) -> None:
            _threads.update_turn(conn, turn.id, status=turn.status, completed_at=turn.completed_at,
                                 error=turn.error, usage=dict(turn.usage))
            for entry in moved:
                try:
                    _items.update_held_input(conn, entry["id"], held=True)
                except NotFound:
                    pass
            _threads.update_thread(conn, tid, updated_at=utc_now())

        try:
            # The turn row is settled even when the lease was lost: reconciliation would do the same.
            await self.persist(None, write)
        except Exception:
            log.exception("thread %s: could not persist the end of turn %s", tid, turn.id)
        for index, existing in enumerate(self.turns):
            if existing["id"] == turn.id:
                self.turns[index] = view
        for entry in moved:
            self.emit("turn/held", {"thread_id": tid, "input": _public(entry)})
        self.active = None
        method = "turn/error" if turn.status == "failed" else "turn/completed"
        full = dict(view)
        full["items"] = list(turn.items)
        self.emit(method, {"thread_id": tid, "turn": full})
        turn.done.set()
        self.idle.set()
        self._turn_ended.set()
        self._turn_ended = trio.Event()
        if turn.status == "completed":
            self._dispatch_next()

    def _dispatch_next(self) -> None:
        """Start the next queued input as a new turn (after a natural end)."""
        queued = [p for p in self.pending if p["kind"] in ("queue", "steer")]
        if not queued or self.active is not None:
            return
        entry = queued[0]
        self.pending.remove(entry)
        self.emit("turn/dequeued", {"thread_id": self.thread.id, "input": _public(entry)})
        try:
            self.ref.tell(StartTurn(prompt=entry["prompt"], client_id=entry.get("client_id"),
                                    images=tuple(entry.get("images") or ()), input_id=entry["id"],
                                    origin=entry.get("_origin") or _default_origin()))
        except Exception:
            log.exception("thread %s: could not dispatch queued input", self.thread.id)

    def turn_view(self, turn_id: str) -> dict | None:
        """The latest view of turn ``turn_id`` of this thread, or None."""
        for turn in reversed(self.turns):
            if turn["id"] == turn_id:
                return turn
        return None

    async def wait_turn_end(self, turn_id: str) -> dict:
        """Wait until turn ``turn_id`` is terminal; return its view (without items).

        Raises:
            TurnNotFound: the thread has no such turn.
        """
        while True:
            view = self.turn_view(turn_id)
            if view is None:
                raise TurnNotFound(f"thread {self.thread.id} has no turn {turn_id}")
            if view["status"] not in ("running", "queued"):
                return view
            await self._turn_ended.wait()

    # -- message handling -----------------------------------------------------------------------

    async def handle(self, message: Any) -> Any:
        handler = _HANDLERS.get(type(message))
        if handler is None:
            raise InvalidParams(f"thread actor cannot handle {type(message).__name__}")
        return await handler(self, message)

    async def _start_turn(self, msg: StartTurn) -> dict:
        if self.active is not None:
            raise ThreadBusy(f"thread {self.thread.id} is running turn {self.active.id}")
        if msg.resume_after_turn_id is not None:
            latest = self.turns[-1]["id"] if self.turns else None
            if msg.resume_after_turn_id in self.consumed_turn_ids:
                raise StaleTurn(f"turn {msg.resume_after_turn_id} was already continued")
            if msg.resume_after_turn_id != latest:
                raise StaleTurn(f"resume_after_turn_id {msg.resume_after_turn_id} is not the latest turn ({latest})")
        elif not msg.prompt and not msg.images:
            raise InvalidParams("prompt (or images) is required")
        turn = TurnState(new_id("turn"), msg.origin, run_id=msg.run_id)
        self.active = turn
        self.idle = trio.Event()
        try:
            await self.nursery.start(self._turn_task, turn, msg)
        except BaseException:
            self.active = None
            self.idle.set()
            raise
        if msg.resume_after_turn_id is not None:
            self.consumed_turn_ids.add(msg.resume_after_turn_id)
        view = turn.view(with_items=True)
        view["thread_id"] = self.thread.id
        return view

    async def _turn_task(self, turn: TurnState, msg: StartTurn, *, task_status: Any) -> None:
        """Hold the lease, make the input durable, report admission, then run the turn."""
        tid = self.thread.id
        keeper = self.services.keeper
        if self.ephemeral:
            execution = None
            user_item = await self._admit(turn, msg)
            task_status.started()
            await self._announce(turn, msg, user_item)
            await run_turn(self, turn, execution)
            return
        try:
            hold = keeper.hold(leases.thread_lease_key(tid), ttl=self.services.lease_ttl)
            execution = await hold.__aenter__()
        except LeaseHeld as exc:
            raise ThreadBusy(f"thread {tid} is executing in another process ({exc.owner})") from None
        try:
            turn.token = execution.lease.token
            turn.scope = execution.cancel_scope
            user_item = await self._admit(turn, msg)
            task_status.started()
            await self._announce(turn, msg, user_item)
            await run_turn(self, turn, execution)
        finally:
            with trio.CancelScope(shield=True):
                await hold.__aexit__(None, None, None)

    async def _admit(self, turn: TurnState, msg: StartTurn) -> dict | None:
        """Make the turn and its user input durable (before the request is answered)."""
        tid = self.thread.id
        meta = {"resume_after_turn_id": msg.resume_after_turn_id} if msg.resume_after_turn_id else None

        def write(conn: Any) -> None:
            _threads.create_turn(conn, tid, id=turn.id, run_id=msg.run_id)
            if meta:
                _threads.update_turn(conn, turn.id, error=meta)

        await self.persist(turn, write)
        self.turns.append({"id": turn.id, "thread_id": tid, "status": "running", "run_id": msg.run_id,
                           "started_at": turn.started_at, "completed_at": None, "error": None,
                           "usage": None})
        if msg.prompt or msg.images:
            return await self._append_user_item(turn, msg.prompt or "", source_id=msg.client_id,
                                                images=msg.images, content_parts=msg.content_parts,
                                                consume_input=msg.input_id, announce=False)
        return None

    async def _announce(self, turn: TurnState, msg: StartTurn, user_item: dict | None) -> None:
        """Emit turn/started and the user item, after the admitting response went out (bounded wait)."""
        if msg.ack is not None:
            with trio.move_on_after(5):
                await msg.ack.wait()
        tid = self.thread.id
        view = turn.view()
        view["thread_id"] = tid
        self.emit("turn/started", {"thread_id": tid, "turn": view})
        if user_item is not None:
            self.emit("item/started", {"thread_id": tid, "turn_id": turn.id, "item": user_item})
            self.emit("item/completed", {"thread_id": tid, "turn_id": turn.id, "item": user_item})

    async def _interrupt(self, msg: InterruptTurn) -> dict:
        tid = self.thread.id
        active = self.active
        if active is not None and (msg.turn_id is None or msg.turn_id == active.id):
            if active.interrupt_reason is None:
                active.interrupt_reason = msg.reason
            active.scope.cancel()
            view = active.view()
            view["thread_id"] = tid
            view["status"] = "interrupting" if active.status == "running" else active.status
            return {"thread_id": tid, "turn": view, "interrupted": True}
        if msg.turn_id is not None:
            for turn in self.turns:
                if turn["id"] == msg.turn_id:
                    return {"thread_id": tid, "turn": turn, "interrupted": False}
            raise TurnNotFound(f"thread {tid} has no turn {msg.turn_id}")
        latest = self.turns[-1] if self.turns else None
        return {"thread_id": tid, "turn": latest, "interrupted": False}

    async def _accept_input(self, kind: str, prompt: str, *, hold: bool, client_id: str | None,
                            images: tuple = (), origin: Any = None) -> tuple[dict, bool]:
        """Durably accept pending input; idempotent per client_id."""
        if client_id is not None:
            for entry in self.pending + self.held:
                if entry.get("client_id") == client_id:
                    return entry, False
        payload = {"prompt": prompt}
        if images:
            payload["images"] = list(images)
        entry = {"id": new_id("input"), "kind": kind, "held": hold, "client_id": client_id, **payload}
        if not self.ephemeral:
            row, created = await self.services.store.writer.submit(functools.partial(
                _items.add_held_input, kind=kind, payload=payload, held=hold, client_id=client_id,
                id=entry["id"]), self.thread.id)
            if not created:
                return {"id": row.id, "kind": row.kind, "held": row.held, "client_id": row.client_id,
                        **(row.payload or {})}, False
            entry["position"] = row.position
        if origin is not None:
            entry["_origin"] = origin
        (self.held if hold else self.pending).append(entry)
        return entry, True

    async def _queue(self, msg: QueueInput) -> dict:
        if not msg.prompt:
            raise InvalidParams("prompt is required")
        entry, created = await self._accept_input("queue", msg.prompt, hold=msg.hold, client_id=msg.client_id,
                                                  images=msg.images, origin=msg.origin)
        public = _public(entry)
        if created:
            self.emit("turn/held" if msg.hold else "turn/queued", {"thread_id": self.thread.id, "input": public})
            if not msg.hold and self.active is None:
                self._dispatch_next()
        return public

    async def _update_queued(self, msg: UpdateQueued) -> dict:
        for entry in self.pending + self.held:
            if entry["id"] == msg.input_id:
                entry["prompt"] = msg.prompt
                payload = {"prompt": msg.prompt}
                if entry.get("images"):
                    payload["images"] = entry["images"]
                if not self.ephemeral:
                    await self.services.store.writer.submit(functools.partial(
                        _items.update_held_input, payload=payload), msg.input_id)
                self.emit("turn/queued", {"thread_id": self.thread.id, "input": _public(entry)})
                return _public(entry)
        raise InvalidParams(f"no pending input {msg.input_id}")

    async def _remove_input(self, input_id: str, kinds: tuple[str, ...], event: str) -> dict:
        for bucket in (self.pending, self.held):
            for entry in bucket:
                if entry["id"] == input_id and entry["kind"] in kinds:
                    bucket.remove(entry)
                    if not self.ephemeral:
                        await self.services.store.writer.submit(_items.remove_held_input, input_id)
                    self.emit(event, {"thread_id": self.thread.id, "input": _public(entry)})
                    return _public(entry)
        raise InvalidParams(f"no pending input {input_id}")

    async def _dequeue(self, msg: Dequeue) -> dict:
        return await self._remove_input(msg.input_id, ("queue", "steer"), "turn/dequeued")

    async def _unsteer(self, msg: Unsteer) -> dict:
        return await self._remove_input(msg.input_id, ("steer",), "turn/unsteered")

    async def _steer(self, msg: SteerInput) -> dict:
        tid = self.thread.id
        if msg.input_id is not None:
            entry = next((e for e in self.held + self.pending if e["id"] == msg.input_id), None)
            if entry is None:
                raise InvalidParams(f"no held input {msg.input_id}")
            prompt, client_id = entry["prompt"], entry.get("client_id")
        else:
            if not msg.prompt:
                raise InvalidParams("prompt (or input_id) is required")
            entry, prompt, client_id = None, msg.prompt, msg.client_id
        if self.active is None:
            if msg.expected_turn_id is not None:
                raise StaleTurn(f"turn {msg.expected_turn_id} is not running on thread {tid}")
            # Idle: sending input (or a held item) starts a turn with it.
            if entry is not None:
                (self.held if entry in self.held else self.pending).remove(entry)
            turn = await self._start_turn(StartTurn(prompt=prompt, client_id=client_id, origin=msg.origin,
                                                    input_id=entry["id"] if entry else None))
            return {"thread_id": tid, "delivery": "started_turn", "turn": turn}
        if msg.expected_turn_id is not None and msg.expected_turn_id != self.active.id:
            raise StaleTurn(f"expected turn {msg.expected_turn_id}, the active turn is {self.active.id}")
        if entry is not None:
            (self.held if entry in self.held else self.pending).remove(entry)
            entry["kind"] = "steer"
            entry["held"] = False
            self.pending.append(entry)
            if not self.ephemeral:
                await self.services.store.writer.submit(functools.partial(
                    _items.update_held_input, kind="steer", held=False), entry["id"])
        else:
            entry, _ = await self._accept_input("steer", prompt, hold=False, client_id=client_id, origin=msg.origin)
        return {"thread_id": tid, "delivery": "active_turn", "turn_id": self.active.id, "input": _public(entry)}

    async def _snapshot(self, msg: Snapshot) -> dict:
        turns = self.turns if msg.history_turns is None else self.turns[-msg.history_turns:]
        by_turn: dict[str | None, list[dict]] = {}
        for item in self.items:
            by_turn.setdefault(item.get("turn_id"), []).append(item)
        if self.active is not None:
            live = {i["id"] for i in by_turn.get(self.active.id, [])}
            by_turn.setdefault(self.active.id, []).extend(i for i in self.active.items if i["id"] not in live)
        out_turns = [dict(t, items=by_turn.get(t["id"], [])) for t in turns]
        return {
            "thread": self.view(),
            "turns": out_turns,
            "pending_user_messages": [_public(e) for e in self.pending],
            "held_user_messages": [_public(e) for e in self.held],
            "has_more": msg.history_turns is not None and len(self.turns) > len(turns),
        }

    async def _subscribe(self, msg: Subscribe) -> None:
        self.hub.subscribe(msg.subscriber)

    async def _unsubscribe(self, msg: Unsubscribe) -> None:
        self.hub.unsubscribe(msg.subscriber)

    async def _update_thread(self, msg: UpdateThread) -> dict:
        if msg.selection and self.active is not None:
            raise ThreadBusy(f"thread {self.thread.id} is executing")
        for key, value in msg.changes.items():
            setattr(self.thread, key, value)
        self.thread.updated_at = utc_now()
        if not self.ephemeral:
            await self.services.store.writer.submit(functools.partial(
                _threads.update_thread, updated_at=self.thread.updated_at, **msg.changes), self.thread.id)
        view = self.view()
        self.emit("thread/updated", {"thread": view})
        return view

    async def _is_busy(self, msg: IsBusy) -> bool:
        return self.active is not None


def _public(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if not k.startswith("_")}


def _default_origin() -> Any:
    from roost.actors._messages import Origin

    return Origin()


_HANDLERS = {
    StartTurn: ThreadActor._start_turn,
    InterruptTurn: ThreadActor._interrupt,
    QueueInput: ThreadActor._queue,
    UpdateQueued: ThreadActor._update_queued,
    Dequeue: ThreadActor._dequeue,
    SteerInput: ThreadActor._steer,
    Unsteer: ThreadActor._unsteer,
    Snapshot: ThreadActor._snapshot,
    Subscribe: ThreadActor._subscribe,
    Unsubscribe: ThreadActor._unsubscribe,
    UpdateThread: ThreadActor._update_thread,
    IsBusy: ThreadActor._is_busy,
}
