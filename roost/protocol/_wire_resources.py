"""Wire-protocol item types of the ``--json`` resource queries other than sessions and chats.

Memories, context files, schedules, configurations and their validation, templates, plugins,
models and objectives (``spec/wire-protocol.md``, "Resource queries"), in the form of
:mod:`roost.protocol._wire_types` (frozen attrs classes, snake_case names that
:func:`~roost.protocol._wire_types.to_wire` sends in camelCase). A module of their own so that
``roost sessions --json`` does not create these classes (issue 19: start-up; each attrs class
costs a fraction of a millisecond to create).
"""

from __future__ import annotations

import attrs

__all__ = [
    "Memory",
    "MemoryAgent",
    "ContextFileInfo",
    "ContextItem",
    "ScheduledJob",
    "ConfigSummary",
    "ValidationIssue",
    "Validation",
    "Template",
    "InitResult",
    "PluginFunction",
    "Plugin",
    "McpPlugin",
    "Model",
    "ObjectiveTaskInfo",
    "Objective",
]


@attrs.frozen(kw_only=True)
class Memory:
    """One typed memory entry (type ``user``, ``feedback``, ``project`` or ``reference``)."""

    guid: str
    name: str
    type: str
    description: str
    body: str


@attrs.frozen(kw_only=True)
class MemoryAgent:
    """An agent with at least one memory, and how many it has."""

    agent: str
    count: int


@attrs.frozen(kw_only=True)
class ContextFileInfo:
    """``{relativePath, sizeBytes}`` of one imported context file (size in bytes)."""

    relative_path: str
    size_bytes: int


@attrs.frozen(kw_only=True)
class ContextItem:
    """Reference material imported into a project's context."""

    name: str
    description: str | None
    source_path: str
    imported_at: str
    size_bytes: int
    files: list[ContextFileInfo] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class ScheduledJob:
    """A cron job (``schedule list --json``)."""

    name: str
    description: str | None
    cron: str
    task: str
    config: str | None
    work_dir: str | None
    enabled: bool
    due: bool
    created_at: str
    last_run: str | None
    next_run: str | None


@attrs.frozen(kw_only=True)
class ConfigSummary:
    """One orchestration config file; ``name``/``description``/``selectionType`` null when it failed to load."""

    path: str
    name: str | None
    description: str | None
    agents: list[str]
    selection_type: str | None
    error: str | None


@attrs.frozen(kw_only=True)
class ValidationIssue:
    """``{level, message}``; level ``error`` or ``warning``."""

    level: str
    message: str


@attrs.frozen(kw_only=True)
class Validation:
    """The result of ``validate PATH``: valid when no issue has level ``error``."""

    path: str
    valid: bool
    issues: list[ValidationIssue]
    config: ConfigSummary | None


@attrs.frozen(kw_only=True)
class Template:
    """A config template of ``init``."""

    key: str
    label: str
    description: str


@attrs.frozen(kw_only=True)
class InitResult:
    """What ``init`` wrote: absolute paths of the config and of its agent files."""

    template: str
    model: str
    endpoint: str | None
    config_path: str
    agent_files: list[str]


@attrs.frozen(kw_only=True)
class PluginFunction:
    """``{name, description}`` of one tool a plugin provides."""

    name: str
    description: str


@attrs.frozen(kw_only=True)
class Plugin:
    """A group of tools: ``source`` is ``builtin`` or ``mcp``."""

    name: str
    source: str
    functions: list[PluginFunction]


@attrs.frozen(kw_only=True)
class McpPlugin(Plugin):
    """A Plugin with ``source`` ``mcp`` (an MCP server); Roost adds ``status``, its connection state
    after one attempt (``connected``, ``failed``, ``connecting``, ``configured``), and ``error``, why
    it is not connected (``null`` when it is)."""

    status: str
    error: str | None


@attrs.frozen(kw_only=True)
class Model:
    """A model of the configured provider; ``current`` marks the configured default."""

    id: str
    current: bool


@attrs.frozen(kw_only=True)
class ObjectiveTaskInfo:
    """One task of an objective: ``outcome`` is ``pending``, ``running``, ``succeeded`` or ``skipped``;
    ``failures`` counts consecutive failed attempts; ``sessionId`` is its latest attempt's task id."""

    index: int
    task: str
    outcome: str
    failures: int
    session_id: str | None


@attrs.frozen(kw_only=True)
class Objective:
    """A long-horizon objective (``objective list --json``, ``objective status ID --json``)."""

    id: str
    title: str
    description: str | None
    status: str
    created_at: str
    updated_at: str
    tasks: list[ObjectiveTaskInfo] = attrs.field(factory=list)
