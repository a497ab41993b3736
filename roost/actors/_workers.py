"""Worker trees: subagents as supervised actors that freeze on interrupt (app-server-protocol.md,
"Interruption"; notifications ``agent/updated`` and ``agent/mailbox``).

A :class:`WorkerTree` belongs to one root thread and holds every worker below it, at any depth.
Each worker is a thread of kind ``worker`` with its own ThreadActor, turns, engine selection, tools
and execution lease; a *driver* task of the tree starts the worker's turn and waits for its end.
The tree is a supervisor of its workers: each driver is a *temporary* child of the tree's
:class:`~roost.supervisor.Supervisor` (a crashed driver is logged and its worker settled, never
replayed: a turn is not idempotent). Freezing the tree stops that supervisor, every driver at once:
each driver, cancelled, interrupts its worker's turn (partial results are kept) and waits for it to
settle, shielded and bounded.

States: pending, queued, running, waiting_children (nonterminal); completed, failed, cancelled,
interrupted (terminal). At most ``max_parallel`` workers of a tree run at once; later spawns are
``queued`` and start in spawn order as slots free. A worker that ends while its children still run
parks in ``waiting_children`` and delivers once, after them.

Delivery is exactly once: a finished worker sends one ``agent/mailbox`` message (``agent_result``)
to its parent, claimed in SQLite (``delivered`` flips 0 -> 1 in the same transaction as the final
status). A result for the root is steered into the running root turn, or queued as an internal turn
that resumes the root when it is idle; ``wait_agents`` claims the results it returns.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

import trio

from roost._paths import tree_settings
from roost.actors._actor import shielded_cleanup
from roost.actors._agent_tools import AGENT_TOOL_NAMES, agent_tool_schemas, run_agent_tool
from roost.actors._worker_state import TERMINAL, WorkerState, worker_thread
from roost.engines import ToolSchema
from roost.errors import RoostError
from roost.storage import (
    claim_queued_worker,
    create_thread,
    create_worker,
    list_workers,
    mark_worker_delivered,
    new_id,
    update_worker,
    utc_now,
)
from roost.supervisor import ChildSpec, Restart, Supervisor

if TYPE_CHECKING:
    from roost.actors._thread import ThreadActor

__all__ = ["WorkerTree", "WorkerState", "AGENT_TOOL_NAMES", "agent_tool_schemas", "TERMINAL", "tree_settings"]

log = logging.getLogger("roost.workers")

#: Characters of a worker's final text kept in its delivered result.
RESULT_CHARS = 8000


class WorkerTree:
    """The workers under one root thread.

    Args:
        root: the root ThreadActor (its hub receives ``agent/updated`` and ``agent/mailbox``).
        max_parallel: workers running at once in this tree.
        max_depth: deepest worker level (root = 0; a worker at ``max_depth`` cannot spawn).
    """

    def __init__(self, root: ThreadActor, *, max_parallel: int | None = None, max_depth: int | None = None) -> None:
        default_parallel, default_depth = tree_settings()
        self.root = root
        self.max_parallel = max_parallel or default_parallel
        self.max_depth = max_depth or default_depth
        self.workers: dict[str, WorkerState] = {}
        self.queue: list[str] = []  # queued worker ids, in spawn order
        self.running: set[str] = set()
        self.frozen = False
        self.snapshot_pending = False
        self.waiting: set[str] = set()  # ids a wait_agents call is about to claim
        self.origin: Any = None
        self._scope = trio.CancelScope()
        #: the supervisor of this generation's drivers (None while frozen or not running)
        self.supervisor: Supervisor | None = None
        self._drivers = 0
        self._generation_done = trio.Event()
        self._spawn_counter = 0
        self._changed = trio.Event()
        self._results: list[str] = []  # texts for the root, not yet handed over
        self._results_ready = trio.Event()

    # -- service --------------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Host the drivers until cancelled; a freeze ends one generation and starts the next.

        Cancellation: cancelling ``run`` (the root actor stopping) cancels every driver, each of
        which interrupts its worker's turn under a shielded, bounded clean-up.
        """
        started = False
        async with trio.open_nursery() as outer:
            outer.start_soon(self._deliverer)
            while True:
                done = trio.Event()
                self._generation_done = done
                with trio.CancelScope() as self._scope:
                    try:
                        supervisor = Supervisor(
                            name=f"workers:{self.root.thread.id}", intensity=1000, period=1, stop_together=True
                        )
                        async with trio.open_nursery() as nursery:
                            await nursery.start(supervisor.run)
                            self.supervisor = supervisor
                            if not started:
                                started = True
                                task_status.started()
                            await trio.sleep_forever()
                    finally:
                        self.supervisor = None
                        done.set()

    async def _deliverer(self) -> None:
        """Hand results for the root to it in batches: one steer (or one internal turn) for all the
        results that arrived meanwhile, so a thousand finishing workers cost the root a few messages."""
        while True:
            await self._results_ready.wait()
            self._results_ready = trio.Event()
            if not self._results:
                continue
            batch, self._results = self._results, []
            try:
                await self.root.deliver_internal("\n\n".join(batch))
            except RoostError as exc:  # the root's mailbox is full or slow: try again shortly
                log.warning(
                    "delivering %d worker results to %s failed (%s); retrying", len(batch), self.root.thread.id, exc
                )
                self._results[:0] = batch
                await trio.sleep(0.05)
                self._results_ready.set()

    def views(self) -> list[dict]:
        """Every worker of the tree as an ``agent`` view, in spawn order."""
        root_id = self.root.thread.id
        return [w.view(root_id) for w in sorted(self.workers.values(), key=lambda w: w.spawn_order)]

    @property
    def live(self) -> list[WorkerState]:
        return [w for w in self.workers.values() if w.status not in TERMINAL]

    def _emit_updated(self, worker: WorkerState) -> None:
        worker.updated_at = utc_now()
        self.root.emit("agent/updated", {"thread_id": self.root.thread.id, "agent": worker.view(self.root.thread.id)})
        self._changed.set()
        self._changed = trio.Event()

    async def _persist(self, fn: Any, *args: Any) -> Any:
        if self.root.ephemeral:
            return None
        return await self.root.services.store.writer.submit(fn, *args)

    # -- tools ----------------------------------------------------------------------------------

    def tool_schemas(self, caller: ThreadActor) -> tuple[ToolSchema, ...]:
        depth = 0 if caller is self.root or caller.worker_id is None else self.workers[caller.worker_id].depth
        return agent_tool_schemas(can_spawn=depth < self.max_depth)

    async def run_tool(self, caller: ThreadActor, turn: Any, name: str, args: dict) -> tuple[str, bool, dict]:
        """Run a subagent tool for ``caller`` (the root or a worker); returns (output, is_error, metadata)
        (:func:`roost.actors._agent_tools.run_agent_tool`)."""
        return await run_agent_tool(self, caller, turn, name, args)

    # -- lifecycle of workers -------------------------------------------------------------------

    async def spawn(
        self,
        *,
        parent_id: str | None,
        parent_thread_id: str,
        name: str,
        description: str,
        prompt: str,
        model: str | None = None,
    ) -> WorkerState:
        """Create a worker (its thread and row) and start it, or queue it when no slot is free."""
        root = self.root
        self._spawn_counter += 1
        parent = self.workers.get(parent_id) if parent_id else None
        depth = 1 if parent is None else parent.depth + 1
        now = utc_now()
        src = root.thread
        thread = worker_thread(src, name=name, model=model, parent_thread_id=parent_thread_id, now=now)
        worker = WorkerState(
            id=new_id("wrk"),
            thread_id=thread.id,
            parent_id=parent_id,
            parent_thread_id=parent_thread_id,
            name=name,
            description=description,
            prompt=prompt,
            depth=depth,
            spawn_order=self._spawn_counter,
            model=model,
            created_at=now,
            updated_at=now,
        )
        status = "running" if len(self.running) < self.max_parallel and not self.queue else "queued"
        worker.status = status

        def write(conn: Any) -> None:
            fields = {
                k: getattr(thread, k)
                for k in (
                    "title",
                    "cwd",
                    "provider",
                    "model",
                    "effort",
                    "permission_mode",
                    "parent_thread_id",
                    "metadata",
                )
            }
            create_thread(conn, kind="worker", id=thread.id, **fields)
            row = create_worker(
                conn,
                thread_id=thread.id,
                root_thread_id=src.id,
                parent_id=parent_id,
                name=name,
                status=status,
                id=worker.id,
            )
            update_worker(
                conn,
                worker.id,
                result={"description": description, "prompt": prompt, "model": model, "delivered": False},
            )
            worker.spawn_order = row.spawn_order

        await self._persist(write)
        await root.services_registry().create(
            thread, ephemeral=root.ephemeral, worker=(self, worker.id), persisted=not root.ephemeral
        )
        self.workers[worker.id] = worker
        if parent is not None:
            parent.children.append(worker.id)
        self._emit_updated(worker)
        if status == "running":
            self._start_driver(worker)
        else:
            self.queue.append(worker.id)
        return worker

    def _start_driver(self, worker: WorkerState, *, claim: bool = False) -> None:
        self.running.add(worker.id)
        worker.status = "running"
        self._start_child(worker, functools.partial(self._drive, worker, claim=claim))

    def _start_child(self, worker: WorkerState, drive: Any) -> None:
        """Start ``drive()`` as a temporary child ``worker:<id>#<n>`` of this generation's supervisor."""
        assert self.supervisor is not None
        self._drivers += 1

        async def start(*, task_status: Any) -> None:
            task_status.started()
            await drive()

        self.supervisor.start_child_soon(
            ChildSpec(f"worker:{worker.id}#{self._drivers}", start, restart=Restart.TEMPORARY, shutdown_timeout=30.0)
        )

    def _fill_slots(self) -> None:
        while self.queue and len(self.running) < self.max_parallel and not self.frozen and self.supervisor is not None:
            worker = self.workers[self.queue.pop(0)]
            if worker.status != "queued":
                continue
            self._start_driver(worker, claim=True)
            self._emit_updated(worker)

    async def restore(self) -> int:
        """Load this root's workers from the store (a restarted process); start the queued ones.

        Terminal workers come back for reference (wait_agents, snapshots); queued spawns are
        claimed exactly once (:func:`roost.storage.claim_queued_worker`) as slots free. Returns how
        many workers were loaded.
        """
        root = self.root
        store = root.services.store

        def read() -> list:
            with store.read() as conn:
                return list_workers(conn, root.thread.id)

        rows = await trio.to_thread.run_sync(read)
        registry = root.services_registry()
        for row in rows:
            parent = self.workers.get(row.parent_id) if row.parent_id else None
            worker = WorkerState.from_row(row, parent.thread_id if parent else root.thread.id)
            self.workers[worker.id] = worker
            if parent is not None:
                parent.children.append(worker.id)
            if registry is not None:
                registry.worker_links[row.thread_id] = (self, row.id)
            self._spawn_counter = max(self._spawn_counter, row.spawn_order)
            if worker.status == "queued":
                self.queue.append(worker.id)
        self._fill_slots()
        return len(rows)

    def _persist_status_soon(self, worker: WorkerState) -> None:
        if self.root.ephemeral:
            return
        try:
            self.root.services.store.writer.submit_nowait(
                functools.partial(update_worker, status=worker.status), worker.id
            )
        except RoostError:
            log.warning("worker %s: status %s not persisted (writer busy)", worker.id, worker.status)

    async def _drive(self, worker: WorkerState, *, message: str | None = None, claim: bool = False) -> None:
        """Run one turn of ``worker`` and settle it (delivering unless frozen).

        ``claim``: the worker was queued; claim it in the store first (exactly once).
        """
        from roost.actors._messages import InterruptTurn, StartTurn

        registry = self.root.services_registry()
        actor = None
        if claim and not self.root.ephemeral:
            try:
                claimed = await self._persist(claim_queued_worker, worker.id)
            except RoostError:
                claimed = False
            if not claimed:  # another process (or an earlier claim) has it
                self.running.discard(worker.id)
                log.info("worker %s was claimed elsewhere", worker.id)
                self._fill_slots()
                return
        try:
            actor = await registry.get(worker.thread_id)
            turn = await actor.ref.ask(StartTurn(prompt=message or worker.prompt, origin=self.origin or _origin()))
            worker.turn_id = turn["id"]
            view = await actor.wait_turn_end(turn["id"])
            worker.status = {"completed": "completed", "failed": "failed"}.get(view["status"], "interrupted")
            worker.result = (actor.last_agent_text() or (view.get("error") or {}).get("message") or "")[:RESULT_CHARS]
            worker.partial = worker.status != "completed"
        except trio.Cancelled:
            with shielded_cleanup(15.0):
                worker.status = "interrupted"
                worker.partial = True
                if actor is not None and worker.turn_id is not None:
                    try:
                        actor.ref.tell(InterruptTurn(reason="frozen"))
                        await actor.wait_turn_end(worker.turn_id)
                    except RoostError:
                        log.debug("could not freeze a worker's turn", exc_info=True)
                    worker.result = (actor.last_agent_text() or "")[:RESULT_CHARS]
                await self._settle(worker)
                self.running.discard(worker.id)
            raise
        except Exception as exc:
            log.exception("worker %s failed", worker.id)
            worker.status = "failed"
            worker.result = f"{type(exc).__name__}: {exc}"
        except BaseException:
            self.running.discard(worker.id)
            raise
        try:
            await self._settle(worker)
        except RoostError:  # never let one worker's bookkeeping take the tree down
            log.exception("worker %s: settling failed", worker.id)
        finally:
            # The slot frees once the end is announced, so agent/updated never shows more than
            # max_parallel workers running.
            self.running.discard(worker.id)
        self._fill_slots()

    async def _settle(self, worker: WorkerState) -> None:
        """Persist and announce a worker's end; deliver it (or park it in waiting_children)."""
        if worker.ended.is_set() and worker.status in TERMINAL:
            return
        live_children = [c for c in worker.children if self.workers[c].status not in TERMINAL]
        if live_children and not self.frozen and worker.status == "completed":
            worker.status = "waiting_children"
            self._emit_updated(worker)
            self._persist_status_soon(worker)
            return
        worker.ended.set()
        result = {
            "text": worker.result,
            "partial": worker.partial,
            "description": worker.description,
            "prompt": worker.prompt,
            "model": worker.model,
            "delivered": worker.delivered,
            "child_results": worker.child_results,
        }
        try:
            await self._persist(functools.partial(update_worker, status=worker.status, result=result), worker.id)
        except RoostError:
            log.exception("worker %s: final state not persisted", worker.id)
        self._emit_updated(worker)
        if not self.frozen and worker.id not in self.waiting:
            await self._deliver(worker)
        parent = self.workers.get(worker.parent_id) if worker.parent_id else None
        if (
            parent is not None
            and parent.status == "waiting_children"
            and all(self.workers[c].status in TERMINAL for c in parent.children)
        ):
            parent.status = "completed"
            await self._settle(parent)

    async def _claim(self, worker: WorkerState) -> bool:
        """Mark ``worker`` delivered exactly once (in memory and in SQLite); False if it was already."""
        if worker.delivered:
            return False
        worker.delivered = True
        if not self.root.ephemeral:

            def write(conn: Any) -> bool:
                return mark_worker_delivered(conn, worker.id)

            return bool(await self._persist(write))
        return True

    async def _deliver(self, worker: WorkerState) -> None:
        """Send the one ``agent/mailbox`` message of ``worker`` to its parent."""
        if not await self._claim(worker):
            return
        message = {
            "id": new_id("msg"),
            "kind": "agent_result",
            "from_agent_id": worker.id,
            "from_name": worker.name,
            "to_agent_id": worker.parent_id,
            "status": worker.status,
            "partial": worker.partial,
            "result": worker.result,
            "child_results": worker.child_results,
        }
        self.root.emit("agent/mailbox", {"thread_id": self.root.thread.id, "message": message})
        text = f"[agent_result] {worker.name} ({worker.id}) {worker.status}:\n{worker.result or ''}"
        parent = self.workers.get(worker.parent_id) if worker.parent_id else None
        if parent is None:
            self._results.append(text)
            self._results_ready.set()
            return
        if parent.status == "running":
            try:
                parent_actor = await self.root.services_registry().get(parent.thread_id)
                await parent_actor.deliver_internal(text, start_turn=False)
            except RoostError:
                log.exception("worker %s: result for its parent %s kept as a child result", worker.id, parent.id)
                parent.child_results.append(
                    {"agent_id": worker.id, "name": worker.name, "status": worker.status, "result": worker.result}
                )
        else:
            parent.child_results.append(
                {"agent_id": worker.id, "name": worker.name, "status": worker.status, "result": worker.result}
            )

    async def close(self, worker_id: str) -> None:
        """Cancel ``worker_id`` and its children (status cancelled), deepest first."""
        from roost.actors._messages import InterruptTurn

        worker = self.workers[worker_id]
        for child in list(worker.children):
            await self.close(child)
        if worker.status in TERMINAL:
            return
        if worker.id in self.queue:
            self.queue.remove(worker.id)
        was_running = worker.id in self.running
        worker.status = "cancelled"
        if was_running and worker.turn_id is not None:
            actor = await self.root.services_registry().get(worker.thread_id)
            actor.ref.tell(InterruptTurn(reason="closed"))
            await actor.wait_turn_end(worker.turn_id)
            worker.result = (actor.last_agent_text() or "")[:RESULT_CHARS]
            worker.partial = True
        await self._settle(worker)

    # -- freezing -------------------------------------------------------------------------------

    async def freeze(self, reason: str = "interrupted") -> int:
        """Freeze the whole tree in one cancellation; returns how many workers it stopped.

        Running workers are interrupted (partial results kept), queued spawns are cleared; every
        worker emits its own terminal ``agent/updated`` (interrupted) before this returns, so no
        worker event follows the root's terminal event. Nothing is delivered or restarted while
        frozen; the next user turn gets a snapshot (:meth:`take_snapshot`).
        """
        live = self.live
        if not live:
            return 0
        self.frozen = True
        self.snapshot_pending = True
        for worker_id in list(self.queue):
            worker = self.workers[worker_id]
            worker.status = "interrupted"
            worker.partial = True
            await self._settle(worker)
        self.queue.clear()
        done = self._generation_done
        self._scope.cancel()
        with trio.move_on_after(30):
            await done.wait()
        for worker in self.live:  # waiting_children, and any driver cut short
            worker.status = "interrupted"
            worker.partial = True
            await self._settle(worker)
        return len(live)

    def take_snapshot(self) -> str | None:
        """Text for the next user turn after a freeze: results, partial results, resume hints.

        Unfreezes the tree; restarts nothing.
        """
        if not self.snapshot_pending:
            return None
        self.snapshot_pending = False
        self.frozen = False
        lines = ["[worker tree snapshot: the previous turn was interrupted; nothing was restarted]"]
        for worker in sorted(self.workers.values(), key=lambda w: w.spawn_order):
            if worker.delivered and worker.status == "completed":
                continue
            indent = "  " * (worker.depth - 1)
            kind = "partial result" if worker.partial else "result"
            text = (worker.result or "").strip() or "(none)"
            hint = (
                f" To resume it, send_message(target={worker.name!r}, message=...)."
                if worker.status != "completed"
                else ""
            )
            lines.append(f"{indent}- {worker.name} ({worker.id}) {worker.status}; {kind}: {text}.{hint}")
            worker.delivered = True
        return "\n".join(lines) if len(lines) > 1 else None


def _origin() -> Any:
    from roost.actors._messages import Origin

    return Origin()
