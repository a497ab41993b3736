"""The Supervisor: starts children in order, restarts them by policy, stops them in reverse.

Children run as trio system tasks, each in its own cancel scope, so that a child that ignores
cancellation can be *abandoned* after its shutdown timeout instead of hanging its supervisor (a trio
nursery would have to wait for it). An abandoned instance is never restarted while it still runs:
there are never two live instances of one child id.

Restart intensity (OTP): more than ``intensity`` restarts within ``period`` seconds makes the
supervisor stop all its children and raise :class:`~roost.errors.RestartIntensityExceeded`, which its
own parent sees as that supervisor's abnormal exit (escalation).
"""

from __future__ import annotations

import collections
import contextvars
import logging
import math
from typing import Any

import trio

from roost.errors import ChildNotFound, LifecycleError, RestartIntensityExceeded
from roost.supervisor._spec import ChildSpec, Restart, Strategy

__all__ = ["Supervisor", "ChildInfo"]

log = logging.getLogger("roost.supervisor")


class _TaskStatus:
    """The ``task_status`` handed to a child's start function (a system task has no nursery.start)."""

    def __init__(self) -> None:
        self.event = trio.Event()
        self.value: Any = None

    def started(self, value: Any = None) -> None:
        if self.event.is_set():
            raise RuntimeError("called 'started' twice on the same task status")
        self.value = value
        self.event.set()


class _Child:
    __slots__ = (
        "spec", "state", "scope", "done", "value", "outcome", "restarts", "stopping",
        "generation", "restart_when_done",
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
        self._specs = list(children)
        self._children: dict[str, _Child] = {}
        self._restart_times: collections.deque[float] = collections.deque()
        self._lock = trio.Lock()
        # One exit report per child instance: bounded by the number of live children.
        self._exit_send, self._exit_recv = trio.open_memory_channel[tuple[_Child, int]](math.inf)
        self._running = False
        self._ran = False

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
        except BaseException:
            self._children.pop(spec.id, None)
            raise
        return child

    async def _launch(self, child: _Child, *, report_failure: bool = True) -> None:
        """Start one instance of ``child``; wait until it reports started or ends."""
        child.generation += 1
        child.state = "starting"
        child.scope = trio.CancelScope()
        child.done = trio.Event()
        child.outcome = None
        child.stopping = False
        status = _TaskStatus()
        generation = child.generation
        trio.lowlevel.spawn_system_task(
            self._child_task, child, status, generation, name=f"{self.name}/{child.spec.id}",
            context=contextvars.copy_context(),
        )
        async with trio.open_nursery() as nursery:
            async def _wait_done() -> None:
                await child.done.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(_wait_done)
            await status.event.wait()
            nursery.cancel_scope.cancel()
        if status.event.is_set():
            child.value = status.value
            if not child.done.is_set():
                child.state = "running"
            return
        if report_failure:
            # The failed start's exit report must not be treated as a running child's crash.
            child.stopping = True
            error = child.outcome or RuntimeError(f"child {child.spec.id!r} ended before it started")
            log.error("%s: child %s failed to start: %r", self.name, child.spec.id, error)
            raise error

    async def _child_task(self, child: _Child, status: _TaskStatus, generation: int) -> None:
        try:
            with child.scope:
                await child.spec.start(task_status=status)
        except Exception as exc:  # a crash; Cancelled (a BaseException) is not caught here
            child.outcome = exc
        except BaseException as exc:
            if not isinstance(exc, trio.Cancelled):
                child.outcome = exc
            raise
        finally:
            child.state = "stopped"
            child.done.set()
            try:
                self._exit_send.send_nowait((child, generation))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                pass

    async def _on_exit(self, child: _Child, generation: int) -> None:
        current = self._children.get(child.spec.id)
        if current is not child or generation != child.generation:
            return
        if child.stopping:
            if child.restart_when_done:
                child.restart_when_done = False
                log.info("%s: abandoned child %s ended; restarting it now", self.name, child.spec.id)
                await self._launch(child, report_failure=False)
            return
        abnormal = child.outcome is not None
        reason = repr(child.outcome) if abnormal else "normal exit"
        restart = child.spec.restart is Restart.PERMANENT or (
            child.spec.restart is Restart.TRANSIENT and abnormal
        )
        if not restart:
            log.info("%s: child %s ended (%s); %s, not restarted", self.name, child.spec.id, reason,
                     child.spec.restart.value)
            self._children.pop(child.spec.id, None)
            return
        now = trio.current_time()
        self._restart_times.append(now)
        while self._restart_times and self._restart_times[0] <= now - self.period:
            self._restart_times.popleft()
        if len(self._restart_times) > self.intensity:
            log.error(
                "%s: restart intensity exceeded (%d restarts in %g s; last: %s %s); escalating",
                self.name, len(self._restart_times), self.period, child.spec.id, reason,
            )
            raise RestartIntensityExceeded(
                f"{self.name}: more than {self.intensity} restarts in {self.period:g} s "
                f"(last: child {child.spec.id!r}, {reason})"
            ) from child.outcome
        ids = list(self._children)
        index = ids.index(child.spec.id)
        if self.strategy is Strategy.ONE_FOR_ONE:
            group = [child]
        elif self.strategy is Strategy.ONE_FOR_ALL:
            group = [self._children[i] for i in ids]
        else:
            group = [self._children[i] for i in ids[index:]]
        log.warning("%s: child %s exited (%s); restarting %s (%s)", self.name, child.spec.id, reason,
                    [c.spec.id for c in group], self.strategy.value)
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
            await self._launch(member, report_failure=False)

    async def _stop_children(self, children: list[_Child]) -> None:
        """Stop ``children`` one by one in reverse order, each bounded by its shutdown timeout."""
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
                    self.name, child.spec.id, child.spec.shutdown_timeout,
                )
            else:
                log.info("%s: child %s stopped", self.name, child.spec.id)
