"""App-server runs: ``run/start`` and ``run/interrupt``.

app-server-protocol.md, "Turns and execution runs" and "Interruption". A run is one invocation
that may span several turns of one thread. Its first turn carries the prompt; with
``output_schema`` the final agent message of a turn must be a JSON value valid against that JSON
Schema, and while it is not (and ``max_turns`` allows) a *correction turn* inside the same run asks
the model again, naming the validation error.

Lifecycle (``status``)::

    accepted -> running -> completed | failed | interrupted | timed_out | cancelled

* ``accepted``: the run row exists, its first turn is being admitted (never seen by a client
  unless admission hangs); ``running``: a turn of the run is admitted or running.
* ``completed``: the last turn completed (and its output is valid); ``result.exit_code`` 0.
* ``failed``: a turn failed, a correction turn could not be admitted, or ``max_turns`` turns gave
  no valid output; exit code 1 and ``error``.
* ``interrupted``: ``run/interrupt`` (any reason but ``timeout``) or ``turn/interrupt`` of the
  run's turn; exit code 1.
* ``timed_out``: ``timeout_ms`` elapsed (the current turn is interrupted), or ``run/interrupt``
  with ``reason: "timeout"``; exit code 124 (the convention of ``timeout(1)``).
* ``cancelled``: the client went away or the server shut down while the run was live; exit code 1.

Notifications: ``run/started`` (after the ``run/start`` response, before the first turn's
``turn/started``) and ``run/updated`` on every status change and whenever a turn joins the run.
Turn notifications carry the ``run_id`` in their turn object.

Ownership: a run is driven by a task of the session that started it, listed in the process's
:class:`RunRegistry`. A run that the database shows live (``accepted``/``running``) but that this
process does not own is interrupted through its owner over the node bus, or answers
``run/interrupt`` with ``run_not_attached`` when the owner is not on the bus (``_as_remote``). Runs of persistent
threads are stored with :func:`roost.storage.create_run`/``update_run`` (``kind`` ``"run"``; the
request, resolved runtime, workspace, turns and result in ``metadata``); runs of ephemeral threads
live in memory only.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import trio

from roost import _faults as faults
from roost.actors import InterruptTurn, IsBusy, Snapshot, StartTurn, shielded_cleanup
from roost.errors import (
    InvalidParams,
    ProtocolError,
    RoostError,
    ThreadBusy,
)
from roost.protocol._appserver import AppServerSession, method
from roost.protocol._as_common import check_writable, thread_actor
from roost.protocol._as_run_state import (
    RUN_STATUSES,
    TERMINAL_STATUSES,
    LiveRun,
    Outcome,
    RunRegistry,
    check_output,
    correction_prompt,
    exit_code_for,
    make_validator,
    runs_of,
    schema_instruction,
)
from roost.protocol._as_turns import _check_permission, _input, check_documents
from roost.protocol._params import DICT, INT, LIST, STR, check_params
from roost.storage import create_run, get_run, new_id, update_run, utc_now

__all__ = [
    "RUN_STATUSES",
    "TERMINAL_STATUSES",
    "LiveRun",
    "RunRegistry",
    "runs_of",
    "exit_code_for",
    "check_output",
    "correction_prompt",
]

log = logging.getLogger("roost.runs")

#: ``max_turns`` when the request does not give it, and the largest accepted.
DEFAULT_MAX_TURNS = 3
MAX_TURNS_LIMIT = 100
#: Seconds the clean-up of a stopping run may take (interrupting its turn, persisting the end).
SETTLE_TIMEOUT = 15.0
#: Seconds ``run/interrupt`` waits for the run to settle before answering with its current state.
INTERRUPT_WAIT = 15.0
#: How many recent turns a snapshot is asked for when looking for a turn's final message.
_SNAPSHOT_TURNS = 8


# -- persistence ------------------------------------------------------------------------------------


async def _persist(run: LiveRun, *, create: bool = False) -> None:
    """Write the run's row (create or update); failures are logged, never raised (the run goes on)."""
    if run.ephemeral:
        return
    writer = run.session.runtime.store.writer
    try:
        if create:
            await writer.submit(
                functools.partial(
                    create_run,
                    thread_id=run.thread_id,
                    id=run.id,
                    kind="run",
                    status=run.status,
                    owner=run.session.runtime.services.owner,
                    metadata=run.metadata(),
                )
            )
        else:
            await writer.submit(
                functools.partial(
                    update_run,
                    status=run.status,
                    error=run.error,
                    metadata=run.metadata(),
                    completed_at=run.completed_at,
                ),
                run.id,
            )
    except RoostError:
        if create:
            raise
        log.exception("run %s: could not persist its state (%s)", run.id, run.status)


async def _read_run(session: AppServerSession, run_id: str) -> Any:
    store = session.runtime.store

    def read() -> Any:
        with store.read() as conn:
            return get_run(conn, run_id)

    return await trio.to_thread.run_sync(read)


def _announce(run: LiveRun, name: str) -> None:
    run.session.notify(name, {"thread_id": run.thread_id, "run": run.view()})


# -- methods ----------------------------------------------------------------------------------------

_START = {
    "thread_id": (STR, True),
    "prompt": (STR, False),
    "request": (DICT, False),
    "max_turns": (INT, False),
    "timeout_ms": (INT, False),
    "output_schema": (DICT, False),
    "images": (LIST, False),
    "files": (LIST, False),
    "client_id": (STR, False),
    "content_parts": (LIST, False),
    "permission_mode": (STR, False),
}


@method("run/start")
async def run_start(session: AppServerSession, params: Any) -> dict:
    """``run/start``: admit the run's first turn and answer ``{run}``; the run goes on in the background.

    Raises:
        InvalidParams: bad params (``request.mode`` other than ``start``, ``max_turns`` < 1,
            ``timeout_ms`` <= 0, an ``output_schema`` that is not a valid JSON Schema, a manual
            compact command, no provider configured); Unsupported: a binary file attachment.
        ThreadNotFound, ReadOnly (archived thread), ThreadBusy: no run is left live.
    """
    p = check_params("run/start", params, _START)
    request, prompt, images, parts, max_turns, timeout_ms, schema = _start_params(p)
    validator = make_validator(schema) if schema is not None else None

    actor = await thread_actor(session, p["thread_id"])
    check_writable(actor)
    _check_permission(actor, p)
    settings = session.engines.settings_for(actor.facts().thread)
    check_documents(session, actor, images)
    if await actor.ref.ask(IsBusy()):
        raise ThreadBusy(f"thread {p['thread_id']} is executing a turn")
    thread = actor.view()
    request.update(prompt=p.get("prompt"), max_turns=max_turns, timeout_ms=timeout_ms, output_schema=schema)
    deadline = trio.current_time() + timeout_ms / 1000 if timeout_ms is not None else float("inf")
    run = LiveRun(
        id=new_id("run"),
        thread_id=thread["id"],
        actor=actor,
        session=session,
        origin=session.origin(),
        request=request,
        runtime={
            "engine": "roost",
            "owner": session.runtime.services.owner,
            "provider": settings.provider,
            "model": settings.model,
            "effort": thread.get("effort"),
            "permission_mode": thread.get("permission_mode") or "standard",
        },
        workspace={"cwd": thread.get("cwd"), "worktree": thread.get("worktree")},
        schema=schema,
        validator=validator,
        max_turns=max_turns,
        ephemeral=bool(thread.get("ephemeral")),
        scope=trio.CancelScope(deadline=deadline),
    )
    await _persist(run, create=True)
    faults.point("run.accepted")
    registry = runs_of(session.runtime)
    registry.add(run)

    # The engines have no structured-output option: the schema travels in the first prompt.
    first_prompt = prompt if schema is None else "\n\n".join(filter(None, (prompt, schema_instruction(schema))))
    parts = parts if first_prompt == prompt else None  # presentation metadata must match the prompt
    ack = session.after_response()
    turn_ack = trio.Event()
    await _admit_first_turn(run, registry, first_prompt, images, parts, p.get("client_id"), turn_ack)
    assert session.nursery is not None  # set while the session serves requests
    session.nursery.start_soon(_drive, run, ack, turn_ack)
    return {"run": run.view()}


def _start_params(p: dict) -> tuple[dict, str, Any, Any, int, int | None, dict | None]:
    """The checked ``run/start`` input: ``(request, prompt, images, content_parts, max_turns,
    timeout_ms, output_schema)``.

    Raises:
        InvalidParams: see :func:`run_start`.
    """
    request = dict(p.get("request") or {"mode": "start"})
    mode = request.setdefault("mode", "start")
    if mode != "start":
        raise InvalidParams(f'request.mode {mode!r} is not supported; run/start takes request.mode "start"')
    prompt, images, parts = _input(p)  # the same input rules as turn/start (text files are inlined)
    if not prompt and not images:
        raise InvalidParams("prompt is required")
    if prompt.lstrip().startswith("/compact"):
        raise InvalidParams("run/start rejects manual compact commands; use the session compaction interface")
    max_turns = p.get("max_turns", DEFAULT_MAX_TURNS)
    if not 1 <= max_turns <= MAX_TURNS_LIMIT:
        raise InvalidParams(f"max_turns must be between 1 and {MAX_TURNS_LIMIT}, not {max_turns}")
    timeout_ms = p.get("timeout_ms")
    if timeout_ms is not None and timeout_ms <= 0:
        raise InvalidParams(f"timeout_ms must be a positive number of milliseconds, not {timeout_ms}")
    return request, prompt, images, parts, max_turns, timeout_ms, p.get("output_schema")


async def _admit_first_turn(
    run: LiveRun,
    registry: RunRegistry,
    first_prompt: str,
    images: Any,
    parts: Any,
    client_id: str | None,
    turn_ack: trio.Event,
) -> None:
    """Admit the run's first turn and mark the run running (persisted, shielded). Never
    admitted, the run ends here, recorded as cancelled with the admission error, which is raised."""
    try:
        turn = await run.actor.ref.ask(
            StartTurn(
                prompt=first_prompt or None,
                images=images,
                client_id=client_id,
                content_parts=parts,
                origin=run.origin,
                run_id=run.id,
                ack=turn_ack,
            )
        )
    except BaseException as exc:
        # Never admitted: the run ends here, recorded as cancelled with the admission error.
        run.status = "cancelled"
        code = exc.code if isinstance(exc, ProtocolError) else "internal_error"
        run.error = {"code": code, "message": str(exc)}
        run.completed_at = run.updated_at = utc_now()
        with trio.CancelScope(shield=True):
            await _persist(run)
        registry.finish(run)
        run.done.set()
        raise
    run.status = "running"
    run.started_at = run.updated_at = utc_now()
    run.current_turn_id = turn["id"]
    run.turns.append({"id": turn["id"], "status": turn["status"], "purpose": "start"})
    with trio.CancelScope(shield=True):  # the admitted turn must get its driver
        await _persist(run)


# -- driving a run ----------------------------------------------------------------------------------


async def _drive(run: LiveRun, ack: trio.Event, turn_ack: trio.Event) -> None:
    """The background task of one run: announce it, follow its turns, settle it exactly once.

    Never raises an ``Exception`` into the session's nursery: a bug fails the run (logged).

    Cancellation: the run's own scope (interrupt, deadline, session closing) ends the loop; the
    current turn is then interrupted and the end persisted and announced, shielded and bounded by
    :data:`SETTLE_TIMEOUT`. A cancellation from outside (the session's nursery) settles the run
    ``cancelled`` the same way, then propagates.
    """
    outcome: Outcome | None = None
    try:
        with trio.move_on_after(5):
            await ack.wait()
        _announce(run, "run/started")
        turn_ack.set()
        with run.scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_on_close, run)
                outcome = await _follow(run)
                nursery.cancel_scope.cancel()
    finally:
        turn_ack.set()
        with shielded_cleanup(SETTLE_TIMEOUT):
            try:
                if outcome is None:
                    status = run.stop_reason or ("timed_out" if run.scope.cancelled_caught else "cancelled")
                    outcome = Outcome(status, error=_stop_error(run, status))
                await _stop_current_turn(run, outcome.status)
                if outcome.item is None and run.current_turn_id is not None:
                    outcome.item = await _final_message(run, run.current_turn_id)
            except Exception:
                log.exception("run %s: clean-up failed", run.id)
            finally:
                await _settle(
                    run,
                    outcome
                    or Outcome("failed", error={"code": "internal_error", "message": "the run's clean-up failed"}),
                )


async def _cancel_on_close(run: LiveRun) -> None:
    await run.session.closed.wait()
    if run.stop_reason is None:
        run.stop_reason = "cancelled"
    run.scope.cancel()


async def _follow(run: LiveRun) -> Outcome:
    """Wait for each turn of the run; start correction turns while the output is invalid."""
    try:
        while True:
            turn_id = run.current_turn_id
            view = await run.actor.wait_turn_end(turn_id)
            _record_turn(run, view)
            if view["status"] == "failed":
                error = view.get("error") or {}
                return Outcome(
                    "failed",
                    item=await _final_message(run, turn_id),
                    error={
                        "code": "turn_failed",
                        "message": f"turn {turn_id} failed: {error.get('message', 'unknown error')}",
                        "turn_error": error,
                    },
                )
            if view["status"] != "completed":
                status = _interrupted_status(run, view)
                return Outcome(status, item=await _final_message(run, turn_id), error=_stop_error(run, status))
            item = await _final_message(run, turn_id)
            if run.validator is None:
                return Outcome("completed", item=item)
            output, problem = check_output(run.validator, (item or {}).get("text"))
            if problem is None:
                return Outcome("completed", item=item, output=output)
            if len(run.turns) >= run.max_turns:
                return Outcome(
                    "failed",
                    item=item,
                    error={
                        "code": "output_invalid",
                        "message": f"no output valid against output_schema after {len(run.turns)} turn(s): {problem}",
                    },
                )
            error = await _start_correction(run, problem)
            if error is not None:
                return Outcome("failed", item=item, error=error)
    except Exception as exc:  # a bug or an unexpected store failure: the run fails, the session lives
        log.exception("run %s failed", run.id)
        return Outcome("failed", error={"code": "internal_error", "message": f"{type(exc).__name__}: {exc}"})


async def _start_correction(run: LiveRun, problem: str) -> dict | None:
    """Admit a correction turn in the run; return an error dict if it cannot be admitted."""
    assert run.schema is not None
    try:
        with trio.CancelScope(shield=True):  # never lose track of a turn admitted for the run
            turn = await run.actor.ref.ask(
                StartTurn(prompt=correction_prompt(problem, run.schema), origin=run.origin, run_id=run.id)
            )
    except ProtocolError as exc:
        return {"code": exc.code, "message": f"the correction turn was not admitted: {exc}"}
    except RoostError as exc:
        return {"code": "internal_error", "message": f"the correction turn was not admitted: {exc}"}
    run.current_turn_id = turn["id"]
    run.turns.append({"id": turn["id"], "status": turn["status"], "purpose": "correction"})
    run.updated_at = utc_now()
    await _persist(run)
    _announce(run, "run/updated")
    return None


def _interrupted_status(run: LiveRun, view: dict) -> str:
    """The run status after its turn ended interrupted without a run-level stop having asked for it.

    The session interrupts every turn with reason ``shutdown`` at end of input (before it counts
    as closed): that, or a closed session, makes the run ``cancelled``; any other interrupt
    (``turn/interrupt``, a lost lease) makes it ``interrupted``.
    """
    if run.stop_reason is not None:
        return run.stop_reason
    error = view.get("error") or {}
    if run.session.closed.is_set() or "shutdown" in (error.get("reason"), error.get("message")):
        return "cancelled"
    return "interrupted"


def _record_turn(run: LiveRun, view: dict) -> None:
    for entry in run.turns:
        if entry["id"] == view["id"]:
            entry["status"] = view["status"]


def _stop_error(run: LiveRun, status: str) -> dict:
    if status == "timed_out":
        timeout_ms = run.request.get("timeout_ms")
        message = (
            f"the run exceeded timeout_ms ({timeout_ms} ms)"
            if run.stop_reason is None and timeout_ms
            else "the run was interrupted with reason timeout"
        )
        return {"code": "timed_out", "message": message}
    if status == "cancelled":
        return {"code": "cancelled", "message": "the client went away or the server shut down"}
    return {"code": "interrupted", "message": "the run was interrupted"}


async def _stop_current_turn(run: LiveRun, status: str) -> None:
    """Interrupt the run's current turn if it is still running and wait for its end (caller bounds)."""
    turn_id = run.current_turn_id
    entry = next((t for t in run.turns if t["id"] == turn_id), None)
    if turn_id is None or (entry is not None and entry["status"] not in ("running", "queued")):
        return
    reason = {"timed_out": "timeout", "cancelled": "cancelled"}.get(status, "interrupted")
    try:
        reply = await run.actor.ref.ask(InterruptTurn(turn_id=turn_id, reason=reason))
        if reply.get("interrupted"):
            _record_turn(run, await run.actor.wait_turn_end(turn_id))
    except RoostError as exc:
        log.warning("run %s: could not interrupt turn %s: %s", run.id, turn_id, exc)


async def _final_message(run: LiveRun, turn_id: str | None) -> dict | None:
    """The last agent message item of turn ``turn_id`` (None when it has none, or no turn)."""
    try:
        snap = await run.actor.ref.ask(Snapshot(_SNAPSHOT_TURNS))
        turn = next((t for t in snap["turns"] if t["id"] == turn_id), None)
        if turn is None:
            snap = await run.actor.ref.ask(Snapshot(None))
            turn = next((t for t in snap["turns"] if t["id"] == turn_id), None)
    except RoostError as exc:
        log.warning("run %s: could not read turn %s: %s", run.id, turn_id, exc)
        return None
    messages = [i for i in (turn or {}).get("items", ()) if i.get("type") == "agent_message"]
    return messages[-1] if messages else None


async def _settle(run: LiveRun, outcome: Outcome) -> None:
    """Make the run terminal: result, error, persisted row, run/updated, ``done``; exactly once."""
    if run.status in TERMINAL_STATUSES:
        return
    run.status = outcome.status
    run.error = outcome.error
    run.result = {
        "turn_id": run.current_turn_id,
        "item_id": (outcome.item or {}).get("id"),
        "output": outcome.output,
        "exit_code": exit_code_for(outcome.status),
    }
    run.completed_at = run.updated_at = utc_now()
    try:
        await _persist(run)
    except Exception:
        log.exception("run %s: could not persist its end", run.id)
    finally:
        runs_of(run.session.runtime).finish(run)
        _announce(run, "run/updated")
        run.done.set()
