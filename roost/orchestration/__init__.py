"""Orchestration configs: the YAML description of a team of agents (``validate``, ``config --list``, ``init``).

Public names are re-exported from the private modules that define them.
"""

from __future__ import annotations

from roost.orchestration._agents import resolve_agents as resolve_agents
from roost.orchestration._config import SELECTION_TYPES as SELECTION_TYPES
from roost.orchestration._config import TERMINATION_TYPES as TERMINATION_TYPES
from roost.orchestration._config import AgentSpec as AgentSpec
from roost.orchestration._config import ConfigInvalid as ConfigInvalid
from roost.orchestration._config import ConfigIssue as ConfigIssue
from roost.orchestration._config import ModelSpec as ModelSpec
from roost.orchestration._config import OrchestrationConfig as OrchestrationConfig
from roost.orchestration._config import RemoteAgentSpec as RemoteAgentSpec
from roost.orchestration._config import Route as Route
from roost.orchestration._config import Selection as Selection
from roost.orchestration._config import Termination as Termination
from roost.orchestration._config import load_config_file as load_config_file
from roost.orchestration._config import validate_config_file as validate_config_file
from roost.orchestration._policy import token_budget as token_budget
from roost.orchestration._run import STOP as STOP
from roost.orchestration._run import Orchestrator as Orchestrator
from roost.orchestration._run import RunOutcome as RunOutcome
from roost.orchestration._templates import TEMPLATES as TEMPLATES
from roost.orchestration._templates import ConfigTemplate as ConfigTemplate
from roost.orchestration._templates import render_template as render_template

__all__ = [
    "Orchestrator",
    "RunOutcome",
    "STOP",
    "resolve_agents",
    "token_budget",
    "SELECTION_TYPES",
    "TERMINATION_TYPES",
    "AgentSpec",
    "RemoteAgentSpec",
    "ConfigInvalid",
    "ConfigIssue",
    "ModelSpec",
    "OrchestrationConfig",
    "Route",
    "Selection",
    "Termination",
    "load_config_file",
    "validate_config_file",
    "TEMPLATES",
    "ConfigTemplate",
    "render_template",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        try:
            _obj.__module__ = __name__
        except (AttributeError, TypeError):
            pass
del _name, _obj
