"""Running a tool call: argument validation, the permission policy and approvals (DESIGN.md 7)."""

from __future__ import annotations

from typing import Any

from roost._json import dumps
from roost.errors import InvalidToolArguments, ToolError
from roost.tools._model import Tool, ToolContext, ToolResult
from roost.tools._schema import validate_args

__all__ = ["run_tool", "approval_request_for"]

#: The longest ``detail`` string put in a ``tool_action`` approval request, in characters.
_DETAIL_CHARS = 2000
#: The unattended denial's reason when the context gives none (``ToolContext.no_approver``).
_NO_CLIENT = (
    "no client is attached to approve it (attaching one that answers approval requests, "
    "permission mode unconfined or unattended policy allow would let it run)"
)


async def approval_request_for(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> tuple[str, dict[str, Any]]:
    """Return the ``(kind, fields)`` of the approval request for a call of ``tool``.

    The fields are exactly those of wire-protocol.md "Prompts" for the kind: ``shell_command`` ->
    ``command``; ``file_write`` -> ``plugin, action, path, oldContent, newContent``;
    ``tool_action`` -> ``plugin, action, detail``.

    Args:
        tool: the tool called.
        args: the validated arguments.
        ctx: the call's context.

    Returns:
        The approval kind and its fields.

    Raises:
        ToolError: the fields could not be built (e.g. the old file content is unreadable).
    """
    kind = tool.approval_kind or "tool_action"
    if tool.approval_fields is not None:
        return kind, await tool.approval_fields(args, ctx)
    detail = dumps(args).decode("utf-8", "replace")
    if len(detail) > _DETAIL_CHARS:
        detail = detail[:_DETAIL_CHARS] + "..."
    return kind, {"plugin": "roost", "action": tool.name, "detail": detail}


async def _decide(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> ToolResult | None:
    """Apply the permission policy; return a refusal result, or ``None`` to run the tool."""
    if not tool.mutating or ctx.permission_mode == "unconfined":
        return None
    if ctx.permission_mode == "read_only":
        return ToolResult.error(
            f"Refused: {tool.name!r} may change files or run processes, and this thread's "
            "permission mode is read_only. Use read-only tools instead.",
            denied="read_only",
        )
    kind, fields = await approval_request_for(tool, args, ctx)
    decision: bool | None = None
    if ctx.request_approval is not None:
        decision = await ctx.request_approval(kind, fields)
    if decision is True:
        return None
    if decision is False:
        return ToolResult.error(
            f"Denied: the user did not approve this {tool.name!r} call. Do not retry it "
            "unchanged; ask the user or choose another approach.",
            denied="user",
            approval_kind=kind,
        )
    if ctx.unattended_policy == "allow":
        return None
    why = ctx.no_approver or _NO_CLIENT
    return ToolResult.error(
        f"Denied: {tool.name!r} needs approval, {why}, and the unattended policy is deny. "
        "Continue without this action or explain what is needed.",
        denied="unattended_policy",
        approval_kind=kind,
    )


async def run_tool(tool: Tool, args: Any, ctx: ToolContext) -> ToolResult:
    """Validate ``args``, apply the permission policy, run ``tool`` and return its result.

    Policy (DESIGN.md section 7): non-mutating tools always run. Mutating tools are refused in
    ``read_only`` mode; in ``standard`` mode they run only after ``ctx.request_approval(kind,
    fields)`` returns True; when it returns None (or is None) ``ctx.unattended_policy`` decides
    (default deny); ``unconfined`` runs everything. A refusal is an error result whose output tells
    the model why, with ``metadata["denied"]`` set.

    Args:
        tool: the tool to run.
        args: the decoded arguments of the model's call (validated here).
        ctx: where and under which policy to run.

    Returns:
        The tool's result, or an error result for invalid arguments (``metadata["invalid_field"]``),
        a refusal, a :class:`roost.errors.ToolError` or any other exception the tool raised.
        Never raises an ``Exception``.

    Cancellation:
        ``trio.Cancelled`` always propagates (from the approval wait or the tool). A tool stopped
        by cancellation has cleaned up before it propagates (the shell kills its process group).
    """
    try:
        args = validate_args(args, tool.parameters)
    except InvalidToolArguments as exc:
        return ToolResult.error(f"Invalid arguments for {tool.name!r}: {exc}", invalid_field=exc.field)
    try:
        refusal = await _decide(tool, args, ctx)
    except Exception as exc:
        return ToolResult.error(
            f"Approval for {tool.name!r} failed ({exc}); the call was not run.",
            denied="approval_failed",
        )
    if refusal is not None:
        return refusal
    try:
        return await tool.run(args, ctx)
    except ToolError as exc:
        return ToolResult.error(f"{tool.name} failed: {exc}")
    except Exception as exc:
        return ToolResult.error(
            f"{tool.name} failed unexpectedly: {type(exc).__name__}: {exc}",
            exception=type(exc).__name__,
        )
