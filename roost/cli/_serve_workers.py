"""``roost serve --workers N``: the front door and its headless worker processes (issue 19, "Every
core").

The front door (``roost serve``: sockets, HTTP, clients, schedules) starts N-1 workers, each the
same ``roost`` (``python -m roost serve ... --worker``) on the same store and ``$ROOST_HOME``. A
worker listens on nothing: its task queue claims tasks from the queue shared by every process of
the store (:func:`roost.storage.claim_daemon_task`, the lease deciding who runs a task), and the
events of a task it runs reach the front door's clients over the node bus
(:mod:`roost.actors._taskqueue_relay`), its approvals too.

Supervision: :class:`WorkerPool` restarts a worker that exits (after a back-off of at most
:data:`BACKOFF_MAX` seconds) and stops them with the front door. A worker's stdin is a pipe from
the front door; the worker stops when it reads end of file. So a front door that dies, even by
``kill -9``, never leaves orphans: the kernel closes the pipe and every worker stops (its running
tasks stay ``running`` in the store and are resumed, ``task_resumed``, by the next process).

Wake-up: SQLite has no ``NOTIFY``, so the same pipe carries it. When the front door queues a task
and none of its own runners is idle (:attr:`TaskQueue.on_unclaimed`), :meth:`WorkerPool.wake`
writes one byte to every live worker, and each byte read wakes one idle runner of the worker
(:meth:`TaskQueue.wake_one`). Without it a worker's idle runner would find the task only at its
next poll (``ROOST_TASK_POLL_S``, 1 s).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any

import attrs
import trio

from roost.cli._logs import WORKER_INDEX_ENV
from roost.storage import iso_from_unix

__all__ = ["WorkerPool", "worker_argv", "run_worker", "DEFAULT_WORKERS"]

log = logging.getLogger("roost.serve")

#: Processes of ``roost serve`` without ``--workers`` (or ``ROOST_SERVE_WORKERS``): one.
DEFAULT_WORKERS = 1
#: Most seconds between two restarts of a worker that keeps exiting.
BACKOFF_MAX = 5.0
#: Seconds a worker may take to stop after its stdin closes, before it is killed.
STOP_TIMEOUT = 15.0


def worker_argv(argv: list[str]) -> list[str]:
    """The command of a worker: this interpreter's ``roost`` with the front door's ``serve``
    arguments (``argv``, without ``--workers``) and ``--worker``."""
    args, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            args.append(arg)
    return [sys.executable, "-m", "roost", *args, "--worker"]


@attrs.define(eq=False)
class WorkerState:
    """One worker slot as ``roost status`` shows it."""

    index: int
    pid: int | None = None
    started_at: float | None = None
    restarts: int = 0
    last_exit: int | None = None
    #: set by :meth:`WorkerPool.wake`, cleared when the wake-up byte is written
    wake: trio.Event = attrs.field(factory=trio.Event, repr=False)

    def view(self) -> dict:
        return {
            "index": self.index,
            "pid": self.pid,
            "alive": self.pid is not None,
            "startedAt": None if self.started_at is None else iso_from_unix(self.started_at),
            "uptimeSeconds": None if self.started_at is None else round(time.time() - self.started_at, 3),
            "restarts": self.restarts,
            "lastExit": self.last_exit,
        }


class WorkerPool:
    """The front door's N-1 worker processes (see the module doc).

    Args:
        argv: a worker's command (:func:`worker_argv`).
        count: workers to keep running (the front door is the N-th process).
        queue: the front door's :class:`~roost.actors.TaskQueue` (None: workers find tasks by polling).
    """

    def __init__(self, argv: list[str], count: int, queue: Any = None) -> None:
        self.argv, self.count, self.queue = argv, count, queue
        self.workers = [WorkerState(i) for i in range(count)]

    def wake(self) -> None:
        """Ask every live worker to look at the shared queue now (a task became claimable).
        Never blocks: each worker's pending wake-up is written by its own task."""
        for state in self.workers:
            if state.pid is not None:
                state.wake.set()

    def views(self) -> list[dict]:
        """``[{index, pid, alive, startedAt, uptimeSeconds, restarts, lastExit}]`` of the workers:
        ``startedAt`` (ISO 8601 UTC) and ``uptimeSeconds`` of the worker's last start, null before
        its first."""
        return [w.view() for w in self.workers]

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Keep every worker running until cancelled; then stop them (bounded, shielded). While
        running, a task ``queue`` (the front door's) queues with no idle runner wakes them."""
        if self.queue is not None:
            self.queue.on_unclaimed = lambda _task: self.wake()
        try:
            async with trio.open_nursery() as nursery:
                for state in self.workers:
                    nursery.start_soon(self._keep, state)
                task_status.started()
        finally:
            if self.queue is not None:
                self.queue.on_unclaimed = None

    async def _keep(self, state: WorkerState) -> None:
        backoff = 0.5
        while True:
            began = time.monotonic()
            code = await self._run_once(state)
            state.restarts += 1
            backoff = 0.5 if time.monotonic() - began > 10 else min(backoff * 2, BACKOFF_MAX)
            log.warning(
                "worker %d exited (status %s); restarting in %.1f s",
                state.index,
                code,
                backoff,
                extra={"event": "worker_exited", "worker": state.index, "status": code},
            )
            await trio.sleep(backoff)

    async def _run_once(self, state: WorkerState) -> int | None:
        env = {**os.environ, WORKER_INDEX_ENV: str(state.index)}
        process = await trio.lowlevel.open_process(self.argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
        state.pid, state.started_at = process.pid, time.time()
        log.info(
            "worker %d started (pid %d)",
            state.index,
            process.pid,
            extra={"event": "worker_started", "worker": state.index, "worker_pid": process.pid},
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_send_wakes, state, process)
                await process.wait()
                nursery.cancel_scope.cancel()
        finally:
            state.pid, state.last_exit = None, process.returncode
            if process.returncode is None:
                with trio.CancelScope(shield=True):
                    await _stop(process)
                    state.last_exit = process.returncode
        return process.returncode


async def _send_wakes(state: WorkerState, process: trio.Process) -> None:
    """Write one wake-up byte to ``process``'s stdin per :meth:`WorkerPool.wake` (coalesced while
    one is being written), until cancelled or the pipe breaks (the worker is gone)."""
    assert process.stdin is not None
    while True:
        await state.wake.wait()
        state.wake = trio.Event()
        try:
            await process.stdin.send_all(b"w")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return


async def _stop(process: trio.Process) -> None:
    """End of file on the worker's stdin (it stops), then SIGKILL after :data:`STOP_TIMEOUT` s."""
    try:
        assert process.stdin is not None
        await process.stdin.aclose()
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    with trio.move_on_after(STOP_TIMEOUT):
        await process.wait()
        return
    process.kill()
    await process.wait()


async def run_worker(options: Any, engines: Any) -> int:
    """Run a headless worker (``roost serve --worker``) until its stdin ends or SIGINT/SIGTERM;
    return 0. Its task queue claims from the store's shared queue; nothing listens.

    Raises:
        RoostError: the store cannot be opened (the front door restarts the worker).
    """
    from roost.protocol import ServeDaemon
    from roost.supervisor import open_runtime
    from roost.tools import builtin_tools

    try:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with open_runtime(engine_for=engines.engine_for, tools=builtin_tools(), node_kind="worker") as rt:
                default = engines.default
                daemon = ServeDaemon(
                    rt,
                    options,
                    provider=default.provider if default else None,
                    model=default.model if default else None,
                    engines=engines,
                )
                async with trio.open_nursery() as nursery:
                    await nursery.start(daemon.run)
                    log.info(
                        "worker %s (pid %d) serving the task queue",
                        os.environ.get(WORKER_INDEX_ENV, "?"),
                        os.getpid(),
                        extra={"event": "worker_ready"},
                    )
                    nursery.start_soon(_until_stdin_ends, nursery.cancel_scope, daemon.queue)
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        break
        return 0
    finally:
        await engines.aclose()


async def _until_stdin_ends(scope: trio.CancelScope, queue: Any) -> None:
    """Read the pipe from the front door: each byte wakes one idle runner of ``queue``
    (:meth:`TaskQueue.wake_one`); at end of file cancel ``scope`` (the worker stops)."""
    fd = sys.stdin.fileno()
    while chunk := await trio.to_thread.run_sync(os.read, fd, 4096, abandon_on_cancel=True):
        for _ in chunk:
            if not queue.wake_one():
                break
    log.info("the front door is gone (stdin closed): worker %d stops", os.getpid())
    scope.cancel()
