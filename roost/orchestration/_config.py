"""Orchestration configs: YAML (or JSON) files describing a team of agents, loaded with cattrs.

The format (keys in PascalCase, under a top-level ``Orchestration`` key)::

    Orchestration:
      Name: DevTeam
      Description: Plans, writes and reviews code.
      Models:                       # aliases reusable by agents
        fast: {ModelId: gpt-4o-mini, Endpoint: http://localhost:11434/v1}
        careful: {Provider: anthropic, ModelId: claude-sonnet-4-5, ApiKeyEnv: TEAM_ANTHROPIC_KEY,
                  MaxTokens: 4096, Temperature: 0.2}
      Agents:
        - Name: Planner
          Description: Breaks the task down.
          Instructions: You plan. Say HANDOFF TO DEVELOPER when done.
          Model: fast               # an alias of Models, a model id, or {ModelId, Endpoint}
          Plugins: [files, memory]
          MaxToolRounds: 8          # tool-calling responses per turn; then it must answer
        - File: agents/developer.yaml   # the agent's mapping in its own file (relative to this one)
      Selection:                    # sequential | roundrobin | keyword | llm
        Type: keyword
        DefaultAgent: Planner
        Routes:
          - {Keyword: HANDOFF TO DEVELOPER, Agent: Developer, SourceAgents: [Planner],
             RequireHumanApproval: true}   # ask (route_approval) before this handoff
      Termination:                  # regex | maxiterations | token_budget | composite
        Type: composite
        Mode: any                   # composite: any (default) or all
        Strategies:
          - {Type: regex, Pattern: APPROVED}
          - {Type: maxiterations, MaxIterations: 20}
          - {Type: token_budget, MaxTokens: 200000}
      McpServers:                   # MCP servers; an agent's Plugins entry naming one gives its tools
        - {Name: notes, Type: stdio, Command: python, Args: [notes_server.py]}
        - {Name: search, Type: http, Url: "http://127.0.0.1:8000/mcp", ReadOnly: true}

Selection defaults to sequential, termination to 10 iterations. Keys Roost does not know are
warnings, not errors (a config written for a newer release still loads). Every error names the
path of the bad field, e.g. ``Orchestration.Agents[1].Name: required``.
"""

from __future__ import annotations

import os
import re
import typing
from pathlib import Path
from typing import Any

import attrs
import cattrs
import yaml
from cattrs.cols import list_structure_factory, mapping_structure_factory
from cattrs.gen import make_dict_structure_fn, override

from roost._json import JSONDecodeError, loads
from roost.errors import ConfigError
from roost.plugins import McpServerConfig, mcp_servers_from_orchestration

__all__ = [
    "SELECTION_TYPES",
    "TERMINATION_TYPES",
    "ModelSpec",
    "AgentSpec",
    "RemoteAgentSpec",
    "Route",
    "Selection",
    "Termination",
    "OrchestrationConfig",
    "ConfigIssue",
    "ConfigInvalid",
    "load_config_file",
    "validate_config_file",
]

SELECTION_TYPES = ("sequential", "roundrobin", "keyword", "llm")
TERMINATION_TYPES = ("regex", "maxiterations", "token_budget", "composite")
_SELECTION_ALIASES = {"round_robin": "roundrobin", "round-robin": "roundrobin"}
_TERMINATION_ALIASES = {
    "max_iterations": "maxiterations",
    "tokenbudget": "token_budget",
    "token-budget": "token_budget",
    "max-iterations": "maxiterations",
}
_DEFAULT_MAX_ITERATIONS = 10


@attrs.frozen(kw_only=True)
class ModelSpec:
    """A model alias: the model id and, optionally, how to reach it and how to sample.

    Attributes:
        model_id: the provider's model id.
        provider: ``scripted``, ``openai``, ``openai-responses`` or ``anthropic`` (None: the
            run's provider).
        endpoint: the server's base URL (None: the run's, or the provider's default).
        api_key_env: the environment variable holding the API key (never the key itself).
        max_tokens: output tokens per model call (None: the adapter's default).
        temperature: sampling temperature (None: the provider's default).
    """

    model_id: str
    provider: str | None = None
    endpoint: str | None = None
    api_key_env: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None


@attrs.frozen(kw_only=True)
class RemoteAgentSpec:
    """``RemoteAgent: {Url, TimeoutSeconds, TokenEnv?}``: the agent is a proxy for the remote A2A
    agent at ``url`` (card at ``{Url}/.well-known/agent.json``; roost.orchestration._remote);
    ``timeout_seconds`` bounds each call; ``token_env`` (additive) names the variable holding a
    bearer token for it."""

    url: str
    timeout_seconds: float = 120.0
    token_env: str | None = None


@attrs.frozen(kw_only=True)
class AgentSpec:
    """One agent of the team; ``model`` is an alias of ``Models``, a model id, or a ModelSpec."""

    name: str
    description: str | None = None
    instructions: str = ""
    model: ModelSpec | str | None = None
    plugins: list[str] = attrs.field(factory=list)
    #: model responses with tool calls allowed per turn (None: no limit but the process's)
    max_tool_rounds: int | None = None
    #: a proxy for a remote A2A agent (its turns are the remote agent's answers); None: a model agent
    remote_agent: RemoteAgentSpec | None = None
    file: str | None = None


@attrs.frozen(kw_only=True)
class Route:
    """keyword selection: when ``keyword`` appears in a message of a source agent, ``agent`` speaks next."""

    keyword: str
    agent: str
    source_agents: list[str] = attrs.field(factory=list)
    #: ask a human (``approval_request`` kind ``route_approval``) before handing off
    require_human_approval: bool = False


@attrs.frozen(kw_only=True)
class Selection:
    """Which agent speaks next: ``type`` is one of :data:`SELECTION_TYPES`."""

    type: str = "sequential"
    default_agent: str | None = None
    routes: list[Route] = attrs.field(factory=list)
    model: ModelSpec | str | None = None
    prompt: str | None = None


@attrs.frozen(kw_only=True)
class Termination:
    """When the run ends: ``type`` is one of :data:`TERMINATION_TYPES`.

    ``regex``: ``pattern`` matches a message (of ``agent_names`` when given); ``maxiterations``:
    after ``max_iterations`` agent turns; ``token_budget``: once ``max_tokens`` tokens were used;
    ``composite``: ``strategies`` combined with ``mode`` ``any`` or ``all``.
    """

    type: str = "maxiterations"
    pattern: str | None = None
    agent_names: list[str] = attrs.field(factory=list)
    max_iterations: int | None = None
    max_tokens: int | None = None
    mode: str = "any"
    strategies: list[Termination] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class OrchestrationConfig:
    """A loaded orchestration config; ``path`` is the absolute file it came from."""

    path: str = ""
    name: str = ""
    description: str | None = None
    models: dict[str, ModelSpec] = attrs.field(factory=dict)
    agents: list[AgentSpec] = attrs.field(factory=list)
    selection: Selection = attrs.field(factory=Selection)
    termination: Termination = attrs.field(
        factory=lambda: Termination(type="maxiterations", max_iterations=_DEFAULT_MAX_ITERATIONS)
    )
    #: ``McpServers``: MCP servers whose tools agents use through ``Plugins`` (roost.plugins)
    mcp_servers: list[McpServerConfig] = attrs.field(factory=list)

    def resolve_model(self, agent: AgentSpec | Selection) -> ModelSpec | None:
        """Return an agent's (or the selector's) model with a ``Models`` alias resolved
        (``None``: the run's provider and model)."""
        if isinstance(agent.model, str):
            return self.models.get(agent.model) or ModelSpec(model_id=agent.model)
        return agent.model


for _cls in (ModelSpec, AgentSpec, Route, Selection, Termination, OrchestrationConfig):
    attrs.resolve_types(_cls, globals(), locals())
del _cls


@attrs.frozen
class ConfigIssue:
    """A finding of :func:`validate_config_file`: ``level`` ``error`` or ``warning``."""

    level: str
    message: str


class ConfigInvalid(ConfigError):
    """The config has errors; ``issues`` lists all of them (errors and warnings)."""

    def __init__(self, message: str, issues: list[ConfigIssue]) -> None:
        super().__init__(message)
        self.issues = issues


def _pascal(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _origin(t: Any) -> Any:
    """``typing.get_origin`` of a type, as a plain value (``list`` for ``list[str]``)."""
    return typing.get_origin(t)


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=False)

    def model_hook(value: Any, _: Any) -> ModelSpec | str | None:
        if value is None or isinstance(value, str):
            return value
        return conv.structure(value, ModelSpec)

    conv.register_structure_hook(ModelSpec | str | None, model_hook)

    def strict_str(value: Any, _: Any) -> str:
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {type(value).__name__}")
        return value

    def strict_int(value: Any, _: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an integer, got {type(value).__name__}")
        return value

    def strict_bool(value: Any, _: Any) -> bool:
        if not isinstance(value, bool):
            raise TypeError(f"expected true or false, got {type(value).__name__}")
        return value

    def strict_float(value: Any, _: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"expected a number, got {type(value).__name__}")
        return float(value)

    def strict_container(kind: type, factory: Any, noun: str) -> Any:
        """A hook factory for ``list[...]``/``dict[...]`` refusing other shapes (cattrs would
        read a string as a list of characters)."""

        def make(type_: Any) -> Any:
            base = factory(type_, conv)

            def hook(value: Any, t: Any) -> Any:
                if not isinstance(value, kind):
                    raise TypeError(f"expected {noun}, got {type(value).__name__}")
                return base(value, t)

            return hook

        return make

    conv.register_structure_hook_factory(
        lambda t: _origin(t) is list, strict_container(list, list_structure_factory, "a list")
    )
    conv.register_structure_hook_factory(
        lambda t: _origin(t) is dict, strict_container(dict, mapping_structure_factory, "a mapping")
    )
    conv.register_structure_hook(float, strict_float)
    conv.register_structure_hook(str, strict_str)
    conv.register_structure_hook(int, strict_int)
    conv.register_structure_hook(bool, strict_bool)  # else the int hook (bool is an int) refuses it
    for cls in (ModelSpec, RemoteAgentSpec, AgentSpec, Route, Selection, Termination, OrchestrationConfig):
        renames = {a.name: override(rename=_pascal(a.name)) for a in attrs.fields(cls) if a.name != "path"}
        if cls is AgentSpec:
            renames["file"] = override(omit=True)
        # cattrs types **kwargs (the per-field overrides) as its keyword flags: a known stub gap.
        conv.register_structure_hook(cls, make_dict_structure_fn(cls, conv, **renames))  # type: ignore[arg-type]
    return conv


_converter = _make_converter()
_KNOWN_KEYS: dict[type, set[str]] = {
    cls: {_pascal(a.name) for a in attrs.fields(cls)}
    for cls in (ModelSpec, RemoteAgentSpec, AgentSpec, Route, Selection, Termination, OrchestrationConfig)
}


def _read_document(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text") from exc
    if path.suffix.lower() == ".json":
        try:
            return loads(text)
        except JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc


def _unknown_keys(raw: Any, cls: type, where: str, out: list[ConfigIssue]) -> None:
    """Warn about keys ``cls`` does not define, recursively."""
    if not isinstance(raw, dict):
        return
    for key, value in raw.items():
        if key not in _KNOWN_KEYS[cls]:
            out.append(ConfigIssue("warning", f"{where}.{key}: unknown key, ignored"))
            continue
        if cls is OrchestrationConfig and key == "Agents" and isinstance(value, list):
            for i, agent in enumerate(value):
                _unknown_keys(agent, AgentSpec, f"{where}.Agents[{i}]", out)
        elif cls is OrchestrationConfig and key == "Selection":
            _unknown_keys(value, Selection, f"{where}.Selection", out)
        elif cls is OrchestrationConfig and key == "Termination":
            _unknown_keys(value, Termination, f"{where}.Termination", out)
        elif cls is Termination and key == "Strategies" and isinstance(value, list):
            for i, sub in enumerate(value):
                _unknown_keys(sub, Termination, f"{where}.Strategies[{i}]", out)
        elif cls is AgentSpec and key == "RemoteAgent":
            _unknown_keys(value, RemoteAgentSpec, f"{where}.RemoteAgent", out)
        elif cls is Selection and key == "Routes" and isinstance(value, list):
            for i, route in enumerate(value):
                _unknown_keys(route, Route, f"{where}.Routes[{i}]", out)


def _expand_agent_files(body: dict[str, Any], base: Path, issues: list[ConfigIssue]) -> None:
    """Replace ``{File: path}`` agent entries with the mapping read from that file."""
    agents = body.get("Agents")
    if not isinstance(agents, list):
        return
    for i, entry in enumerate(agents):
        if not (isinstance(entry, dict) and "File" in entry):
            continue
        where = f"Orchestration.Agents[{i}].File"
        ref = entry["File"]
        if not isinstance(ref, str) or not ref:
            issues.append(ConfigIssue("error", f"{where}: expected a path"))
            continue
        path = (base / ref).resolve()
        try:
            loaded = _read_document(path)
        except ConfigError as exc:
            issues.append(ConfigIssue("error", f"{where}: {exc}"))
            continue
        if isinstance(loaded, dict) and isinstance(loaded.get("Agent"), dict):
            loaded = loaded["Agent"]
        if not isinstance(loaded, dict):
            issues.append(ConfigIssue("error", f"{where}: {path} must hold a mapping of agent fields"))
            continue
        agents[i] = {**loaded, **{k: v for k, v in entry.items() if k != "File"}, "_file": str(path)}


def _format_error(exc: BaseException, type_: Any) -> str:
    """One structuring error as a reader would want it (our hooks' ``expected ...`` messages)."""
    if isinstance(exc, TypeError) and str(exc).startswith("expected "):
        return str(exc)
    if isinstance(exc, ValueError) and type_ in (int, float):
        return f"expected a number, got {exc}"
    return cattrs.v.format_exception(exc, type_)


def _structure_errors(exc: Exception) -> list[str]:
    messages = cattrs.transform_error(exc, path="Orchestration", format_exception=_format_error)
    out = []
    for msg in messages:
        # "expected a list, got str @ Orchestration.agents[0].plugins" -> path first, PascalCase
        text, _, where = msg.partition(" @ ")
        where = re.sub(r"\.(\w+)", lambda m: "." + _pascal(m.group(1)), where) if where else "Orchestration"
        where = re.sub(r"\['([^']*)'\]", r".\1", where)  # Models['fast'] -> Models.fast
        text = text.replace("required field missing", "required")
        out.append(f"{where}: {text}")
    return out


def _in_file(message: str, files: dict[int, str]) -> str:
    """Name the agent file an ``Orchestration.Agents[i]...`` message is about, if it has one."""
    match = re.match(r"Orchestration\.Agents\[(\d+)\]", message)
    if match and int(match.group(1)) in files:
        return f"{message} (in {files[int(match.group(1))]})"
    return message


def _normalise(body: dict[str, Any]) -> None:
    """Lower-case the Type names and map their aliases, in place."""
    sel = body.get("Selection")
    if isinstance(sel, dict) and isinstance(sel.get("Type"), str):
        t = sel["Type"].strip().lower()
        sel["Type"] = _SELECTION_ALIASES.get(t, t)

    def term(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("Type"), str):
                t = node["Type"].strip().lower()
                node["Type"] = _TERMINATION_ALIASES.get(t, t)
            for sub in node.get("Strategies") or [] if isinstance(node.get("Strategies"), list) else []:
                term(sub)

    term(body.get("Termination"))


def _check(config: OrchestrationConfig, issues: list[ConfigIssue]) -> None:
    """Semantic checks that the types alone cannot express."""

    def error(msg: str) -> None:
        issues.append(ConfigIssue("error", msg))

    names = [a.name for a in config.agents]
    if not config.agents:
        error("Orchestration.Agents: at least one agent is required")
    seen: set[str] = set()
    for i, agent in enumerate(config.agents):
        if not agent.name.strip():
            error(f"Orchestration.Agents[{i}].Name: must not be empty")
        elif agent.name in seen:
            error(f"Orchestration.Agents[{i}].Name: duplicate agent name {agent.name!r}")
        seen.add(agent.name)
        if not agent.instructions.strip() and agent.remote_agent is None:  # a proxy needs none
            issues.append(ConfigIssue("warning", f"Orchestration.Agents[{i}].Instructions: empty"))
        if isinstance(agent.model, str) and config.models and agent.model not in config.models:
            issues.append(
                ConfigIssue(
                    "warning",
                    f"Orchestration.Agents[{i}].Model: {agent.model!r} is not an alias "
                    f"of Models ({', '.join(config.models)}); it is used as a model id",
                )
            )
        if isinstance(agent.model, ModelSpec):
            _check_model(agent.model, f"Orchestration.Agents[{i}].Model", error)
        elif isinstance(agent.model, str) and not agent.model.strip():
            error(f"Orchestration.Agents[{i}].Model: must not be empty")
        if agent.max_tool_rounds is not None and agent.max_tool_rounds < 0:
            error(f"Orchestration.Agents[{i}].MaxToolRounds: must be 0 or more")
        remote = agent.remote_agent
        if remote is not None and not re.match(r"https?://[^/\s]+", remote.url):
            error(f"Orchestration.Agents[{i}].RemoteAgent.Url: must be an http:// or https:// URL")
        if remote is not None and not remote.timeout_seconds > 0:
            error(f"Orchestration.Agents[{i}].RemoteAgent.TimeoutSeconds: must be more than 0")
    for alias, spec in config.models.items():
        _check_model(spec, f"Orchestration.Models.{alias}", error)
    if isinstance(config.selection.model, ModelSpec):
        _check_model(config.selection.model, "Orchestration.Selection.Model", error)
    sel = config.selection
    if sel.type not in SELECTION_TYPES:
        error(f"Orchestration.Selection.Type: unknown selection {sel.type!r} (one of {', '.join(SELECTION_TYPES)})")
    if sel.default_agent is not None and sel.default_agent not in names:
        error(f"Orchestration.Selection.DefaultAgent: no agent named {sel.default_agent!r}")
    if sel.type == "keyword" and not sel.routes:
        error("Orchestration.Selection.Routes: keyword selection needs at least one route")
    for i, route in enumerate(sel.routes):
        where = f"Orchestration.Selection.Routes[{i}]"
        if not route.keyword.strip():
            error(f"{where}.Keyword: must not be empty")
        if route.agent not in names:
            error(f"{where}.Agent: no agent named {route.agent!r}")
        for j, src in enumerate(route.source_agents):
            if src not in names:
                error(f"{where}.SourceAgents[{j}]: no agent named {src!r}")
    _check_termination(config.termination, "Orchestration.Termination", names, error)


def _check_model(spec: ModelSpec, where: str, error: Any) -> None:
    from roost.engines import PROVIDERS

    if not spec.model_id.strip():
        error(f"{where}.ModelId: must not be empty")
    if spec.provider is not None and spec.provider not in PROVIDERS:
        error(f"{where}.Provider: unknown provider {spec.provider!r} (one of {', '.join(PROVIDERS)})")
    if spec.endpoint is not None and not re.match(r"^https?://", spec.endpoint):
        error(f"{where}.Endpoint: must be an http:// or https:// URL")
    if spec.max_tokens is not None and spec.max_tokens < 1:
        error(f"{where}.MaxTokens: must be a positive number of tokens")
    if spec.temperature is not None and not 0 <= spec.temperature <= 2:
        error(f"{where}.Temperature: must be between 0 and 2")


def _check_termination(term: Termination, where: str, names: list[str], error: Any) -> None:
    if term.type not in TERMINATION_TYPES:
        error(f"{where}.Type: unknown termination {term.type!r} (one of {', '.join(TERMINATION_TYPES)})")
        return
    if term.type == "regex":
        if not term.pattern:
            error(f"{where}.Pattern: required for regex termination")
        else:
            try:
                re.compile(term.pattern)
            except re.error as exc:
                error(f"{where}.Pattern: not a valid regular expression ({exc})")
        for j, agent in enumerate(term.agent_names):
            if agent not in names:
                error(f"{where}.AgentNames[{j}]: no agent named {agent!r}")
    elif term.type == "maxiterations":
        if term.max_iterations is None or term.max_iterations < 1:
            error(f"{where}.MaxIterations: required, a positive integer")
    elif term.type == "token_budget":
        if term.max_tokens is None or term.max_tokens < 1:
            error(f"{where}.MaxTokens: required, a positive integer of tokens")
    else:
        if term.mode not in ("any", "all"):
            error(f"{where}.Mode: must be any or all, not {term.mode!r}")
        if not term.strategies:
            error(f"{where}.Strategies: composite termination needs at least one strategy")
        for i, sub in enumerate(term.strategies):
            _check_termination(sub, f"{where}.Strategies[{i}]", names, error)


def validate_config_file(path: str | os.PathLike[str]) -> tuple[OrchestrationConfig | None, list[ConfigIssue]]:
    """Load and check an orchestration config, collecting every issue (blocking file I/O).

    Args:
        path: the YAML (``.yaml``/``.yml``, or any other suffix) or JSON (``.json``) file.

    Returns:
        ``(config, issues)``: ``config`` is ``None`` when the file could not be read, parsed or
        structured; otherwise it is returned even when semantic checks found errors. Each issue's
        message starts with the path of the field (``Orchestration.Agents[0].Name: ...``) or the
        file.
    """
    file = Path(path).expanduser().resolve()
    issues: list[ConfigIssue] = []
    try:
        raw = _read_document(file)
    except ConfigError as exc:
        return None, [ConfigIssue("error", str(exc))]
    if not isinstance(raw, dict) or not isinstance(raw.get("Orchestration"), dict):
        return None, [ConfigIssue("error", f"{file}: the top level must be a mapping with an Orchestration key")]
    body = dict(raw["Orchestration"])
    _expand_agent_files(body, file.parent, issues)
    if any(i.level == "error" for i in issues):
        return None, issues
    _normalise(body)
    mcp_warnings: list[str] = []
    mcp_servers, mcp_errors = mcp_servers_from_orchestration(
        body.pop("McpServers", None), base=file.parent, warnings=mcp_warnings
    )
    issues += [ConfigIssue("error", m) for m in mcp_errors] + [ConfigIssue("warning", m) for m in mcp_warnings]
    _unknown_keys({k: v for k, v in body.items()}, OrchestrationConfig, "Orchestration", issues)
    issues[:] = [i for i in issues if not i.message.endswith("._file: unknown key, ignored")]
    files = {}
    if isinstance(body.get("Agents"), list):
        for i, agent in enumerate(body["Agents"]):
            if isinstance(agent, dict) and "_file" in agent:
                files[i] = agent.pop("_file")
    try:
        config = _converter.structure(body, OrchestrationConfig)
    except Exception as exc:  # cattrs raises ClassValidationError / BaseValidationError groups
        return None, issues + [ConfigIssue("error", _in_file(m, files)) for m in _structure_errors(exc)]
    if files:
        config = attrs.evolve(config, agents=[attrs.evolve(a, file=files.get(i)) for i, a in enumerate(config.agents)])
    config = attrs.evolve(config, path=str(file), mcp_servers=mcp_servers)
    _check(config, issues)
    return config, issues


def load_config_file(path: str | os.PathLike[str]) -> OrchestrationConfig:
    """Load an orchestration config that must be free of errors (warnings are allowed).

    Raises:
        ConfigInvalid: (a :class:`ConfigError`) the file is missing, unparsable, or has errors;
            the message lists every error with the path of its field.
    """
    config, issues = validate_config_file(path)
    errors = [i.message for i in issues if i.level == "error"]
    if config is None or errors:
        raise ConfigInvalid(f"{Path(path)}: " + "; ".join(errors), issues)
    return config
