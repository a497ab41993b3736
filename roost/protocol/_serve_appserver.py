"""Run the app-server dialect over a pair of byte streams (stdio for ``roost app-server``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from roost.protocol import _as_config, _as_runs, _as_threads, _as_turns  # noqa: F401  (register methods)
from roost.protocol._appserver import AppServerSession
from roost.protocol._engines import EngineCatalog
from roost.supervisor import open_runtime
from roost.tools import builtin_tools

__all__ = ["serve_app_server"]


async def serve_app_server(
    receive: trio.abc.ReceiveStream, send: trio.abc.SendStream, *, engines: EngineCatalog,
    db_path: Path | None = None, tools: dict[str, Any] | None = None,
) -> None:
    """Start a runtime and serve one app-server session until end of input or ``shutdown``.

    On the way out, running turns are interrupted and persisted before the runtime stops.
    """
    tools = builtin_tools() if tools is None else tools
    try:
        async with open_runtime(engine_for=engines.engine_for, tools=tools, db_path=db_path) as runtime:
            session = AppServerSession(runtime, engines=engines)
            await session.serve(receive, send)
    finally:
        with trio.CancelScope(shield=True):
            await engines.aclose()
