"""What a dialect may read of a thread actor: an immutable snapshot (DESIGN.md section 3).

A dialect (``roost.protocol``) asks actors and never reads their state: besides the messages it
sends to :attr:`ThreadActor.ref`, it uses only the actor's small query interface —
:attr:`~roost.actors._thread.ThreadActor.thread_id`, :meth:`~roost.actors._thread.ThreadActor.facts`
(this snapshot), :meth:`~roost.actors._thread.ThreadActor.view`,
:meth:`~roost.actors._thread.ThreadActor.wait_idle` and
:meth:`~roost.actors._thread.ThreadActor.wait_turn_end`. ``tests/test_rooms_actor_state.py``
keeps it so.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from roost.model import Thread

__all__ = ["ThreadFacts", "copy_thread"]


@attrs.frozen(kw_only=True)
class ThreadFacts:
    """A point-in-time snapshot of one thread actor (it never changes after it is taken).

    Attributes:
        thread: a copy of the thread's record (:class:`roost.model.Thread`; its ``metadata`` dict
            is a copy too, so changing it changes nothing in the actor).
        cwd: the thread's resolved working directory.
        ephemeral: the thread lives in memory only (``thread/start`` with ``ephemeral: true``).
        running_turn_id: the id of the turn running now, or None when the thread is idle.
        stopped: the actor has stopped (a dialect holding it should look the thread up again).
        local_input_ids: the ids of this process's own pending and held input of the thread (not
            input of an execution in another process, which that process manages).
    """

    thread: Thread
    cwd: Path
    ephemeral: bool
    running_turn_id: str | None
    stopped: bool
    local_input_ids: frozenset[str] = frozenset()

    @property
    def id(self) -> str:
        """The thread's id."""
        return self.thread.id

    @property
    def running(self) -> bool:
        """Whether a turn runs now."""
        return self.running_turn_id is not None


def copy_thread(thread: Thread) -> Thread:
    """A copy of ``thread`` whose ``metadata`` is a copy as well (a shallow copy of the dict)."""
    return attrs.evolve(thread, metadata=dict(thread.metadata or {}))
