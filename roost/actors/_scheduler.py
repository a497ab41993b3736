"""The Scheduler actor: sleeps until the next due schedule slot, claims it, starts a run.

How ``roost serve`` starts it (a permanent child of the root supervisor, DESIGN.md section 2)::

    outcomes = TaskOutcomes(queue.lookup)     # and in TaskListener.task_finished(task):
                                              #     outcomes.finished_task(task)

    async def start_scheduler(*, task_status):
        scheduler = Scheduler(runtime.store, dispatch=queue.dispatch, wait_task=outcomes.wait,
                              owner=runtime.services.owner)
        await scheduler.run(task_status=task_status)

    await runtime.root.start_child(ChildSpec("scheduler", start_scheduler,
                                             restart=Restart.PERMANENT, shutdown_timeout=10))

Contract of the injected coroutine functions:

* ``dispatch(task, *, config, work_dir, client_id, source) -> task_id``: queue one run (the
  TaskQueue's ``dispatch``); ``client_id`` is ``None`` (nobody to ask: approvals follow the
  unattended policy), ``source`` is ``"schedule"``; ``provider``/``model`` are passed only when the
  job stores them (``schedule add --provider/--model``). The task id is the run's session id; the run record
  (``schedule_runs.session_id``) links it to the job and slot.
  ``config`` is the job's orchestration config (``schedule add --config``, an absolute path) or
  None: the TaskQueue then runs the daemon's ``roost serve -c`` default, or one agent without one.
* ``wait_task(task_id) -> outcome``: wait until the task ends and return ``"succeeded"``,
  ``"failed"`` or ``"interrupted"``; raise :class:`LookupError` (or
  :class:`~roost.errors.NotFound`) for a task the queue does not know (e.g. lost in a restart).

Behaviour (issue 7):

* Exactly once: a slot is claimed in SQLite (``UNIQUE(schedule_id, slot)``) before dispatch; a
  scheduler that loses the claim does nothing. Two daemons on one database, a run slower than the
  interval, and a restart mid-run therefore never fire a slot twice.
* The next run is computed from the slot (``cron.next_after(slot)``), never from a finish time.
* Slots missed while no daemon ran (slot earlier than this scheduler's start): ``catch_up once``
  runs the latest missed slot and records the others ``skipped``/``missed``; ``none`` records all
  of them skipped. Several slots that passed while this scheduler ran (a suspended host) are
  handled the same way, except that the latest one always runs.
* Overlap, when a run of the same job is still claimed or running: ``skip`` records the slot
  ``skipped``/``overlap``; ``queue`` claims it and dispatches it when the previous run of that job
  (in this process) ends.
* No polling tick for firing: the actor sleeps on its clock until the earliest ``next_run``. It
  wakes early on :class:`SchedulesChanged` (tell it after an in-process change) and when the
  ``schedule_changes`` counter row, bumped in the same transaction by every ``roost schedule``
  mutation, has moved: a cheap read of that one row every ``change_poll`` seconds (default 1 s;
  ``None`` disables it). Only when it moved are the jobs reloaded.
* A job whose cron no longer parses (written by an older version) or can never fire is marked
  ``next_run = NULL`` and skipped; the others are unaffected.
* Start-up adoption: open run records of this owner or of a dead process (``owner_is_dead``)
  are settled: ``claimed`` ones (the process died between claim and dispatch) become
  ``done``/``interrupted`` (at most once, never re-dispatched); ``running`` ones are awaited
  again with ``wait_task`` (a resumed task), ``interrupted`` if the queue does not know them.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import heapq
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from roost import storage as db
from roost._faults import fault_point
from roost.actors._actor import Actor
from roost.errors import NotFound, RoostError
from roost.scheduling import Clock, CronExpr, InvalidCron, SystemClock, format_slot, parse_cron, parse_slot
from roost.storage import default_owner
from roost.storage.leases import owner_is_dead

__all__ = ["Scheduler", "SchedulesChanged", "TaskOutcomes", "Dispatch", "WaitTask"]

#: Seconds the shielded dispatch-and-record step of a run may take.
_DISPATCH_TIMEOUT = 15.0

log = logging.getLogger("roost.scheduler")

Dispatch = Callable[..., Awaitable[str]]
WaitTask = Callable[[str], Awaitable[str]]

_OUTCOMES = frozenset({"succeeded", "failed", "interrupted"})


@attrs.frozen
class SchedulesChanged:
    """Tell: schedules changed in the database; reload them and recompute the next wake."""


@attrs.define(eq=False)
class _Job:
    id: str
    name: str
    cron: CronExpr | None
    task: str
    config: str | None
    work_dir: str | None
    catch_up: str
    overlap: str
    next_run: datetime.datetime | None
    enabled: bool
    queue_lock: trio.Lock = attrs.field(factory=trio.Lock)
    settings: dict = attrs.field(factory=dict)  # provider/model stored with the job (only the set ones)


class TaskOutcomes:
    """The ``wait_task`` of a Scheduler, fed by the TaskQueue's listener.

    ``roost serve`` calls :meth:`finished` from its ``TaskListener.task_finished(task)`` (not
    blocking) and passes :meth:`wait` as the scheduler's ``wait_task``.

    Args:
        lookup: ``async lookup(task_id) -> task | None`` (``TaskQueue.lookup``): a task with
            ``status`` ``finished`` or ``collected`` and ``result["succeeded"]`` has already ended; ``None`` means
            the queue does not know it (:meth:`wait` raises :class:`LookupError`).
    """

    def __init__(self, lookup: Callable[[str], Awaitable[Any]]) -> None:
        self._lookup = lookup
        self._ended: dict[str, trio.Event] = {}
        self._outcomes: dict[str, str] = {}

    def finished(self, task_id: str, outcome: str) -> None:
        """Record that ``task_id`` ended with ``outcome`` (``succeeded``/``failed``/``interrupted``).

        Not a checkpoint. Only tasks someone waits on are remembered (so memory stays bounded).
        """
        event = self._ended.get(task_id)
        if event is not None:
            self._outcomes[task_id] = outcome
            event.set()

    def finished_task(self, task: Any) -> None:
        """:meth:`finished` for a ``QueuedTask`` (``result["succeeded"]``)."""
        result = getattr(task, "result", None) or {}
        self.finished(task.id, "succeeded" if result.get("succeeded") else "failed")

    async def wait(self, task_id: str) -> str:
        """Wait until ``task_id`` ends; return its outcome.

        Raises:
            LookupError: the queue does not know the task.

        Cancellation: stops waiting; nothing else changes.
        """
        event = self._ended.setdefault(task_id, trio.Event())
        try:
            task = await self._lookup(task_id)
            if task is None:
                raise LookupError(f"no task {task_id!r}")
            if getattr(task, "status", None) in ("finished", "collected") and not event.is_set():
                result = getattr(task, "result", None) or {}
                return "succeeded" if result.get("succeeded") else "failed"
            await event.wait()
            return self._outcomes.get(task_id, "failed")
        finally:
            self._ended.pop(task_id, None)
            self._outcomes.pop(task_id, None)


class Scheduler(Actor):
    """Fires due schedule slots as runs through an injected ``dispatch``.

    Args:
        store: the process's :class:`~roost.storage.Store` (writes go through ``store.writer``).
        dispatch: see the module docstring.
        wait_task: see the module docstring.
        clock: time source (default :class:`~roost.scheduling.SystemClock`).
        owner: identity recorded on claimed runs (default :func:`~roost.storage.default_owner`).
        change_poll: seconds between reads of the change counter (real trio time), or ``None``.
        max_skipped_records: most missed slots recorded individually per job and catch-up (the
            most recent ones); older missed slots are only counted in the log.
        project: the daemon's work directory (absolute, resolved): only the jobs of that work
            directory fire here, each run in it (issue 17: every project shares ``$ROOST_HOME``);
            a job without one (written before this rule) is adopted by the first scheduler that
            loads it. ``None``: every job (tests).

    Attributes:
        stats: counters (``fired``, ``skipped``, ``lost_claims``, ``reloads``, ``wakeups``).
        dispatch_delays: seconds from slot time to dispatch start, per cron run (clock time; the
            latest 100,000).
    """

    def __init__(
        self,
        store: Any,
        *,
        dispatch: Dispatch,
        wait_task: WaitTask,
        clock: Clock | None = None,
        owner: str | None = None,
        change_poll: float | None = 1.0,
        max_skipped_records: int = 100,
        name: str = "scheduler",
        project: str | None = None,
    ) -> None:
        super().__init__(name=name)
        self.store = store
        self._dispatch_run = dispatch
        self._wait_run = wait_task
        self.clock: Clock = clock or SystemClock()
        self.owner = owner or default_owner()
        self.change_poll = change_poll
        self.max_skipped_records = max_skipped_records
        self.project = project
        self.started_at: datetime.datetime | None = None
        self.stats = {"fired": 0, "skipped": 0, "lost_claims": 0, "reloads": 0, "wakeups": 0}
        self.dispatch_delays: collections.deque[float] = collections.deque(maxlen=100_000)
        self._jobs: dict[str, _Job] = {}
        self._heap: list[tuple[datetime.datetime, str]] = []
        self._seen_changes: int | None = None
        self._wake = trio.Event()
        self._busy = 0
        self._sleeping = False
        self._processed: datetime.datetime | None = None
        self._state_changed = trio.Event()

    # -- actor hooks -----------------------------------------------------------------------------

    async def on_start(self) -> None:
        self.started_at = self.clock.now()
        await self._adopt_open_runs()
        self.nursery.start_soon(self._fire_loop)
        if self.change_poll is not None:
            self.nursery.start_soon(self._watch_changes, self.change_poll)

    async def handle(self, message: Any) -> Any:
        if isinstance(message, SchedulesChanged):
            self._seen_changes = None
            self._wake.set()
            return None
        return await super().handle(message)

    # -- observation (tests, benchmarks) ---------------------------------------------------------

    def jobs(self) -> dict[str, datetime.datetime | None]:
        """The loaded jobs' next run times by name (a snapshot; not a checkpoint)."""
        return {j.name: j.next_run for j in self._jobs.values()}

    async def wait_quiet(self, at_least: datetime.datetime | None = None) -> None:
        """Wait until the scheduler sleeps with no claim/dispatch in flight, having processed the
        clock up to ``at_least`` (default: the clock's current time). A checkpoint."""
        target = at_least or self.clock.now()
        while not (self._sleeping and self._busy == 0 and self._processed is not None and self._processed >= target):
            await self._state_changed.wait()

    def _changed(self) -> None:
        self._state_changed.set()
        self._state_changed = trio.Event()

    # -- the loop --------------------------------------------------------------------------------

    async def _fire_loop(self) -> None:
        while True:
            self._wake = trio.Event()
            await self._reload_if_changed()
            await self._take_requests()
            now = self.clock.now()
            self._fire_due(now)
            wake_at = self._heap[0][0] if self._heap else None
            try:
                async with trio.open_nursery() as nursery:
                    if wake_at is not None:
                        # start() returns once the sleeper has called sleep_until (registered).
                        await nursery.start(self._sleep_then_cancel, wake_at, nursery.cancel_scope)
                    nursery.start_soon(self._wake_then_cancel, nursery.cancel_scope)
                    self._processed = now
                    self._sleeping = True
                    self._changed()
            finally:
                self._sleeping = False
            self.stats["wakeups"] += 1

    async def _sleep_then_cancel(
        self,
        when: datetime.datetime,
        scope: trio.CancelScope,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        task_status.started()
        await self.clock.sleep_until(when)
        scope.cancel()

    async def _wake_then_cancel(self, scope: trio.CancelScope) -> None:
        await self._wake.wait()
        scope.cancel()

    async def _watch_changes(self, interval: float) -> None:
        """Wake the loop when the ``schedule_changes`` counter moved (one-row read per interval)."""
        while True:
            await trio.sleep(interval)
            try:
                counter = await trio.to_thread.run_sync(self._read_changes)
            except RoostError:
                log.warning("could not read the schedule change counter", exc_info=True)
                continue
            if counter != self._seen_changes:
                self._wake.set()

    def _read_changes(self) -> int:
        with self.store.read() as conn:
            return db.schedule_changes(conn)

    async def _reload_if_changed(self) -> None:
        def load() -> tuple[int, list[db.ScheduledJob]]:
            with self.store.read() as conn, db.read_snapshot(conn):
                return db.schedule_changes(conn), db.list_jobs(conn, project=self.project)

        counter = await trio.to_thread.run_sync(self._read_changes)
        if counter == self._seen_changes:
            return
        counter, rows = await trio.to_thread.run_sync(load)
        rows = await self._adopt_unowned(rows)
        self._seen_changes = counter
        self.stats["reloads"] += 1
        now = self.clock.now()
        old, self._jobs = self._jobs, {}
        never: list[str] = []
        for row in rows:
            try:
                # The "can it fire" check runs only for rows without a next run (at add time it
                # ran already); a row that cannot fire is caught when it is due.
                cron = parse_cron(row.cron, now=now, check_fires=row.next_run is None)
                next_run = parse_slot(row.next_run) if row.next_run else cron.next_after(now)
            except (InvalidCron, ValueError) as exc:
                if row.next_run is not None:
                    log.warning("schedule %r: %s; marked as never firing", row.name, exc)
                    never.append(row.id)
                cron, next_run = None, None
            job = _Job(
                row.id,
                row.name,
                cron,
                row.task,
                row.config,
                row.work_dir,
                row.catch_up,
                row.overlap,
                next_run,
                row.enabled,
                settings={k: v for k, v in (("provider", row.provider), ("model", row.model)) if v},
            )
            previous = old.get(row.id)
            if previous is not None:
                job.queue_lock = previous.queue_lock
                if (
                    previous.next_run is not None
                    and next_run is not None
                    and previous.next_run > next_run
                    and previous.cron == cron
                ):
                    job.next_run = previous.next_run  # the database lags this process's own firing
            self._jobs[row.id] = job
        self._heap = [(j.next_run, j.id) for j in self._jobs.values() if j.next_run is not None and j.enabled]
        heapq.heapify(self._heap)
        for job_id in never:
            await self._record(db.advance_next_run, job_id, None)

    async def _adopt_unowned(self, rows: list[db.ScheduledJob]) -> list[db.ScheduledJob]:
        """Adopt the jobs without a work directory into :attr:`project`; return the rows this
        scheduler fires (those another scheduler adopted first are dropped)."""
        if self.project is None:
            return rows
        kept = []
        for row in rows:
            if row.work_dir is None:
                try:
                    adopted = await self.store.writer.submit(db.adopt_job, row.id, self.project)
                except RoostError as exc:
                    log.warning("schedule %r: could not adopt it: %s", row.name, exc)
                    continue
                if not adopted:
                    continue
                log.info(
                    "schedule %r adopted by the project %s",
                    row.name,
                    self.project,
                    extra={"event": "schedule_adopted", "schedule": row.name, "work_dir": self.project},
                )
                row.work_dir = self.project
            kept.append(row)
        return kept

    # -- firing ----------------------------------------------------------------------------------

    def _fire_due(self, now: datetime.datetime) -> None:
        # Jobs sharing an expression and a due time share one slot computation.
        memo: dict[tuple[CronExpr, datetime.datetime], tuple[list[datetime.datetime], datetime.datetime]] = {}
        while self._heap and self._heap[0][0] <= now:
            at, job_id = heapq.heappop(self._heap)
            job = self._jobs.get(job_id)
            if job is None or job.next_run != at or job.cron is None or not job.enabled:
                continue  # stale heap entry
            key = (job.cron, at)
            try:
                if key not in memo:
                    memo[key] = job.cron.due_slots(at, now, limit=self.max_skipped_records + 1)
                slots, following = memo[key]
            except InvalidCron as exc:
                log.warning("schedule %r: %s; marked as never firing", job.name, exc)
                job.next_run = None
                self.nursery.start_soon(self._record, db.advance_next_run, job.id, None)
                continue
            missed = slots[:-1]
            latest = slots[-1] if slots else None
            assert self.started_at is not None
            if latest is not None and latest < self.started_at and job.catch_up == "none":
                missed.append(latest)
                latest = None
            job.next_run = following
            heapq.heappush(self._heap, (following, job.id))
            self._busy += 1
            self.nursery.start_soon(self._fire, job, latest, [format_slot(s) for s in missed], format_slot(following))

    async def _fire(self, job: _Job, slot: datetime.datetime | None, missed: list[str], following: str) -> None:
        """Record ``missed``, claim and dispatch ``slot``, advance ``next_run``; await the run."""
        run_id: str | None = None
        verdict = "lost"
        fault_point("scheduler")
        try:
            slot_text = format_slot(slot) if slot is not None else None
            run_id, verdict = await self.store.writer.submit(
                _claim_tx, job.id, slot_text, missed, following, self.owner, job.overlap
            )
            self.stats["skipped"] += len(missed) + (verdict == "overlap")
            if verdict == "lost":
                self.stats["lost_claims"] += slot is not None
                return
            if verdict == "overlap":
                log.info("schedule %r: slot %s skipped, the previous run still runs", job.name, slot_text)
                return
        except RoostError:
            log.exception("schedule %r: could not claim slot %s", job.name, slot)
            return
        finally:
            if verdict in ("lost", "overlap") or run_id is None:
                self._busy -= 1
                self._changed()
        assert run_id is not None and slot is not None
        await self._run(job, run_id, slot=slot)

    async def _take_requests(self) -> None:
        """Claim the manual ``roost schedule run`` requests and dispatch them (overlap ignored)."""

        def requests() -> list[db.JobRun]:
            with self.store.read() as conn:
                return db.list_requested_runs(conn)

        for request in await trio.to_thread.run_sync(requests):
            job = self._jobs.get(request.schedule_id)
            if job is None:
                continue  # removed meanwhile (its request row went with it)
            if await self.store.writer.submit(db.claim_requested_run, request.id, self.owner):
                self._busy += 1
                self.nursery.start_soon(self._run, job, request.id)

    async def _run(self, job: _Job, run_id: str, *, slot: datetime.datetime | None = None) -> None:
        """Dispatch a claimed run and record its start and end. ``_busy`` was counted by the caller."""
        counted = True

        def settle() -> None:
            nonlocal counted
            if counted:
                counted = False
                self._busy -= 1
                self._changed()

        try:
            queued = job.overlap == "queue"
            if queued and job.queue_lock.locked():
                settle()  # waiting for the previous run of the job is not "in flight"
            async with job.queue_lock if queued else contextlib.nullcontext():
                start = self.clock.now()
                if slot is not None:
                    self.dispatch_delays.append((start - slot).total_seconds())
                # Dispatch and its record are one step a cancellation (a stop, a crash of this
                # actor) cannot split: a dispatched task always has its run record.
                with trio.move_on_after(_DISPATCH_TIMEOUT) as step:
                    step.shield = True
                    try:
                        task_id = await self._dispatch_run(
                            job.task,
                            config=job.config,
                            work_dir=job.work_dir,
                            client_id=None,
                            source="schedule",
                            **job.settings,
                        )
                    except Exception:
                        log.exception("schedule %r: dispatch failed", job.name)
                        await self._record(db.mark_run_finished, run_id, "failed", format_slot(self.clock.now()))
                        return
                    await self._record(db.mark_run_started, run_id, str(task_id), format_slot(start))
                await trio.lowlevel.checkpoint()
                self.stats["fired"] += 1
                log.info(
                    "schedule %r fired: task %s (slot %s)",
                    job.name,
                    task_id,
                    format_slot(slot) if slot is not None else "manual",
                    extra={
                        "event": "schedule_fired",
                        "schedule": job.name,
                        "task_id": str(task_id),
                        "slot": format_slot(slot) if slot is not None else None,
                        "work_dir": job.work_dir,
                    },
                )
                settle()
                await self._await_outcome(run_id, str(task_id))
        finally:
            settle()

    async def _await_outcome(self, run_id: str, task_id: str) -> None:
        try:
            outcome = await self._wait_run(task_id)
        except (LookupError, NotFound):
            outcome = "interrupted"
        except Exception:
            log.exception("waiting for scheduled task %s failed", task_id)
            outcome = "interrupted"
        if outcome not in _OUTCOMES:
            outcome = "failed"
        log.info(
            "scheduled task %s finished: %s",
            task_id,
            outcome,
            extra={"event": "schedule_run_finished", "task_id": task_id, "outcome": outcome},
        )
        await self._record(db.mark_run_finished, run_id, outcome, format_slot(self.clock.now()))

    async def _record(self, fn: Any, *args: Any) -> None:
        """Write a run record; a store failure (e.g. stopping) is logged, never a crash: the
        record stays open and the next scheduler's start-up adoption settles it."""
        try:
            await self.store.writer.submit(fn, *args)
        except RoostError as exc:
            log.warning("could not record %s%r: %s", fn.__name__, args, exc)

    async def _adopt_open_runs(self) -> None:
        def open_runs() -> list[db.JobRun]:
            with self.store.read() as conn:
                return db.list_open_runs(conn)

        for run in await trio.to_thread.run_sync(open_runs):
            if not (run.owner is None or run.owner == self.owner or owner_is_dead(run.owner)):
                continue  # a live scheduler of another process owns it
            if run.status == "running" and run.session_id:
                await self.store.writer.submit(_adopt_tx, run.id, self.owner)
                self.nursery.start_soon(self._await_outcome, run.id, run.session_id)
            else:
                await self.store.writer.submit(
                    db.mark_run_finished, run.id, "interrupted", format_slot(self.clock.now())
                )


def _claim_tx(
    conn: Any, schedule_id: str, slot: str | None, missed: list[str], following: str, owner: str, overlap: str
) -> tuple[str | None, str]:
    """One transaction: record missed slots, claim ``slot``, apply the overlap rule, advance.

    Returns ``(run_id, verdict)``: ``claimed``, ``overlap`` (claimed and recorded skipped) or
    ``lost`` (another scheduler has it, or there was no slot to claim).
    """
    if missed:
        db.record_skipped(conn, schedule_id, missed, "missed")
    db.advance_next_run(conn, schedule_id, following)
    if slot is None:
        return None, "lost"
    run_id = db.claim_slot(conn, schedule_id, slot, owner)
    if run_id is None:
        return None, "lost"
    if overlap == "skip" and db.has_running_run(conn, schedule_id, exclude=run_id):
        db.mark_run_finished(conn, run_id, "overlap", slot)
        return run_id, "overlap"
    return run_id, "claimed"


def _adopt_tx(conn: Any, run_id: str, owner: str) -> None:
    db.adopt_schedule_run(conn, run_id, owner)
