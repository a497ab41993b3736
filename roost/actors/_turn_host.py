"""The explicit interface between a thread and its turn (DESIGN.md section 2; issue 12, Build 2).

* turn -> thread: the :class:`TurnHost` protocol, which :class:`~roost.actors._thread.ThreadActor`
  implements (its conversation history, the fan-out, its pending steers, and the callbacks that
  keep the thread's own state);
* thread -> turn: the messages :class:`StopTurn` and :class:`CutForSteer` through the turn's
  mailbox (and the :class:`~roost.actors._turn.TurnActor` methods of the same names);
* :data:`TurnBody`, the signature of a turn's work, and :data:`STOP_MESSAGES`, the ``message`` of
  an interrupted turn's error per reason.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from roost.actors._admission import Admission
    from roost.actors._turn import TurnActor

__all__ = ["STOP_MESSAGES", "TurnHost", "StopTurn", "CutForSteer", "TurnBody"]

#: The ``message`` of an interrupted turn's ``error`` per ``reason``.
STOP_MESSAGES = {
    "interrupted": "interrupted by the client",
    "shutdown": "interrupted: the server is shutting down (end of input or SIGTERM)",
    "stopped": "interrupted: the thread was stopped",
    "SIGINT": "interrupted by SIGINT",
    "output_closed": "interrupted: the output was closed (the reader of stdout went away)",
}

#: ``await body(turn, execution)``: a turn's work; must settle the turn (:meth:`TurnActor.finish`)
#: even when cancelled. ``execution`` is the lease's :class:`roost.storage.Execution` (None when
#: the thread is ephemeral).
TurnBody = Callable[["TurnActor", Any], Awaitable[None]]


class TurnHost(Protocol):
    """What a turn may use of its thread (implemented by :class:`~roost.actors._thread.ThreadActor`).

    Attributes:
        thread: the thread's row (``id``, ``model``, ``effort``, ``cwd``, ``permission_mode``).
        services: the process's services (engines, tools, store, keeper, limits).
        ephemeral: nothing is written (``thread/start`` with ``ephemeral: true``).
        history: the engine conversation; the turn appends its messages in order.
        agent_name: the thread's agent (worker threads), or None.
        tree: the root thread's WorkerTree once started, else None.
        worker_id: set when the thread is a worker.
    """

    thread: Any
    services: Any
    ephemeral: bool
    history: list
    agent_name: str | None
    tree: Any
    worker_id: str | None

    @property
    def cwd(self) -> Path: ...

    def emit(self, method: str, params: dict) -> None:
        """Fan a notification out to the thread's subscribers."""

    async def ensure_tree(self) -> Any:
        """The root thread's WorkerTree (started on first use)."""

    def take_steers(self) -> list[dict]:
        """Remove and return the pending steers the turn admits next (in order)."""

    def return_steers(self, steers: list[dict]) -> None:
        """Put steers the turn could not admit back in front of the pending input."""

    def has_steers(self) -> bool:
        """Whether a steer is pending for this process's turn."""

    def admission(self, turn: TurnActor) -> Admission:
        """Prepare the admission (:class:`~roost.actors._admission.Admission`): its write of the
        turn row and user input, which the turn commits with the lease, then ``admitted``."""

    def item_settled(self, turn: TurnActor, view: dict) -> None:
        """Record a stored item of ``turn`` in the thread's conversation (``view["seq"]`` set
        when it was stored)."""

    def inputs_at_end(self, turn: TurnActor) -> list[dict]:
        """The pending input that becomes held work because ``turn`` did not complete."""

    def turn_finished(self, turn: TurnActor, moved: list[dict]) -> None:
        """The turn's end is stored (or refused): update the thread, emit turn/held for ``moved``
        and the terminal event (turn/completed or turn/error)."""

    def turn_released(self, turn: TurnActor) -> None:
        """The turn's execution lease is released (a completed turn may start queued input)."""


@attrs.frozen
class StopTurn:
    """Interrupt the turn (``reason``: ``interrupted``, ``shutdown``...). Reply: bool, whether
    this message stopped it (False: it had already ended or was settling with its own outcome)."""

    reason: str = "interrupted"


@attrs.frozen
class CutForSteer:
    """Cut the model response streaming text now, for a steer. Reply: None."""
