"""The agents of a run: one :class:`AgentActor` per agent, under the run's supervisor.

An agent actor owns what is the agent's own: its resolved model (engine, model id, max tokens,
temperature), its instructions, its tools and its tool-round limit, as one
:class:`~roost.actors._messages.AgentTurn`. It takes its turns on the run's conversation thread
(the run's ThreadActor), so every agent sees the whole conversation, and the thread's lease,
persistence and interrupt semantics apply to every agent turn unchanged.

The run's supervisor (:func:`run_supervisor`, one-for-one, each agent ``transient``) restarts an
agent actor that crashes; an agent that crashes more than ``intensity`` times within ``period``
seconds escalates and fails the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import trio

from roost.actors import Actor, AgentTurn, Origin, StartTurn
from roost.orchestration._config import AgentSpec, ModelSpec, OrchestrationConfig
from roost.supervisor import ChildSpec, Restart, Strategy, Supervisor
from roost.tools import plugin_tool_names

__all__ = ["AgentActor", "Speak", "resolve_agents", "run_supervisor", "agent_child_id"]


@attrs.frozen(kw_only=True)
class Speak:
    """Take one turn on the run's thread. Reply: the admitted turn view (dict).

    Exactly one of ``prompt`` (new input, from ``client_id``) and ``resume_after_turn_id`` (carry
    on from that turn without new input) is given.
    """

    origin: Origin
    prompt: str | None = None
    client_id: str | None = None
    resume_after_turn_id: str | None = None


class AgentActor(Actor):
    """One agent of a run.

    Args:
        settings: the agent's :class:`AgentTurn` (from :func:`resolve_agents`).
        thread_ref: the run thread's :class:`~roost.actors.Ref`.

    Errors: :class:`Speak` answers what the thread's ``StartTurn`` raises (``ThreadBusy``,
    ``StaleTurn``, ``InvalidParams``...).
    """

    mailbox_size = 8

    def __init__(self, settings: AgentTurn, thread_ref: Any) -> None:
        super().__init__(name=f"agent:{settings.name}")
        self.settings = settings
        self.thread_ref = thread_ref
        #: turns this instance started
        self.turns = 0

    async def handle(self, message: Any) -> Any:
        if not isinstance(message, Speak):
            raise TypeError(f"{self.name} does not handle {type(message).__name__}")
        view = await self.thread_ref.ask(
            StartTurn(
                prompt=message.prompt,
                client_id=message.client_id,
                resume_after_turn_id=message.resume_after_turn_id,
                origin=message.origin,
                agent=self.settings,
            )
        )
        self.turns += 1
        return view


def agent_child_id(name: str) -> str:
    """The supervisor child id of agent ``name``."""
    return f"agent:{name}"


def run_supervisor(session_id: str, agents: dict[str, AgentTurn], thread_ref: Any) -> Supervisor:
    """The run's supervisor: an :class:`AgentActor` per agent (config order), one-for-one.

    Returns:
        A Supervisor to start with ``await nursery.start(sup.run)``; each child's started value
        is the agent's Ref (``sup.child_value(agent_child_id(name))``).
    """

    def child(settings: AgentTurn) -> ChildSpec:
        async def start(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            await AgentActor(settings, thread_ref).run(task_status=task_status)

        return ChildSpec(agent_child_id(settings.name), start, restart=Restart.TRANSIENT, shutdown_timeout=5.0)

    return Supervisor(
        [child(s) for s in agents.values()],
        name=f"run:{session_id}",
        strategy=Strategy.ONE_FOR_ONE,
        intensity=3,
        period=10.0,
    )


def resolve_agents(
    config: OrchestrationConfig,
    engines: Any,
    groups: Mapping[str, tuple[str, ...]] | None = None,
    remote_contexts: dict[str, str] | None = None,
) -> dict[str, AgentTurn]:
    """Each agent's turn settings, its ``Model`` resolved to an engine of ``engines``.

    Args:
        config: the loaded config.
        engines: a :class:`roost.protocol._engines.EngineCatalog`.
        groups: more plugin groups for the agents' ``Plugins`` (an MCP server's name -> its
            tools' names, :meth:`roost.plugins.McpHost.groups`).
        remote_contexts: the run's remote A2A context ids, shared by its ``RemoteAgent`` proxies
            (proxy name -> ``contextId``, see :mod:`roost.orchestration._remote`); None: each
            proxy keeps its own.

    Returns:
        Agent name -> :class:`AgentTurn`, in config order.

    Raises:
        ConfigError: an agent's model cannot be used (no provider, unknown provider, missing
            API key); the message names the agent.
        InvalidParams: the engine cannot be opened.
    """
    from roost.errors import ConfigError

    out: dict[str, AgentTurn] = {}
    for agent in config.agents:
        try:
            out[agent.name] = agent_turn(config, agent, engines, groups, remote_contexts)
        except ConfigError as exc:
            raise ConfigError(f"agent {agent.name}: {exc}") from None
    return out


def agent_turn(
    config: OrchestrationConfig,
    agent: AgentSpec,
    engines: Any,
    groups: Mapping[str, tuple[str, ...]] | None = None,
    remote_contexts: dict[str, str] | None = None,
) -> AgentTurn:
    """One agent's :class:`AgentTurn` (see :func:`resolve_agents`); a ``RemoteAgent`` proxy's engine
    is a :class:`~roost.orchestration._remote.RemoteAgentEngine` and it is offered no tools."""
    if agent.remote_agent is not None:
        from roost.orchestration._remote import RemoteAgentEngine

        return AgentTurn(
            name=agent.name,
            system_prompt=agent.instructions or None,
            tools=(),
            engine=RemoteAgentEngine.from_spec(agent.name, agent.remote_agent, remote_contexts),
            model=agent.remote_agent.url,
        )
    spec = config.resolve_model(agent)
    engine, model, max_tokens, temperature = model_options(spec, engines)
    return AgentTurn(
        name=agent.name,
        system_prompt=agent.instructions or None,
        tools=plugin_tool_names(agent.plugins, groups),
        engine=engine,
        model=model,
        max_tokens=max_tokens,
        temperature=temperature,
        max_tool_rounds=agent.max_tool_rounds,
    )


def model_options(spec: ModelSpec | None, engines: Any) -> tuple[Any, str | None, int | None, float | None]:
    """``(engine, model, max_tokens, temperature)`` for a model alias (None: the run's engine).

    Raises:
        ConfigError: see :func:`resolve_agents`.
    """
    if spec is None:
        return None, None, None, None
    settings = engines.settings_for_model(
        provider=spec.provider, endpoint=spec.endpoint, model=spec.model_id, api_key_env=spec.api_key_env
    )
    return engines.engine_for_settings(settings), settings.model, spec.max_tokens, spec.temperature
