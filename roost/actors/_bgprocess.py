"""Background processes of threads (app-server-protocol.md, "Background process triggers").

The shell tool with ``background: true`` starts its command through :meth:`ProcessManager.start`
instead of waiting for it: the process runs in the manager's nursery (for as long as the server
runs; ``PR_SET_PDEATHSIG`` still ties it to Roost), its output is kept as a bounded tail, and its
row in ``background_processes`` records status, exit code and its exit trigger.

Exit trigger (``trigger.status``): ``waiting`` while it runs; on exit ``received`` (persisted),
then the thread is given a continuation input with the exit status and output tail (source id
``roost:process:<id>``; it starts a turn when the thread is idle, or is admitted at the next
model request of a running turn), and the trigger becomes ``handled`` once a turn admitted it
(seen when the notice starts a turn, and when ``process/list`` or ``process/read`` finds it in
the thread's history). A notice still ``received`` when Roost ended (kept only in memory while a
turn ran) is delivered again at start-up (:meth:`ProcessManager.reconcile`), unless the thread
admitted it or keeps it as held work. ``process/cancel-notifications`` sets ``cancelled`` (durably; the
process keeps running), ``process/stop`` stops the process group and sets ``stopped``. A process
that ended with Roost (the server exited, or crashed) is ``lost``: on shutdown the manager stops
its processes and records them so; on start-up, ``running`` rows of a dead owner are marked
``lost``, so none is silently forgotten.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from typing import Any

import trio

from roost import _faults as faults
from roost.actors._messages import DeliverInternal
from roost.errors import InvalidParams, NotFound, RoostError
from roost.storage import (
    get_bg_process,
    insert_bg_process,
    list_bg_processes,
    mark_lost_bg_processes,
    new_id,
    received_bg_processes,
    record_bg_exit,
    running_owners,
    tool_process_hook,
    update_bg_process,
)
from roost.storage.leases import owner_is_dead
from roost.tools import MARK_ENV, OutputBuffer, spawn_shell, stop_process_group

__all__ = ["ProcessManager", "process_view"]

log = logging.getLogger("roost.processes")

#: Output bytes kept per process (beginning and end, like the shell tool's result).
OUTPUT_CAP_BYTES = 64 * 1024
#: Characters of the output tail given to the model with the exit notice.
CONTINUATION_TAIL_CHARS = 4000
_GRACE_S = 2.0


def process_view(row: dict) -> dict:
    """The ``process`` object: ``{id, thread_id, command, cwd, pid, status, exit_code, reason,
    started_at, ended_at, trigger: {status, on_exit}}``."""
    return {
        "id": row["id"],
        "thread_id": row["thread_id"],
        "command": row["command"],
        "cwd": row["cwd"],
        "pid": row["pid"],
        "status": row["status"],
        "exit_code": row["exit_code"],
        "reason": row["reason"],
        "started_at": row["started_at"],
        "ended_at": row["ended_at"],
        "trigger": {"status": row["trigger_status"], "on_exit": row["on_exit"]},
    }


class _Live:
    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.out = OutputBuffer(OUTPUT_CAP_BYTES)
        self.stopping = False
        self.drained = trio.Event()  # the output pipe is read to its end
        self.forget: tuple[Any, int] | None = None  # (tool process hook, marker) to forget on exit


class ProcessManager:
    """Starts, tracks and stops background processes for one runtime.

    Args:
        services: the runtime's services (``store``, ``owner``).
        registry: the runtime's thread registry (``await registry.get(thread_id)``).
        nursery: where the processes' watchers run (open for the server's lifetime).
    """

    def __init__(self, services: Any, registry: Any, nursery: trio.Nursery) -> None:
        self.services = services
        self.registry = registry
        self.nursery = nursery
        self.live: dict[str, _Live] = {}

    async def _write(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await self.services.store.writer.submit(fn, *args, **kwargs)

    async def _read(self, fn: Any, *args: Any) -> Any:
        store = self.services.store

        def run() -> Any:
            with store.read() as conn:
                return fn(conn, *args)

        return await trio.to_thread.run_sync(run)

    async def reconcile(self) -> list[dict]:
        """Start-up: mark ``running`` rows of dead owners (an earlier Roost that ended) ``lost``
        (returns them), and deliver again the exit notices those owners left ``received``."""
        owners = [o for o in await self._read(running_owners) if o != self.services.owner and owner_is_dead(o)]
        lost = await self._write(mark_lost_bg_processes, owners, "Roost ended while the process ran") if owners else []
        for row in await self._read(received_bg_processes):
            if row["owner"] == self.services.owner or not owner_is_dead(row["owner"]):
                continue  # its owner still runs and delivers it
            try:
                if not await self._settle_received(row):
                    await self._deliver(row)
            except RoostError:
                log.exception("background process %s: the exit notice stays received", row["id"])
        return lost

    def starter(self, thread_id: str) -> Any:
        """The ``ToolContext.start_background`` callable of ``thread_id``'s tool calls."""

        async def start(command: str, cwd: Path) -> dict:
            return await self.start(thread_id, command, cwd)

        return start

    async def start(self, thread_id: str, command: str, cwd: Path) -> dict:
        """Start ``command`` in the background for ``thread_id``; returns its ``process`` view.

        Raises:
            OSError: the shell could not be started.
        """
        # Nothing runs that the store does not know about first (issue 18, finding 2): the
        # intent, keyed by a marker every process of the command inherits, commits before the
        # fork, so a kill at any point leaves a row that start-up reconciliation reaps by.
        hook = tool_process_hook(self.services.store.writer, self.services.owner, thread_id)
        mark = secrets.randbits(62) + 1
        try:
            await hook(-mark, True)
        except RoostError as exc:
            raise OSError(f"the command was not started: it could not be recorded first ({exc})") from exc
        env = {**os.environ, "PAGER": "cat", "GIT_PAGER": "cat", MARK_ENV: str(mark)}
        process = await spawn_shell(command, cwd=str(cwd), env=env)
        faults.point("process.spawned")
        await hook(process.pid, True)
        process_id = new_id("proc")
        live = self.live[process_id] = _Live(process)
        live.forget = (hook, mark)
        try:
            row = await self._write(
                insert_bg_process,
                id=process_id,
                thread_id=thread_id,
                owner=self.services.owner,
                pid=process.pid,
                command=command,
                cwd=str(cwd),
            )
        except BaseException:
            with trio.CancelScope(shield=True):
                await stop_process_group(process, grace_s=_GRACE_S)
            self.live.pop(process_id, None)
            raise
        self.nursery.start_soon(self._watch, process_id, live)
        return process_view(row)

    async def _watch(self, process_id: str, live: _Live) -> None:
        process = live.process
        assert process.stdout is not None
        async with trio.open_nursery() as nursery:

            async def pump() -> None:
                assert process.stdout is not None
                while chunk := await process.stdout.receive_some(65536):
                    live.out.add(bytes(chunk))

            nursery.start_soon(pump)
            await process.wait()
            nursery.cancel_scope.deadline = trio.current_time() + 1.0  # drain what is buffered
        with trio.CancelScope(shield=True):
            await process.stdout.aclose()
            live.drained.set()
            self.live.pop(process_id, None)
            if live.forget is not None:  # the group ended: nothing of it is left to reap
                hook, mark = live.forget
                await hook(process.pid, False)
                await hook(-mark, False)
            if live.stopping:
                return  # stop() records the outcome
            # the exit and a waiting trigger's ``received`` commit together: a crash between
            # two writes would leave a notice no restart delivers
            row = await self._write(
                record_bg_exit,
                process_id,
                exit_code=process.returncode,
                ended_at=_now(),
                output_tail=live.out.text(),
            )
        await self._trigger(row)

    async def _trigger(self, row: dict) -> None:
        """The exit trigger: ``waiting`` -> ``received`` (with the exit, :func:`record_bg_exit`)
        -> continuation input -> ``handled``."""
        if row["trigger_status"] != "received":
            return  # cancelled or stopped: no notification
        try:
            await self._deliver(row)
        except RoostError:
            log.exception("background process %s: the exit notice stays received", row["id"])

    async def _deliver(self, row: dict) -> None:
        """Give the thread the exit notice of ``row``; the trigger becomes ``handled`` if a turn
        admitted it at once (else it stays ``received`` until one does)."""
        tail = (row["output_tail"] or "")[-CONTINUATION_TAIL_CHARS:]
        text = (
            f"[background process {row['id']} exited with status {row['exit_code']}]\n"
            f"command: {row['command']}\noutput (tail):\n{tail}"
        )
        actor = await self.registry.get(row["thread_id"])
        await actor.ref.ask(DeliverInternal(text=text, start_turn=True, source_id=_source(row["id"])), timeout=30)
        await self._settle_received(row)

    async def _settle_received(self, row: dict) -> bool:
        """Whether the exit notice of ``row`` (trigger ``received``) is taken care of: admitted
        into the thread's history (the trigger is then written ``handled``), or kept as the
        thread's held work (it stays ``received``)."""
        actor = await self.registry.get(row["thread_id"])
        source = _source(row["id"])
        if actor.consumed(source):
            row.update(await self._write(update_bg_process, row["id"], trigger_status="handled"))
            return True
        return any(entry.get("client_id") == source for entry in actor.held)

    async def _views(self, rows: list[dict]) -> list[dict]:
        """``process`` views of ``rows``; a ``received`` notice a turn has admitted since is
        recorded ``handled`` first."""
        for row in rows:
            if row["trigger_status"] == "received" and row["status"] == "exited":
                try:
                    await self._settle_received(row)
                except RoostError:
                    log.exception("background process %s: could not settle its exit notice", row["id"])
        return [process_view(r) for r in rows]

    async def owned(self, thread_id: str, process_id: str) -> dict:
        """The row of ``process_id`` if ``thread_id`` owns it.

        Raises:
            InvalidParams: no such process of that thread.
        """
        try:
            row = await self._read(get_bg_process, process_id)
        except NotFound:
            row = None
        if row is None or row["thread_id"] != thread_id:
            raise InvalidParams(f"thread {thread_id} has no background process {process_id!r}")
        return row

    async def list(self, thread_id: str) -> list[dict]:
        """The thread's own processes, oldest first (views)."""
        return await self._views(await self._read(list_bg_processes, thread_id))

    async def read(self, thread_id: str, process_id: str) -> tuple[dict, str]:
        """``(view, output)``: the live output so far, or the recorded tail (read-only)."""
        row = await self.owned(thread_id, process_id)
        live = self.live.get(process_id)
        (view,) = await self._views([row])
        return view, live.out.text() if live is not None else row["output_tail"]

    async def stop(
        self, thread_id: str, process_id: str, *, status: str = "stopped", reason: str | None = "stopped by the client"
    ) -> dict:
        """Stop the process group (if running) and record ``status``; the trigger becomes ``stopped``."""
        row = await self.owned(thread_id, process_id)
        live = self.live.get(process_id)
        if live is None or row["status"] != "running":
            return process_view(row)
        live.stopping = True
        with trio.CancelScope(shield=True):
            await stop_process_group(live.process, grace_s=_GRACE_S)
            with trio.move_on_after(_GRACE_S):
                await live.drained.wait()  # keep the output it wrote before it stopped
            trigger = "stopped" if row["trigger_status"] == "waiting" else row["trigger_status"]
            row = await self._write(
                update_bg_process,
                process_id,
                status=status,
                exit_code=live.process.returncode,
                ended_at=_now(),
                reason=reason,
                trigger_status=trigger,
                output_tail=live.out.text(),
            )
        return process_view(row)

    async def cancel_notifications(self, thread_id: str, process_id: str) -> dict:
        """Durably cancel the exit notification (the process keeps running)."""
        row = await self.owned(thread_id, process_id)
        if row["trigger_status"] == "waiting":
            row = await self._write(update_bg_process, process_id, trigger_status="cancelled")
        return process_view(row)

    async def aclose(self) -> None:
        """Server exit: stop every live process and record it ``lost`` (ended with Roost)."""
        for process_id in list(self.live):
            try:
                row = await self._read(get_bg_process, process_id)
                await self.stop(row["thread_id"], process_id, status="lost", reason="Roost exited while it ran")
            except RoostError:
                log.exception("background process %s: could not record its end", process_id)


def _source(process_id: str) -> str:
    """The source id (``client_id``) of the exit notice of ``process_id``."""
    return f"roost:process:{process_id}"


def _now() -> str:
    from roost.storage import utc_now

    return utc_now()
