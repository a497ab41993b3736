"""The Supervisor: starts children in order, restarts them by policy, stops them in reverse.

Children run in the supervisor's own nursery (structured cancellation: a supervisor never
outlives its children), each in its own cancel scope, shielded once started so that a cancelled
parent stops them one by one in reverse start order. A child that ignores cancellation past its
shutdown timeout is logged as *abandoned* and its siblings' stop goes on; the supervisor still
waits for it before it ends. An abandoned instance is never restarted while it still runs: there
are never two live instances of one child id.

Every restart, failed start and escalation is logged on ``roost.supervisor`` with its reason.
:meth:`Supervisor.inject_fault` crashes a named child for tests (see :mod:`roost._faults`).

Restart intensity (OTP): more than ``intensity`` restarts within ``period`` seconds makes the
supervisor stop all its children and raise :class:`~roost.errors.RestartIntensityExceeded`, which its
own parent sees as that supervisor's abnormal exit (escalation).
"""

from __future__ import annotations

import collections
import logging
import math
from typing import Any

import trio

from roost._faults import InjectedFault
from roost.errors import ChildNotFound, LifecycleError, RestartIntensityExceeded
from roost.supervisor._spec import ChildSpec, Restart, Strategy

__all__ = ["Supervisor", "ChildInfo"]

log = logging.getLogger("roost.supervisor")


class _Status:
    """The ``task_status`` a child's start function sees: marks the child started, then passes on."""

    __slots__ = ("started",)

    def __init__(self, started: Any) -> None:
        self.started = started


class _Child:
    __slots__ = (
        "spec",
        "state",
        "scope",
        "done",
        "value",
        "outcome",
        "restarts",
        "stopping",
        "generation",
        "restart_when_done",
    )

    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self.state = "starting"
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.value: Any = None
        self.outcome: BaseException | None = None
        self.restarts = 0
        self.stopping = False
        self.generation = 0
        self.restart_when_done = False


class ChildInfo:
    """A read-only view of one child: ``id``, ``state``, ``restart``, ``restarts``, ``value``."""

    __slots__ = ("id", "state", "restart", "restarts", "value")

    def __init__(self, child: _Child) -> None:
        self.id = child.spec.id
        self.state = child.state
        self.restart = child.spec.restart
        self.restarts = child.restarts
        self.value = child.value

    def __repr__(self) -> str:
        return f"<ChildInfo {self.id} {self.state} restarts={self.restarts}>"


class Supervisor:
    """Supervise an ordered list of children.

    Args:
        children: specs started in order when the supervisor starts.
        name: a label for logs and :meth:`render_tree`.
        strategy: which siblings restart with a failed child.
        intensity: restarts allowed within ``period`` (more escalates).
        period: seconds of the intensity window (trio's clock).
        stop_together: stop all children at once (independent siblings, e.g. a worker tree's
            drivers) instead of one by one in reverse start order.

    A Supervisor instance runs once; to supervise a supervisor, give the parent a start function
    that builds a new instance each time (see :meth:`child_spec`).
    """

    def __init__(
        self,
        children: list[ChildSpec] | tuple[ChildSpec, ...] = (),
        *,
        name: str = "supervisor",
        strategy: Strategy = Strategy.ONE_FOR_ONE,
        intensity: int = 3,
        period: float = 10.0,
        stop_together: bool = False,
    ) -> None:
        if intensity < 0 or not period > 0:
            raise ValueError("intensity must be >= 0 and period > 0 seconds")
        ids = [spec.id for spec in children]
        if len(ids) != len(set(ids)):
            raise ValueError(f"duplicate child ids in {ids}")
        self.name = name
        self.strategy = strategy
        self.intensity = intensity
        self.period = period
        self.stop_together = stop_together
        self._specs = list(children)
        self._children: dict[str, _Child] = {}
        self._restart_times: collections.deque[float] = collections.deque()
        self._lock = trio.Lock()
        # One exit report per child instance: bounded by the number of live children.
        self._exit_send, self._exit_recv = trio.open_memory_channel[tuple[_Child, int]](math.inf)
        self._running = False
        self._ran = False
        self._nursery: trio.Nursery | None = None

    @classmethod
    def child_spec(
        cls, id: str, factory: Any, *, restart: Restart = Restart.PERMANENT, shutdown_timeout: float = 30.0
    ) -> ChildSpec:
        """A :class:`ChildSpec` that runs ``factory()`` (a fresh Supervisor) as a child."""

        async def start(*, task_status: Any) -> None:
            await factory().run(task_status=task_status)

        return ChildSpec(id, start, restart=restart, shutdown_timeout=shutdown_timeout)

    # -- running --------------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Start the children in order, supervise them, and stop them in reverse order on exit.

        Reports ``self`` through ``task_status`` once every initial child has started.

        Raises:
            RestartIntensityExceeded: too many restarts within the period (after stopping all).
            LifecycleError: this instance already ran.
            Exception: an initial child failed to start (the ones started are stopped first).

        Cancellation: cancelling ``run`` stops every child in reverse start order, each bounded by
        its shutdown timeout.
        """
        if self._ran:
            raise LifecycleError(f"supervisor {self.name} already ran; build a new instance")
        self._ran = True
        self._running = True
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                for spec in self._specs:
                    await self._start_new(spec)
                task_status.started(self)
                async for child, generation in self._exit_recv:
                    async with self._lock:
                        await self._on_exit(child, generation)
            finally:
                self._running = False
                with trio.CancelScope(shield=True):
                    await self._stop_children(list(self._children.values()))

    async def start_child(self, spec: ChildSpec) -> Any:
        """Add and start a dynamic child (after the existing ones); return its started value.

        Raises:
            ValueError: a child with that id exists.
            LifecycleError: the supervisor is not running.
            Exception: the child failed before it reported started (it is not kept).
        """
        if not self._running:
            raise LifecycleError(f"supervisor {self.name} is not running")
        async with self._lock:
            if spec.id in self._children:
                raise ValueError(f"child {spec.id!r} already exists in {self.name}")
            child = await self._start_new(spec)
            return child.value

    def start_child_soon(self, spec: ChildSpec) -> None:
        """:meth:`start_child` without waiting (from synchronous code); a failure is logged.

        Raises:
            LifecycleError: the supervisor is not running.
        """
        if not self._running or self._nursery is None:
            raise LifecycleError(f"supervisor {self.name} is not running")

        async def start() -> None:
            try:
                await self.start_child(spec)
            except Exception as exc:  # noqa: BLE001 - any start failure is logged, never raised here
                log.error("%s: dynamic child %s did not start: %r", self.name, spec.id, exc)

        self._nursery.start_soon(start, name=f"{self.name}/start:{spec.id}")

    async def terminate_child(self, id: str) -> None:
        """Stop child ``id`` (bounded by its shutdown timeout) and forget it.

        Raises:
            ChildNotFound: no such child.
        """
        async with self._lock:
            child = self._children.get(id)
            if child is None:
                raise ChildNotFound(f"{self.name} has no child {id!r}")
            await self._stop_children([child])
            self._children.pop(id, None)

    @property
    def running(self) -> bool:
        """Whether the supervisor runs (started and not yet stopping); not a checkpoint."""
        return self._running

    def which_children(self) -> list[ChildInfo]:
        """The children in start order, as :class:`ChildInfo` views (not a checkpoint)."""
        return [ChildInfo(c) for c in self._children.values()]

    def child_value(self, id: str) -> Any:
        """The started value (e.g. a Ref) of the current instance of child ``id``.

        Raises:
            ChildNotFound: no such child.
        """
        try:
            return self._children[id].value
        except KeyError:
            raise ChildNotFound(f"{self.name} has no child {id!r}") from None

    def render_tree(self, indent: str = "") -> str:
        """The live supervision tree below this supervisor as indented text lines."""
        lines = [f"{indent}{self.name} ({self.strategy.value}, intensity {self.intensity}/{self.period:g} s)"]
        kids = list(self._children.values())
        for i, child in enumerate(kids):
            last = i == len(kids) - 1
            branch, pad = ("└── ", "    ") if last else ("├── ", "│   ")
            label = f"{child.spec.id:<22} {child.spec.restart.value:<9} {child.state}"
            if child.restarts:
                label += f" (restarts {child.restarts})"
            lines.append(f"{indent}{branch}{label}")
            describe = getattr(child.value, "render_tree", None)
            if isinstance(child.value, Supervisor):
                sub = child.value.render_tree(indent + pad).splitlines()[1:]
                lines.extend(sub)
            elif callable(describe):
                lines.extend(describe(indent + pad).splitlines())
        return "\n".join(lines)

    # -- internals ------------------------------------------------------------------------------

    async def _start_new(self, spec: ChildSpec) -> _Child:
        child = _Child(spec)
        self._children[spec.id] = child
        try:
            await self._launch(child)
        except BaseException as exc:
            self._children.pop(spec.id, None)
            if isinstance(exc, Exception):
                log.error("%s: child %s failed to start: %r", self.name, spec.id, exc)
            raise
        return child

    async def _launch(self, child: _Child) -> None:
        """Start one instance of ``child`` in the supervisor's nursery; return once it reported
        started. Raises what the instance raised before that (it is not running then)."""
        assert self._nursery is not None
        child.generation += 1
        child.state = "starting"
        child.scope = trio.CancelScope()
        child.done = trio.Event()
        child.outcome = None
        child.stopping = False
        child.value = await self._nursery.start(
            self._child_task, child, child.generation, name=f"{self.name}/{child.spec.id}"
        )
        if not child.done.is_set():
            child.state = "running"

    async def _child_task(self, child: _Child, generation: int, *, task_status: Any) -> None:
        started = False

        def report(value: Any = None) -> None:
            nonlocal started
            started = True
            child.scope.shield = True  # from now on only the supervisor stops it, in order
            task_status.started(value)

        status = _Status(report)
        try:
            with child.scope:
                await child.spec.start(task_status=status)
            if not started:
                raise RuntimeError(f"child {child.spec.id!r} ended before it started")
        except Exception as exc:  # a crash; Cancelled (a BaseException) is not caught here
            if not started:
                child.state = "stopped"
                child.done.set()
                raise
            child.outcome = exc
        except BaseException as exc:
            if not isinstance(exc, trio.Cancelled):
                child.outcome = exc
            raise
        finally:
            if not child.done.is_set():
                child.state = "stopped"
                child.done.set()
                if started:
                    try:
                        self._exit_send.send_nowait((child, generation))
                    except (trio.ClosedResourceError, trio.BrokenResourceError):
                        pass

    def inject_fault(self, path: str, reason: str = "injected fault") -> None:
        """Crash the running child at ``path`` (test API; DESIGN.md section 2's fault hook).

        ``path`` is a child id, or ids joined by ``/`` through nested supervisors (a child whose
        value is a Supervisor, or has a ``supervisor`` attribute that is one), e.g.
        ``"threads/thread:<id>"``. The child's scope is cancelled and its exit counts as abnormal
        (:class:`roost._faults.InjectedFault`), so its restart type and intensity apply as for any
        crash.

        Raises:
            ChildNotFound: no running child at ``path``.
        """
        head, _, rest = path.partition("/")
        child = self._children.get(head)
        if child is None or child.state != "running":
            raise ChildNotFound(f"{self.name} has no running child {head!r}")
        if rest:
            sub = child.value if isinstance(child.value, Supervisor) else getattr(child.value, "supervisor", None)
            if not isinstance(sub, Supervisor):
                raise ChildNotFound(f"{self.name}/{head} is not a supervisor")
            sub.inject_fault(rest, reason)
            return
        log.warning("%s: fault injection crashes child %s (%s)", self.name, head, reason)
        child.outcome = InjectedFault(f"{reason}: {self.name}/{head}")
        child.scope.cancel()

    async def _on_exit(self, child: _Child, generation: int) -> None:
        current = self._children.get(child.spec.id)
        if current is not child or generation != child.generation:
            return
        if child.stopping:
            if child.restart_when_done:
                child.restart_when_done = False
                log.info("%s: abandoned child %s ended; restarting it now", self.name, child.spec.id)
                await self._restart(child, "its abandoned instance ended")
            return
        abnormal = child.outcome is not None
        reason = repr(child.outcome) if abnormal else "normal exit"
        restart = child.spec.restart is Restart.PERMANENT or (child.spec.restart is Restart.TRANSIENT and abnormal)
        if not restart:
            log.info(
                "%s: child %s ended (%s); %s, not restarted", self.name, child.spec.id, reason, child.spec.restart.value
            )
            self._children.pop(child.spec.id, None)
            return
        self._count_restart(child, reason, child.outcome)
        ids = list(self._children)
        index = ids.index(child.spec.id)
        if self.strategy is Strategy.ONE_FOR_ONE:
            group = [child]
        elif self.strategy is Strategy.ONE_FOR_ALL:
            group = [self._children[i] for i in ids]
        else:
            group = [self._children[i] for i in ids[index:]]
        log.warning(
            "%s: child %s exited (%s); restarting %s (%s)",
            self.name,
            child.spec.id,
            reason,
            [c.spec.id for c in group],
            self.strategy.value,
        )
        others = [c for c in group if c is not child]
        await self._stop_children(others)
        for member in group:
            if member is not child and member.spec.restart is Restart.TEMPORARY:
                self._children.pop(member.spec.id, None)
                continue
            member.restarts += 1
            if not member.done.is_set():
                member.restart_when_done = True  # abandoned: restart only once it has really ended
                continue
            await self._restart(member, reason)

    def _count_restart(self, child: _Child, reason: str, cause: BaseException | None) -> None:
        """Record one restart; escalate (raise) when the intensity is exceeded."""
        now = trio.current_time()
        self._restart_times.append(now)
        while self._restart_times and self._restart_times[0] <= now - self.period:
            self._restart_times.popleft()
        if len(self._restart_times) > self.intensity:
            log.error(
                "%s: restart intensity exceeded (%d restarts in %g s; last: %s %s); escalating",
                self.name,
                len(self._restart_times),
                self.period,
                child.spec.id,
                reason,
            )
            raise RestartIntensityExceeded(
                f"{self.name}: more than {self.intensity} restarts in {self.period:g} s "
                f"(last: child {child.spec.id!r}, {reason})"
            ) from cause

    async def _restart(self, child: _Child, reason: str) -> None:
        """Start ``child`` again; a failed start counts as one more restart (and may escalate)."""
        while True:
            try:
                await self._launch(child)
                log.info("%s: child %s restarted (%s)", self.name, child.spec.id, reason)
                return
            except Exception as exc:  # noqa: BLE001 - a failed restart counts as a crash
                reason = f"restart failed: {exc!r}"
                log.error("%s: child %s failed to restart: %r", self.name, child.spec.id, exc)
                child.restarts += 1
                self._count_restart(child, reason, exc)

    async def _stop_children(self, children: list[_Child]) -> None:
        """Stop ``children`` one by one in reverse order, each bounded by its shutdown timeout
        (all at once with ``stop_together``)."""
        if self.stop_together and len(children) > 1:
            async with trio.open_nursery() as nursery:
                for child in children:
                    nursery.start_soon(self._stop_one_by_one, [child])
            return
        await self._stop_one_by_one(children)

    async def _stop_one_by_one(self, children: list[_Child]) -> None:
        for child in reversed(children):
            if child.done.is_set():
                continue
            child.stopping = True
            child.state = "stopping"
            child.scope.cancel()
            with trio.move_on_after(child.spec.shutdown_timeout):
                await child.done.wait()
            if not child.done.is_set():
                child.state = "abandoned"
                log.error(
                    "%s: child %s ignored cancellation for %g s; abandoned",
                    self.name,
                    child.spec.id,
                    child.spec.shutdown_timeout,
                )
            else:
                log.info("%s: child %s stopped", self.name, child.spec.id)
