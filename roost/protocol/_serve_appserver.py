"""Run the app-server dialect over a pair of byte streams (stdio for ``roost app-server``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from roost.actors import ProcessManager
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
from roost.protocol._engines import EngineCatalog
from roost.supervisor import ChildSpec, Restart, open_runtime
from roost.tools import builtin_tools

__all__ = ["serve_app_server", "serve_connection"]


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
                engine_for=engines.engine_for, tools=tools, db_path=db_path, node_kind="app-server"
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
                        nursery.start_soon(reloader.run)
                    await serve_connection(runtime, session, receive, send)
                finally:
                    with trio.CancelScope(shield=True):
                        await processes.aclose()  # recorded as lost: they end with Roost
                    runtime.services.processes = None
                    nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await engines.aclose()


async def serve_connection(
    runtime: Any, session: AppServerSession, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream
) -> None:
    """Serve the one stdio client as the root supervisor's temporary child ``connection:stdio``
    (DESIGN.md section 2: one supervised part per client connection) until it ends.

    Its request intake is bounded (``MAX_IN_FLIGHT`` requests at once; reading waits beyond
    that). The child is temporary, as a stdio client cannot come back: its end is logged by the
    supervisor, and a crash is raised here too, so the process ends as it always did.

    Cancellation: cancelled, the child is stopped (its shielded clean-up interrupts and persists
    the running turns) before this returns.
    """
    ended = trio.Event()
    crashed: list[Exception] = []

    async def run(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await session.serve(receive, send)
        except Exception as exc:
            crashed.append(exc)
            raise
        finally:
            ended.set()

    spec = ChildSpec("connection:stdio", run, restart=Restart.TEMPORARY, shutdown_timeout=30)
    await runtime.root.start_child(spec)
    try:
        await ended.wait()
    finally:
        if not ended.is_set():  # cancelled from outside: stop the session (its clean-up runs)
            from roost.errors import ChildNotFound

            with trio.CancelScope(shield=True):
                try:
                    await runtime.root.terminate_child(spec.id)
                except ChildNotFound:
                    pass  # it ended meanwhile
    if crashed:
        raise crashed[0]
