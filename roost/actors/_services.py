"""What every domain actor of one process shares: the store, the lease keeper, engines, tools."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

__all__ = ["Services"]


@attrs.define(eq=False)
class Services:
    """Process-wide dependencies handed to ThreadActors (no globals).

    Attributes:
        store: the open :class:`roost.storage.Store` (its writer is running).
        keeper: the :class:`roost.storage.LeaseKeeper` service (running).
        owner: this process's lease owner name (unique per process).
        engine_for: ``engine_for(thread) -> Engine``; raises ConfigError when unconfigured.
        tools: model-facing tool name -> :class:`roost.tools.Tool`.
        lease_ttl: seconds an execution lease lives between renewals.
        system_prompt: the system prompt of chat threads.
        max_model_calls: bound on model calls per turn (a runaway tool loop ends the turn failed).
    """

    store: Any
    keeper: Any
    owner: str
    engine_for: Callable[[Any], Any]
    tools: dict[str, Any]
    lease_ttl: float = 15.0
    system_prompt: str = "You are Roost, a careful coding agent. Use tools when they help."
    max_model_calls: int = 50
    #: offer spawn_agent / send_message / close_agent / wait_agents to the model
    worker_tools: bool = True
    #: the background :class:`~roost.actors._bgprocess.ProcessManager`, where a server runs one
    processes: Any = None
    #: this node's :class:`~roost.actors.NodeBus`, where the process is a node (app-server, serve)
    bus: Any = None
    #: the cross-node input delivery (:class:`~roost.actors.ThreadRemote`) over :attr:`bus`
    remote: Any = None
