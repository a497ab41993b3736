"""The tool model: :class:`Tool`, the :class:`ToolContext` a call runs in, and its :class:`ToolResult`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal, TypeAlias

import attrs

__all__ = [
    "PermissionMode",
    "UnattendedPolicy",
    "PERMISSION_MODES",
    "APPROVAL_KINDS",
    "DEFAULT_OUTPUT_CAP_BYTES",
    "DEFAULT_KILL_GRACE_S",
    "ApprovalRequester",
    "QuestionAsker",
    "Tool",
    "ToolContext",
    "ToolResult",
]

#: ``read_only`` (no mutation), ``standard`` (mutations need approval), ``unconfined`` (DESIGN.md 7).
PermissionMode: TypeAlias = Literal["read_only", "standard", "unconfined"]
#: What a mutating call does in ``standard`` mode when nobody can be asked.
UnattendedPolicy: TypeAlias = Literal["deny", "allow"]

PERMISSION_MODES: frozenset[str] = frozenset({"read_only", "standard", "unconfined"})
#: The ``approval_request`` kinds built-in tools use (wire-protocol.md, "Prompts").
APPROVAL_KINDS: frozenset[str] = frozenset({"shell_command", "tool_action", "file_write"})

#: Default bytes of tool output kept in a :class:`ToolResult` (64 KiB).
DEFAULT_OUTPUT_CAP_BYTES = 64 * 1024
#: Default seconds between SIGTERM and SIGKILL when a shell command's process group is stopped.
DEFAULT_KILL_GRACE_S = 2.0

#: ``async (kind, fields) -> True (approved) | False (denied) | None (nobody to ask)``.
ApprovalRequester: TypeAlias = Callable[[str, dict[str, Any]], Awaitable[bool | None]]
#: ``async (question, options, allow_other) -> answer``: asks the user (the ``ask_user`` tool);
#: the answer is a string, or None when the user skipped it or nobody answered.
QuestionAsker: TypeAlias = Callable[[str, list[str], bool], Awaitable[str | None]]


@attrs.frozen
class ToolResult:
    """What a tool call returns to the model.

    Attributes:
        output: the text the model sees (already capped; a truncation is noted in it).
        is_error: True when the call failed, was refused, or was denied.
        metadata: facts for clients and storage, e.g. ``exit_code``, ``timed_out``, ``diff``,
            ``truncated``, ``denied`` (the reason: ``"user"``, ``"unattended_policy"``,
            ``"read_only"``), ``invalid_field``.
    """

    output: str
    is_error: bool = False
    metadata: dict[str, Any] = attrs.field(factory=dict)

    @classmethod
    def error(cls, output: str, **metadata: Any) -> ToolResult:
        """Return an error result with ``output`` and ``metadata``."""
        return cls(output=output, is_error=True, metadata=metadata)


def _check_cwd(instance: Any, attribute: Any, value: Path) -> None:
    if not isinstance(value, Path):
        raise TypeError(f"cwd must be a pathlib.Path, got {type(value).__name__}")


@attrs.define(kw_only=True)
class ToolContext:
    """Where and under which policy a tool call runs.

    Attributes:
        cwd: the working directory; relative paths in arguments resolve against it.
        permission_mode: ``"read_only"``, ``"standard"`` or ``"unconfined"``.
        on_output: called with each streamed output chunk (text) as it arrives, for
            ``item/toolCall/outputDelta``; must not block. ``None`` to stream nowhere.
        request_approval: asks the client that started the work; see :data:`ApprovalRequester`.
            ``None`` means nobody can be asked.
        unattended_policy: ``"deny"`` (default) or ``"allow"``: the decision when nobody can be
            asked (``request_approval`` is ``None`` or returns ``None``).
        no_approver: why nobody can be asked and what would change that, a clause put in the
            unattended denial's text; ``None``: the text says no client is attached to approve.
        output_cap_bytes: the most bytes of output kept in a result (default 64 KiB).
        kill_grace_s: seconds between SIGTERM and SIGKILL when stopping a process group
            (default 2 s).
        agent: the orchestration agent running the tool (memory scope), None outside
            orchestrations.
        on_process: ``async (pgid, running) -> None``: told of each process group a tool starts
            (``running=True``, right after the start) and when the call is done with it
            (``running=False``; not said while a group it failed to stop still runs), e.g.
            :func:`roost.storage.tool_process_hook`, which records groups so a restart can kill
            a killed process's leftovers. Its errors are logged, never fail the call. ``None``:
            nobody is told.
        start_background: starts a background process for the calling thread (see the
            attribute comment).
        ask_question: asks the client that started the work a question (``ask_user``); see
            :data:`QuestionAsker`. ``None`` means nobody can be asked.
    """

    cwd: Path = attrs.field(validator=_check_cwd)
    permission_mode: PermissionMode = attrs.field(default="standard", validator=attrs.validators.in_(PERMISSION_MODES))
    on_output: Callable[[str], None] | None = None
    request_approval: ApprovalRequester | None = None
    unattended_policy: UnattendedPolicy = attrs.field(
        default="deny", validator=attrs.validators.in_(frozenset({"deny", "allow"}))
    )
    no_approver: str | None = None
    output_cap_bytes: int = attrs.field(default=DEFAULT_OUTPUT_CAP_BYTES)
    kill_grace_s: float = DEFAULT_KILL_GRACE_S
    agent: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str))
    )
    on_process: Callable[[int, bool], Awaitable[None]] | None = None
    #: ``async (command, cwd) -> process view``: starts a background process owned by the calling
    #: thread (the shell tool's ``background: true``); None where nothing can own one.
    start_background: Callable[[str, Path], Awaitable[dict]] | None = None
    ask_question: QuestionAsker | None = None

    @output_cap_bytes.validator
    def _check_cap(self, attribute: Any, value: int) -> None:
        if value < 64:
            raise ValueError(f"output_cap_bytes must be at least 64, got {value!r}")

    def emit(self, chunk: str) -> None:
        """Pass ``chunk`` to :attr:`on_output` when one is set and ``chunk`` is not empty."""
        if chunk and self.on_output is not None:
            self.on_output(chunk)


@attrs.frozen(kw_only=True)
class Tool:
    """A tool the model may call.

    Attributes:
        name: the model-facing name (``shell``, ``read_file``...).
        description: the model-facing description.
        parameters: the JSON schema (``type: object``) of the arguments.
        mutating: True when the tool may change anything outside Roost (files, processes);
            refused in ``read_only`` mode and approved in ``standard`` mode.
        approval_kind: the ``approval_request`` kind asked for in ``standard`` mode
            (``shell_command``, ``file_write``, ``tool_action``); ``None`` means ``tool_action``.
        run: ``async (args, ctx) -> ToolResult``. It may raise :class:`roost.errors.ToolError`
            to report a failure; :func:`run_tool` turns any exception into an error result.
        approval_fields: ``async (args, ctx) -> dict``: the kind's fields of the approval request
            (wire-protocol.md "Prompts"); ``None`` builds ``tool_action`` fields from the args.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    mutating: bool
    run: Callable[[dict[str, Any], ToolContext], Awaitable[ToolResult]]
    approval_kind: str | None = None
    approval_fields: Callable[[dict[str, Any], ToolContext], Awaitable[dict[str, Any]]] | None = None

    def schema(self) -> dict[str, Any]:
        """Return ``{"name", "description", "parameters"}`` for an engine's tool list."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}
