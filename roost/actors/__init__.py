"""The actor kernel: bounded mailboxes, refs with ``tell``/``ask``, and the Actor base class."""

from __future__ import annotations

from roost.actors._actor import Actor as Actor
from roost.actors._actor import ActorState as ActorState
from roost.actors._actor import shielded_cleanup as shielded_cleanup
from roost.actors._mailbox import DEFAULT_ASK_TIMEOUT as DEFAULT_ASK_TIMEOUT
from roost.actors._mailbox import Envelope as Envelope
from roost.actors._mailbox import Mailbox as Mailbox
from roost.actors._mailbox import Ref as Ref
from roost.actors._mailbox import ReplySlot as ReplySlot
from roost.actors._bgprocess import ProcessManager as ProcessManager
from roost.actors._bgprocess import process_view as process_view

__all__ = [
    "Actor",
    "ActorState",
    "shielded_cleanup",
    "DEFAULT_ASK_TIMEOUT",
    "Envelope",
    "Mailbox",
    "Ref",
    "ReplySlot",
    "ProcessManager",
    "process_view",
]

for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and not isinstance(_obj, float):
        try:
            _obj.__module__ = __name__
        except (AttributeError, TypeError):
            pass
