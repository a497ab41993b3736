"""Config templates of ``roost init``: an orchestration config plus one file per agent.

Each template renders to YAML text: the config (its agents referenced as ``File: agents/<x>.yaml``)
and the agent files, which ``roost init`` writes into an ``agents/`` folder beside the config.
"""

from __future__ import annotations

import attrs
import yaml

__all__ = ["ConfigTemplate", "TEMPLATES", "render_template"]


@attrs.frozen(kw_only=True)
class ConfigTemplate:
    """A template: ``key`` (``init --template KEY``), a label and a one-line description.

    ``agents`` holds ``(name, description, instructions, plugins)`` per agent; ``selection`` and
    ``termination`` are the config's mappings (PascalCase keys, see :mod:`roost.orchestration`).
    """

    key: str
    label: str
    description: str
    name: str
    agents: tuple[tuple[str, str, str, tuple[str, ...]], ...]
    selection: dict
    termination: dict


TEMPLATES: dict[str, ConfigTemplate] = {
    t.key: t
    for t in (
        ConfigTemplate(
            key="assistant",
            label="Single assistant",
            description="One agent with file, shell and memory tools that keeps working, turn after turn, "
            "until it says TASK COMPLETE (at most 20 turns).",
            name="Assistant",
            agents=(
                (
                    "Assistant",
                    "A general software assistant.",
                    "You are a helpful software assistant. Use the tools to read and write files and run "
                    "commands to complete the user's task. When you are done, say TASK COMPLETE.",
                    ("files", "shell", "memory"),
                ),
            ),
            selection={"Type": "roundrobin"},  # one agent: it continues until the termination
            termination={
                "Type": "composite",
                "Strategies": [
                    {"Type": "regex", "Pattern": "TASK COMPLETE"},
                    {"Type": "maxiterations", "MaxIterations": 20},
                ],
            },
        ),
        ConfigTemplate(
            key="dev-team",
            label="Development team",
            description="Planner, Developer and Reviewer handing off by keyword until the Reviewer approves.",
            name="DevTeam",
            agents=(
                (
                    "Planner",
                    "Breaks the task into steps.",
                    "You plan the work: read the code, then write a short numbered plan. End with "
                    "HANDOFF TO DEVELOPER on its own line.",
                    ("files", "memory"),
                ),
                (
                    "Developer",
                    "Implements the plan.",
                    "You implement the plan with the file and shell tools and run the tests. End with "
                    "HANDOFF TO REVIEWER on its own line.",
                    ("files", "shell"),
                ),
                (
                    "Reviewer",
                    "Reviews the change.",
                    "You review the change. If it is right, say APPROVED; otherwise list the problems and "
                    "end with REVISION REQUIRED on its own line.",
                    ("files",),
                ),
            ),
            selection={
                "Type": "keyword",
                "DefaultAgent": "Planner",
                "Routes": [
                    {"Keyword": "HANDOFF TO DEVELOPER", "Agent": "Developer", "SourceAgents": ["Planner"]},
                    {"Keyword": "HANDOFF TO REVIEWER", "Agent": "Reviewer", "SourceAgents": ["Developer"]},
                    {"Keyword": "REVISION REQUIRED", "Agent": "Developer", "SourceAgents": ["Reviewer"]},
                ],
            },
            termination={
                "Type": "composite",
                "Strategies": [
                    {"Type": "regex", "Pattern": "APPROVED", "AgentNames": ["Reviewer"]},
                    {"Type": "maxiterations", "MaxIterations": 30},
                ],
            },
        ),
    )
}


#: the tool-calling responses each template agent may make per turn before it must answer
_MAX_TOOL_ROUNDS = 25


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-") or "agent"


def render_template(key: str, *, model: str, endpoint: str | None) -> tuple[str, dict[str, str]]:
    """Render a template.

    Args:
        key: a key of :data:`TEMPLATES`.
        model: the model id every agent uses (through the ``default`` alias of ``Models``).
        endpoint: the server's base URL, or ``None`` for the provider's default.

    Returns:
        ``(config_yaml, {"<agent>.yaml": agent_yaml})``; agent file names are relative to the
        ``agents/`` folder beside the config.

    Raises:
        KeyError: unknown template key.
    """
    template = TEMPLATES[key]
    spec: dict = {"ModelId": model}
    if endpoint:
        spec["Endpoint"] = endpoint
    files: dict[str, str] = {}
    refs = []
    for name, description, instructions, plugins in template.agents:
        fname = f"{_slug(name)}.yaml"
        files[fname] = yaml.safe_dump(
            {
                "Name": name,
                "Description": description,
                "Instructions": instructions,
                "Model": "default",
                "Plugins": list(plugins),
                "MaxToolRounds": _MAX_TOOL_ROUNDS,
            },
            sort_keys=False,
            width=100,
        )
        refs.append({"File": f"agents/{fname}"})
    config = {
        "Orchestration": {
            "Name": template.name,
            "Description": template.description,
            "Models": {"default": spec},
            "Agents": refs,
            "Selection": template.selection,
            "Termination": template.termination,
        }
    }
    return yaml.safe_dump(config, sort_keys=False, width=100), files
