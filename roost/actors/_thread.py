"""ThreadActor: admission, pending input, fan-out and the execution lease of one thread.

Its parts: pending input and held work are a :class:`~roost.actors._thread_inputs.PendingInputs`
component (``self.inputs``); each admitted turn is a :class:`~roost.actors._turn.TurnActor`, a
child of this actor (restart type temporary) that uses the thread only through the
:class:`~roost.actors._turn.TurnHost` protocol, which this class implements; the sampling loop is
:mod:`roost.actors._turn_loop`; loading and reconciling with the store is
:mod:`roost.actors._thread_store`.

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
from typing import Any

import trio

from roost import _faults as faults
from roost import storage
from roost.actors._actor import Actor, ActorState
from roost.actors._admission import Admission, prepare_admission
from roost.actors._compact import Compact, compact
from roost.actors._edit import ImportHistory, RetractFrom, import_history, retract_from
from roost.actors._hub import EventHub
from roost.actors._messages import (
    DeliverInternal,
    Dequeue,
    InterruptTurn,
    IsBusy,
    QueueInput,
    Snapshot,
    StartTurn,
    SteerInput,
    Subscribe,
    Unsteer,
    Unsubscribe,
    UpdateQueued,
    UpdateThread,
)
from roost.actors._thread_facts import ThreadFacts, copy_thread
from roost.actors._thread_inputs import PendingInputs, public_input
from roost.actors._thread_interrupt import interrupt
from roost.actors._thread_store import (
    apply_state,
    live_elsewhere,
    load_state,
    merge_held,
    read_held,
    read_lease,
    read_state,
    store_changed,
)
from roost.actors._turn import TurnActor
from roost.actors._views import history_from_items, thread_view
from roost.errors import InvalidParams, LifecycleError, RoostError, StaleTurn, ThreadBusy, TurnNotFound
from roost.storage import new_id, utc_now

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

    def __init__(self, thread: Any, services: Any, *, ephemeral: bool = False, fresh: bool = False) -> None:
        super().__init__(name=f"thread:{thread.id}")
        self.fresh = fresh
        self.thread = thread
        self.services = services
        self.ephemeral = ephemeral
        self.hub = EventHub()
        self.items: list[dict] = []  # item views in thread order (completed or settled)
        self.turns: list[dict] = []  # turn views, oldest first
        self.inputs = PendingInputs(self)  # pending input and held work (a component)
        self.history: list = []  # engine history
        self.active: TurnActor | None = None
        self.agent_name: str | None = None
        self.consumed_turn_ids: set[str] = set()
        self.idle = trio.Event()
        self.idle.set()
        self._turn_ended = trio.Event()
        self.stored_turns = 0  # turn rows of this thread in the store, last seen (admission, reload)
        self.stored_max_seq = 0  # highest item seq of this thread, last seen
        self.registry: Any = None  # the ThreadRegistry that started this actor
        self.tree: Any = None  # the WorkerTree this thread belongs to (root's own)
        self.worker_id: str | None = None  # set when this thread is a worker
        self._cwd: tuple[str, Path] | None = None  # (thread.cwd, resolved) of an absolute cwd

    # -- lifecycle ------------------------------------------------------------------------------

    async def on_start(self) -> None:
        if self.ephemeral or self.fresh:
            return  # nothing stored yet (a thread created by this process a moment ago)
        state = await trio.to_thread.run_sync(load_state, self.services.store, self.thread.id)
        # Input a dead process left pending is never re-run automatically: it becomes held work
        # (app-server-protocol.md: a restarted server exposes it through held_user_messages).
        await self.inputs.persist_held(apply_state(self, state), announce=False)
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
        entry = {
            "id": new_id("input"),
            "kind": "steer",
            "held": False,
            "client_id": msg.source_id,
            "prompt": msg.text,
            "_internal": True,
        }
        if self.active is not None or not msg.start_turn:
            self.pending.append(entry)
            return
        origin = self.tree.origin if self.tree is not None and self.tree.origin is not None else None
        try:
            await self._start_turn(
                StartTurn(
                    prompt=msg.text,
                    client_id=msg.source_id,
                    internal=True,
                    **({"origin": origin} if origin is not None else {}),
                )
            )
        except RoostError as exc:
            log.warning("thread %s: internal input waits (%s)", self.thread.id, exc)
            self.pending.append(entry)

    async def busy_elsewhere(self) -> bool:
        """Whether another process holds this thread's execution lease now (a store read)."""
        return await self._busy_elsewhere()

    async def _busy_elsewhere(self) -> bool:
        """Whether another process holds this thread's execution lease now (a store read)."""
        if self.ephemeral:
            return False

        lease = await trio.to_thread.run_sync(read_lease, self.services.store, self.thread.id)
        return live_elsewhere(lease, self.services.owner)

    async def refresh_if_changed(self) -> None:
        """While idle: reload from the store if another process changed this thread."""
        await self._refresh_if_changed()

    async def _refresh_if_changed(self) -> None:
        """While idle: reload from the store if another process changed this thread."""
        if self.ephemeral or self.active is not None:
            return
        tid, turn_rows, max_seq = self.thread.id, self.stored_turns, self.stored_max_seq

        def check() -> Any:
            with self.services.store.read() as conn:
                return read_state(conn, tid) if store_changed(conn, tid, turn_rows, max_seq) else None

        state = await trio.to_thread.run_sync(check)
        if state is not None and self.active is None:
            await self.inputs.persist_held(apply_state(self, state), reason="abandoned")

    async def on_stop(self) -> None:
        if self.active is not None:
            await self.active.done.wait()

    # -- the query interface (all a dialect reads of a thread actor; roost.actors._thread_facts) --

    @property
    def thread_id(self) -> str:
        """The thread's id (never changes)."""
        return self.thread.id

    def facts(self) -> ThreadFacts:
        """An immutable snapshot: a copy of the thread's record, cwd, ephemeral, the running turn."""
        return ThreadFacts(
            thread=copy_thread(self.thread),
            cwd=self.cwd,
            ephemeral=self.ephemeral,
            running_turn_id=self.active.id if self.active is not None else None,
            stopped=self.state is ActorState.STOPPED,
            local_input_ids=frozenset(e["id"] for e in self.inputs.pending + self.inputs.held if not e.get("_foreign")),
        )

    async def wait_idle(self) -> None:
        """Wait until no turn runs (returns at once when idle). Cancellation: a checkpoint."""
        await self.idle.wait()

    # -- helpers used by the turn loop ----------------------------------------------------------

    @property
    def cwd(self) -> Path:
        """The thread's working directory, resolved (an absolute one is resolved once per value:
        ``facts()`` and every turn ask for it, and resolving costs a ``stat`` per component)."""
        raw = self.thread.cwd or "."
        cached = self._cwd
        if cached is not None and cached[0] == raw:
            return cached[1]
        given = Path(raw)
        path = given.resolve()
        if given.is_absolute():  # a relative one follows the process's directory
            self._cwd = (raw, path)
        return path

    def emit(self, method: str, params: dict) -> None:
        self.hub.emit(method, params)

    def view(self) -> dict:
        status = "running" if self.active is not None else "idle"
        return thread_view(
            self.thread, ephemeral=self.ephemeral, status=status, active_turn_id=self.active.id if self.active else None
        )

    # -- the TurnHost interface (what a turn uses of its thread; roost.actors._turn) --------------

    def take_steers(self) -> list[dict]:
        return self.inputs.take_steers()

    def return_steers(self, steers: list[dict]) -> None:
        self.inputs.return_steers(steers)

    def has_steers(self) -> bool:
        return self.inputs.has_steers()

    def item_settled(self, turn: TurnActor, view: dict) -> None:
        if "seq" in view:
            self.stored_max_seq = max(self.stored_max_seq, view["seq"])
        self.items.append(view)
        if view["type"] == "user_message":
            self.history.extend(history_from_items([view]))  # with its images

    def inputs_at_end(self, turn: TurnActor) -> list[dict]:
        return self.inputs.at_turn_end()

    def turn_finished(self, turn: TurnActor, moved: list[dict]) -> None:
        tid = self.thread.id
        view = turn.view()
        view["thread_id"] = tid
        turns = self.turns
        for index in range(len(turns) - 1, -1, -1):  # the newest first: it is almost always last
            if turns[index]["id"] == turn.id:
                turns[index] = view
                break
        for entry in moved:
            self.inputs.announce("turn/held", entry, "held", reason="turn_ended")
        if self.active is turn:
            self.active = None
        method = "turn/error" if turn.status == "failed" else "turn/completed"
        self.emit(method, {"thread_id": tid, "turn": dict(view, items=list(turn.items))})
        self.idle.set()
        self._turn_ended.set()
        self._turn_ended = trio.Event()

    def turn_released(self, turn: TurnActor) -> None:
        if self.active is not None and self.active is not turn:
            # A newer turn started while this one released its lease (its terminal event was
            # already out): the pending input is that turn's now (e.g. the worker-tree snapshot
            # it was given), not late input of this one.
            return
        if turn.status == "completed":
            self.inputs.dispatch_next()  # a completed turn starts queued input next
            return
        late = self.inputs.at_turn_end()  # accepted while the turn was ending: held work too
        if late:
            try:
                self.nursery.start_soon(functools.partial(self.inputs.persist_held, late, reason="turn_ended"))
            except LifecycleError:
                pass  # stopping: the rows stay pending in the store and are held at the next load

    # -- the InputsHost interface (roost.actors._thread_inputs) --------------------------------

    def consumed(self, client_id: str) -> bool:
        return any(i.get("source_id") == client_id for i in self.items if i["type"] == "user_message")

    async def start_turn(self, msg: StartTurn) -> dict:
        return await self._start_turn(msg)

    # The pending input lives in ``self.inputs``; these keep the older attribute names working.

    @property
    def pending(self) -> list[dict]:
        return self.inputs.pending

    @pending.setter
    def pending(self, value: list[dict]) -> None:
        self.inputs.pending = value

    @property
    def held(self) -> list[dict]:
        return self.inputs.held

    @held.setter
    def held(self, value: list[dict]) -> None:
        self.inputs.held = value

    @property
    def _dispatching(self) -> dict | None:
        return self.inputs.dispatching

    async def finish_turn(
        self,
        turn: TurnActor,
        *,
        settle: list[dict] | None = None,
        settle_status: str = "interrupted",
        open_items: dict[str, dict] | None = None,
    ) -> None:
        """:meth:`TurnActor.finish` (kept for callers of the former name)."""
        await turn.finish(settle=settle, settle_status=settle_status, open_items=open_items)

    async def launch(self, turn: TurnActor) -> None:
        """Start ``turn`` (already :attr:`active`) as a child of this thread and wait for its
        admission (:meth:`TurnActor.on_start`); on failure the thread is idle again.

        Raises:
            ThreadBusy: another execution holds the thread's lease.
            StaleLease, StoreBusy: the admission write failed (nothing was admitted).
        """
        try:
            await self.nursery.start(turn.run)
        except BaseException:
            if self.active is turn:
                self.active = None
                self.idle.set()
            raise

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
        handler: Any = _HANDLERS.get(type(message))
        if handler is None:
            raise InvalidParams(f"thread actor cannot handle {type(message).__name__}")
        return await handler(self, message)

    def _check_new_client_id(self, client_id: str) -> None:
        """Refuse ``client_id`` for new input if the thread consumed it or holds input with it.

        Raises:
            InvalidParams: consumed, or pending/held input carries it (send that with turn/steer).
        """
        if self.consumed(client_id):
            raise InvalidParams(f"client_id {client_id!r} was already consumed by thread {self.thread.id}")
        for entry in self.inputs.pending + self.inputs.held:
            if entry.get("client_id") == client_id:
                raise InvalidParams(
                    f"client_id {client_id!r} belongs to pending input {entry['id']}; "
                    "send it with turn/steer (input_id)"
                )

    async def _start_turn(self, msg: StartTurn) -> dict:
        if self.active is not None:
            raise ThreadBusy(f"thread {self.thread.id} is running turn {self.active.id}")
        if self.inputs.dispatching is not None and msg.input_id != self.inputs.dispatching["id"]:
            raise ThreadBusy(f"thread {self.thread.id} is starting a turn with queued input")
        if msg.check_client_id and msg.client_id is not None and msg.input_id is None:
            await self._refresh_if_changed()  # a client_id another process consumed counts too
            if self.active is not None:
                raise ThreadBusy(f"thread {self.thread.id} is running turn {self.active.id}")
            self._check_new_client_id(msg.client_id)
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
                self.pending.insert(
                    0,
                    {
                        "id": new_id("input"),
                        "kind": "steer",
                        "held": False,
                        "client_id": "roost:worker_snapshot",
                        "prompt": snapshot,
                        "_internal": True,
                    },
                )
        turn = TurnActor(self, new_id("turn"), msg.origin, run_id=msg.run_id, start=msg)
        turn.resume_after_turn_id = msg.resume_after_turn_id
        turn.agent = msg.agent
        self.active = turn
        self.idle = trio.Event()
        await self.launch(turn)
        if msg.resume_after_turn_id is not None:
            self.consumed_turn_ids.add(msg.resume_after_turn_id)
        view = turn.view(with_items=True)
        view["thread_id"] = self.thread.id
        return view

    def admission(self, turn: TurnActor) -> Admission:
        """Prepare the admission of ``turn``: the turn and its user input, made durable in one
        transaction with the thread's execution lease (before the request is answered).

        Under the lease the store is the truth: turns a dead or superseded execution left
        ``running`` are settled as interrupted, and if another process changed the thread since
        this actor last looked, the conversation is reloaded before the turn is added.
        """
        return prepare_admission(self, turn)

    async def _snapshot(self, msg: Snapshot) -> dict:
        await self._refresh_if_changed()
        if not self.ephemeral:  # held work another process on this store added or sent
            merge_held(self, await trio.to_thread.run_sync(read_held, self.services.store, self.thread.id))
        turns = self.turns if msg.history_turns is None else self.turns[-msg.history_turns :]
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
        if msg.selection and await self._is_busy(IsBusy()):
            # app-server-protocol.md: "Selection changes return thread_busy while the conversation
            # has active execution, including outstanding workers or a cross-process execution lease."
            raise ThreadBusy(
                f"thread {self.thread.id} is executing (a turn, queued input starting, "
                "live workers, or another process's execution lease)"
            )
        for key, value in msg.changes.items():
            setattr(self.thread, key, value)
        self.thread.updated_at = utc_now()
        if not self.ephemeral:
            await self.services.store.writer.submit(
                functools.partial(storage.update_thread, updated_at=self.thread.updated_at, **msg.changes),
                self.thread.id,
            )
        view = self.view()
        self.emit("thread/updated", {"thread": view})
        return view

    async def _is_busy(self, msg: IsBusy) -> bool:
        """True while a turn is admitted here, a queued input is starting, workers of this root
        are live, or another process holds the lease."""
        if self.tree is not None and self.worker_id is None and self.tree.live:
            return True
        if self.active is not None or self.inputs.dispatching is not None:
            return True
        return await self._busy_elsewhere()


_HANDLERS = {
    StartTurn: ThreadActor._start_turn,
    InterruptTurn: interrupt,
    QueueInput: lambda actor, msg: actor.inputs.queue(msg),
    UpdateQueued: lambda actor, msg: actor.inputs.update_queued(msg),
    Dequeue: lambda actor, msg: actor.inputs.dequeue(msg),
    SteerInput: lambda actor, msg: actor.inputs.steer(msg),
    Unsteer: lambda actor, msg: actor.inputs.unsteer(msg),
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
