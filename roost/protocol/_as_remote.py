"""App-server requests for work that executes in another process on the same store.

``turn/interrupt``, ``turn/steer`` and ``turn/queue`` for a thread whose live execution lease
another node holds are forwarded to that node (``_as_common.forwarded``, over
:class:`roost.actors.ThreadRemote`) and answered with its result or its error (same codes); its
notifications reach this client through the relay. ``run/interrupt`` (defined here) of a live run
another node owns is forwarded to that node's ``run.interrupt`` handler
(:func:`install_run_handlers`), which interrupts it exactly as a local ``run/interrupt`` would.

When the owner is not on the bus (a one-shot command, a stale heartbeat, a dead process), or does
not take the request in time (it is withdrawn unclaimed), the local rules apply: pending input is
held (``turn/held``, reason ``executing_elsewhere``), ``turn/interrupt`` answers ``thread_busy``,
``run/interrupt`` answers ``run_not_attached`` (app-server-protocol.md, "Interruption").
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from roost.errors import NodeUnreachable, NotFound, RunNotAttached, RunNotFound
from roost.protocol._appserver import AppServerSession, method
from roost.protocol._as_run_state import TERMINAL_STATUSES, runs_of, stored_view
from roost.protocol._as_runs import INTERRUPT_WAIT, _read_run
from roost.protocol._params import STR, check_params

__all__ = ["install_run_handlers"]

log = logging.getLogger("roost.appserver")


@method("run/interrupt")
async def run_interrupt(session: AppServerSession, params: Any) -> dict:
    """``run/interrupt {run_id, reason?}``: stop a live run and answer ``{run}``.

    ``reason: "timeout"`` settles the run ``timed_out``, any other reason ``interrupted``. The
    answer waits (at most ``INTERRUPT_WAIT`` seconds) for the run to settle. A terminal run is
    returned as-is. A live run of another node on the bus is interrupted there.

    Raises:
        RunNotFound: no such run. RunNotAttached: the run is live but owned by a process that is
            not on the bus (or did not take the request).
    """
    p = check_params("run/interrupt", params, {"run_id": (STR, True), "reason": (STR, False)})
    runtime = session.runtime
    if runs_of(runtime).get(p["run_id"]) is not None:
        return await _interrupt_here(runtime, p["run_id"], p.get("reason"))
    try:
        row = await _read_run(session, p["run_id"])
    except NotFound:
        raise RunNotFound(f"no run {p['run_id']}") from None
    if row.status in TERMINAL_STATUSES:
        return {"run": stored_view(row)}
    bus = runtime.services.bus
    if bus is not None and row.owner and row.owner != bus.node_id and await bus.node_alive(row.owner):
        try:
            return await bus.request(row.owner, "run.interrupt", {"run_id": row.id, "reason": p.get("reason")})
        except NodeUnreachable as exc:
            log.warning("run %s: interrupt not taken by %s (%s)", row.id, row.owner, exc)
    raise RunNotAttached(
        f"run {row.id} is {row.status} in another process ({row.owner or 'unknown owner'}); "
        "interrupt it through the app-server that started it"
    )


async def _interrupt_here(runtime: Any, run_id: str, reason: str | None) -> dict:
    """Interrupt run ``run_id`` of this process (``{run}``; a terminal run as it is).

    Raises:
        RunNotAttached: not a live run of this process (it ended and was forgotten, or it is
            another process's).
        RunNotFound: no such run.
    """
    run = runs_of(runtime).get(run_id)
    if run is None:

        def read() -> Any:
            with runtime.store.read() as conn:
                return runtime.store.get_run(conn, run_id)

        try:
            row = await trio.to_thread.run_sync(read)
        except NotFound:
            raise RunNotFound(f"no run {run_id}") from None
        if row.status in TERMINAL_STATUSES:
            return {"run": stored_view(row)}
        raise RunNotAttached(f"run {run_id} is {row.status} but not attached to {runtime.services.owner}")
    if run.status not in TERMINAL_STATUSES:
        if run.stop_reason is None:
            run.stop_reason = "timed_out" if reason == "timeout" else "interrupted"
        run.scope.cancel()
        with trio.move_on_after(INTERRUPT_WAIT):
            await run.done.wait()
    return {"run": run.view()}


def install_run_handlers(runtime: Any) -> None:
    """Serve other nodes' ``run/interrupt`` for this process's runs (``run.interrupt`` on the bus)."""
    bus = runtime.services.bus
    if bus is None:
        return

    async def on_run_interrupt(message: Any) -> dict:
        data = message.body.get("data") or {}
        return await _interrupt_here(runtime, str(data.get("run_id")), data.get("reason"))

    bus.on("run.interrupt", on_run_interrupt)
