"""The TurnActor of DESIGN.md section 2: one admitted turn of a thread (restart type *temporary*).

A ThreadActor admits input; each admitted turn is a :class:`TurnActor`, started in the thread's
nursery. The turn holds the thread's execution lease, writes the turn row and its input
(admission), runs its body (the sampling loop of :mod:`roost.actors._turn_loop`, or a compaction)
inside its own cancel scope, writes its items (fenced by the lease's token) and ends with exactly
one terminal event. It is never restarted: a turn is never replayed automatically (model calls and
tool side effects are not idempotent); a bug in it fails the turn, and the thread lives on.

The two sides talk through a small, explicit interface:

* thread -> turn: :meth:`TurnActor.interrupt`, :meth:`TurnActor.cut_for_steer`,
  :meth:`TurnActor.view` and :attr:`TurnActor.done` (also as the messages :class:`StopTurn` and
  :class:`CutForSteer` through the turn's mailbox);
* turn -> thread: the :class:`TurnHost` protocol, which the ThreadActor implements: its
  conversation history, the fan-out (``emit``), its pending steers, and three callbacks that keep
  the thread's own state (``admit``, ``item_settled``, ``turn_finished``).

An interrupted turn's ``error`` says who stopped it (STYLE.md: attributed cancellation):
``{"category": "cancelled", "reason": ..., "message": ...}`` with ``reason`` one of
``interrupted`` (turn/interrupt), ``shutdown`` (end of input), ``timeout``/other run reasons,
``lease_lost`` (the execution lease was superseded or expired; ``lease`` then names how, and every
later write of the turn was refused), or ``stopped`` (the thread actor was stopped).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import trio

from roost import _trace, storage
from roost._heap import note_large_output
from roost.actors._actor import Actor, shielded_cleanup
from roost.actors._turn_host import STOP_MESSAGES, CutForSteer, StopTurn, TurnBody, TurnHost
from roost.actors._views import item_payload, user_item_view
from roost.errors import InvalidParams, LeaseHeld, NotFound, RoostError, StaleLease, StoreBusy, ThreadBusy
from roost.storage import leases, utc_now

__all__ = ["STOP_MESSAGES", "TurnActor", "TurnState", "TurnHost", "StopTurn", "CutForSteer", "TurnBody"]

log = logging.getLogger("roost.turn")

#: Seconds a shielded write of turn state may take before the caller gives up (StoreBusy).
PERSIST_TIMEOUT = 30.0
#: Seconds a turn's terminal notification waits for the answer to the interrupt that ended it.
_ANSWER_WAIT_S = 5.0


class TurnActor(Actor):
    """One admitted turn (see the module doc).

    Args:
        host: the thread (a :class:`TurnHost`).
        turn_id: the turn's id.
        origin: who started it (approvals go back to it).
        run_id: the execution run it belongs to, or None.
        start: the :class:`~roost.actors._messages.StartTurn` that admitted it.
        body: what the turn does once admitted (:data:`TurnBody`; default: the sampling loop).
    """

    mailbox_size = 16
    #: DESIGN.md section 2: a turn is never restarted.
    restart = "temporary"

    def __init__(
        self,
        host: TurnHost | None,
        turn_id: str,
        origin: Any,
        *,
        run_id: str | None = None,
        start: Any = None,
        body: TurnBody | None = None,
    ) -> None:
        super().__init__(name=f"turn:{turn_id}")
        self.host: Any = host
        self.id = turn_id
        self.origin = origin
        self.run_id = run_id
        self.start = start
        self._body = body
        self.scope = trio.CancelScope()
        self.status = "running"
        self.started_at = utc_now()
        self.completed_at: str | None = None
        self.error: dict | None = None
        self.usage = {"input_tokens": 0, "output_tokens": 0, "cached_tokens": 0}
        self.items: list[dict] = []
        self.interrupt_reason: str | None = None
        self.done = trio.Event()
        self.token: int | None = None
        #: the :class:`roost.storage.Execution` holding the thread's lease (None when ephemeral)
        self.execution: Any = None
        self._hold: Any = None
        self._user_item: dict | None = None
        #: the turn this one continues (``turn/start`` with ``resume_after_turn_id``), or None
        self.resume_after_turn_id: str | None = None
        self.model_calls = 0
        self.final_text = ""
        #: orchestration agent turn: the agent's settings (:class:`AgentTurn`), else None
        self.agent: Any = None
        self.tool_rounds = 0
        #: ids of this turn's items stored while still in progress (their end replaces the row)
        self.checkpointed: set[str] = set()
        #: the model response streaming now (cancelled to cut it for a steer), and whether it is
        #: streaming text with no tool call started (only then is it cut)
        self.stream_cut: trio.CancelScope | None = None
        self.text_streaming = False
        self._terminal_after: list[trio.Event] = []  # answers the terminal notification follows

    # -- the interface of the thread -------------------------------------------------------------

    def interrupt(self, reason: str) -> bool:
        """Interrupt the turn (idempotent, not a checkpoint): cancel its scope, name ``reason``.

        Returns:
            True if the turn is (now, or already was) being interrupted; False if it is settling
            with an outcome of its own (completed, failed, lease lost).
        """
        if self.interrupt_reason is None:
            if self.status != "running":
                return False
            self.interrupt_reason = reason
            self.scope.cancel()
            _trace.hop("turn_cancelled", self.id)
        return True

    def terminal_after(self, answer: trio.Event) -> None:
        """Hold this turn's terminal notification until ``answer`` is set (at most
        :data:`_ANSWER_WAIT_S`): the answer to an interrupt goes out first (docs/app-server.md)."""
        self._terminal_after.append(answer)

    def cut_for_steer(self) -> None:
        """Cut the model response streaming text now, for a steer (app-server-protocol.md:
        "steering during an active model response closes the visible assistant item at that
        point, persists the prefix as a non-terminal steered fragment, admits the user item after
        it, and continues the same turn with the next model request"). A response that started a
        tool call, or a turn between responses, is not cut: the steer waits for the next step."""
        if self.stream_cut is not None and self.text_streaming:
            self.stream_cut.cancel()

    @property
    def tools(self) -> tuple[str, ...] | None:
        """The tool names this turn may use (None: every tool)."""
        return self.agent.tools if self.agent is not None else None

    def view(self, *, with_items: bool = False) -> dict:
        """The wire ``turn`` object (``thread_id`` None; the thread fills it in)."""
        view: dict[str, Any] = {
            "id": self.id,
            "thread_id": None,
            "status": self.status,
            "run_id": self.run_id,
            "started_at": self.started_at,
            "completed_at": self.completed_at,
            "error": self.error,
            "usage": dict(self.usage),
        }
        if with_items:
            view["items"] = list(self.items)
        return view

    async def handle(self, message: Any) -> Any:
        if isinstance(message, StopTurn):
            return self.interrupt(message.reason)
        if isinstance(message, CutForSteer):
            self.cut_for_steer()
            return None
        raise InvalidParams(f"a turn cannot handle {type(message).__name__}")

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Admit the turn (:meth:`_admission`), then run it as an actor until it has ended; reports
        its ref once admitted.

        Raises (to the ``nursery.start(turn.run)`` caller, nothing admitted): what
        :meth:`_admission` raises, unwrapped.
        """
        self._user_item = await self._admission()
        try:
            await super().run(task_status=task_status)
        finally:
            await self._release()  # normally released by the body's end already

    async def on_start(self) -> None:
        self.nursery.start_soon(self._main, self._user_item)

    async def _admission(self) -> dict | None:
        """Admission: take the thread's execution lease (persistent threads) and write the turn
        row and its input (:meth:`TurnHost.admission`) in one control-lane transaction
        (:meth:`roost.storage.LeaseKeeper.hold_with`); then the body runs in the turn's nursery.

        Returns:
            The turn's user item view (None: the turn has no user message).

        Raises:
            ThreadBusy: another execution holds the thread's lease (another process), or took it
                while the turn was being admitted.
            StoreBusy: the admission did not commit within :data:`PERSIST_TIMEOUT` (it may still).

        Cancellation: the admission's write is shielded (bounded), as :meth:`persist` is.
        """
        host = self.host
        tid = host.thread.id
        admission = host.admission(self)
        result = None
        if not host.ephemeral:
            hold = host.services.keeper.hold_with(
                leases.thread_lease_key(tid), admission.write, ttl=host.services.lease_ttl, control=True
            )
            try:
                with trio.CancelScope(shield=True, deadline=trio.current_time() + PERSIST_TIMEOUT) as scope:
                    self.execution, result = await hold.__aenter__()
            except LeaseHeld as exc:
                raise ThreadBusy(f"thread {tid} is executing in another process ({exc.owner})") from None
            if scope.cancelled_caught:
                raise StoreBusy(f"thread {tid}: the admission took longer than {PERSIST_TIMEOUT:g} s")
            self._hold = hold
            self.token = self.execution.lease.token
            if self.scope.cancel_called:  # interrupted while the lease was being taken
                self.execution.cancel_scope.cancel()
            self.scope = self.execution.cancel_scope
        try:
            return await admission.admitted(result)
        except BaseException as exc:
            await self._release()
            if isinstance(exc, StaleLease):
                raise ThreadBusy(f"thread {tid}: another process took the execution lease") from None
            raise

    async def _main(self, user_item: dict | None) -> None:
        """Announce the turn, run the body (which settles it), release the lease, stop."""
        from roost.actors._turn_loop import run_turn

        body = self._body or run_turn
        try:
            try:
                await self._announce(user_item)
            finally:
                await body(self, self.execution)  # settles the turn even if cancelled above
        except Exception:  # a bug: a temporary actor is not restarted; the thread lives on
            log.exception("turn %s crashed", self.id)
            if not self.done.is_set():
                self.status, self.error = "failed", {"category": "internal", "message": "the turn crashed"}
                with shielded_cleanup(30.0):
                    await self.finish()
        finally:
            await self._release()
            self.host.turn_released(self)
            self.stop("ended")
            note_large_output(len(self.final_text or ""))  # a large reply's buffers go back to the OS

    async def _release(self) -> None:
        if self._hold is not None:
            hold, self._hold = self._hold, None
            with trio.CancelScope(shield=True):
                await hold.__aexit__(None, None, None)

    async def _announce(self, user_item: dict | None) -> None:
        """Emit turn/started and the user item, after the admitting response went out (bounded wait)."""
        ack = getattr(self.start, "ack", None)
        if ack is not None:
            with trio.move_on_after(5):
                await ack.wait()
        tid = self.host.thread.id
        view = self.view()
        view["thread_id"] = tid
        self.host.emit("turn/started", {"thread_id": tid, "turn": view})
        if user_item is not None:
            self.host.emit("item/started", {"thread_id": tid, "turn_id": self.id, "item": user_item})
            self.host.emit("item/completed", {"thread_id": tid, "turn_id": self.id, "item": user_item})

    # -- writes of the turn -----------------------------------------------------------------------

    async def persist(self, fn: Any, *args: Any, urgent: bool = False, control: bool = False) -> Any:
        """Run a storage write for this turn, fenced by its lease token.

        ``urgent`` writes skip the writer's queue (:meth:`roost.storage.StoreWriter.submit_urgent`):
        the end of an interrupted turn, which a client is waiting on. ``control`` writes go in
        the writer's control lane, ahead of its queue (``submit_control``): the admission.

        Returns:
            What ``fn`` returned (None for an ephemeral thread: nothing is written).

        Raises:
            StaleLease: the turn's lease was superseded; the write changed nothing, and the
                turn's execution is cancelled (``lost_reason="superseded"``).
            StoreBusy: the write did not finish within 30 s (it may still commit).

        Cancellation: the write is shielded (bounded), so the caller's in-memory state can follow
        what was committed; a pending cancellation is delivered at the caller's next checkpoint.
        """
        host = self.host
        if host.ephemeral:
            return None
        execution = self.execution
        lane = "submit_urgent" if urgent else "submit_control" if control else "submit"
        if execution is not None:
            submit = getattr(execution, lane)
        else:
            writer = host.services.store.writer
            submit = getattr(writer, lane)
            if self.token is not None:
                fn = leases.fenced(leases.thread_lease_key(host.thread.id), self.token, fn)
        result: Any = None
        with trio.CancelScope(shield=True, deadline=trio.current_time() + PERSIST_TIMEOUT) as scope:
            result = await submit(fn, *args)
        if scope.cancelled_caught:
            raise StoreBusy(f"thread {host.thread.id}: a write took longer than {PERSIST_TIMEOUT:g} s")
        return result

    async def complete_item(self, view: dict, open_items: dict[str, dict], *, status: str = "completed") -> None:
        """Persist ``view`` as a settled item and emit item/completed.

        With the lease lost the write is refused (logged); the item still settles in memory.
        """
        await self.complete_items([view], open_items, status=status)

    async def complete_items(
        self, views: list[dict], open_items: dict[str, dict], *, status: str = "completed"
    ) -> None:
        """Persist several settled items in one write (in order), then emit item/completed for each."""
        if not views:
            return
        write = self.items_write(views, status)
        try:
            rows = await self.persist(write)
        except StaleLease:
            log.warning("thread %s: %d item(s) not persisted, lease lost", self.host.thread.id, len(views))
            rows = None
        self.items_settled(views, rows, open_items)

    async def checkpoint_item(self, view: dict) -> None:
        """Store ``view`` (an item still in progress, e.g. a tool call about to run) now, so a
        crash cannot lose it; its completion then updates the row. A write refused because the
        lease was lost is logged: the turn is being stopped anyway.
        """
        host = self.host
        if host.ephemeral or view["id"] in self.checkpointed:
            return
        tid = host.thread.id
        payload, text = item_payload(view)
        write = functools.partial(
            storage.append_item,
            type=view["type"],
            payload=payload,
            text=text,
            turn_id=self.id,
            status="in_progress",
            id=view["id"],
        )
        try:
            row = await self.persist(write, tid)
        except StaleLease:
            log.warning("thread %s: item %s not checkpointed, lease lost", tid, view["id"])
            return
        self.checkpointed.add(view["id"])
        if row is not None:
            view["seq"] = row.seq

    def checkpoint_stream(self, view: dict, text: str) -> None:
        """Queue a checkpoint of ``view`` (agent text or reasoning still streaming) with ``text``,
        its text so far, as an ``in_progress`` row (:mod:`roost.actors._checkpoint`); not a
        checkpoint of trio's, never waits. Fenced by the turn's lease token; a full writer queue
        skips this checkpoint (backpressure), the next one carries the text.
        """
        host = self.host
        if host.ephemeral:
            return
        payload, _ = item_payload(dict(view, text=text))
        # Not full-text indexed while it streams (re-indexing a growing text at every checkpoint
        # would cost O(n²)); the item's final write indexes it.
        write: Callable[..., Any] = functools.partial(
            storage.put_item,
            id=view["id"],
            type=view["type"],
            payload=payload,
            text=None,
            turn_id=self.id,
            status="in_progress",
            only_in_progress=True,
        )
        if self.token is not None:
            write = leases.fenced(leases.thread_lease_key(host.thread.id), self.token, write)
        try:
            host.services.store.writer.submit_nowait(write, host.thread.id)
        except RoostError as exc:  # StoreFull / StoreClosed: this checkpoint is skipped
            log.debug("thread %s: checkpoint of %s skipped (%s)", host.thread.id, view["id"], exc)
            return
        self.checkpointed.add(view["id"])

    def items_write(self, views: list[dict], status: str) -> Callable[[Any], list]:
        """Mark ``views`` settled with ``status``; return the write storing them (-> rows): an
        append, or a replacement of an item checkpointed while in progress."""
        tid = self.host.thread.id
        rows_in = []
        for view in views:
            view["status"] = status
            payload, text = item_payload(view)
            rows_in.append((view, payload, text, view["id"] in self.checkpointed))

        def write(conn: Any) -> list:
            return [
                storage.put_item(
                    conn, tid, id=v["id"], type=v["type"], payload=payload, text=text, turn_id=self.id, status=status
                )
                if stored
                else storage.append_item(
                    conn, tid, type=v["type"], payload=payload, text=text, turn_id=self.id, status=status, id=v["id"]
                )
                for v, payload, text, stored in rows_in
            ]

        return write

    def items_settled(self, views: list[dict], rows: list | None, open_items: dict[str, dict]) -> None:
        """Record settled ``views`` (their ``rows``, None when not persisted); emit item/completed."""
        host = self.host
        tid = host.thread.id
        for view, row in zip(views, rows or [None] * len(views), strict=True):
            open_items.pop(view["id"], None)
            if row is not None:
                view["seq"] = row.seq
            host.item_settled(self, view)
            self.items.append(view)
            host.emit("item/completed", {"thread_id": tid, "turn_id": self.id, "item": view})

    async def request_approval(self, item: dict, kind: str, fields: dict) -> bool | None:
        """Ask the client that started the turn (never a bystander); None if it cannot be asked."""
        ask = getattr(self.origin, "request_approval", None)
        if ask is None:
            return None
        params = {"thread_id": self.host.thread.id, "turn_id": self.id, "item_id": item["id"], "kind": kind, **fields}
        return await ask(params)

    async def append_user_item(
        self,
        prompt: str,
        *,
        source_id: str | None,
        images: Any = None,
        content_parts: Any = None,
        consume_input: str | None = None,
    ) -> dict:
        """Store a user message of this turn (a steer; ``consume_input``: the pending input row it
        consumes, in the same write); record it in the thread; emit item/started and item/completed."""
        host = self.host
        tid = host.thread.id
        view = user_item_view(tid, self.id, prompt, source_id=source_id, images=images, content_parts=content_parts)
        payload = {k: v for k, v in view.items() if k not in ("id", "type", "status", "turn_id", "thread_id")}

        def write(conn: Any) -> Any:
            if consume_input is not None:
                try:
                    storage.remove_held_input(conn, consume_input)
                except NotFound:
                    pass
            return storage.append_item(
                conn, tid, type="user_message", payload=payload, text=prompt, turn_id=self.id, id=view["id"]
            )

        row = await self.persist(write)
        if row is not None:
            view["seq"] = row.seq
        host.item_settled(self, view)
        self.items.append(view)
        host.emit("item/started", {"thread_id": tid, "turn_id": self.id, "item": view})
        host.emit("item/completed", {"thread_id": tid, "turn_id": self.id, "item": view})
        return view

    async def admit_steers(self) -> None:
        """Admit the thread's pending steers into this turn (before each model request)."""
        from roost.actors._thread_inputs import public_input

        for steer in self.host.take_steers():
            try:
                await self.append_user_item(
                    steer["prompt"],
                    source_id=steer.get("client_id"),
                    images=steer.get("images"),
                    consume_input=None if steer.get("_internal") else steer["id"],
                    content_parts=steer.get("content_parts"),
                )
            except BaseException:
                # Not admitted (e.g. the lease was lost): it stays pending, and becomes held work
                # when the turn ends.
                self.host.return_steers([steer])
                raise
            self.host.emit(
                "turn/steered",
                {
                    "thread_id": self.host.thread.id,
                    "turn_id": self.id,
                    "input": public_input(steer),
                    "state": "admitted",
                },
            )

    async def finish(
        self,
        *,
        settle: list[dict] | None = None,
        settle_status: str = "interrupted",
        open_items: dict[str, dict] | None = None,
    ) -> None:
        """Persist the turn's end, settle pending input, end the execution, emit the terminal event.

        A turn that did not complete turns pending steers and queued input into durable held work,
        steers first (:meth:`TurnHost.inputs_at_end`). The turn row, that input, the items of
        ``settle`` (items still open when the turn stopped, settled with ``settle_status``) and the
        release of the lease commit in one transaction fenced by the turn's token, before the one
        terminal event is emitted: an interrupt costs one store round trip. If the lease was lost,
        the turn's own writes are refused (its new holder settles the row); the user's input still
        becomes held work.

        Cancellation: called from the turn's shielded, bounded clean-up.
        """
        from roost.actors._thread_store import hold_inputs

        host = self.host
        settle = settle or []
        items_write = self.items_write(settle, settle_status) if settle else None
        tid = host.thread.id
        moved = host.inputs_at_end(self) if self.status != "completed" else []
        error = self.error
        if self.resume_after_turn_id:  # kept so the continued turn id stays consumed
            error = {**(error or {}), "resume_after_turn_id": self.resume_after_turn_id}
        execution = self.execution
        host.thread.updated_at = utc_now()
        updated_at = host.thread.updated_at

        def write(conn: Any) -> list | None:
            rows = items_write(conn) if items_write is not None else None
            storage.update_turn(
                conn, self.id, status=self.status, completed_at=self.completed_at, error=error, usage=dict(self.usage)
            )
            hold_inputs(conn, tid, moved)
            storage.update_thread(conn, tid, updated_at=updated_at)
            if execution is not None:
                leases.release(conn, execution.lease)  # the execution ends with its turn row
            return rows

        rows = None
        traced = _trace.enabled() and self.status != "completed"
        if traced:
            _trace.hop("settle_begin", self.id)
        try:
            rows = await self.persist(write, urgent=self.status != "completed")
            if execution is not None:
                execution.mark_released()  # committed with the turn row: the hold writes no other
        except StaleLease:
            log.warning("thread %s: turn %s ended after its lease was lost; its end is not persisted", tid, self.id)
            if moved and not host.ephemeral:
                try:
                    await host.services.store.writer.submit(hold_inputs, tid, moved)
                except Exception:
                    log.exception("thread %s: could not make input held work", tid)
        except Exception:
            log.exception("thread %s: could not persist the end of turn %s", tid, self.id)
        if traced:
            _trace.hop("settle_end", self.id)
        for answer in self._terminal_after:  # an interrupt's answer goes out before the end
            with trio.move_on_after(_ANSWER_WAIT_S):
                await answer.wait()
        if settle:
            self.items_settled(settle, rows, open_items if open_items is not None else {})
        host.turn_finished(self, moved)
        if traced:
            _trace.hop("terminal_emitted", self.id)
        self.done.set()


#: The name this class had before the turn became an actor (kept for callers outside this room).
TurnState = TurnActor
