"""The subagent tools a worker tree gives its threads' turns: ``spawn_agent``, ``send_message``,
``close_agent`` and ``wait_agents`` (app-server-protocol.md, "Interruption"; notifications
``agent/updated`` and ``agent/mailbox``).

This is the model-facing side of a :class:`~roost.actors._workers.WorkerTree`: argument checks,
worker lookup by id or name, and the text results the model reads. The tree itself (supervision,
drivers, delivery, freezing) stays in :mod:`roost.actors._workers`, which calls
:func:`run_agent_tool` from :meth:`WorkerTree.run_tool`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import trio

from roost.actors._worker_state import TERMINAL, WorkerState
from roost.engines import ToolSchema
from roost.storage import new_id

if TYPE_CHECKING:
    from roost.actors._thread import ThreadActor
    from roost.actors._workers import WorkerTree

__all__ = ["AGENT_TOOL_NAMES", "agent_tool_schemas", "run_agent_tool"]

AGENT_TOOL_NAMES = frozenset({"spawn_agent", "send_message", "close_agent", "wait_agents"})


def agent_tool_schemas(*, can_spawn: bool) -> tuple[ToolSchema, ...]:
    """The model-facing subagent tools (``spawn_agent`` only while the depth limit allows)."""
    target = {"type": "string", "description": "A worker's id or name."}
    schemas = [
        ToolSchema(
            name="send_message",
            description="Queue a message for a worker, or revive a finished one with it.",
            parameters={
                "type": "object",
                "properties": {"target": target, "message": {"type": "string"}},
                "required": ["target", "message"],
            },
        ),
        ToolSchema(
            name="close_agent",
            description="Cancel a worker and its children.",
            parameters={"type": "object", "properties": {"target": target}, "required": ["target"]},
        ),
        ToolSchema(
            name="wait_agents",
            description="Wait for workers to finish and collect their results.",
            parameters={
                "type": "object",
                "properties": {
                    "targets": {"type": "array", "items": {"type": "string"}},
                    "any": {"type": "boolean", "description": "Return as soon as one target finishes."},
                    "timeout_s": {"type": "number", "description": "Seconds to wait at most."},
                },
            },
        ),
    ]
    if can_spawn:
        schemas.insert(
            0,
            ToolSchema(
                name="spawn_agent",
                description="Start a subagent (a worker with its own thread) on a task.",
                parameters={
                    "type": "object",
                    "properties": {
                        "description": {"type": "string"},
                        "prompt": {"type": "string"},
                        "name": {"type": "string"},
                        "model": {"type": "string", "description": "Optional model alias."},
                        "run_in_background": {
                            "type": "boolean",
                            "description": "Return at once instead of waiting for the result.",
                        },
                    },
                    "required": ["prompt"],
                },
            ),
        )
    return tuple(schemas)


async def run_agent_tool(
    tree: WorkerTree, caller: ThreadActor, turn: Any, name: str, args: dict
) -> tuple[str, bool, dict]:
    """Run a subagent tool for ``caller`` (the root or a worker); returns (output, is_error, metadata)."""
    tree.origin = tree.origin or turn.origin
    try:
        if name == "spawn_agent":
            return await tool_spawn(tree, caller, turn, args)
        if name == "wait_agents":
            return await tool_wait(tree, caller, args)
        if name == "close_agent":
            worker = resolve_worker(tree, caller, args.get("target"))
            await tree.close(worker.id)
            return f"closed {worker.name} ({worker.id}): {worker.status}", False, {"agent_id": worker.id}
        if name == "send_message":
            worker = resolve_worker(tree, caller, args.get("target"))
            message = args.get("message")
            if not isinstance(message, str) or not message:
                raise _ToolInputError("message must be a non-empty string")
            emit_message(tree, caller, worker, message)
            return await send_message(tree, worker, message, turn)
    except _ToolInputError as exc:
        return f"error: {exc}", True, {}
    return f"error: unknown agent tool {name!r}", True, {}


def resolve_worker(tree: WorkerTree, caller: ThreadActor, target: Any) -> WorkerState:
    if not isinstance(target, str) or not target:
        raise _ToolInputError("target must be a worker id or name")
    if target in tree.workers:
        return tree.workers[target]
    parent = None if caller is tree.root else caller.worker_id
    matches = [w for w in tree.workers.values() if w.name == target and w.parent_id == parent]
    matches = matches or [w for w in tree.workers.values() if w.name == target]
    if not matches:
        raise _ToolInputError(f"no worker named {target!r}")
    return matches[-1]


async def tool_spawn(tree: WorkerTree, caller: ThreadActor, turn: Any, args: dict) -> tuple[str, bool, dict]:
    prompt = args.get("prompt") or args.get("task")
    if not isinstance(prompt, str) or not prompt.strip():
        raise _ToolInputError("prompt must be a non-empty string")
    parent_id = None if caller is tree.root else caller.worker_id
    depth = 1 if parent_id is None else tree.workers[parent_id].depth + 1
    if depth > tree.max_depth:
        raise _ToolInputError(f"worker depth limit reached ({tree.max_depth}); do the work yourself")
    if tree.frozen:
        raise _ToolInputError("the worker tree is frozen by an interrupt; nothing new starts")
    raw_name, raw_description = args.get("name"), args.get("description")
    name = raw_name if isinstance(raw_name, str) and raw_name else f"worker-{tree._spawn_counter + 1}"
    description = raw_description if isinstance(raw_description, str) else ""
    worker = await tree.spawn(
        parent_id=parent_id,
        parent_thread_id=caller.thread.id,
        name=name,
        description=description,
        prompt=prompt,
        model=args.get("model"),
    )
    if args.get("run_in_background", False):
        return (
            f"spawned {worker.name} ({worker.id}), status {worker.status}; collect its result with "
            f"wait_agents or receive it when it finishes",
            False,
            {"agent_id": worker.id},
        )
    return await tool_wait(tree, caller, {"targets": [worker.id]})


async def tool_wait(tree: WorkerTree, caller: ThreadActor, args: dict) -> tuple[str, bool, dict]:
    targets = args.get("targets") or args.get("names")
    parent = None if caller is tree.root else caller.worker_id
    if targets:
        if not isinstance(targets, list):
            raise _ToolInputError("targets must be an array of worker ids or names")
        chosen = [resolve_worker(tree, caller, t) for t in targets]
    else:
        chosen = [w for w in tree.workers.values() if w.parent_id == parent]
    if not chosen:
        return "no workers to wait for", False, {}
    timeout = args.get("timeout_s")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
        raise _ToolInputError("timeout_s must be a non-negative number")
    wait_any = bool(args.get("any"))
    ids = {w.id for w in chosen}
    tree.waiting |= ids
    try:
        with trio.move_on_after(timeout if timeout is not None else float("inf")):
            while True:
                ended = [w for w in chosen if w.status in TERMINAL and w.ended.is_set()]
                if (wait_any and ended) or len(ended) == len(chosen):
                    break
                await tree._changed.wait()
    finally:
        tree.waiting -= ids
    lines, results = [], []
    for worker in chosen:
        if worker.status in TERMINAL and worker.ended.is_set():
            claimed = await tree._claim(worker)
            text = worker.result if claimed else "(result already delivered earlier)"
            lines.append(f"## {worker.name} ({worker.id}): {worker.status}\n{text or ''}")
            results.append({"agent_id": worker.id, "status": worker.status, "claimed": claimed})
        else:
            lines.append(f"## {worker.name} ({worker.id}): still {worker.status}")
            results.append({"agent_id": worker.id, "status": worker.status, "claimed": False})
    return "\n\n".join(lines), False, {"agents": results}


def emit_message(tree: WorkerTree, caller: ThreadActor, worker: WorkerState, text: str) -> None:
    """``agent/mailbox`` for a ``send_message`` to ``worker`` (app-server-protocol.md,
    "Notifications": worker state and messages): ``{id, kind: "agent_message", from_agent_id,
    from_name, to_agent_id, to_name, text}``; ``from_agent_id`` is None from the root thread."""
    sender = None if caller is tree.root else tree.workers.get(caller.worker_id or "")
    message = {
        "id": new_id("msg"),
        "kind": "agent_message",
        "from_agent_id": sender.id if sender else None,
        "from_name": sender.name if sender else "root",
        "to_agent_id": worker.id,
        "to_name": worker.name,
        "text": text,
    }
    tree.root.emit("agent/mailbox", {"thread_id": tree.root.thread.id, "message": message})


async def send_message(tree: WorkerTree, worker: WorkerState, message: str, turn: Any) -> tuple[str, bool, dict]:
    if tree.frozen:
        raise _ToolInputError("the worker tree is frozen by an interrupt")
    actor = await tree.root.services_registry().get(worker.thread_id)
    if worker.status in ("running", "waiting_children", "queued", "pending"):
        await actor.deliver_internal(f"[message from parent] {message}", start_turn=False)
        return f"queued the message for {worker.name} ({worker.status})", False, {"agent_id": worker.id}
    # revive a terminal worker with a new turn
    worker.status = "running" if len(tree.running) < tree.max_parallel else "queued"
    worker.ended = trio.Event()
    worker.delivered = False
    worker.result = None
    tree._emit_updated(worker)
    if worker.status == "running":
        tree.running.add(worker.id)
        tree._start_child(worker, functools.partial(tree._drive, worker, message=message))
    else:
        worker.prompt = message
        tree.queue.append(worker.id)
    return f"revived {worker.name} with the message ({worker.status})", False, {"agent_id": worker.id}


class _ToolInputError(Exception):
    """A subagent tool call with bad arguments (becomes an error result for the model)."""
