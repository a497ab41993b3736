"""``process/list``, ``process/read``, ``process/stop`` and ``process/cancel-notifications``
(app-server-protocol.md, "Background process triggers"), served by the runtime's
:class:`~roost.actors.ProcessManager` (the shell tool's ``background: true`` starts processes).

Every method takes ``thread_id`` and sees only that thread's own processes; another thread's
``process_id`` is ``invalid_params`` as if it did not exist.
"""

from __future__ import annotations

from typing import Any

from roost.errors import Unsupported
from roost.protocol._appserver import AppServerSession, method
from roost.protocol._as_common import thread_actor
from roost.protocol._params import STR, check_params

__all__: list[str] = []


async def _manager(session: AppServerSession, thread_id: str) -> Any:
    await thread_actor(session, thread_id)  # ThreadNotFound; subscribes to its continuation turns
    manager = getattr(session.runtime.services, "processes", None)
    if manager is None:
        raise Unsupported("this server runs no background processes")
    return manager


@method("process/list")
async def process_list(session: AppServerSession, params: Any) -> dict:
    """``process/list``: ``{processes: [process]}`` of the thread, oldest first; each ``process``
    is ``{id, thread_id, command, cwd, pid, status, exit_code, reason, started_at, ended_at,
    trigger: {status, on_exit}}`` (:func:`roost.actors.process_view`).

    Raises:
        ThreadNotFound: no such thread.
    """
    p = check_params("process/list", params, {"thread_id": (STR, True)})
    manager = await _manager(session, p["thread_id"])
    return {"processes": await manager.list(p["thread_id"])}


@method("process/read")
async def process_read(session: AppServerSession, params: Any) -> dict:
    """``process/read``: ``{process, output}`` (the output so far, or the recorded tail: at most
    64 KiB, beginning and end). Read-only: it does not acknowledge the exit notification.

    Raises:
        ThreadNotFound; InvalidParams: not a process of that thread.
    """
    p = check_params("process/read", params, {"thread_id": (STR, True), "process_id": (STR, True)})
    manager = await _manager(session, p["thread_id"])
    view, output = await manager.read(p["thread_id"], p["process_id"])
    return {"process": view, "output": output}


@method("process/stop")
async def process_stop(session: AppServerSession, params: Any) -> dict:
    """``process/stop``: stop the process group (SIGTERM, then SIGKILL); ``{process}`` with status
    ``stopped`` and trigger ``stopped`` (a process that already ended is returned as it is).

    Raises:
        ThreadNotFound; InvalidParams: not a process of that thread.
    """
    p = check_params("process/stop", params, {"thread_id": (STR, True), "process_id": (STR, True)})
    manager = await _manager(session, p["thread_id"])
    return {"process": await manager.stop(p["thread_id"], p["process_id"])}


@method("process/cancel-notifications")
async def process_cancel_notifications(session: AppServerSession, params: Any) -> dict:
    """``process/cancel-notifications``: durably cancel the exit notification without stopping
    the process; ``{process}`` with trigger ``cancelled`` (an already received or handled trigger
    is returned as it is).

    Raises:
        ThreadNotFound; InvalidParams: not a process of that thread.
    """
    p = check_params("process/cancel-notifications", params, {"thread_id": (STR, True), "process_id": (STR, True)})
    manager = await _manager(session, p["thread_id"])
    return {"process": await manager.cancel_notifications(p["thread_id"], p["process_id"])}
