"""The scripted engine: deterministic replies from a YAML/JSON script, no network.

Script form (``rules`` are tried in order against the turn's user prompt; the first match wins)::

    rules:
      - match: {prompt: "regex", agent: "worker-name"}   # both optional; omitted = always
        steps:                  # one step per model call inside the turn, in order
          - - {text: "Hello", tokens_per_second: 50}     # streamed as deltas; pacing optional
            - {tool_call: {name: list_dir, arguments: {path: "."}}}
          - - {reasoning: "thinking..."}
            - {delay: 0.5}                               # seconds
            - {text: "Done."}
          - - {error: {category: rate_limit, message: "slow down", retryable: true}}
    default: echo               # no rule matched: reply with the user's prompt

Extensions: ``{text: "...", deltas: N}`` forces exactly N deltas (text shorter than N characters is
repeated until it is long enough); ``reasoning`` takes the same options; ``tool_call`` may give an
``id``; ``{usage: {input: 10, output: 5, cached: 0}}`` overrides the computed usage; ``{finish:
length}`` overrides the finish reason; ``default`` may also be a list of steps. In ``text`` and
``reasoning``, ``{prompt}``, ``{agent}``, ``{tool_output}`` (the last tool result in the
history), ``{history}`` (the user and agent messages before the prompt, ``user: TEXT / agent:
TEXT / ...``, or ``none``) and ``{images}`` (the images of the turn's user message, as ``N image(s): TYPE BYTES
sha256:HEX12, ...``, or ``no images``: so tests can see what reached the engine) are
substituted. ``prompt`` is matched with ``re.search``, ``agent`` with ``re.fullmatch``. A top-level
key other than ``rules`` and ``default`` is refused, naming it.

A compaction's summary request (:mod:`roost.actors._compact`) has ``agent`` ``compactor``, no
tools, and ends with the user prompt ``"Summarize the conversation so far. ..."``: match it with
``match: {agent: compactor}``; with ``default: echo`` the summary is that prompt.

Which step runs is the number of model calls already made in this turn, counted from the history
after the last user message (each run of assistant items, up to its tool results, is one call), so
the engine is stateless. When the steps run out, the reply is the last step's text.

Determinism: the same script and request always give the same event sequence (no clock, no
randomness; tool call ids derive from the history length). Pacing (``tokens_per_second``,
``delay``) only changes timing, and ``pacing=False`` removes it (benchmarks).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs

from roost._json import JSONDecodeError, dumps, loads
from roost.engines._types import (
    FINISH_REASONS,
    AgentMessage,
    EngineEvent,
    EngineRequest,
    Finish,
    ModelInfo,
    Reasoning,
    ReasoningDelta,
    Retrying,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    ToolResult,
    Usage,
    UserMessage,
)
from roost.errors import ConfigError, EngineFailure

__all__ = ["Script", "Rule", "ScriptedEngine", "load_script", "parse_script", "builtin_scripts", "split_deltas"]

#: The keys a script document may have at its top level.
_TOP_KEYS = ("rules", "default")
_KINDS = ("text", "reasoning", "tool_call", "delay", "error", "usage", "finish", "retrying")
_WORD = re.compile(r"\S+\s*|\s+")


@attrs.frozen
class Rule:
    """One script rule: optional prompt/agent patterns and its steps (tuple of element tuples)."""

    prompt: re.Pattern[str] | None
    agent: re.Pattern[str] | None
    steps: tuple[tuple[dict[str, Any], ...], ...]

    def matches(self, prompt: str, agent: str | None) -> bool:
        """Whether the rule applies to this prompt and worker name."""
        if self.prompt is not None and not self.prompt.search(prompt):
            return False
        return self.agent is None or (agent is not None and self.agent.fullmatch(agent) is not None)


@attrs.frozen
class Script:
    """A parsed script. ``default`` is ``"echo"`` or a steps tuple."""

    name: str
    rules: tuple[Rule, ...]
    default: str | tuple[tuple[dict[str, Any], ...], ...] = "echo"

    def steps_for(self, prompt: str, agent: str | None) -> tuple[tuple[dict[str, Any], ...], ...] | None:
        """Return the steps of the first matching rule, the default steps, or None for echo."""
        for rule in self.rules:
            if rule.matches(prompt, agent):
                return rule.steps
        return None if self.default == "echo" else self.default  # type: ignore[return-value]


#: The built-in scripts' folder (package data beside this module; a plain path rather than
#: importlib.resources, whose import is some 5 ms of roost app-server's start on this engine).
_SCRIPTS = Path(__file__).resolve().parent / "scripts"


def builtin_scripts() -> list[str]:
    """Names of the scripts shipped in ``roost/engines/scripts/`` (e.g. ``["demo"]``)."""
    root = _SCRIPTS
    return sorted(p.name[: -len(".yaml")] for p in root.iterdir() if p.name.endswith(".yaml"))


def load_script(source: str | Path) -> Script:
    """Load a script from a ``.yaml``/``.yml``/``.json`` path or a built-in name (``"demo"``).

    Raises:
        ConfigError: the file is missing, unreadable or not a valid script (the message says where).
    """
    text: str
    name: str
    path = Path(source).expanduser()
    suffix = path.suffix
    if isinstance(source, str) and source in builtin_scripts() and not path.exists():
        # the parsed twin of scripts/NAME.yaml (tests/test_engine_scripted.py keeps them equal):
        # PyYAML need not load for the built-in scripts (issue 19: start-up)
        res = _SCRIPTS / f"{source}.json"
        text, name, suffix = res.read_text("utf-8"), source, ".json"
    else:
        try:
            text = path.read_text("utf-8")
        except OSError as exc:
            builtins = ", ".join(builtin_scripts())
            raise ConfigError(
                f"cannot read script {str(path)!r}: {exc.strerror or exc} (built-in scripts: {builtins})"
            ) from exc
        name = path.stem
    try:
        doc = loads(text) if suffix == ".json" else _load_yaml(text)
    except (JSONDecodeError, ValueError) as exc:
        raise ConfigError(f"script {str(source)!r} is not valid YAML/JSON: {exc}") from exc
    if name == source:
        return parse_script(doc, name=name)
    try:
        return parse_script(doc, name=name)
    except ConfigError as exc:  # name the file, not only its stem
        raise ConfigError(f"{exc} (in {str(path)!r})") from exc


def _load_yaml(text: str) -> Any:
    """Decode a YAML script with libyaml's safe loader when PyYAML has it (the same documents, a
    quarter of the time); PyYAML (some 25 ms to import) loads with the first YAML script.

    Raises:
        ValueError: not valid YAML (the message is PyYAML's).
    """
    import yaml

    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from exc


def parse_script(doc: Any, *, name: str = "script") -> Script:
    """Validate a decoded script document and return a :class:`Script`.

    Raises:
        ConfigError: the document does not have the script form; the message names the place.
    """
    if not isinstance(doc, dict):
        raise ConfigError(f"script {name!r}: the top level must be a mapping with 'rules'")
    unknown = [str(key) for key in doc if key not in _TOP_KEYS]
    if unknown:
        raise ConfigError(
            f"script {name!r}: unknown top-level key {unknown[0]!r} (a script has only {' and '.join(_TOP_KEYS)})"
        )
    rules_doc = doc.get("rules") or []
    if not isinstance(rules_doc, list):
        raise ConfigError(f"script {name!r}: 'rules' must be a list")
    rules = []
    for i, rule in enumerate(rules_doc):
        where = f"script {name!r} rules[{i}]"
        if not isinstance(rule, dict):
            raise ConfigError(f"{where}: must be a mapping")
        match = rule.get("match") or {}
        if not isinstance(match, dict):
            raise ConfigError(f"{where}.match: must be a mapping")
        rules.append(
            Rule(
                _compile(match.get("prompt"), f"{where}.match.prompt"),
                _compile(match.get("agent"), f"{where}.match.agent"),
                _steps(rule.get("steps"), where),
            )
        )
    default = doc.get("default", "echo")
    if default != "echo":
        default = _steps(default, f"script {name!r} default")
    return Script(name, tuple(rules), default)


def _compile(pattern: Any, where: str) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    try:
        return re.compile(str(pattern))
    except re.error as exc:
        raise ConfigError(f"{where}: invalid regex: {exc}") from exc


def _steps(doc: Any, where: str) -> tuple[tuple[dict[str, Any], ...], ...]:
    if not isinstance(doc, list):
        raise ConfigError(f"{where}.steps: must be a list of steps")
    steps = []
    for s, step in enumerate(doc):
        elements = [step] if isinstance(step, dict) else step
        if not isinstance(elements, list):
            raise ConfigError(f"{where}.steps[{s}]: must be a list of elements")
        for e, element in enumerate(elements):
            _check_element(element, f"{where}.steps[{s}][{e}]")
        steps.append(tuple(elements))
    return tuple(steps)


def _check_element(element: Any, where: str) -> None:
    if not isinstance(element, dict):
        raise ConfigError(f"{where}: must be a mapping")
    kinds = [k for k in _KINDS if k in element]
    if len(kinds) != 1:
        raise ConfigError(f"{where}: needs exactly one of {', '.join(_KINDS)}")
    kind = kinds[0]
    value = element[kind]
    if kind == "tool_call" and not (isinstance(value, dict) and isinstance(value.get("name"), str)):
        raise ConfigError(f"{where}.tool_call: needs a 'name'")
    if kind == "tool_call" and not isinstance(value.get("arguments", {}), dict):
        raise ConfigError(f"{where}.tool_call.arguments: must be a mapping")
    if kind == "error" and (not isinstance(value, dict) or value.get("category") not in EngineFailure.CATEGORIES):
        raise ConfigError(f"{where}.error.category: one of {sorted(EngineFailure.CATEGORIES)}")
    if kind == "delay" and not (isinstance(value, (int, float)) and value >= 0):
        raise ConfigError(f"{where}.delay: seconds >= 0")
    if kind == "finish" and value not in FINISH_REASONS:
        raise ConfigError(f"{where}.finish: one of {sorted(FINISH_REASONS)}")
    if kind in ("text", "reasoning") and not isinstance(value, str):
        raise ConfigError(f"{where}.{kind}: must be a string")


def split_deltas(text: str, deltas: int | None = None) -> list[str]:
    """Split ``text`` into stream deltas deterministically.

    Args:
        text: the text.
        deltas: force exactly this many pieces (even character split; text shorter than
            ``deltas`` characters is repeated until long enough); ``None`` splits by words (each
            word with its trailing whitespace).
    """
    if deltas is None:
        return _WORD.findall(text)
    if deltas <= 0 or not text:
        return [text] if text else []
    while len(text) < deltas:
        text += text
    size = len(text)
    return [text[i * size // deltas : (i + 1) * size // deltas] for i in range(deltas)]


def call_index(request: EngineRequest) -> int:
    """Number of model calls already made in the current turn (from history after the last user
    message: each run of assistant items ended by tool results counts as one call). Synthetic user
    messages (injected by Roost mid-turn) do not start a new count."""
    history = request.history
    start = 0
    for index in range(len(history) - 1, -1, -1):  # only the current turn matters
        item = history[index]
        if isinstance(item, UserMessage) and not item.synthetic:
            start = index
            break
    count = 0
    in_call = False
    for item in history[start:]:
        if isinstance(item, UserMessage):
            if not item.synthetic:
                count = 0
            in_call = False
        elif isinstance(item, ToolResult):
            in_call = False
        elif not in_call:
            count += 1
            in_call = True
    return count


def _substitute(text: str, request: EngineRequest) -> str:
    if "{" not in text:
        return text
    tool_output = next((i.output for i in reversed(request.history) if isinstance(i, ToolResult)), "")
    if "{images}" in text:
        text = text.replace("{images}", _images_text(request))
    if "{history}" in text:
        text = text.replace("{history}", _history_text(request))
    return (
        text.replace("{prompt}", request.prompt)
        .replace("{agent}", request.agent or "")
        .replace("{tool_output}", tool_output)
    )


def _history_text(request: EngineRequest) -> str:
    """``{history}``: the user and agent messages before the turn's prompt, ``user: T / agent: T
    / ...`` (``none`` on a fresh conversation)."""
    items = list(request.history)
    last = max((i for i, m in enumerate(items) if isinstance(m, UserMessage) and not m.synthetic), default=0)
    said = [
        f"{'user' if isinstance(m, UserMessage) else 'agent'}: {m.text}"
        for m in items[:last]
        if isinstance(m, AgentMessage) or (isinstance(m, UserMessage) and not m.synthetic)
    ]
    return " / ".join(said) or "none"


def _images_text(request: EngineRequest) -> str:
    """``{images}``: the images of the last real user message of ``request``'s history."""
    message = next((i for i in reversed(request.history) if isinstance(i, UserMessage) and not i.synthetic), None)
    images = message.images if message is not None else ()
    if not images:
        return "no images"
    described = []
    for image in images:
        raw = base64.b64decode(image.data)
        described.append(f"{image.media_type} {len(raw)} bytes sha256:{hashlib.sha256(raw).hexdigest()[:12]}")
    return f"{len(images)} image(s): " + ", ".join(described)


def _input_tokens(request: EngineRequest) -> int:
    words = len(request.system.split())
    for item in request.history:
        if isinstance(item, (UserMessage, AgentMessage, Reasoning)):
            words += len(item.text.split())
        elif isinstance(item, ToolResult):
            words += len(item.output.split())
        elif isinstance(item, ToolCall):
            words += 1 + len(item.arguments)
    return words


class ScriptedEngine:
    """Deterministic engine driven by a :class:`Script`; see the module docstring.

    Args:
        script: the parsed script.
        pacing: honour ``tokens_per_second`` and ``delay`` with ``trio.sleep``; ``False`` streams
            with zero latency (benchmarks).
        model: the name reported as current by :meth:`list_models` (default: the script name).
    """

    name = "scripted"
    #: The scripted engine reads no files (no PDFs): turn input carrying one is refused.
    document_types: frozenset[str] = frozenset()

    def __init__(self, script: Script, *, pacing: bool = True, model: str | None = None) -> None:
        self.script = script
        self.pacing = pacing
        self.model = model or script.name

    @asynccontextmanager
    async def stream(self, request: EngineRequest) -> AsyncIterator[AsyncIterator[EngineEvent]]:
        """Yield the events of the step selected for ``request``.

        Raises:
            EngineFailure: from an ``error`` element, after the events before it.

        Cancellation:
            Checkpoints at each element (and each paced delta); cancelling simply stops the stream.
        """
        async with aclosing(self._events(request)) as events:
            yield events

    async def list_models(self) -> list[ModelInfo]:
        """Return the built-in script names plus this engine's script; the current one is marked."""
        names = sorted(set(builtin_scripts()) | {self.model})
        return [ModelInfo(n, n == self.model) for n in names]

    async def aclose(self) -> None:
        """Nothing to release; present for the Engine interface."""

    async def _events(self, request: EngineRequest) -> AsyncGenerator[EngineEvent, None]:
        import trio  # loaded with the runtime: opening the engine (checking a script) needs no event loop

        steps = self.script.steps_for(request.prompt, request.agent)
        if not steps:
            elements: tuple[dict[str, Any], ...] = ({"text": "{prompt}"},)
        else:
            index = call_index(request)
            if index < len(steps):
                elements = steps[index]
            else:
                elements = tuple(e for e in steps[-1] if "text" in e) or ({"text": ""},)
        out_tokens = 0
        tool_calls = 0
        partial: list[str] = []
        usage: Usage | None = None
        finish: str | None = None
        for element in elements:
            await trio.lowlevel.checkpoint()
            if "text" in element or "reasoning" in element:
                is_text = "text" in element
                raw = element["text"] if is_text else element["reasoning"]
                rate = element.get("tokens_per_second")
                pause = 1.0 / rate if self.pacing and rate else 0.0
                for n, piece in enumerate(split_deltas(_substitute(raw, request), element.get("deltas"))):
                    if pause and n:
                        await trio.sleep(pause)
                    out_tokens += 1
                    if is_text:
                        partial.append(piece)
                        yield TextDelta(piece)
                    else:
                        yield ReasoningDelta(piece)
            elif "tool_call" in element:
                spec = element["tool_call"]
                call_id = spec.get("id") or f"call_{len(request.history)}_{tool_calls}"
                arguments = dict(spec.get("arguments") or {})
                yield ToolCallStart(call_id, spec["name"], tool_calls)
                yield ToolCallDelta(call_id, dumps(arguments).decode())
                yield ToolCallEnd(call_id, spec["name"], arguments)
                tool_calls += 1
                out_tokens += 1 + len(arguments)
            elif "delay" in element:
                if self.pacing:
                    await trio.sleep(float(element["delay"]))
            elif "error" in element:
                spec = element["error"]
                raise EngineFailure(
                    str(spec.get("message") or spec["category"]),
                    category=spec["category"],
                    retryable=bool(spec.get("retryable", False)),
                    provider_code=spec.get("provider_code"),
                    http_status=spec.get("http_status"),
                    partial_text="".join(partial),
                )
            elif "usage" in element:
                u = element["usage"] or {}
                usage = Usage(u.get("input"), u.get("output"), u.get("cached"))
            elif "finish" in element:
                finish = element["finish"]
            elif "retrying" in element:  # a provider retry: {retrying: {attempt, max, reason, restart}}
                spec = element["retrying"] or {}
                yield Retrying(
                    int(spec.get("attempt", 1)),
                    int(spec.get("max", 3)),
                    0.0,
                    str(spec.get("reason", "rate_limit")),
                    restart=bool(spec.get("restart", False)),
                )
                if spec.get("restart"):
                    partial.clear()
        yield usage or Usage(_input_tokens(request), out_tokens, 0)
        yield Finish(finish or ("tool_calls" if tool_calls else "stop"))
