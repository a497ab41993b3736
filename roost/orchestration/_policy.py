"""Selection and termination of an orchestration run: pure functions of the run's progress.

Selection (``Selection.Type``):

* ``sequential``: each agent once, in config order (from ``DefaultAgent`` when set); the run
  ends after the last one (unless a termination strategy ends it first).
* ``roundrobin``: the agents in config order, cycling until a termination strategy ends the run.
* ``keyword``: after an agent's message, the first route whose ``Keyword`` appears in it
  (case-insensitive) and whose ``SourceAgents`` (empty: any) include the speaker names the next
  agent; no route matches: ``DefaultAgent`` speaks next, or, without one, the same agent is asked
  again with a correction from ``Orchestrator``. A route with ``RequireHumanApproval`` is asked
  first (the caller's ``route_approval``).
* ``llm``: a selector model picks the next agent by name (see :mod:`roost.orchestration._run`).

Termination (``Termination.Type``), checked after every agent message: ``regex`` (the pattern is
searched in the message, of ``AgentNames`` when given), ``maxiterations`` (agent turns so far),
``token_budget`` (input plus output tokens of the run so far), ``composite`` (``any``/``all``).
"""

from __future__ import annotations

import re

import attrs

from roost.orchestration._config import OrchestrationConfig, Route, Termination

__all__ = [
    "Progress",
    "Handoff",
    "first_agent",
    "next_sequential",
    "keyword_handoff",
    "terminated",
    "token_budget",
    "WARN_FRACTION",
]

#: A ``token_budget_warning`` is sent once the run has used this fraction of its budget.
WARN_FRACTION = 0.8


@attrs.define(kw_only=True)
class Progress:
    """What the run has done so far (persisted in the thread's metadata for ``--resume``).

    Attributes:
        iterations: agent turns completed.
        tokens: input plus output tokens of the run (all agent turns and selector calls).
        input_tokens, output_tokens: the same, split.
        next_agent: the agent that speaks next (None: the run has not started).
        correction: an Orchestrator message to inject before the next agent's turn, or None.
        warned: whether ``token_budget_warning`` was sent.
        selecting, last_agent, last_text: see below.
    """

    iterations: int = 0
    tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    next_agent: str | None = None
    correction: str | None = None
    #: ``--hitl``: the human's message for the next agent's turn, or None
    human_input: str | None = None
    warned: bool = False
    #: set while the next agent is being chosen (a route approval may be pending): a resumed run
    #: chooses again from ``last_agent``'s message ``last_text``
    selecting: bool = False
    last_agent: str | None = None
    last_text: str = ""


@attrs.frozen(kw_only=True)
class Handoff:
    """A keyword selection outcome: the next agent, the route taken (None: no route matched),
    and the correction to inject (None: none)."""

    agent: str
    route: Route | None = None
    correction: str | None = None


def first_agent(config: OrchestrationConfig) -> str:
    """The agent that speaks first: ``DefaultAgent`` or the first agent of the config."""
    return config.selection.default_agent or config.agents[0].name


def next_sequential(config: OrchestrationConfig, current: str, *, cycle: bool) -> str | None:
    """The agent after ``current`` in config order; at the end, the first (``cycle``) or None."""
    names = [a.name for a in config.agents]
    index = names.index(current) + 1 if current in names else 0
    if index < len(names):
        return names[index]
    return names[0] if cycle else None


def keyword_handoff(config: OrchestrationConfig, speaker: str, message: str) -> Handoff:
    """Keyword selection after ``speaker`` said ``message`` (see the module docstring)."""
    text = message.lower()
    for route in config.selection.routes:
        if route.source_agents and speaker not in route.source_agents:
            continue
        if route.keyword.lower() in text:
            return Handoff(agent=route.agent, route=route)
    if config.selection.default_agent is not None:
        return Handoff(agent=config.selection.default_agent)
    keywords = [r.keyword for r in config.selection.routes if not r.source_agents or speaker in r.source_agents]
    hint = ", ".join(repr(k) for k in keywords) or "a handoff keyword"
    return Handoff(
        agent=speaker,
        correction=f"{speaker}: no handoff found in your message. Continue, and "
        f"end your message with one of {hint} to hand off.",
    )


def token_budget(term: Termination) -> int | None:
    """The smallest ``token_budget`` of ``term`` (searching composites), in tokens, or None."""
    if term.type == "token_budget":
        return term.max_tokens
    budgets = [b for b in (token_budget(s) for s in term.strategies) if b is not None]
    return min(budgets) if budgets else None


def terminated(term: Termination, progress: Progress, speaker: str, message: str) -> str | None:
    """Whether ``term`` ends the run after ``speaker`` said ``message``; the reason, or None."""
    if term.type == "regex":
        if term.agent_names and speaker not in term.agent_names:
            return None
        return f"{speaker} matched {term.pattern!r}" if re.search(term.pattern or "", message) else None
    if term.type == "maxiterations":
        limit = term.max_iterations or 0
        return f"reached {limit} iterations" if progress.iterations >= limit else None
    if term.type == "token_budget":
        limit = term.max_tokens or 0
        return f"token budget of {limit} used" if progress.tokens >= limit else None
    reasons = [terminated(s, progress, speaker, message) for s in term.strategies]
    hits = [r for r in reasons if r is not None]
    if term.mode == "all":
        return "; ".join(hits) if hits and len(hits) == len(reasons) else None
    return hits[0] if hits else None
