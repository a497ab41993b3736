"""The ``update_plan`` tool: the model keeps a step plan the client shows (wire-protocol.md
"Turn events": ``plan {steps}`` and ``step_status {step, total, status, stepsLeft}``).

The tool keeps the plan of one chat (one tool per chat: ``roost repl`` makes one per process).
Its result's metadata carries what the client is told: ``plan`` (the step texts) after the plan is
set, ``step_status`` (``{step, total, status, steps_left}``) after a step changes; the repl's
translator turns those into the events.
"""

from __future__ import annotations

from typing import Any

from roost.tools._model import Tool, ToolContext, ToolResult

__all__ = ["plan_tool", "STEP_STATUSES"]

#: A step's statuses; ``completed`` and ``skipped`` are done.
STEP_STATUSES = ("pending", "in_progress", "completed", "skipped")


def plan_tool() -> Tool:
    """A new ``update_plan`` tool with its own (empty) plan.

    Arguments (model-facing): ``steps`` (strings: replace the plan, every step pending) and/or
    ``step`` (1-based) with ``status`` (``in_progress``, ``completed``, ``skipped``, ``pending``).
    A step out of range or a status without a step is an error result (the plan is unchanged).
    """
    steps: list[str] = []
    statuses: list[str] = []

    async def run(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        metadata: dict[str, Any] = {}
        new_steps = args.get("steps")
        step, status = args.get("step"), args.get("status")
        if new_steps is None and step is None:
            return ToolResult.error("give `steps` (the plan) or `step` with `status`")
        if (step is None) != (status is None):
            return ToolResult.error("`step` and `status` go together")
        if new_steps is not None:
            texts = [str(s).strip() for s in new_steps]
            if not texts or any(not t for t in texts):
                return ToolResult.error("`steps` must be a non-empty list of non-empty strings")
            proposed = ["pending"] * len(texts)
        else:
            texts, proposed = list(steps), list(statuses)
        if step is not None:
            if not isinstance(step, int) or not 1 <= step <= len(texts):
                return ToolResult.error(
                    f"`step` must be between 1 and {len(texts)} (the plan has {len(texts)} steps)"
                    if texts
                    else "there is no plan yet: set `steps` first"
                )
            proposed[step - 1] = str(status)
        steps[:], statuses[:] = texts, proposed
        if new_steps is not None:
            metadata["plan"] = list(texts)
        left = sum(1 for s in statuses if s not in ("completed", "skipped"))
        if step is not None:
            metadata["step_status"] = {"step": step, "total": len(steps), "status": status, "steps_left": left}
        lines = [f"{i + 1}. [{s}] {t}" for i, (t, s) in enumerate(zip(steps, statuses, strict=True))]
        return ToolResult(output="Plan updated:\n" + "\n".join(lines) + f"\n{left} step(s) left.", metadata=metadata)

    return Tool(
        name="update_plan",
        description=(
            "Keep a short step plan the user can see. Set it with `steps` before multi-step work; "
            "mark progress with `step` (1-based) and `status` as you go."
        ),
        parameters={
            "type": "object",
            "properties": {
                "steps": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "The plan's steps in order (replaces the plan).",
                },
                "step": {"type": "integer", "minimum": 1, "description": "The step whose status changes."},
                "status": {"type": "string", "enum": list(STEP_STATUSES), "description": "Its new status."},
            },
            "additionalProperties": False,
        },
        mutating=False,
        run=run,
    )
