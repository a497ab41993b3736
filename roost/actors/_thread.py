"""ThreadActor: admission, the event hub, and the turns of one thread (its pending input is
:mod:`roost.actors._thread_inputs`).

One ThreadActor per loaded thread, a dynamic child of the ThreadRegistry. It admits at most one
turn at a time, and only under the thread's execution lease, so two processes on one database never
both run a turn of the same thread (the loser gets ``thread_busy``).

Durability (app-server-protocol.md, "Turns and execution runs"): accepted input is committed to
SQLite before the request is answered; a retry with the same ``client_id`` returns the original
input instead of a duplicate, and a consumed ``client_id`` is refused.

Leases and other processes: a turn is admitted only once this process holds the thread's execution
lease. Under the lease the store is the truth: admission settles turns a dead or superseded
execution left ``running`` (as interrupted) and, when another process changed the thread since this
actor last looked, reloads the conversation first (so does ``thread/resume`` while idle). A turn's
end, its held input and the release of the lease commit in one transaction before the terminal
event goes out, so another process may take the thread as soon as a client sees the turn end.
Input a dead process left pending is never re-run: it becomes held work.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, Callable

import trio

from roost import _faults as faults
from roost.actors._actor import Actor
from roost.actors._compact import Compact, compact
from roost.actors._edit import ImportHistory, RetractFrom, import_history, retract_from
from roost.actors._hub import EventHub
from roost.actors._thread_store import (
    apply_state, hold_inputs, live_elsewhere, load_state, read_state, settle_abandoned, store_changed,
)
from roost.actors._messages import (
    DeliverInternal, Dequeue, InterruptTurn, IsBusy, QueueInput, Snapshot, StartTurn, SteerInput, Subscribe, Unsteer,
    Unsubscribe, UpdateQueued, UpdateThread,
)
from roost.actors._thread_inputs import PendingInputs, public_input
from roost.actors._turn import TurnState, run_turn
from roost.actors._views import history_from_items, thread_view
from roost.errors import (
    InvalidParams, LeaseHeld, NotFound, RoostError, StaleLease, StaleTurn, StoreBusy,
    ThreadBusy, TurnNotFound,
)
from roost.storage import _items, _threads, leases
from roost.storage._rows import new_id, utc_now

__all__ = ["ThreadActor"]

log = logging.getLogger("roost.thread")

#: Seconds a shielded write of turn state may take before the caller gives up (StoreBusy).
_PERSIST_TIMEOUT = 30.0


class ThreadActor(PendingInputs, Actor):
    """The actor of one thread.

    Args:
        thread: the :class:`roost.model.Thread` row.
        services: the process's :class:`~roost.actors.Services`.
        ephemeral: keep everything in memory only (``thread/start`` with ``ephemeral: true``).
    """

    mailbox_size = 512

    def __init__(self, thread: Any, services: Any, *, ephemeral: bool = False, fresh: bool = False) -> None:
        super().__init__(name=f"thread:{thread.id}")
        self.fresh = fresh
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
        self._dispatching: dict | None = None         # queued input being started as a turn
        self._dispatch_cancelled: str | None = None   # why an interrupt withdrew that start
        self._accepting: set[str] = set()             # input ids whose acceptance write is in flight
        self._turn_rows = 0                           # turn rows of this thread in the store, last seen
        self._max_seq = 0                             # highest item seq of this thread, last seen
        self.registry: Any = None                     # the ThreadRegistry that started this actor
        self.tree: Any = None                         # the WorkerTree this thread belongs to (root's own)
        self.worker_id: str | None = None             # set when this thread is a worker

    # -- lifecycle ------------------------------------------------------------------------------

    async def on_start(self) -> None:
        if self.ephemeral or self.fresh:
            return  # nothing stored yet (a thread created by this process a moment ago)
        state = await trio.to_thread.run_sync(load_state, self.services.store, self.thread.id)
        # Input a dead process left pending is never re-run automatically: it becomes held work
        # (app-server-protocol.md: a restarted server exposes it through held_user_messages).
        await self._persist_held(apply_state(self, state), announce=False)
        if self.thread.kind != "worker" and state.get("has_workers"):
            tree = await self.ensure_tree()
            await tree.restore()

    def services_registry(self) -> Any:
        """The ThreadRegistry (workers start their own ThreadActors through it)."""
        return self.registry

    def last_agent_text(self) -> str:
        """The text of this thread's latest agent message ('' if none)."""
        for item in reversed(self.items):
            if item["type"] == "agent_message" and item.get("text"):
                return item["text"]
        return ""

    async def ensure_tree(self) -> Any:
        """This root thread's WorkerTree, started in the actor's nursery on first use."""
        if self.tree is None:
            from roost.actors._workers import WorkerTree

            self.tree = WorkerTree(self)
            await self.nursery.start(self.tree.run)
        return self.tree

    async def deliver_internal(self, text: str, *, start_turn: bool = True) -> None:
        """Give this thread input from Roost itself (see :class:`DeliverInternal`)."""
        await self.ref.ask(DeliverInternal(text=text, start_turn=start_turn), timeout=30)

    async def _deliver_internal(self, msg: DeliverInternal) -> None:
        entry = {"id": new_id("input"), "kind": "steer", "held": False, "client_id": msg.source_id,
                 "prompt": msg.text, "_internal": True}
        if self.active is not None or not msg.start_turn:
            self.pending.append(entry)
            return
        origin = self.tree.origin if self.tree is not None and self.tree.origin is not None else None
        try:
            await self._start_turn(StartTurn(prompt=msg.text, client_id=msg.source_id, internal=True,
                                             **({"origin": origin} if origin is not None else {})))
        except RoostError as exc:
            log.warning("thread %s: internal input waits (%s)", self.thread.id, exc)
            self.pending.append(entry)

    async def _busy_elsewhere(self) -> bool:
        """Whether another process holds this thread's execution lease now (a store read)."""
        if self.ephemeral:
            return False

        def read() -> Any:
            with self.services.store.read() as conn:
                return leases.get_lease(conn, leases.thread_lease_key(self.thread.id))

        return live_elsewhere(await trio.to_thread.run_sync(read), self.services.owner)

    async def _refresh_if_changed(self) -> None:
        """While idle: reload from the store if another process changed this thread."""
        if self.ephemeral or self.active is not None:
            return
        tid, turn_rows, max_seq = self.thread.id, self._turn_rows, self._max_seq

        def check() -> Any:
            with self.services.store.read() as conn:
                return read_state(conn, tid) if store_changed(conn, tid, turn_rows, max_seq) else None

        state = await trio.to_thread.run_sync(check)
        if state is not None and self.active is None:
            await self._persist_held(apply_state(self, state))

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

    async def persist(self, turn: TurnState | None, fn: Any, *args: Any, urgent: bool = False) -> Any:
        """Run a storage write for this thread (fenced by the turn's lease token when given).

        ``urgent`` writes skip the writer's queue (:meth:`roost.storage.StoreWriter.submit_urgent`):
        the end of an interrupted turn, which a client is waiting on.

        Returns:
            What ``fn`` returned (None for an ephemeral thread: nothing is written).

        Raises:
            StaleLease: the turn's lease was superseded; the write changed nothing, and the
                turn's execution is cancelled (``lost_reason="superseded"``).
            StoreBusy: the write did not finish within 30 s (it may still commit).

        Cancellation: the write is shielded (bounded), so the caller's in-memory state can follow
        what was committed; a pending cancellation is delivered at the caller's next checkpoint.
        """
        if self.ephemeral:
            return None
        execution = turn.execution if turn is not None else None
        if execution is not None:
            # fenced by its token; a stale token cancels the execution
            submit = execution.submit_urgent if urgent else execution.submit
        else:
            writer = self.services.store.writer
            submit = writer.submit_urgent if urgent else writer.submit
            if turn is not None and turn.token is not None:
                fn = leases.fenced(leases.thread_lease_key(self.thread.id), turn.token, fn)
        result: Any = None
        with trio.CancelScope(shield=True, deadline=trio.current_time() + _PERSIST_TIMEOUT) as scope:
            result = await submit(fn, *args)
        if scope.cancelled_caught:
            raise StoreBusy(f"thread {self.thread.id}: a write took longer than {_PERSIST_TIMEOUT:g} s")
        return result

    async def complete_item(self, turn: TurnState, view: dict, open_items: dict[str, dict], *,
                            status: str = "completed") -> None:
        """Persist ``view`` as a settled item and emit item/completed.

        With the lease lost the write is refused (logged); the item still settles in memory.
        """
        await self.complete_items(turn, [view], open_items, status=status)

    async def complete_items(self, turn: TurnState, views: list[dict], open_items: dict[str, dict], *,
                             status: str = "completed") -> None:
        """Persist several settled items in one write (in order), then emit item/completed for each."""
        if not views:
            return
        write = self._items_write(turn, views, status)
        try:
            rows = await self.persist(turn, write)
        except StaleLease:
            log.warning("thread %s: %d item(s) not persisted, lease lost", self.thread.id, len(views))
            rows = None
        self._items_settled(turn, views, rows, open_items)

    async def checkpoint_item(self, turn: TurnState, view: dict) -> None:
        """Store ``view`` (an item still in progress, e.g. a tool call about to run) now, so a
        crash cannot lose it; its completion then updates the row. A write refused because the
        lease was lost is logged: the turn is being stopped anyway.
        """
        if self.ephemeral or view["id"] in turn.checkpointed:
            return
        tid = self.thread.id
        payload, text = _item_payload(view)

        def write(conn: Any) -> Any:
            return _items.append_item(conn, tid, type=view["type"], payload=payload, text=text, turn_id=turn.id,
                                      status="in_progress", id=view["id"])

        try:
            row = await self.persist(turn, write)
        except StaleLease:
            log.warning("thread %s: item %s not checkpointed, lease lost", tid, view["id"])
            return
        turn.checkpointed.add(view["id"])
        if row is not None:
            view["seq"] = row.seq
            self._max_seq = max(self._max_seq, row.seq)

    def _items_write(self, turn: TurnState, views: list[dict], status: str) -> Callable[[Any], list]:
        """Mark ``views`` settled with ``status``; return the write storing them (-> rows): an
        append, or an update of an item checkpointed while in progress."""
        tid = self.thread.id
        rows_in = []
        for view in views:
            view["status"] = status
            payload, text = _item_payload(view)
            rows_in.append((view, payload, text, view["id"] in turn.checkpointed))

        def write(conn: Any) -> list:
            return [_items.update_item(conn, v["id"], payload=payload, text=text, status=status) if stored
                    else _items.append_item(conn, tid, type=v["type"], payload=payload, text=text, turn_id=turn.id,
                                            status=status, id=v["id"])
                    for v, payload, text, stored in rows_in]

        return write

    def _items_settled(self, turn: TurnState, views: list[dict], rows: list | None,
                       open_items: dict[str, dict]) -> None:
        """Record settled ``views`` (their ``rows``, None when not persisted); emit item/completed."""
        tid = self.thread.id
        for view, row in zip(views, rows or [None] * len(views)):
            open_items.pop(view["id"], None)
            if row is not None:
                view["seq"] = row.seq
                self._max_seq = max(self._max_seq, row.seq)
            self.items.append(view)
            turn.items.append(view)
            self.emit("item/completed", {"thread_id": tid, "turn_id": turn.id, "item": view})

    async def request_approval(self, turn: TurnState, item: dict, kind: str, fields: dict) -> bool | None:
        """Ask the client that started ``turn`` (never a bystander); None if it cannot be asked."""
        ask = getattr(turn.origin, "request_approval", None)
        if ask is None:
            return None
        params = {"thread_id": self.thread.id, "turn_id": turn.id, "item_id": item["id"], "kind": kind, **fields}
        return await ask(params)

    async def _append_user_item(self, turn: TurnState, prompt: str, *, source_id: str | None,
                                images: Any = None, content_parts: Any = None,
                                consume_input: str | None = None, announce: bool = True) -> dict:
        view = self._user_view(turn, prompt, source_id=source_id, images=images, content_parts=content_parts)
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
            self._max_seq = max(self._max_seq, row.seq)
        self.items.append(view)
        turn.items.append(view)
        self.history.extend(history_from_items([view]))  # with its images
        if announce:
            self.emit("item/started", {"thread_id": self.thread.id, "turn_id": turn.id, "item": view})
            self.emit("item/completed", {"thread_id": self.thread.id, "turn_id": turn.id, "item": view})
        return view

    async def finish_turn(self, turn: TurnState, *, settle: list[dict] | None = None,
                          settle_status: str = "interrupted", open_items: dict[str, dict] | None = None) -> None:
        """Persist the turn's end, settle pending input, end the execution, emit the terminal event.

        A turn that did not complete turns pending steers and queued input into durable held work,
        steers first. The turn row, that input, the items of ``settle`` (items still open when the
        turn stopped, settled with ``settle_status``) and the release of the lease commit in one
        transaction fenced by the turn's token, before the one terminal event is emitted: an
        interrupt costs one store round trip. If the lease was lost, the turn's own writes are
        refused (its new holder settles the row); the user's input still becomes held work.

        Cancellation: called from the turn's shielded, bounded clean-up.
        """
        settle = settle or []
        items_write = self._items_write(turn, settle, settle_status) if settle else None
        tid = self.thread.id
        view = turn.view()
        view["thread_id"] = tid
        moved: list[dict] = []
        if turn.status != "completed":
            # Pending steers and queued input become durable held work, steers first.
            own = [p for p in self.pending if not p.get("_foreign")]
            ordered = [p for p in own if p["kind"] == "steer"] + [p for p in own if p["kind"] != "steer"]
            self.pending = [p for p in self.pending if p.get("_foreign")]
            for entry in ordered:
                entry["held"] = True
                self.held.append(entry)
                moved.append(entry)
        error = turn.error
        if turn.resume_after_turn_id:  # kept so the continued turn id stays consumed
            error = {**(error or {}), "resume_after_turn_id": turn.resume_after_turn_id}
        execution = turn.execution

        self.thread.updated_at = utc_now()
        updated_at = self.thread.updated_at

        def write(conn: Any) -> list | None:
            rows = items_write(conn) if items_write is not None else None
            _threads.update_turn(conn, turn.id, status=turn.status, completed_at=turn.completed_at,
                                 error=error, usage=dict(turn.usage))
            hold_inputs(conn, tid, moved)
            _threads.update_thread(conn, tid, updated_at=updated_at)
            if execution is not None:
                leases.release(conn, execution.lease)  # the execution ends with its turn row
            return rows

        rows = None
        try:
            rows = await self.persist(turn, write, urgent=turn.status != "completed")
        except StaleLease:
            log.warning("thread %s: turn %s ended after its lease was lost; its end is not persisted",
                        tid, turn.id)
            if moved:
                try:
                    await self.persist(None, hold_inputs, tid, moved)
                except Exception:
                    log.exception("thread %s: could not make input held work", tid)
        except Exception:
            log.exception("thread %s: could not persist the end of turn %s", tid, turn.id)
        if settle:
            self._items_settled(turn, settle, rows, open_items if open_items is not None else {})
        for index, existing in enumerate(self.turns):
            if existing["id"] == turn.id:
                self.turns[index] = view
        for entry in moved:
            self.emit("turn/held", {"thread_id": tid, "input": public_input(entry)})
        self.active = None
        method = "turn/error" if turn.status == "failed" else "turn/completed"
        full = dict(view)
        full["items"] = list(turn.items)
        self.emit(method, {"thread_id": tid, "turn": full})
        turn.done.set()
        self.idle.set()
        self._turn_ended.set()
        self._turn_ended = trio.Event()

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
        faults.point(f"thread.{type(message).__name__}")
        handler = _HANDLERS.get(type(message))
        if handler is None:
            raise InvalidParams(f"thread actor cannot handle {type(message).__name__}")
        return await handler(self, message)

    async def _start_turn(self, msg: StartTurn) -> dict:
        if self.active is not None:
            raise ThreadBusy(f"thread {self.thread.id} is running turn {self.active.id}")
        if self._dispatching is not None and msg.input_id != self._dispatching["id"]:
            raise ThreadBusy(f"thread {self.thread.id} is starting a turn with queued input")
        if msg.resume_after_turn_id is not None:
            latest = self.turns[-1]["id"] if self.turns else None
            if msg.resume_after_turn_id in self.consumed_turn_ids:
                raise StaleTurn(f"turn {msg.resume_after_turn_id} was already continued")
            if self.turn_view(msg.resume_after_turn_id) is None:
                raise TurnNotFound(f"thread {self.thread.id} has no turn {msg.resume_after_turn_id}")
            if msg.resume_after_turn_id != latest:
                raise StaleTurn(f"resume_after_turn_id {msg.resume_after_turn_id} is not the latest turn ({latest})")
        elif not msg.prompt and not msg.images:
            raise InvalidParams("prompt (or images) is required")
        if self.tree is not None and self.worker_id is None and not msg.internal:
            snapshot = self.tree.take_snapshot()
            if snapshot:  # the next user turn sees the frozen tree; nothing restarts
                self.pending.insert(0, {"id": new_id("input"), "kind": "steer", "held": False,
                                        "client_id": "roost:worker_snapshot", "prompt": snapshot,
                                        "_internal": True})
        turn = TurnState(new_id("turn"), msg.origin, run_id=msg.run_id)
        turn.resume_after_turn_id = msg.resume_after_turn_id
        turn.agent = msg.agent
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
        """Hold the lease, make the input durable, report admission, then run the turn.

        Raises (before admission is reported, so to :meth:`_start_turn`):
            ThreadBusy: another execution holds the thread's lease (another process).
        """
        await self.run_admitted(turn, msg, functools.partial(run_turn, self, turn), task_status=task_status)

    async def run_admitted(self, turn: TurnState, start: StartTurn, body: Any, *, task_status: Any) -> None:
        """Run an admitted turn: hold the thread's execution lease (persistent threads), write the
        turn row and its input (:meth:`_admit`), report admission, announce it, then
        ``await body(execution)`` (``execution`` None for an ephemeral thread), which must settle
        the turn even when cancelled; release the lease. A completed turn starts queued input next.

        Raises (before admission is reported, so to the ``nursery.start`` caller):
            ThreadBusy: another execution holds the thread's lease (another process), or took it
                while the turn was being admitted.
        """
        tid = self.thread.id
        if self.ephemeral:
            user_item = await self._admit(turn, start)
            task_status.started()
            try:
                await self._announce(turn, start, user_item)
            finally:
                await body(None)
        else:
            try:
                hold = self.services.keeper.hold(leases.thread_lease_key(tid), ttl=self.services.lease_ttl)
                execution = await hold.__aenter__()
            except LeaseHeld as exc:
                raise ThreadBusy(f"thread {tid} is executing in another process ({exc.owner})") from None
            try:
                turn.token = execution.lease.token
                turn.execution = execution
                if turn.scope.cancel_called:  # interrupted while the lease was being taken
                    execution.cancel_scope.cancel()
                turn.scope = execution.cancel_scope
                try:
                    user_item = await self._admit(turn, start)
                except StaleLease:
                    raise ThreadBusy(f"thread {tid}: another process took the execution lease") from None
                task_status.started()
                try:
                    await self._announce(turn, start, user_item)
                finally:
                    await body(execution)  # settles the turn even if cancelled above
            finally:
                with trio.CancelScope(shield=True):
                    await hold.__aexit__(None, None, None)
        if turn.status == "completed":
            self._dispatch_next()

    def _user_view(self, turn: TurnState, prompt: str, *, source_id: str | None, images: Any = None,
                   content_parts: Any = None) -> dict:
        """A new user_message item view of ``turn``."""
        view = {"id": new_id("item"), "type": "user_message", "status": "completed", "turn_id": turn.id,
                "thread_id": self.thread.id, "text": prompt, "source_id": source_id}
        if images:
            view["images"] = list(images)
        if content_parts is not None:
            view["content_parts"] = content_parts
        return view

    async def _admit(self, turn: TurnState, msg: StartTurn) -> dict | None:
        """Make the turn and its user input durable in one transaction (before the request is answered).

        Under the lease the store is the truth: turns a dead or superseded execution left
        ``running`` are settled as interrupted, and if another process changed the thread since
        this actor last looked, the conversation is reloaded before the turn is added.

        Raises:
            StaleLease: the lease was superseded before the write (nothing was written).
        """
        tid = self.thread.id
        meta = {"resume_after_turn_id": msg.resume_after_turn_id} if msg.resume_after_turn_id else None
        user = None
        if msg.prompt or msg.images:
            user = self._user_view(turn, msg.prompt or "", source_id=msg.client_id, images=msg.images,
                                   content_parts=msg.content_parts)
        payload = {k: v for k, v in (user or {}).items() if k not in ("id", "type", "status", "turn_id", "thread_id")}

        turn_rows, max_seq = self._turn_rows, self._max_seq

        def write(conn: Any) -> tuple[dict | None, Any]:
            state = None
            if settle_abandoned(conn, tid) or store_changed(conn, tid, turn_rows, max_seq):
                state = read_state(conn, tid)
            _threads.create_turn(conn, tid, id=turn.id, run_id=msg.run_id)
            if meta:
                _threads.update_turn(conn, turn.id, error=meta)
            row = None
            if user is not None:
                if msg.input_id is not None:
                    try:
                        _items.remove_held_input(conn, msg.input_id)
                    except NotFound:
                        pass
                row = _items.append_item(conn, tid, type="user_message", payload=payload,
                                         text=user["text"], turn_id=turn.id, id=user["id"])
            return state, row

        state, row = await self.persist(turn, write) or (None, None)
        if state is not None:
            log.info("thread %s: changed by another process; reloaded at admission", tid)
            keep = frozenset({msg.input_id}) if msg.input_id else frozenset()
            await self._persist_held(apply_state(self, state, keep=keep))
        self._turn_rows += 1
        self.turns.append({"id": turn.id, "thread_id": tid, "status": "running", "run_id": msg.run_id,
                           "started_at": turn.started_at, "completed_at": None, "error": None,
                           "usage": None})
        if user is None:
            return None
        if row is not None:
            user["seq"] = row.seq
            self._max_seq = max(self._max_seq, row.seq)
        self.items.append(user)
        turn.items.append(user)
        self.history.extend(history_from_items([user]))
        return user

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
        """Interrupt the active turn; answered deterministically in every state.

        Active (admitted, also before turn/started went out, or already settling): its scope is
        cancelled (idempotent) and the reply says ``interrupted: true`` with the turn ``interrupting``.
        Queued input about to start a turn: the start is withdrawn, the input becomes held work,
        ``interrupted: true``. Otherwise the latest (or named) turn as it is, ``interrupted: false``.
        """
        tid = self.thread.id
        active = self.active
        if active is None and self._dispatching is not None and msg.turn_id is None:
            if self._dispatch_cancelled is None:
                self._dispatch_cancelled = msg.reason
            latest = self.turns[-1] if self.turns else None
            return {"thread_id": tid, "turn": latest, "interrupted": True,
                    "input": public_input(self._dispatching)}
        if active is not None and (msg.turn_id is None or msg.turn_id == active.id):
            view = active.view()
            view["thread_id"] = tid
            if active.interrupt_reason is None:
                if active.status != "running":
                    # Already settling with an outcome of its own (completed, failed, lease lost).
                    return {"thread_id": tid, "turn": view, "interrupted": False}
                active.interrupt_reason = msg.reason
                active.scope.cancel()
            # Asked again while it settles: the same answer as the first time (idempotent).
            view["status"] = "interrupting"
            return {"thread_id": tid, "turn": view, "interrupted": True}
        if not self.ephemeral and await self._busy_elsewhere():
            # The turn runs in another process: this one cannot interrupt it (app-server-protocol.md
            # answers run/interrupt of a run attached elsewhere the same way, run_not_attached).
            raise ThreadBusy(f"thread {tid} is executing in another process; interrupt it through that app-server")
        if msg.turn_id is not None:
            for turn in self.turns:
                if turn["id"] == msg.turn_id:
                    return {"thread_id": tid, "turn": turn, "interrupted": False}
            raise TurnNotFound(f"thread {tid} has no turn {msg.turn_id}")
        latest = self.turns[-1] if self.turns else None
        if self.tree is not None and self.worker_id is None and self.tree.live:
            # No active turn, but live workers: freeze them (each emits its terminal agent/updated).
            frozen = await self.tree.freeze(msg.reason)
            self.emit("thread/updated", {"thread": self.view()})
            return {"thread_id": tid, "turn": latest, "interrupted": True, "workers_frozen": frozen}
        return {"thread_id": tid, "turn": latest, "interrupted": False}

    async def _snapshot(self, msg: Snapshot) -> dict:
        await self._refresh_if_changed()
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
            "pending_user_messages": [public_input(e) for e in self.pending if not e.get("_internal")],
            "held_user_messages": [public_input(e) for e in self.held],
            "has_more": msg.history_turns is not None and len(self.turns) > len(turns),
            "agents": self.tree.views() if self.tree is not None and self.worker_id is None else [],
        }

    async def _subscribe(self, msg: Subscribe) -> None:
        self.hub.subscribe(msg.subscriber)

    async def _unsubscribe(self, msg: Unsubscribe) -> None:
        self.hub.unsubscribe(msg.subscriber)

    async def _update_thread(self, msg: UpdateThread) -> dict:
        if msg.selection and (self.active is not None or await self._busy_elsewhere()):
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
        """True while a turn is admitted here, a queued input is starting, workers of this root
        are live, or another process holds the lease."""
        if self.tree is not None and self.worker_id is None and self.tree.live:
            return True
        if self.active is not None or self._dispatching is not None:
            return True
        return await self._busy_elsewhere()


def _item_payload(view: dict) -> tuple[dict, str | None]:
    """An item view's stored ``payload`` (the fields without columns) and searchable ``text``."""
    payload = {k: v for k, v in view.items() if k not in ("id", "type", "status", "turn_id", "thread_id", "seq")}
    text = view.get("text") if view["type"] in ("agent_message", "user_message") else None
    return payload, text


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
    DeliverInternal: ThreadActor._deliver_internal,
    RetractFrom: retract_from,
    ImportHistory: import_history,
    Compact: compact,
}
