"""``roost repl --vscode`` as a process: the stdio writer, SIGINT, the runtime and the chat's
thread around one :class:`~roost.protocol._repl.ReplSession` (wire-protocol.md, "Live sessions";
the dialect itself is described in :mod:`roost.protocol._repl`)."""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from roost._json import dumps_line
from roost.errors import ConfigError, RoostError
from roost.protocol._coalesce import WIRE_TOKENS
from roost.protocol._framing import LineDecoder, line_limit, read_frames
from roost.protocol._outbox import Outbox
from roost.protocol._repl import ReplSession
from roost.protocol._repl_events import replay_event
from roost.protocol._repl_prompts import PromptBroker, ask_user_tool

__all__ = ["serve_repl"]

log = logging.getLogger("roost.repl")


async def _open_chat(runtime: Any, *, resume: str | None, cwd: Path, settings: Any, permission_mode: str) -> Any:
    """The chat's ThreadActor: the resumed thread, or a new ``chat`` thread in ``cwd``.

    Raises:
        ThreadNotFound: ``resume`` names no thread. InvalidParams: it is not a chat.
    """
    from roost.errors import InvalidParams
    from roost.model import Thread
    from roost.storage import new_id, utc_now

    if resume is not None:
        actor = await runtime.registry.get(resume)
        kind = actor.facts().thread.kind
        if kind != "chat":
            raise InvalidParams(f"{resume} is a {kind} thread, not a chat")
        return actor
    now = utc_now()
    thread = Thread(
        id=new_id("thr"),
        kind="chat",
        cwd=str(cwd),
        provider=settings.provider,
        model=settings.model,
        permission_mode=permission_mode,
        created_at=now,
        updated_at=now,
    )
    return await runtime.registry.create(thread, ephemeral=False)


async def serve_repl(
    receive: trio.abc.ReceiveStream,
    send: trio.abc.SendStream,
    *,
    engines: Any,
    cwd: Path,
    resume: str | None = None,
    permission_mode: str = "standard",
    questions: bool = False,
    db_path: Path | None = None,
    handle_sigint: bool = True,
) -> int:
    """Serve one stdio chat until end of input or ``/exit``; return the exit status.

    Args:
        receive, send: the client's byte streams (stdin / stdout).
        engines: the :class:`~roost.protocol._engines.EngineCatalog` (``default`` None = unconfigured).
        cwd: the new chat's working directory (a resumed chat keeps its own).
        resume: the id of a chat thread to continue (its earlier turns are sent as ``replay``).
        permission_mode: a new chat's permission mode (``standard`` asks approvals).
        questions: offer the ``ask_user`` tool (FUSERAFT_VSCODE_QUESTIONS=1).
        db_path: the database (default ``$ROOST_HOME/roost.db``).
        handle_sigint: SIGINT interrupts the running turn (only from the main thread).

    Returns:
        0 after a normal end; 1 when the chat could not be opened (unknown ``--resume`` id, the
        store); 2 when no model provider is configured. Each failure is first reported as an
        ``error`` event, then ``session_end``.

    Cancellation: cancelled from outside, the runtime stops (a running turn settles as interrupted
    in its shielded clean-up) and no ``session_end`` is promised.
    """
    outbox = Outbox(coalesce=WIRE_TOKENS)
    code = 0
    chat: list[ReplSession] = []  # the session, once the chat is open

    def emit(event: dict) -> None:
        outbox.deliver(dumps_line(event))

    def before_prompt(item_id: Any) -> None:
        if chat:
            chat[0].announce_tool_call(item_id)

    broker = PromptBroker(emit, before_prompt=before_prompt)

    def on_sigint() -> None:
        if chat:
            chat[0].interrupt()
        else:
            emit({"type": "cancelled"})  # nothing is running yet; the process lives on

    async with _stdout_writer(outbox, send, on_sigint if handle_sigint else None) as signals_scope:
        try:
            code = await _run_chat(
                receive,
                engines=engines,
                outbox=outbox,
                broker=broker,
                chat=chat,
                cwd=cwd,
                resume=resume,
                permission_mode=permission_mode,
                questions=questions,
                db_path=db_path,
            )
        finally:
            broker.close()
            emit({"type": "session_end"})
            outbox.close()
            signals_scope.cancel()  # the writer task drains what is queued, then returns
    return code


async def _run_chat(
    receive: trio.abc.ReceiveStream,
    *,
    engines: Any,
    outbox: Outbox,
    broker: PromptBroker,
    chat: list[ReplSession],
    cwd: Path,
    resume: str | None,
    permission_mode: str,
    questions: bool,
    db_path: Path | None,
) -> int:
    """Open the runtime and the chat, then serve it (:func:`serve_repl`'s exit status); the
    session is appended to ``chat`` once it exists."""
    from roost.config import configured_mcp_servers
    from roost.plugins import open_mcp_host
    from roost.supervisor import open_runtime
    from roost.tools import builtin_tools, plan_tool

    def emit(event: dict) -> None:
        outbox.deliver(dumps_line(event))

    if engines.default is None:
        emit({"type": "error", "text": engines.setup_error or "no model provider is configured"})
        return 2
    tools = builtin_tools()
    tools["update_plan"] = plan_tool()  # plan and step_status events
    if questions:
        tools["ask_user"] = ask_user_tool(broker)
    try:
        mcp_servers = configured_mcp_servers()
    except ConfigError as exc:  # a broken config.toml or ROOST_HOME: the client's event, and the
        emit({"type": "error", "text": str(exc)})  # command's one stderr line and exit status 2
        raise
    async with (
        open_mcp_host(mcp_servers) as mcp,
        open_runtime(engine_for=engines.engine_for, tools=tools, db_path=db_path) as runtime,
    ):
        mcp.attach(runtime.services.tools)
        try:
            actor = await _open_chat(
                runtime, resume=resume, cwd=cwd, settings=engines.default, permission_mode=permission_mode
            )
            snapshot = await actor.ref.ask(_snapshot()) if resume is not None else None
        except RoostError as exc:
            emit({"type": "error", "text": f"{type(exc).__name__}: {exc}"})
            return 1
        model = actor.facts().thread.model or engines.default.model or engines.default.provider
        turns = len(snapshot["turns"]) if snapshot else 0
        session = ReplSession(
            actor,
            outbox,
            broker,
            model=model,
            questions=questions,
            turn_index=turns,
            registry=runtime.registry,
            engines=engines,
        )
        chat.append(session)
        await _serve(session, receive, snapshot)
    return 0


@asynccontextmanager
async def _stdout_writer(outbox: Outbox, send: trio.abc.SendStream, on_sigint: Any) -> AsyncIterator[trio.CancelScope]:
    """Drain ``outbox`` to ``send`` (and, with ``on_sigint``, call it on each SIGINT) while the
    body runs; the body cancels the yielded scope to stop the signal watcher, and the writer then
    drains what is queued and returns once the outbox is closed."""
    async with trio.open_nursery() as writer:

        async def write() -> None:
            try:
                await outbox.run_writer(send)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                log.info("the client closed stdout")

        writer.start_soon(write)
        signals_scope = trio.CancelScope()
        if on_sigint is not None:

            async def signals(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
                with signals_scope:
                    await _sigint(on_sigint, task_status=task_status)

            await writer.start(signals)
        yield signals_scope


def _snapshot() -> Any:
    from roost.actors import Snapshot

    return Snapshot()


async def _serve(session: ReplSession, receive: trio.abc.ReceiveStream, snapshot: dict | None) -> None:
    from roost.actors import Subscribe, Unsubscribe

    actor = session.actor
    await actor.ref.ask(Subscribe(session))
    try:
        session.emit(session.ready_event())
        if snapshot is not None:
            session.emit(replay_event(snapshot))
        async with trio.open_nursery() as nursery:
            session.nursery = nursery
            async for frame in read_frames(receive, LineDecoder(max_line_bytes=line_limit())):
                await session.handle(frame)
                if session.exit_requested:
                    break
            await session.shutdown()
            nursery.cancel_scope.cancel()
    finally:
        session.nursery = None
        session.untap_workers()
        with trio.CancelScope(shield=True):
            try:
                await session.actor.ref.ask(Unsubscribe(session), timeout=5)  # /switch may have changed it
            except RoostError:
                log.debug("could not unsubscribe at shutdown", exc_info=True)


async def _sigint(on_sigint: Any, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """SIGINT cancels the running turn only (wire-protocol.md "Input": ``interrupt``)."""
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            on_sigint()
