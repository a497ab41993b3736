"""ThreadRegistry: loads ThreadActors on demand as dynamic children of the threads supervisor."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import trio

from roost.actors._interrupt import interrupt_active
from roost.actors._thread import ThreadActor
from roost.errors import LifecycleError, NotFound, ThreadNotFound
from roost.storage import create_thread, get_thread
from roost.supervisor import ChildSpec, Restart, Supervisor

log = logging.getLogger("roost.actors")

__all__ = ["ThreadRegistry"]


class ThreadRegistry:
    """Finds or starts the ThreadActor of a thread.

    Persistent threads are loaded from the store on first use; ephemeral ones exist only here.
    Each ThreadActor is a *transient* child of ``supervisor``: a crash restarts it from the store.
    """

    def __init__(self, supervisor: Supervisor, services: Any) -> None:
        self.supervisor = supervisor
        self.services = services
        self.actors: dict[str, ThreadActor] = {}
        self._ephemeral: dict[str, Any] = {}
        #: thread id -> its subscriber list, shared with every instance of its actor, so
        #: subscriptions survive a restart of the actor
        self.subscribers: dict[str, list] = {}
        #: worker thread id -> (WorkerTree, worker id), re-applied when the actor restarts
        self.worker_links: dict[str, tuple[Any, str]] = {}
        self._fresh: set[str] = set()  # created here, nothing to load from the store yet
        self._lock = trio.Lock()
        #: set while ``supervisor`` runs; a restart of the threads supervisor clears it meanwhile
        self._ready = trio.Event()
        self._ready.set()

    async def run_supervisor(self, make: Callable[[], Supervisor], *, task_status: Any) -> None:
        """Run a fresh threads supervisor ``make()`` as the registry's (a permanent root child).

        Every start (a restart after a crash too) begins empty: the ThreadActors of the previous
        instance have stopped, and each thread is loaded again from the store on its next
        :meth:`get`; subscriptions and worker links, kept here, carry over. Reports the
        Supervisor as started.
        """
        if self._ready.is_set():
            self._ready = trio.Event()
        self.actors.clear()
        supervisor = make()
        self.supervisor = supervisor
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(supervisor.run)
                self._ready.set()
                task_status.started(supervisor)
        finally:
            if self._ready.is_set():
                self._ready = trio.Event()

    async def create(
        self, thread: Any, *, ephemeral: bool, worker: tuple[Any, str] | None = None, persisted: bool = False
    ) -> ThreadActor:
        """Persist (unless ephemeral or ``persisted``) and start a new thread's actor.

        Args:
            worker: ``(tree, worker_id)`` when the thread is a worker of ``tree``.
            persisted: the caller already wrote the thread row.
        """
        if worker is not None:
            self.worker_links[thread.id] = worker
        if ephemeral:
            self._ephemeral[thread.id] = thread
        elif not persisted:
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
            stored = await self.services.store.writer.submit(
                functools.partial(create_thread, kind=thread.kind, id=thread.id, **fields)
            )
            thread = stored
        self._fresh.add(thread.id)
        return await self.get(thread.id, _thread=thread)

    async def get(self, thread_id: str, *, _thread: Any = None) -> ThreadActor:
        """The running actor of ``thread_id``.

        Raises:
            ThreadNotFound: no such thread.
        """
        actor = self.actors.get(thread_id)
        if actor is not None and actor.state.value == "running":
            return actor
        async with self._lock:
            actor = self.actors.get(thread_id)
            if actor is not None and actor.state.value == "running":
                return actor
            ephemeral = thread_id in self._ephemeral
            if _thread is None:
                _thread = self._ephemeral.get(thread_id) or await self._load(thread_id)
            spec = ChildSpec(
                f"thread:{thread_id}",
                functools.partial(self._run_actor, thread_id, ephemeral),
                restart=Restart.TRANSIENT,
                shutdown_timeout=15.0,
            )
            while True:
                await self._ready.wait()  # the threads supervisor is (re)starting
                supervisor = self.supervisor
                self._pending_thread = _thread
                try:
                    await supervisor.terminate_child(spec.id)
                except Exception:
                    log.debug("could not terminate the previous thread actor", exc_info=True)
                try:
                    await supervisor.start_child(spec)
                    return self.actors[thread_id]
                except LifecycleError:
                    if supervisor.running or supervisor is not self.supervisor:
                        if supervisor.running:
                            raise
                        continue
                    if self._ready.is_set():  # it is stopping: wait for its successor
                        self._ready = trio.Event()

    async def _load(self, thread_id: str) -> Any:
        store = self.services.store

        def read() -> Any:
            with store.read() as conn:
                return get_thread(conn, thread_id)

        try:
            return await trio.to_thread.run_sync(read)
        except NotFound:
            raise ThreadNotFound(f"no thread {thread_id}") from None

    async def _run_actor(self, thread_id: str, ephemeral: bool, *, task_status: Any) -> None:
        thread = getattr(self, "_pending_thread", None)
        if thread is None or thread.id != thread_id:
            thread = self._ephemeral.get(thread_id) or await self._load(thread_id)
        self._pending_thread = None
        actor = ThreadActor(thread, self.services, ephemeral=ephemeral, fresh=thread_id in self._fresh)
        self._fresh.discard(thread_id)  # a restart of the actor loads from the store
        actor.registry = self
        actor.hub.use_subscribers(self.subscribers.setdefault(thread_id, []))
        link = self.worker_links.get(thread_id)
        if link is not None:
            actor.tree, actor.worker_id = link
            actor.agent_name = (thread.metadata or {}).get("agent_name") or thread.title
        self.actors[thread_id] = actor
        await actor.run(task_status=task_status)

    def forget(self, thread_id: str) -> None:
        self.actors.pop(thread_id, None)
        self._ephemeral.pop(thread_id, None)
        self.subscribers.pop(thread_id, None)
        self.worker_links.pop(thread_id, None)

    def unloadable(self, actor: ThreadActor) -> bool:
        """Whether ``actor`` can be stopped now and reloaded from the store later without loss:
        persistent, no turn admitted or starting, no pending input, no subscriber, no live workers."""
        return (
            not actor.ephemeral
            and actor.state.value == "running"
            and actor.active is None
            and actor._dispatching is None
            and not actor.pending
            and not actor.hub.subscribers
            and (actor.tree is None or actor.worker_id is not None or not actor.tree.live)
        )

    async def run_idle_unloader(self, *, idle_s: float, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Stop ThreadActors that stayed idle for ``idle_s`` seconds (DESIGN.md: idle unload).

        A thread is idle when :meth:`unloadable` holds and it emitted no event between two sweeps
        ``idle_s`` apart. Its actor is stopped (the store keeps everything) and is loaded again by
        the next :meth:`get`. Memory then stays proportional to the threads in use, not to every
        thread a long-running process ever touched.
        """
        task_status.started()
        seen: dict[str, tuple[int, int]] = {}
        while True:
            await trio.sleep(idle_s)
            for thread_id, actor in list(self.actors.items()):
                if not self.unloadable(actor):
                    seen.pop(thread_id, None)
                    continue
                mark = (actor.hub.seq, len(actor.items))
                if seen.get(thread_id) != mark:
                    seen[thread_id] = mark
                    continue
                seen.pop(thread_id, None)
                async with self._lock:
                    if self.actors.get(thread_id) is actor and self.unloadable(actor):
                        self.actors.pop(thread_id, None)
                        try:
                            await self.supervisor.terminate_child(f"thread:{thread_id}")
                        except Exception:
                            log.debug("could not terminate an idle thread actor", exc_info=True)

    def loaded(self) -> list[ThreadActor]:
        return [a for a in self.actors.values() if a.state.value == "running"]

    def interrupt_now(self, thread_id: str, turn_id: str | None = None, reason: str = "interrupted") -> dict | None:
        """Interrupt the active turn of loaded thread ``thread_id`` without its mailbox (not a
        checkpoint): :func:`roost.actors._interrupt.interrupt_active`.

        Returns:
            The ``InterruptTurn`` reply; None when the thread is not loaded here, has no active
            turn, or ``turn_id`` is not the active one (send ``InterruptTurn`` for those).
        """
        actor = self.actors.get(thread_id)
        if actor is None or actor.state.value != "running":
            return None
        return interrupt_active(actor, turn_id, reason)

    # -- what the dialects may ask (views, never the actors' members) -------------------------

    def add_subscriber(self, thread_id: str, subscriber: Any) -> None:
        """Add ``subscriber`` (``deliver(line)``) to thread ``thread_id``'s shared subscriber list,
        which every instance of its actor uses, loaded or not yet (idempotent)."""
        subscribers = self.subscribers.setdefault(thread_id, [])
        if subscriber not in subscribers:
            subscribers.append(subscriber)

    def remove_subscriber(self, thread_id: str, subscriber: Any) -> None:
        """Remove ``subscriber`` from thread ``thread_id``'s subscriber list (no-op if absent)."""
        subscribers = self.subscribers.get(thread_id) or []
        if subscriber in subscribers:
            subscribers.remove(subscriber)

    async def unload(self, thread_id: str) -> None:
        """Stop thread ``thread_id``'s actor, if loaded, and forget it (after ``thread/delete``).

        A failure to stop the actor is logged, never raised: the thread is forgotten either way.
        """
        try:
            await self.supervisor.terminate_child(f"thread:{thread_id}")
        except Exception:
            log.debug("could not terminate the actor of thread %s", thread_id, exc_info=True)
        self.forget(thread_id)

    def running_count(self) -> int:
        """Loaded threads with an admitted turn (cheap: no copies), for load-spreading decisions."""
        return sum(1 for a in self.actors.values() if a.active is not None)

    def can_hand_off(self, thread_id: str, subscriber: Any) -> bool:
        """Whether thread ``thread_id`` may leave this process now (another process of the store is
        to execute it; the app-server's worker processes): not loaded, or loaded and
        :meth:`unloadable` once ``subscriber`` (its only subscriber) is gone."""
        actor = self.actors.get(thread_id)
        if actor is None:
            return True
        others = [s for s in actor.hub.subscribers if s is not subscriber]
        if others or actor.ephemeral or actor.state.value != "running":
            return False
        return (
            actor.active is None
            and actor._dispatching is None
            and not actor.pending
            and (actor.tree is None or actor.worker_id is not None or not actor.tree.live)
        )

    def live_view(self, thread_id: str) -> dict | None:
        """The thread view (``thread`` object of the app-server spec) of a loaded, running thread
        actor, with its live status; None when the thread is not loaded here."""
        actor = self.actors.get(thread_id)
        return actor.view() if actor is not None and actor.state.value == "running" else None

    def ephemeral_views(self) -> list[dict]:
        """The views of the loaded ephemeral threads (they have no stored rows to list)."""
        return [a.view() for a in self.loaded() if a.ephemeral]
