"""Child specifications and the restart vocabulary (after Erlang/OTP's supervisor)."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import attrs
import trio

__all__ = ["Restart", "Strategy", "ChildSpec", "StartFn"]


class StartFn(Protocol):
    """``async start(*, task_status)``: runs a child until it ends; reports readiness once.

    The value passed to ``task_status.started(value)`` is the child's handle (for an actor, its
    :class:`~roost.actors.Ref`). Every call must build a fresh instance: a restart calls it again.
    """

    def __call__(self, *, task_status: trio.TaskStatus[Any]) -> Awaitable[Any]: ...


class Restart(enum.Enum):
    """When a child that ended is started again (OTP restart types)."""

    #: always restarted
    PERMANENT = "permanent"
    #: restarted only after an abnormal exit (an exception)
    TRANSIENT = "transient"
    #: never restarted
    TEMPORARY = "temporary"


class Strategy(enum.Enum):
    """Which siblings restart with a child that must restart (OTP strategies)."""

    #: only the child itself
    ONE_FOR_ONE = "one_for_one"
    #: every child: the others are stopped in reverse order, then all started in order
    ONE_FOR_ALL = "one_for_all"
    #: the child and every child started after it
    REST_FOR_ONE = "rest_for_one"


@attrs.frozen
class ChildSpec:
    """How to start, restart and stop one child.

    Args:
        id: unique among the supervisor's children.
        start: an :class:`StartFn` (``nursery.start``-compatible, fresh instance per call).
        restart: the child's :class:`Restart` type.
        shutdown_timeout: seconds to wait after cancelling the child before abandoning it.
    """

    id: str
    start: Callable[..., Awaitable[Any]]
    restart: Restart = Restart.PERMANENT
    shutdown_timeout: float = attrs.field(default=5.0)

    @classmethod
    def of_factory(
        cls, id: str, factory: Callable[[], Any], *, restart: Restart = Restart.PERMANENT, shutdown_timeout: float = 5.0
    ) -> ChildSpec:
        """A spec whose every start builds a fresh instance ``factory()`` and runs its
        ``run(task_status=...)`` (an Actor, a Supervisor, a service): a restart never reuses the
        crashed instance (DESIGN.md section 4, "Restart for real")."""

        async def start(*, task_status: Any) -> None:
            await factory().run(task_status=task_status)

        return cls(id, start, restart=restart, shutdown_timeout=shutdown_timeout)

    @shutdown_timeout.validator
    def _check_timeout(self, attribute: attrs.Attribute, value: float) -> None:
        if not value >= 0:
            raise ValueError(f"shutdown_timeout must be >= 0 seconds, got {value!r}")
