"""The ``ask_user`` tool: the model asks the user a question and waits for the answer.

wire-protocol.md, "Prompts": the client gets ``question {question, options, allowOther}`` and
answers with ``question_response {answer}`` (a string, or null to skip). Who is asked is the
caller's business: ``roost repl --vscode`` passes its prompt broker's asker (offered only with
``FUSERAFT_VSCODE_QUESTIONS=1``); ``roost serve`` registers the tool without one, so each call asks
through :attr:`ToolContext.ask_question`, which the daemon binds to the task's dispatching client.
"""

from __future__ import annotations

from typing import Any

from roost.tools._model import QuestionAsker, Tool, ToolContext, ToolResult

__all__ = ["ask_user_tool"]

_SKIPPED = "The user skipped the question (no answer). Continue with your best judgement."
_NOBODY = (
    "Nobody is attached to answer the question (the unattended policy applies). Continue with "
    "your best judgement, and say what you assumed."
)


def ask_user_tool(ask: QuestionAsker | None = None) -> Tool:
    """The ``ask_user`` tool.

    Args:
        ask: ``async (question, options, allow_other) -> answer | None`` used for every call;
            None: each call uses its context's :attr:`ToolContext.ask_question`, and without one
            the call returns at once, saying nobody can answer (``metadata["unattended"]``).

    Arguments (model-facing): ``question`` (string), ``options`` (strings, may be empty),
    ``allowOther`` (bool, default true: a free-text answer is allowed).

    Result metadata: ``answer`` (the string), or ``skipped: True`` (``answer: null``, or nobody
    answered in time), plus ``unattended: True`` when nobody could be asked at all.
    """

    async def run(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        asker = ask if ask is not None else ctx.ask_question
        if asker is None:
            return ToolResult(output=_NOBODY, metadata={"skipped": True, "unattended": True})
        options = [str(o) for o in args.get("options") or []]
        allow_other = args.get("allowOther")
        answer = await asker(str(args["question"]), options, True if allow_other is None else bool(allow_other))
        if answer is None:
            return ToolResult(output=_SKIPPED, metadata={"skipped": True})
        return ToolResult(output=f"The user answered: {answer}", metadata={"answer": answer})

    return Tool(
        name="ask_user",
        description=(
            "Ask the user a question and wait for the answer. Give `options` when there are "
            "a few likely answers; set `allowOther` to false to allow only those."
        ),
        parameters={
            "type": "object",
            "properties": {
                "question": {"type": "string", "description": "The question, in one or two sentences."},
                "options": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Suggested answers (may be empty).",
                },
                "allowOther": {"type": "boolean", "description": "Allow a free-text answer (default true)."},
            },
            "required": ["question"],
            "additionalProperties": False,
        },
        mutating=False,
        run=run,
    )
