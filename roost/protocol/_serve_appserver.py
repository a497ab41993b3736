"""Run the app-server dialect over a pair of byte streams (stdio for ``roost app-server``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from roost.actors import ProcessManager
from roost.errors import ChildNotFound
from roost.plugins import open_mcp_host
from roost.protocol import (  # noqa: F401  (register methods)
    _as_attachments,
    _as_config,
    _as_content,
    _as_processes,
    _as_remote,
    _as_runs,
    _as_threads,
    _as_turns,
    _as_usage,
    _as_workers,
)
from roost.protocol._appserver import AppServerSession
from roost.protocol._as_connection import (
    STDIO_CHILD,
    TOO_SLOW,
    StdioClientTooSlow,
    StdioConnection,
    StdioConnectionCrashed,
)
from roost.protocol._as_early import EarlyInitialize
from roost.protocol._engines import EngineCatalog
from roost.supervisor import ChildSpec, Restart, Supervisor, open_runtime
from roost.tools import builtin_tools

__all__ = ["serve_app_server", "serve_connection", "StdioClientTooSlow", "StdioConnectionCrashed"]

log = logging.getLogger("roost.appserver")


async def serve_app_server(
    receive: trio.abc.ReceiveStream,
    send: trio.abc.SendStream,
    *,
    engines: EngineCatalog,
    db_path: Path | None = None,
    tools: dict[str, Any] | None = None,
    host: dict | None = None,
    watch_config: tuple[Path, Callable[[], Any]] | None = None,
    mcp_servers: list[Any] | None = None,
    open_store: Callable[[], Any] | None = None,
    early: EarlyInitialize | None = None,
    workers: bool = False,
) -> None:
    """Start a runtime and serve one app-server session until end of input or ``shutdown``.

    Args:
        host: hosted mode's ``{kind, instance_id, workspace_id}`` for ``initialize`` (None: local).
        watch_config: ``(config file, resolve)`` to reload the configuration on edits
            (:class:`~roost.protocol._as_reload.ConfigReloader`); None watches nothing.
        mcp_servers: :class:`roost.plugins.McpServerConfig` items whose tools threads get (each
            connects in the background; a server that is down gives its calls a tool error);
            every status change is sent as ``mcp/status/updated``.
        open_store: :func:`~roost.supervisor.open_runtime`'s (instead of ``db_path``).
        early: the first ``initialize``, answered before the event loop started
            (:func:`~roost.protocol._as_early.answer_initialize_early`): the runtime takes the
            owner id it reported and the session starts initialized.
        workers: hand threads to worker processes under load (``roost app-server`` only: a worker
            runs this process's command line; :mod:`roost.protocol._as_workers`); in a worker
            process (``ROOST_APPSERVER_WORKER=1``) it makes the session a worker's.

    Background processes (``process/*``) run in a :class:`~roost.actors.ProcessManager` for the
    session's lifetime. On the way out, running turns are interrupted and persisted, and live
    background processes are stopped and recorded ``lost``, before the runtime stops.
    """
    tools = builtin_tools() if tools is None else tools
    try:
        async with (
            open_mcp_host(mcp_servers or (), wait=False) as mcp,
            open_runtime(
                engine_for=engines.engine_for,
                tools=tools,
                db_path=db_path,
                node_kind="app-server",
                open_store=open_store,
                owner=early.owner if early is not None else None,
            ) as runtime,
        ):
            session = AppServerSession(runtime, engines=engines, host=host)
            if workers:
                _as_workers.install(session)
            _as_remote.install_run_handlers(runtime)
            if mcp.states:
                session.mcp = mcp
                mcp.attach(runtime.services.tools)
                mcp.add_listener(session.on_mcp_status)
            async with trio.open_nursery() as nursery:
                processes = ProcessManager(runtime.services, runtime.registry, nursery)
                await processes.reconcile()
                runtime.services.processes = processes
                try:
                    if watch_config is not None:
                        from roost.protocol._as_reload import ConfigReloader

                        reloader = ConfigReloader(session, *watch_config)
                        await trio.to_thread.run_sync(reloader.prime)
                        # run() re-checks the file once its watcher is live: starting it late misses no edit
                        nursery.start_soon(_after_initialize, session, reloader.run)
                    if early is not None:  # from here on, the session answers for the start
                        early.apply(session)
                    await serve_connection(runtime, session, receive, send)
                finally:
                    with trio.CancelScope(shield=True):
                        await processes.aclose()  # recorded as lost: they end with Roost
                    runtime.services.processes = None
                    nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await engines.aclose()


#: Seconds background start-up work waits for the first ``initialize`` answer before it starts anyway.
_INITIALIZE_GRACE_S = 1.0


async def _after_initialize(session: AppServerSession, work: Callable[[], Awaitable[None]]) -> None:
    """Run ``work()`` once the first ``initialize`` response is written (or after
    :data:`_INITIALIZE_GRACE_S` without one): start-up work a client does not wait for (the
    configuration watcher's imports) stays off the way to that response."""
    with trio.move_on_after(_INITIALIZE_GRACE_S):
        await session.answered_initialize.wait()
        while session.outbox.queued_bytes:  # let the writer take the response ...
            await trio.sleep(0)
        await trio.sleep(0)  # ... and write it
    await work()


async def serve_connection(
    runtime: Any, session: AppServerSession, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream
) -> None:
    """Serve the one stdio client as the actor :class:`~roost.protocol._as_connection.StdioConnection`,
    the temporary child ``connection:stdio`` of the root's ``connections`` supervisor (DESIGN.md
    section 2: one supervised actor per client connection), until it ends.

    ``connections`` is temporary here too: a restart could only bring back an empty supervisor, as
    a stdio client cannot be re-opened. End of input, ``shutdown`` and the client going away are
    normal ends (this returns). Any other end of the connection (its crash, or the crash of
    ``connections``, each logged by its supervisor) has already interrupted and persisted the
    running turns; it is logged here with its reason and raised as
    :class:`~roost.protocol._as_connection.StdioConnectionCrashed`, so the process ends. A client
    that stopped reading (its outbox overflowed) ends it normally, then this raises
    :class:`~roost.protocol._as_connection.StdioClientTooSlow` (exit status 3).

    Cancellation: cancelled, the connection is stopped (its shielded clean-up interrupts and
    persists the running turns) before this returns.
    """
    conn = StdioConnection(session, receive, send)
    ended = trio.Event()
    crash: list[BaseException] = []

    async def run(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await conn.run(task_status=task_status)
        except BaseException as exc:
            crash.append(exc)
            raise
        finally:
            ended.set()

    connections = Supervisor(name="connections", intensity=1, period=1)
    await runtime.root.start_child(
        ChildSpec("connections", connections.run, restart=Restart.TEMPORARY, shutdown_timeout=35)
    )
    try:
        await connections.start_child(ChildSpec(STDIO_CHILD, run, restart=Restart.TEMPORARY, shutdown_timeout=35))
        await ended.wait()
    finally:
        # Cancelled from outside: this stops the connection (its clean-up runs). Ended: the
        # supervisor has nothing left to supervise.
        with trio.CancelScope(shield=True):
            try:
                await runtime.root.terminate_child("connections")
            except ChildNotFound:
                pass  # it ended meanwhile (crashed, or stopped with the root)
    if not conn.ended_normally:
        reason = _crash_reason(crash[0] if crash else None)
        log.error(
            "app-server: the stdio connection crashed (%s); the session ends (running turns were "
            "interrupted and persisted)",
            reason,
        )
        raise StdioConnectionCrashed(f"the stdio connection crashed ({reason})")
    log.info("app-server: the session ended (%s)", conn.end_reason)
    if conn.end_reason == TOO_SLOW:
        raise StdioClientTooSlow("the client stopped reading stdout (its outbox overflowed)")


def _crash_reason(exc: BaseException | None) -> str:
    """The exception a crashed connection raised, or, when its task was only cancelled (its
    supervisor crashed it, or went down), that (the supervisor's log line has the cause)."""
    if exc is None:
        return "ended abnormally"
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(trio.Cancelled)
        if rest is None:
            return "stopped by its supervisor"
        exc = rest.exceptions[0] if len(rest.exceptions) == 1 else rest
    elif isinstance(exc, trio.Cancelled):
        return "stopped by its supervisor"
    return repr(exc)
