"""The actor kernel (bounded mailboxes, refs with ``tell``/``ask``, the Actor base class), and the
domain actors and messages that other rooms may use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from roost._lazy import attach as _attach
from roost._lazy import publish as _publish
from roost.actors._actor import Actor as Actor
from roost.actors._actor import ActorState as ActorState
from roost.actors._actor import shielded_cleanup as shielded_cleanup
from roost.actors._bgprocess import ProcessManager as ProcessManager
from roost.actors._bgprocess import process_view as process_view
from roost.actors._bus import NodeBus as NodeBus
from roost.actors._bus import error_from_wire as error_from_wire
from roost.actors._connection import CLOSE_NORMAL as CLOSE_NORMAL
from roost.actors._connection import ConnectionActor as ConnectionActor
from roost.actors._connection import InputEnded as InputEnded
from roost.actors._connection import InputFrame as InputFrame
from roost.actors._edit import RETRACTED as RETRACTED
from roost.actors._edit import ImportHistory as ImportHistory
from roost.actors._edit import RetractFrom as RetractFrom
from roost.actors._edit import stored_payload as stored_payload
from roost.actors._mailbox import DEFAULT_ASK_TIMEOUT as DEFAULT_ASK_TIMEOUT
from roost.actors._mailbox import Envelope as Envelope
from roost.actors._mailbox import Mailbox as Mailbox
from roost.actors._mailbox import Ref as Ref
from roost.actors._mailbox import ReplySlot as ReplySlot
from roost.actors._messages import AgentTurn as AgentTurn
from roost.actors._messages import Compact as Compact
from roost.actors._messages import Dequeue as Dequeue
from roost.actors._messages import InterruptTurn as InterruptTurn
from roost.actors._messages import IsBusy as IsBusy
from roost.actors._messages import Origin as Origin
from roost.actors._messages import QueueInput as QueueInput
from roost.actors._messages import Snapshot as Snapshot
from roost.actors._messages import StartTurn as StartTurn
from roost.actors._messages import SteerInput as SteerInput
from roost.actors._messages import Subscribe as Subscribe
from roost.actors._messages import Unsteer as Unsteer
from roost.actors._messages import Unsubscribe as Unsubscribe
from roost.actors._messages import UpdateQueued as UpdateQueued
from roost.actors._messages import UpdateThread as UpdateThread
from roost.actors._registry import ThreadRegistry as ThreadRegistry
from roost.actors._remote import ThreadRemote as ThreadRemote
from roost.actors._services import Services as Services
from roost.actors._thread_facts import ThreadFacts as ThreadFacts
from roost.actors._turn_host import STOP_MESSAGES as STOP_MESSAGES
from roost.actors._views import thread_view as thread_view
from roost.actors._workers import agent_tool_schemas as agent_tool_schemas
from roost.actors._workers import tree_settings as tree_settings

__all__ = [
    "AgentTurn",
    "ObjectiveRunner",
    "CLOSE_NORMAL",
    "Compact",
    "ConnectionActor",
    "InputEnded",
    "InputFrame",
    "Dequeue",
    "ImportHistory",
    "NodeBus",
    "ThreadRemote",
    "error_from_wire",
    "InterruptTurn",
    "IsBusy",
    "Origin",
    "QueueInput",
    "QueuedTask",
    "RETRACTED",
    "RetractFrom",
    "STOP_MESSAGES",
    "Scheduler",
    "Services",
    "Snapshot",
    "StartTurn",
    "SteerInput",
    "Subscribe",
    "TaskOutcomes",
    "TaskQueue",
    "ThreadFacts",
    "ThreadRegistry",
    "Unsteer",
    "Unsubscribe",
    "UpdateQueued",
    "UpdateThread",
    "agent_tool_schemas",
    "stored_payload",
    "thread_view",
    "Actor",
    "ActorState",
    "shielded_cleanup",
    "DEFAULT_ASK_TIMEOUT",
    "Envelope",
    "Mailbox",
    "Ref",
    "ReplySlot",
    "tree_settings",
    "ProcessManager",
    "process_view",
]

if TYPE_CHECKING:
    from roost.actors._objectives import ObjectiveRunner as ObjectiveRunner
    from roost.actors._scheduler import Scheduler as Scheduler
    from roost.actors._scheduler import TaskOutcomes as TaskOutcomes
    from roost.actors._taskqueue import QueuedTask as QueuedTask
    from roost.actors._taskqueue import TaskQueue as TaskQueue

#: The scheduler imports the cron parser (croniter, dateutil): loaded on first access (PEP 562), so
#: the app-server, which never fires schedules, does not pay for it at start-up (issue 19). The
#: daemon's task queue and objective runner are ``roost serve``'s alone: loaded the same way.
_LAZY = {
    "Scheduler": "roost.actors._scheduler",
    "TaskOutcomes": "roost.actors._scheduler",
    "TaskQueue": "roost.actors._taskqueue",
    "QueuedTask": "roost.actors._taskqueue",
    "ObjectiveRunner": "roost.actors._objectives",
}


def _fix_module_metadata(names: list[str]) -> None:
    _publish(globals(), names)


__getattr__, __dir__ = _attach(globals(), _LAZY, on_load=_fix_module_metadata)
_fix_module_metadata([n for n in __all__ if n not in _LAZY])
