"""The daemon's MCP tools (``dispatch_task``, ``get_status``, ``get_result``) on the official ``mcp`` SDK.

wire-protocol.md, "Daemon events" (the daemon exposes them over HTTP) and the appendix
(``dispatch_task(task, objectiveId?)``). Served at ``/mcp`` by :mod:`roost.protocol._serve_http`,
which imports this module on the first MCP request (the SDK is slow to import).
"""

from __future__ import annotations

import os
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import ValidationError

from roost.errors import NotFound, RoostError
from roost.protocol._serve_auth import bearer_token, parse_client_id
from roost.storage import add_objective_task, start_objective_task

__all__ = ["build_mcp_app", "argument_errors"]

#: JSON's names for the Python types of decoded arguments (what a client sent).
_JSON_TYPES = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}


def argument_errors(tool: str, error: ValidationError) -> str:
    """One sentence naming each bad argument of a ``tool`` call (instead of pydantic's report):
    ``invalid arguments for dispatch_task: task must be a string (got a number); ...``."""
    problems = []
    for item in error.errors():
        where = ".".join(str(part) for part in item.get("loc") or ()) or "the arguments"
        if item.get("type") == "missing":
            problems.append(f"{where} is required")
            continue
        message = str(item.get("msg") or "is invalid").replace("Input should be", "must be")
        got = item.get("input")
        sent = "null" if got is None else _JSON_TYPES.get(type(got), type(got).__name__)
        problems.append(f"{where} {message[0].lower()}{message[1:]} (got {'an' if sent[0] in 'aeiou' else 'a'} {sent})")
    return f"invalid arguments for {tool}: " + "; ".join(problems)


class _Server(MCPServer):
    """The SDK's server, with argument errors in one clear sentence (:func:`argument_errors`)."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(argument_errors(name, exc.__cause__)) from exc.__cause__
            raise


def build_mcp_app(daemon: Any) -> Any:
    """The MCP server (``dispatch_task``, ``get_status``, ``get_result``) as a streamable HTTP ASGI app.

    Each tool returns structured output (MCP ``structuredContent``, an object) and refuses bad
    input with a tool error (``isError``): an argument of the wrong type or a missing one (one
    sentence naming each, see :func:`argument_errors`), an unknown ``objectiveId``, a ``work_dir``
    that is not a directory, a malformed ``Fuseraft-Client-Id``. ``get_status``/``get_result`` take the id as
    ``sessionId`` (what ``dispatch_task`` returns) or ``session_id``. A request with a
    ``Fuseraft-Client-Id`` header dispatches its task for that client (scoped to its bearer token,
    as on ``/attach``): an attached connection with the same id is asked its approvals (with the
    reconnect grace), else the unattended policy answers; ``get_result`` lists each approval with
    ``answeredBy`` (``client`` or ``unattended``).
    """
    server = _Server("roost-serve")
    queue = daemon.queue

    @server.tool(structured_output=True)
    async def dispatch_task(
        task: str, ctx: Context, config: str | None = None, work_dir: str | None = None, objectiveId: str | None = None
    ) -> dict[str, Any]:  # noqa: N803 (wire name)
        """Queue a task on the daemon; returns its sessionId and queue position.

        objectiveId adds the task to that objective (see `roost objective`): its outcome is
        recorded there. work_dir must be an existing directory (relative: from the daemon's).
        """
        return await _dispatch(daemon, ctx, task, config, work_dir, objectiveId)

    @server.tool(structured_output=True)
    async def get_status(session_id: str | None = None, sessionId: str | None = None) -> dict[str, Any]:  # noqa: N803
        """The status of a task: queued (with position), running, or finished."""
        sid = _session_of(session_id, sessionId)
        task = await queue.lookup(sid)
        if task is None:
            return {"sessionId": sid, "status": "unknown"}
        status = "finished" if task.status in ("finished", "collected") else task.status
        return {"sessionId": sid, "task": task.task, "status": status, "position": queue.position(sid)}

    @server.tool(structured_output=True)
    async def get_result(session_id: str | None = None, sessionId: str | None = None) -> dict[str, Any]:  # noqa: N803
        """The result of a finished task (the daemon's ``result`` event, plus its approvals and who
        answered each), or its status while it is not done."""
        sid = _session_of(session_id, sessionId)
        task = await queue.lookup(sid)
        if task is None:
            return {"sessionId": sid, "status": "unknown"}
        if task.status not in ("finished", "collected"):
            return {"sessionId": sid, "status": task.status, "position": queue.position(sid)}
        return {**daemon.result_of(task), "approvals": daemon.approvals_of(sid)}

    return server.streamable_http_app(streamable_http_path="/mcp", json_response=True)


def _client_key(daemon: Any, ctx: Context) -> str | None:
    """The client a request dispatches for: ``<token scope>/<Fuseraft-Client-Id>``, or None
    without the header.

    Raises:
        ToolError: a malformed ``Fuseraft-Client-Id``.
    """
    request = ctx.request_context.request
    headers = getattr(request, "headers", None) or {}
    try:
        client_id = parse_client_id(headers.get("fuseraft-client-id"))
    except ValueError as exc:
        raise ToolError(str(exc)) from None
    if client_id is None:
        return None
    grant = daemon.options.auth.check(bearer_token(headers.get("authorization")))
    return f"{grant.scope if grant else 'http'}/{client_id}"


def _session_of(session_id: str | None, camel: str | None) -> str:
    chosen = camel or session_id
    if not chosen:
        raise ToolError("give the task's sessionId (what dispatch_task returned)")
    return chosen


async def _dispatch(
    daemon: Any, ctx: Context, task: str, config: str | None, work_dir: str | None, objective_id: str | None
) -> dict[str, Any]:
    """``dispatch_task``: queue ``task`` for the request's client (added to objective ``objective_id``).

    Raises:
        ToolError: an empty task, a ``work_dir`` that is not a directory, a malformed
            ``Fuseraft-Client-Id``, an unknown objective, or a task the queue refused.
    """
    queue = daemon.queue
    if not task.strip():
        raise ToolError("task must not be empty")
    if work_dir is not None:
        work_dir = os.path.join(str(daemon.options.work_dir), os.path.expanduser(work_dir))
        if not os.path.isdir(work_dir):
            raise ToolError(f"work_dir {work_dir!r} is not an existing directory")
    key = _client_key(daemon, ctx)
    index = None
    if objective_id is not None:
        try:
            index = (await daemon.runtime.store.writer.submit(add_objective_task, objective_id, task)).index
        except NotFound:
            raise ToolError(f"no objective {objective_id!r}") from None
    try:
        session_id = await queue.dispatch(task, config=config, work_dir=work_dir, client_id=key, source="mcp")
    except RoostError as exc:
        raise ToolError(f"the task could not be queued: {exc}") from None
    if objective_id is not None and index is not None:
        await daemon.runtime.store.writer.submit(start_objective_task, objective_id, index, session_id)
    return {"sessionId": session_id, "position": queue.position(session_id) or 0, "objectiveId": objective_id}
