"""``roost run``: one orchestration session, as the run bridge (JSONL on stdio) or for a terminal.

wire-protocol.md, "Run events (run bridge)": the first event is ``ready {protocolVersion,
sessionId, task, config, resumed, agents}``; then ``agent_starting``, ``tool_calling``,
``token_budget_warning``, ``agent_message {message, elapsedMs}`` and ``approval_request`` (answered
by ``approval_response`` on stdin); ``result`` is the last event and its ``exitCode`` is the
process's. Input is ``approval_response`` and ``interrupt`` (``user_input`` is not read); an
interrupt or SIGINT ends the session with ``succeeded: false`` (exit code 130), and ``--resume``
continues it. A run that fails before it starts sends only ``result`` with ``sessionId: null``
(exit code 1).

Exit codes: 0 the run completed (a termination strategy, or sequential selection ran out of
agents), 1 it failed (or could not start), 130 it was interrupted.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from roost._json import dumps_line
from roost.errors import ConfigError, InvalidParams, NotFound, RoostError, ThreadNotFound

__all__ = ["run_session", "run_bridge", "failed_result", "PROTOCOL_VERSION"]

log = logging.getLogger("roost.run")

PROTOCOL_VERSION = 1
_EXIT = {"completed": 0, "failed": 1, "interrupted": 130}


def failed_result(message: str, *, task: str | None = None, config: str | None = None) -> dict:
    """The ``result`` of a run that failed before it started (``sessionId`` null, exit code 1)."""
    return {
        "type": "result",
        "sessionId": None,
        "task": task,
        "config": config,
        "succeeded": False,
        "errorMessage": message,
        "exitCode": 1,
        "turns": 0,
        "elapsedSeconds": 0.0,
        "inputTokens": 0,
        "outputTokens": 0,
    }


def engine_record(settings: Any) -> dict:
    """The model settings a session started with, kept in its metadata so ``--resume`` keeps them
    (issue 14): provider, base URL, model, script and the API key's variable (never the key)."""
    return {k: getattr(settings, k, None) for k in ("provider", "base_url", "model", "script", "api_key_env")}


def run_mcp_servers(config: Any) -> list[Any]:
    """The MCP servers of a run: ``config.toml``'s ``[mcp_servers]``, then the orchestration
    config's ``McpServers`` (which wins on a name both use).

    Raises:
        ConfigError: ``config.toml``'s table is malformed.
    """
    from roost.config import configured_mcp_servers

    servers = {s.name: s for s in configured_mcp_servers()}
    servers.update({s.name: s for s in config.mcp_servers})
    return list(servers.values())


async def run_session(
    *,
    config_path: str | None,
    task: str | None,
    resume_id: str | None,
    settings: Any,
    cwd: Path,
    emit: Callable[[dict], None],
    request_approval: Any,
    on_orchestrator: Callable[[Any], None] | None = None,
    after_turn: Any = None,
    subscriber: Any = None,
    permission_mode: str = "standard",
) -> dict:
    """Run (or resume) one orchestration session; return its ``result`` event (also emitted).

    Args:
        config_path: the orchestration config (with ``resume_id``: optional, default the
            session's own).
        task: the task (required without ``resume_id``).
        resume_id: a session to continue (``--resume``).
        settings: :class:`roost.engines.ProviderSettings` of the agents' model.
        cwd: the session's working directory.
        emit: sends one run event dict (must not block).
        request_approval: ``await request_approval(params) -> bool | None``.
        on_orchestrator: called with the :class:`Orchestrator` once it exists (to interrupt it).
        after_turn: ``--hitl``'s pause after each agent turn (see :class:`Orchestrator`).
        subscriber: a hub subscriber (``deliver(line)``) of the session's thread, subscribed
            before the run starts (``roost run`` streams agent text with it).
        permission_mode: the permission mode of a new session's thread (``read_only``,
            ``standard``: mutations ask ``request_approval``, ``unconfined``).

    Cancellation: interrupt through the orchestrator (``interrupt()``); cancelling this call
    stops the run abruptly (the running turn is persisted as interrupted by the runtime).
    """
    from roost.model import Thread
    from roost.orchestration import Orchestrator, load_config_file, resolve_agents
    from roost.plugins import open_mcp_host
    from roost.protocol._engines import EngineCatalog
    from roost.storage import new_id, utc_now
    from roost.supervisor import open_runtime
    from roost.tools import builtin_tools

    began = trio.current_time()
    config = None
    if config_path is not None:
        try:
            config = await trio.to_thread.run_sync(load_config_file, config_path)
        except ConfigError as exc:
            result = failed_result(str(exc), task=task, config=config_path)
            emit(result)
            return result
    if config is None and resume_id is None:
        result = failed_result("a new session needs an orchestration config", task=task, config=None)
        emit(result)
        return result
    engines = EngineCatalog(settings)
    if config is not None:
        try:  # each agent's model, before anything starts
            resolve_agents(config, engines)
        except (ConfigError, InvalidParams) as exc:
            with trio.CancelScope(shield=True):
                await engines.aclose()
            result = failed_result(str(exc), task=task, config=config_path)
            emit(result)
            return result
    try:
        async with (
            open_runtime(engine_for=engines.engine_for, tools=builtin_tools()) as runtime,
            AsyncExitStack() as stack,
        ):
            if resume_id is not None:
                try:
                    actor = await runtime.registry.get(resume_id)
                except (NotFound, ThreadNotFound):
                    actor = None
                resumed = actor.facts().thread if actor is not None else None
                meta = resumed.metadata or {} if resumed is not None else {}
                problem = (
                    f"no session with id {resume_id!r}"
                    if resumed is None or resumed.kind != "orchestration"
                    else f"session {resume_id} is already complete"
                    if meta.get("is_complete")
                    else None
                )
                if problem is None and config is None:
                    try:
                        config = await trio.to_thread.run_sync(load_config_file, str(meta.get("config_path")))
                    except ConfigError as exc:
                        problem = str(exc)
                if problem is not None:
                    result = failed_result(
                        problem, task=meta.get("task"), config=config_path or meta.get("config_path")
                    )
                    emit(result)
                    return result
                task = str(meta.get("task") or "")
            else:
                assert config is not None  # a new session without a config was refused above
                now = utc_now()
                thread = Thread(
                    id=new_id("thr"),
                    kind="orchestration",
                    cwd=str(cwd),
                    provider=settings.provider,
                    model=settings.model,
                    permission_mode=permission_mode,
                    created_at=now,
                    updated_at=now,
                    metadata={
                        "task": task,
                        "config_path": config.path,
                        "is_complete": False,
                        "engine": engine_record(settings),
                    },
                )
                actor = await runtime.registry.create(thread, ephemeral=False)
            assert config is not None and actor is not None  # else a problem was returned above
            if subscriber is not None:
                from roost.actors import Subscribe

                await actor.ref.ask(Subscribe(subscriber))
            mcp = await stack.enter_async_context(open_mcp_host(run_mcp_servers(config)))
            mcp.attach(runtime.services.tools)
            orch = Orchestrator(
                config,
                actor,
                engines=engines,
                emit=emit,
                request_approval=request_approval,
                after_turn=after_turn,
                tool_groups=mcp.groups(),
            )
            if on_orchestrator is not None:
                on_orchestrator(orch)
            emit(
                {
                    "type": "ready",
                    "protocolVersion": PROTOCOL_VERSION,
                    "sessionId": actor.thread_id,
                    "task": task,
                    "config": config.path,
                    "resumed": resume_id is not None,
                    "agents": [a.name for a in config.agents],
                }
            )
            try:
                outcome = await orch.run(task or "")
            except RoostError as exc:
                log.exception("run %s failed", actor.thread_id)
                from roost.orchestration import RunOutcome

                outcome = RunOutcome(status="failed", error_message=str(exc))
            p = orch.progress
            result = {
                "type": "result",
                "sessionId": actor.thread_id,
                "task": task,
                "config": config.path,
                "succeeded": outcome.status == "completed",
                "errorMessage": None if outcome.status == "completed" else outcome.error_message,
                "exitCode": _EXIT[outcome.status],
                "turns": p.iterations,
                "elapsedSeconds": round(trio.current_time() - began, 3),
                "inputTokens": p.input_tokens,
                "outputTokens": p.output_tokens,
            }
    except RoostError as exc:
        result = failed_result(str(exc), task=task, config=config_path)
    finally:
        with trio.CancelScope(shield=True):
            await engines.aclose()
    emit(result)
    return result


async def run_bridge(
    *,
    config_path: str | None,
    task: str | None,
    resume_id: str | None,
    settings: Any,
    cwd: Path,
    receive: trio.abc.ReceiveStream,
    send: trio.abc.SendStream,
    permission_mode: str = "standard",
) -> int:
    """Serve one run bridge session on ``receive``/``send`` (stdin/stdout); return the exit code.

    Input lines: ``approval_response`` answers the pending ``approval_request``; ``interrupt``
    (or SIGINT/SIGTERM) interrupts the session. A line that is not a JSON object gets an
    ``error`` event and, while an approval is pending, denies it (wire-protocol.md: "Anything
    malformed counts as denied"); an unknown type, or an ``approval_response`` with no approval
    pending, gets an ``error`` event and is otherwise ignored. At end of input, approvals can no
    longer be asked and are denied (the unattended policy). The ``result`` of a session that
    started also counts its approvals: ``approvedActions`` and ``deniedActions`` (additive fields,
    the same as ``roost run --json`` reports).
    """
    from roost.protocol._framing import FrameError, LineDecoder, line_limit, read_frames
    from roost.protocol._outbox import Outbox
    from roost.protocol._repl_prompts import PromptBroker

    outbox = Outbox()
    state: dict[str, Any] = {"orch": None, "pending_interrupt": False}
    counts = {"approvedActions": 0, "deniedActions": 0}

    def emit(event: dict) -> None:
        if event.get("type") == "result" and event.get("sessionId") is not None:
            event.update(counts)  # additive, as in ``roost run --json``
        outbox.deliver(dumps_line(event))

    broker = PromptBroker(emit)

    async def request_approval(params: dict) -> bool | None:
        answer = await broker.request_approval(params)
        counts["approvedActions" if answer is True else "deniedActions"] += 1
        return answer

    def interrupt() -> None:
        orch = state["orch"]
        if orch is None:
            state["pending_interrupt"] = True
        else:
            orch.interrupt("interrupted")

    def on_orchestrator(orch: Any) -> None:
        state["orch"] = orch
        if state["pending_interrupt"]:
            orch.interrupt("interrupted")

    def refuse(text: str) -> None:
        emit({"type": "error", "text": text})

    async def read_input() -> None:
        async for frame in read_frames(receive, LineDecoder(max_line_bytes=line_limit())):
            if isinstance(frame, FrameError) or not isinstance(frame, dict):
                reason = frame.message if isinstance(frame, FrameError) else "an input line must be a JSON object"
                if broker.pending_kind == "approval":  # anything malformed counts as denied
                    broker.answer({"type": "approval_response", "approved": False})
                    reason += "; the pending approval is denied"
                refuse(reason)
                continue
            kind = frame.get("type")
            if kind == "approval_response":
                if not broker.answer(frame):
                    refuse("approval_response ignored: no approval is pending")
            elif kind == "interrupt":
                interrupt()
            else:
                refuse(f"unknown input type {kind!r} (expected approval_response or interrupt)")
        broker.close()  # end of input: nobody left to ask (a pending approval is denied)

    async def sigint() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                interrupt()

    async def write_output() -> None:
        try:
            await outbox.run_writer(send)
        except (trio.BrokenResourceError, trio.ClosedResourceError, BrokenPipeError):
            # Nobody reads the events any more: stop the run (resumable) rather than crash.
            log.warning("stdout was closed; interrupting the run")
            state["stdout_gone"] = True
            outbox.close()
            interrupt()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write_output)
        async with trio.open_nursery() as inputs:
            inputs.start_soon(read_input)
            inputs.start_soon(sigint)
            result = await run_session(
                config_path=config_path,
                task=task,
                resume_id=resume_id,
                settings=settings,
                cwd=cwd,
                emit=emit,
                request_approval=request_approval,
                on_orchestrator=on_orchestrator,
                permission_mode=permission_mode,
            )
            inputs.cancel_scope.cancel()
        outbox.close()
    if state.get("stdout_gone"):
        from roost.protocol._stdout import silence_stdout

        silence_stdout()
        return 1 if result["exitCode"] == 0 else int(result["exitCode"])
    return int(result["exitCode"])
