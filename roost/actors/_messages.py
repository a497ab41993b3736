"""Messages a ThreadActor handles (attrs classes; replies are documented per message)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

__all__ = [
    "Origin",
    "AgentTurn",
    "StartTurn",
    "InterruptTurn",
    "QueueInput",
    "UpdateQueued",
    "Dequeue",
    "SteerInput",
    "Unsteer",
    "DeliverInternal",
    "Snapshot",
    "Subscribe",
    "Unsubscribe",
    "UpdateThread",
    "IsBusy",
    "Compact",
]


@attrs.define(eq=False)
class Origin:
    """Who started some work: approvals go back to it, never to bystanders.

    ``await request_approval(params) -> bool | None`` with ``params`` = ``{thread_id, turn_id,
    item_id, kind, ...the kind's fields}`` (wire-protocol.md approval kinds); None means nobody
    can be asked, and ``unattended_policy`` (``deny`` or ``allow``) decides.

    ``await ask_question(params) -> str | None`` (the ``ask_user`` tool) with ``params`` =
    ``{thread_id, turn_id, item_id, question, options, allowOther}``; None is no answer (skipped,
    or nobody could be asked). An origin without it gives tools no way to ask.

    ``no_approver``: why this origin cannot be asked and what would change that, a clause for
    the text of an unattended denial (e.g. a client that did not opt in to ``approval/request``);
    None: the denial says no client is attached to approve.
    """

    client_id: str = "local"
    request_approval: Any = None
    unattended_policy: str = "deny"
    ask_question: Any = None
    no_approver: str | None = None


@attrs.frozen(kw_only=True)
class AgentTurn:
    """An orchestration agent's settings for one turn (``StartTurn.agent``).

    Attributes:
        name: the agent (scripted ``match.agent``; the agent_message item's ``agent``).
        system_prompt: the agent's instructions (None: the process's system prompt).
        tools: the tool names the turn may use (None: every tool of the process).
        engine: the agent's own engine (its ``Model``), or None for the thread's.
        model: the model id sent to ``engine`` (None: the thread's).
        max_tokens: output token limit per model call, or None for the adapter's default.
        temperature: sampling temperature, or None for the provider's default.
        max_tool_rounds: model responses with tool calls allowed in the turn (None: the
            process limit); once used, the next call offers no tools and must answer.
        extra_tools: tools of the agent's run beside the process's (name -> ``Tool``: the MCP
            servers a run started for itself); a name here shadows the process's tool. A live
            mapping: read when the turn starts and at each call.
    """

    name: str
    system_prompt: str | None = None
    tools: tuple[str, ...] | None = None
    engine: Any = None
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    max_tool_rounds: int | None = None
    extra_tools: Mapping[str, Any] = attrs.field(factory=dict, eq=False)


@attrs.frozen(kw_only=True)
class StartTurn:
    """Start a turn. Reply: the turn view (dict). Errors: ThreadBusy, StaleTurn, InvalidParams."""

    prompt: str | None = None
    images: tuple = ()
    client_id: str | None = None
    content_parts: Any = None
    resume_after_turn_id: str | None = None
    origin: Origin = attrs.field(factory=Origin)
    run_id: str | None = None
    input_id: str | None = None
    #: set by the front door once the admitting response is on its way; the turn's notifications
    #: wait for it (bounded), so a client sees the response before turn/started
    ack: Any = None
    #: started by Roost itself (a worker result resuming an idle root), not by a user
    internal: bool = False
    #: app-server input rules (app-server-protocol.md: "consumed IDs are rejected across input
    #: methods"): a ``client_id`` a user item of the thread already carries, or one of pending or
    #: held input, is refused (``invalid_params``) instead of starting the input again
    check_client_id: bool = False
    #: orchestration: the agent taking this turn, with its own prompt, tools and model
    #: (None: an ordinary turn with the thread's settings)
    agent: AgentTurn | None = None


@attrs.frozen(kw_only=True)
class InterruptTurn:
    """Interrupt the active turn (optionally only if it is ``turn_id``). Reply: a result dict."""

    turn_id: str | None = None
    reason: str = "interrupted"
    #: set by the front door once its answer is on its way (a ``trio.Event``); the interrupted
    #: turn's terminal notification waits for it (bounded), so a client sees the answer first
    ack: Any = None


@attrs.frozen(kw_only=True)
class QueueInput:
    """Queue input for the next turn (``hold``: keep it as held work). Reply: the input view."""

    prompt: str
    hold: bool = False
    client_id: str | None = None
    images: tuple = ()
    content_parts: Any = None
    origin: Origin = attrs.field(factory=Origin)


@attrs.frozen(kw_only=True)
class UpdateQueued:
    """Replace the prompt of a pending input. Reply: the input view."""

    input_id: str
    prompt: str
    content_parts: Any = None


@attrs.frozen(kw_only=True)
class Dequeue:
    """Withdraw a pending input. Reply: the removed input view."""

    input_id: str


@attrs.frozen(kw_only=True)
class SteerInput:
    """Steer the active turn (fenced by ``expected_turn_id``), or send a held item. Reply: view."""

    prompt: str | None = None
    expected_turn_id: str | None = None
    client_id: str | None = None
    input_id: str | None = None
    images: tuple = ()
    content_parts: Any = None
    origin: Origin = attrs.field(factory=Origin)


@attrs.frozen(kw_only=True)
class Unsteer:
    """Withdraw a steer not yet admitted. Reply: the removed input view."""

    input_id: str


@attrs.frozen
class Snapshot:
    """Reply: the thread snapshot dict (thread, turns with items, pending and held input)."""

    history_turns: int | None = None


@attrs.frozen
class Subscribe:
    subscriber: Any


@attrs.frozen
class Unsubscribe:
    subscriber: Any


@attrs.frozen(kw_only=True)
class UpdateThread:
    """Change thread metadata or selection (refused with ThreadBusy while executing for selection)."""

    changes: dict
    selection: bool = False


@attrs.frozen
class IsBusy:
    """Reply: True while a turn is admitted or running."""


@attrs.frozen(kw_only=True)
class DeliverInternal:
    """Input from Roost itself (a worker's result, a parent's message) for this thread.

    Steered into the running turn (admitted at its next model step); with no turn running, it
    starts an internal turn when ``start_turn`` is true, else waits as pending input. Reply: None.
    """

    text: str
    start_turn: bool = True
    source_id: str = "roost:agent_result"


@attrs.frozen(kw_only=True)
class Compact:
    """Replace the thread's model-facing history with a model-written summary (compaction).

    Runs as a turn of its own (see :mod:`roost.actors._compact`): the model is asked, without
    tools, to summarise the conversation; its summary is stored as an item of type ``compaction``
    in the same transaction that ends the turn, and from then on the engine history starts with it.

    Attributes:
        instructions: extra instructions for the summary (e.g. what to keep), or None.
        origin: who asked (the turn's origin; compaction asks no approvals).

    Reply: once the compaction turn is admitted (under the thread's lease, the turn row written),
    the compaction item view as it will be stored, still ``{"id", "type": "compaction", "status":
    "in_progress", "turn_id", "thread_id", "instructions", "source_id"}``; the summary follows as
    ``item/completed`` and the turn's terminal event (``turn/completed``, or ``turn/error`` when the
    model call failed). :func:`roost.actors._compact.compact_thread` waits for that end.
    Errors: ThreadBusy (a turn is running, queued input is starting, or another process holds
    the thread), InvalidParams (nothing to compact: no history since the latest compaction).
    """

    instructions: str | None = None
    origin: Origin = attrs.field(factory=Origin)
