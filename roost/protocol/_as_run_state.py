"""The state of app-server runs (``run/start``): the output-schema checks, the live run record,
its stored view and the process's registry of runs (app-server-protocol.md, "Turns and execution
runs"; the methods and the driving of a run are :mod:`roost.protocol._as_runs`)."""

from __future__ import annotations

import collections
import weakref
from typing import Any

import attrs
import trio

from roost._json import JSONDecodeError, dumps, loads
from roost.errors import InvalidParams
from roost.storage import utc_now

__all__ = [
    "RUN_STATUSES",
    "TERMINAL_STATUSES",
    "Outcome",
    "LiveRun",
    "RunRegistry",
    "runs_of",
    "stored_view",
    "exit_code_for",
    "make_validator",
    "check_output",
    "correction_prompt",
    "schema_instruction",
]

RUN_STATUSES = ("accepted", "running", "completed", "failed", "interrupted", "timed_out", "cancelled")
TERMINAL_STATUSES = frozenset(RUN_STATUSES[2:])
#: Finished runs kept in memory per process (older ones are read back from the store).
KEEP_FINISHED = 256


def exit_code_for(status: str) -> int:
    """The ``result.exit_code`` of a terminal run: 0 completed, 124 timed_out, 1 otherwise."""
    return {"completed": 0, "timed_out": 124}.get(status, 1)


# -- output schema ----------------------------------------------------------------------------------


def make_validator(schema: Any) -> Any:
    """A jsonschema validator for ``output_schema`` (draft chosen by ``$schema``, default 2020-12).

    Raises:
        InvalidParams: ``schema`` is not an object or is not itself a valid JSON Schema.
    """
    if not isinstance(schema, dict):
        raise InvalidParams("output_schema must be a JSON Schema object")
    import jsonschema  # only runs with an output_schema use it: keeps it off the start-up path

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = exc.json_path if exc.json_path != "$" else "the schema"
        raise InvalidParams(f"output_schema is not a valid JSON Schema: {exc.message} (at {where})") from None
    return cls(schema)


def check_output(validator: Any, text: str | None) -> tuple[Any, str | None]:
    """Parse a final agent message as JSON and validate it.

    A single surrounding Markdown code fence (```` ```json ... ``` ````) is tolerated.

    Returns:
        ``(value, None)`` when valid, ``(None, problem)`` otherwise (a one-line description).
    """
    raw = (text or "").strip()
    if raw.startswith("```") and raw.endswith("```") and "\n" in raw:
        raw = raw[raw.index("\n") + 1 : -3].strip()
    if not raw:
        return None, "the reply was empty, not a JSON value"
    try:
        value = loads(raw)
    except JSONDecodeError as exc:
        return None, f"the reply is not valid JSON ({exc})"
    import jsonschema.exceptions

    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except Exception as exc:  # e.g. an unresolvable $ref: the schema cannot be applied
        return None, f"the output schema could not be applied: {type(exc).__name__}: {exc}"
    if error is None:
        return value, None
    return None, f"{error.message} (at {error.json_path})"


def correction_prompt(problem: str, schema: dict) -> str:
    """The prompt of a correction turn: what was wrong and the schema to follow."""
    return (
        "Your previous reply did not match the required output schema: "
        + problem
        + ".\n"
        + schema_instruction(schema, again=True)
    )


def schema_instruction(schema: dict, *, again: bool = False) -> str:
    """The instruction that carries ``output_schema`` in a prompt (the engines have no
    structured-output option of their own)."""
    return (
        f"Reply{' again' if again else ''} with only a JSON value (no prose, no code fence) that "
        f"validates against this JSON Schema:\n{dumps(schema).decode()}"
    )


# -- the run and the registry -----------------------------------------------------------------------


@attrs.define(eq=False)
class Outcome:
    """How a run ended: its terminal status, the final agent message item, output and error."""

    status: str
    item: dict | None = None
    output: Any = None
    error: dict | None = None


@attrs.define(eq=False, kw_only=True)
class LiveRun:
    """A run owned (driven) by this process.

    Attributes:
        scope: cancelled by ``run/interrupt`` and by the session closing; its deadline is
            ``timeout_ms`` after acceptance (trio's clock).
        stop_reason: the terminal status a stop asked for (``interrupted``/``timed_out``/``cancelled``).
        done: set once the run is terminal and its end is persisted and announced.
    """

    id: str
    thread_id: str
    actor: Any
    session: Any
    origin: Any
    request: dict
    runtime: dict
    workspace: dict
    schema: dict | None
    validator: Any
    max_turns: int
    ephemeral: bool
    scope: trio.CancelScope
    status: str = "accepted"
    turns: list[dict] = attrs.field(factory=list)
    created_at: str = attrs.field(factory=utc_now)
    started_at: str | None = None
    updated_at: str = attrs.field(factory=utc_now)
    completed_at: str | None = None
    result: dict | None = None
    error: dict | None = None
    current_turn_id: str | None = None
    stop_reason: str | None = None
    done: trio.Event = attrs.field(factory=trio.Event)

    def view(self) -> dict:
        """The ``run`` object of results and notifications."""
        return {
            "id": self.id,
            "thread_id": self.thread_id,
            "status": self.status,
            "request": self.request,
            "runtime": self.runtime,
            "workspace": self.workspace,
            "turns": [dict(t) for t in self.turns],
            "created_at": self.created_at,
            "started_at": self.started_at,
            "updated_at": self.updated_at,
            "completed_at": self.completed_at,
            "result": self.result,
            "error": self.error,
        }

    def metadata(self) -> dict:
        """What the ``runs.metadata`` column keeps (everything of the view not in a column)."""
        return {
            "request": self.request,
            "runtime": self.runtime,
            "workspace": self.workspace,
            "turns": self.turns,
            "result": self.result,
            "started_at": self.started_at,
            "updated_at": self.updated_at,
        }


def stored_view(row: Any) -> dict:
    """The ``run`` object of a run read from the store (:class:`roost.model.Run`)."""
    meta = row.metadata or {}
    return {
        "id": row.id,
        "thread_id": row.thread_id,
        "status": row.status,
        "request": meta.get("request"),
        "runtime": meta.get("runtime"),
        "workspace": meta.get("workspace"),
        "turns": meta.get("turns") or [],
        "created_at": row.started_at,
        "started_at": meta.get("started_at"),
        "updated_at": meta.get("updated_at"),
        "completed_at": row.completed_at,
        "result": meta.get("result"),
        "error": row.error,
    }


class RunRegistry:
    """The runs of one process: live ones (driven here) and the most recent finished ones."""

    def __init__(self) -> None:
        self.live: dict[str, LiveRun] = {}
        self.finished: collections.OrderedDict[str, LiveRun] = collections.OrderedDict()

    def add(self, run: LiveRun) -> None:
        self.live[run.id] = run

    def get(self, run_id: str) -> LiveRun | None:
        return self.live.get(run_id) or self.finished.get(run_id)

    def finish(self, run: LiveRun) -> None:
        """Move ``run`` to the bounded finished list (idempotent)."""
        self.live.pop(run.id, None)
        self.finished[run.id] = run
        while len(self.finished) > KEEP_FINISHED:
            self.finished.popitem(last=False)


_REGISTRIES: weakref.WeakKeyDictionary[Any, RunRegistry] = weakref.WeakKeyDictionary()


def runs_of(runtime: Any) -> RunRegistry:
    """The :class:`RunRegistry` of ``runtime`` (one per running process, created on first use)."""
    registry = _REGISTRIES.get(runtime)
    if registry is None:
        registry = _REGISTRIES[runtime] = RunRegistry()
    return registry
