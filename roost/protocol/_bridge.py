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
    from roost.orchestration import Orchestrator
    from roost.plugins import open_mcp_host
    from roost.supervisor import open_runtime
    from roost.tools import builtin_tools

    began = trio.current_time()
    loaded = await _load_config(config_path, task=task, resume_id=resume_id, settings=settings)
    if isinstance(loaded, dict):
        emit(loaded)
        return loaded
    config, engines = loaded
    try:
        async with (
            open_runtime(engine_for=engines.engine_for, tools=builtin_tools()) as runtime,
            AsyncExitStack() as stack,
        ):
            opened = await _session_actor(
                runtime, resume_id, config, config_path, task, settings, cwd, permission_mode, subscriber
            )
            if isinstance(opened, dict):
                emit(opened)
                return opened
            actor, config, task = opened
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
            emit(_ready_event(actor, task, config, resumed=resume_id is not None))
            result = await _run_orchestration(orch, actor, task, config, began)
    except RoostError as exc:
        result = failed_result(str(exc), task=task, config=config_path)
    finally:
        with trio.CancelScope(shield=True):
            await engines.aclose()
    emit(result)
    return result


async def _session_actor(
    runtime: Any,
    resume_id: str | None,
    config: Any,
    config_path: str | None,
    task: str | None,
    settings: Any,
    cwd: Path,
    permission_mode: str,
    subscriber: Any,
) -> Any:
    """``(actor, config, task)`` of the session (resumed, or a new orchestration thread), with
    ``subscriber`` subscribed to it; or the failed ``result`` event (a dict) of a resume that
    cannot go on."""
    if resume_id is not None:
        resumed = await _resume(runtime, resume_id, config, config_path)
        if isinstance(resumed, dict):
            return resumed
        actor, config, task = resumed
    else:
        assert config is not None  # a new session without a config was refused by _load_config
        actor = await _new_session(runtime, config, task, settings, cwd, permission_mode)
    if subscriber is not None:
        from roost.actors import Subscribe

        await actor.ref.ask(Subscribe(subscriber))
    return actor, config, task


def _ready_event(actor: Any, task: str | None, config: Any, *, resumed: bool) -> dict:
    """The ``ready`` event of a session (wire-protocol.md, "Run bridge")."""
    return {
        "type": "ready",
        "protocolVersion": PROTOCOL_VERSION,
        "sessionId": actor.thread_id,
        "task": task,
        "config": config.path,
        "resumed": resumed,
        "agents": [a.name for a in config.agents],
    }


async def _load_config(config_path: str | None, *, task: str | None, resume_id: str | None, settings: Any) -> Any:
    """``(config or None, engines)`` for a session, or the failed ``result`` event (a dict) when
    the config cannot be loaded, a new session has none, or an agent's model cannot be resolved."""
    from roost.orchestration import load_config_file, resolve_agents
    from roost.protocol._engines import EngineCatalog

    config = None
    if config_path is not None:
        try:
            config = await trio.to_thread.run_sync(load_config_file, config_path)
        except ConfigError as exc:
            return failed_result(str(exc), task=task, config=config_path)
    if config is None and resume_id is None:
        return failed_result("a new session needs an orchestration config", task=task, config=None)
    engines = EngineCatalog(settings)
    if config is not None:
        try:  # each agent's model, before anything starts
            resolve_agents(config, engines)
        except (ConfigError, InvalidParams) as exc:
            with trio.CancelScope(shield=True):
                await engines.aclose()
            return failed_result(str(exc), task=task, config=config_path)
    return config, engines


async def _resume(runtime: Any, resume_id: str, config: Any, config_path: str | None) -> Any:
    """``(actor, config, task)`` of the session to resume, or the failed ``result`` event (a dict):
    no such orchestration session, already complete, or its config cannot be loaded."""
    from roost.orchestration import load_config_file

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
        return failed_result(problem, task=meta.get("task"), config=config_path or meta.get("config_path"))
    return actor, config, str(meta.get("task") or "")


async def _new_session(
    runtime: Any, config: Any, task: str | None, settings: Any, cwd: Path, permission_mode: str
) -> Any:
    """The actor of a new ``orchestration`` thread for ``task`` under ``config``."""
    from roost.model import Thread
    from roost.storage import new_id, utc_now

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
    return await runtime.registry.create(thread, ephemeral=False)


async def _run_orchestration(orch: Any, actor: Any, task: str | None, config: Any, began: float) -> dict:
    """Run ``orch`` to its end; return the ``result`` event (a RoostError of the run fails it)."""
    try:
        outcome = await orch.run(task or "")
    except RoostError as exc:
        log.exception("run %s failed", actor.thread_id)
        from roost.orchestration import RunOutcome

        outcome = RunOutcome(status="failed", error_message=str(exc))
    p = orch.progress
    return {
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
    from roost.protocol._outbox import Outbox
    from roost.protocol._repl_prompts import PromptBroker

    outbox = Outbox()

    def emit(event: dict) -> None:
        if event.get("type") == "result" and event.get("sessionId") is not None:
            event.update(control.counts)  # additive, as in ``roost run --json``
        outbox.deliver(dumps_line(event))

    control = _BridgeControl(emit, PromptBroker(emit))

    async def write_output() -> None:
        try:
            await outbox.run_writer(send)
        except (trio.BrokenResourceError, trio.ClosedResourceError, BrokenPipeError):
            # Nobody reads the events any more: stop the run (resumable) rather than crash.
            log.warning("stdout was closed; interrupting the run")
            control.stdout_gone = True
            outbox.close()
            control.interrupt()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write_output)
        async with trio.open_nursery() as inputs:
            inputs.start_soon(control.read_input, receive)
            inputs.start_soon(control.watch_signals)
            result = await run_session(
                config_path=config_path,
                task=task,
                resume_id=resume_id,
                settings=settings,
                cwd=cwd,
                emit=emit,
                request_approval=control.request_approval,
                on_orchestrator=control.on_orchestrator,
                permission_mode=permission_mode,
            )
            inputs.cancel_scope.cancel()
        outbox.close()
    if control.stdout_gone:
        from roost.protocol._stdout import silence_stdout

        silence_stdout()
        return 1 if result["exitCode"] == 0 else int(result["exitCode"])
    return int(result["exitCode"])


class _BridgeControl:
    """The run bridge's input side: approval answers, interrupts (input, SIGINT, SIGTERM) and the
    orchestrator they reach (an interrupt before it exists is applied when it does)."""

    def __init__(self, emit: Callable[[dict], None], broker: Any) -> None:
        self.emit = emit
        self.broker = broker
        self.orch: Any = None
        self.pending_interrupt = False
        self.stdout_gone = False
        self.counts = {"approvedActions": 0, "deniedActions": 0}  # the result's approval counts

    async def request_approval(self, params: dict) -> bool | None:
        """Ask the client through the broker and count the answer (None: denied by policy)."""
        answer = await self.broker.request_approval(params)
        self.counts["approvedActions" if answer is True else "deniedActions"] += 1
        return answer

    def interrupt(self) -> None:
        if self.orch is None:
            self.pending_interrupt = True
        else:
            self.orch.interrupt("interrupted")

    def on_orchestrator(self, orch: Any) -> None:
        self.orch = orch
        if self.pending_interrupt:
            orch.interrupt("interrupted")

    def refuse(self, text: str, code: str = "invalid_request") -> None:
        """An ``error`` event for a refused input line, with the serve socket's additive ``code``
        (``parse_error`` for a line that does not parse, else ``invalid_request``)."""
        self.emit({"type": "error", "text": text, "code": code})

    async def read_input(self, receive: trio.abc.ReceiveStream) -> None:
        """Handle input lines until end of input, then deny what is still to be asked."""
        from roost.protocol._framing import FrameError, LineDecoder, line_limit, read_frames

        broker = self.broker
        async for frame in read_frames(receive, LineDecoder(max_line_bytes=line_limit())):
            if isinstance(frame, FrameError) or not isinstance(frame, dict):
                reason = frame.message if isinstance(frame, FrameError) else "an input line must be a JSON object"
                if broker.pending_kind == "approval":  # anything malformed counts as denied
                    broker.answer({"type": "approval_response", "approved": False})
                    reason += "; the pending approval is denied"
                self.refuse(reason, "parse_error" if isinstance(frame, FrameError) else "invalid_request")
                continue
            kind = frame.get("type")
            if kind == "approval_response":
                if not broker.answer(frame):
                    self.refuse("approval_response ignored: no approval is pending")
            elif kind == "interrupt":
                self.interrupt()
            elif "type" not in frame:  # as on the serve socket: name the missing field, not a type None
                self.refuse('the input object has no "type" field (expected approval_response or interrupt)')
            else:
                self.refuse(f"unknown input type {kind!r} (expected approval_response or interrupt)")
        broker.close()  # end of input: nobody left to ask (a pending approval is denied)

    async def watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                self.interrupt()
