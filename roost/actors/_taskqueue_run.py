"""Running one daemon task to its end: one agent's turn, or an orchestration of its config, on the
task's own thread; its result recorded fenced by the task's lease (split from
:mod:`roost.actors._taskqueue`, which claims tasks and keeps the queue).

:class:`TaskRunner` is a part of :class:`roost.actors._taskqueue.TaskQueue` (its attributes:
``runtime``, ``listener``, ``provider``, ``model``, ``unattended_policy``, ``permission_mode``,
``default_work_dir``, ``engines``, ``orchestrations``; ``_listener`` of
:class:`~roost.actors._taskqueue_shared.SharedQueue`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import trio

from roost._faults import point as fault_action
from roost._heap import note_large_output
from roost.actors._actor import shielded_cleanup
from roost.actors._messages import Origin, StartTurn, Subscribe, Unsubscribe
from roost.actors._task_model import (
    Orchestrations,
    QueuedTask,
    TaskListener,
    TaskSink,
    mark_complete,
    resume_prompt,
    task_result,
)
from roost.errors import ConfigError, RoostError, StaleLease, ThreadNotFound
from roost.storage import update_daemon_task, utc_now

__all__ = ["TaskRunner"]

log = logging.getLogger("roost.serve")

#: Seconds a runner's clean-up (unsubscribe, persist the end) may take.
_CLEANUP = 10.0


class TaskRunner:
    """Runs one claimed task (mixed into ``TaskQueue``)."""

    runtime: Any
    listener: TaskListener
    provider: str | None
    model: str | None
    unattended_policy: str
    permission_mode: str
    default_work_dir: str
    engines: Any
    orchestrations: Orchestrations | None
    _listener: Any

    async def _run(self, task: QueuedTask, execution: Any) -> None:
        """Run one task to its end and record its result (never raises a RoostError).

        ``execution`` holds the task's lease (claimed, status ``running`` already): the result
        is written fenced by its token, so a node that lost the task writes nothing.

        A task with a config runs that orchestration (:meth:`_orchestrate`), one without runs
        one turn of the default agent (:meth:`_single_turn`). Either way the result is
        ``{succeeded, errorMessage, lastAgent, lastMessage}``, persisted with the task and sent
        to the listener's ``task_finished``.
        """
        task.status = "running"
        result = task_result(False, None)
        sink = TaskSink(task, self._listener(task))
        actor = None
        try:
            fault_action("task.running")  # (claimed: the row is ``running`` under the task's lease)
            log.info(
                "task %s started%s",
                task.id,
                " (resumed)" if task.resumed else "",
                extra={"event": "task_started", "task_id": task.id, "resumed": task.resumed},
            )
            self._listener(task).task_started(task)
            config = await self._load_config(task)
            actor = await self._thread(task, config)
            task.actor = actor
            await actor.ref.ask(Subscribe(sink))
            if config is None:
                result = await self._single_turn(task, actor)
            else:
                result = await self._orchestrate(task, actor, config)
        except ConfigError as exc:
            result = task_result(False, str(exc))
            log.warning("task %s: its config is unusable: %s", task.id, exc)
        except RoostError as exc:
            result = task_result(False, f"{type(exc).__name__}: {exc}")
            log.warning("task %s failed: %s", task.id, result["errorMessage"])
        finally:
            with shielded_cleanup(_CLEANUP):
                if actor is not None:
                    try:
                        await actor.ref.ask(Unsubscribe(sink))
                    except RoostError:
                        log.debug("could not unsubscribe from a finished task's thread", exc_info=True)
        task.actor = task.orchestrator = None
        task.interrupt_pending = False
        await self._finish(task, result, execution)

    async def _finish(self, task: QueuedTask, result: dict, execution: Any) -> None:
        """Record ``result`` as the task's (status ``finished``; its session complete when it
        succeeded), fenced by the task's lease, and tell the listener. A store failure is
        logged, the listener still told; a lost lease (another node resumes the task) writes
        and tells nothing."""
        task.result = result
        task.status = "finished"
        task.ran_on = self.runtime.services.owner
        try:
            await execution.submit(update_daemon_task, task.id, status="finished", payload=task.payload())
            if result["succeeded"]:  # the session is complete (``roost sessions --json`` lists incomplete ones)
                await execution.submit(mark_complete, task.thread)
        except StaleLease:
            task.status, task.result = "running", None  # it runs elsewhere now
            return
        except RoostError:
            log.exception("task %s: could not persist its result", task.id)
        log.info(
            "task %s finished: %s",
            task.id,
            "succeeded" if result["succeeded"] else f"failed: {result.get('errorMessage')}",
            extra={
                "event": "task_finished",
                "task_id": task.id,
                "succeeded": bool(result["succeeded"]),
                "error": result.get("errorMessage"),
                "source": task.source,
            },
        )
        self._listener(task).task_finished(task)
        note_large_output(len(result.get("lastMessage") or ""))  # its rows are written: trim the heap

    async def _single_turn(self, task: QueuedTask, actor: Any) -> dict:
        """Run the task as one turn of the default agent (a resumed task: :func:`resume_prompt`).

        Returns:
            The task result dict (``lastAgent`` ``"assistant"`` when the agent said something).

        Raises:
            RoostError: the turn could not be started or awaited.
        """
        origin = Origin(
            client_id=task.client_id or "serve",
            request_approval=functools.partial(self._listener(task).request_approval, task),
            unattended_policy=self.unattended_policy,
            ask_question=self._asker(task),
        )
        live = actor.turn_view(task.turn_id) if task.resumed and task.turn_id is not None else None
        if live is not None and live["status"] in ("running", "queued"):
            turn_id = task.turn_id  # a restarted queue re-attaches to the turn still running
        else:
            prompt = resume_prompt(task) if task.resumed else task.task
            turn = await actor.ref.ask(StartTurn(prompt=prompt, origin=origin, client_id=task.client_id))
            turn_id = task.turn_id = turn["id"]
        view = await actor.wait_turn_end(turn_id)
        succeeded, task.interrupted = view.get("status") == "completed", view.get("status") == "interrupted"
        error = None
        if not succeeded:
            error = (view.get("error") or {}).get("message") or f"the turn ended {view.get('status')}"
        last = actor.last_agent_text() or None
        return task_result(succeeded, error, "assistant" if last else None, last)

    async def _orchestrate(self, task: QueuedTask, actor: Any, config: Any) -> dict:
        """Run the task as an orchestration of ``config`` on its thread ``actor``.

        A resumed task continues where the previous daemon's run stopped (the Orchestrator keeps
        its progress in the thread's metadata): the same task text, no resume prompt. The run's
        events go to the listener's ``task_event``; its approvals (tool approvals and keyword
        routes' ``route_approval``) to the task's client, like a single agent's.

        Returns:
            The task result dict: ``succeeded`` when the run completed; ``lastAgent`` and
            ``lastMessage`` from the last agent message of an agent (not the Orchestrator's
            corrections).

        Raises:
            RoostError: the run could not start (a failure inside the run is its outcome).
        """
        assert self.orchestrations is not None  # _load_config refused the task without it
        orchestrator_class = self.orchestrations.Orchestrator
        last: dict[str, str | None] = {"agent": None, "message": None}

        def emit(event: dict) -> None:
            if event.get("type") == "agent_message":
                message = event.get("message") or {}
                if message.get("role") == "assistant":
                    last["agent"], last["message"] = message.get("agentName"), message.get("content") or None
            try:
                self._listener(task).task_event(task, event)
            except Exception:
                log.exception("task %s: could not render a run event", task.id)

        orch = orchestrator_class(
            config,
            actor,
            engines=self.engines,
            emit=emit,
            request_approval=functools.partial(self._ask, task),
            ask_question=self._asker(task),
        )
        task.orchestrator = orch
        if task.interrupt_pending:
            orch.interrupt("interrupted")
        outcome = await orch.run(task.task, follow_up=task.thread_id is not None and not task.resumed)
        succeeded, task.interrupted = outcome.status == "completed", outcome.status == "interrupted"
        error = None if succeeded else outcome.error_message or f"the run ended {outcome.status}"
        return task_result(succeeded, error, last["agent"], last["message"])

    def _asker(self, task: QueuedTask) -> Any:
        """``ask_question(params)`` of ``task`` (its listener's), or None when the listener has none."""
        ask = getattr(self.listener, "ask_question", None)
        return functools.partial(ask, task) if ask is not None else None

    async def _ask(self, task: QueuedTask, params: dict) -> bool | None:
        """An orchestrated task's approval: asked of its client; when nobody answers (None), the
        unattended policy decides (``allow``: True; ``deny``: None, which the run denies)."""
        answer = await self._listener(task).request_approval(task, params)
        if answer is None and self.unattended_policy == "allow":
            return True
        return answer

    async def _load_config(self, task: QueuedTask) -> Any:
        """The task's orchestration config (loaded in a worker thread), or None without one.

        Raises:
            ConfigError: (``ConfigInvalid``) the file is missing, unparsable or has errors.
        """
        if not task.config:
            return None
        if self.orchestrations is None:
            raise ConfigError("this task queue runs no orchestrations (no orchestration room was given)")
        return await trio.to_thread.run_sync(self.orchestrations.load_config_file, task.config)

    async def _thread(self, task: QueuedTask, config: Any = None) -> Any:
        """The task's thread actor: loaded when it exists (a resumed task, or the thread it continues:
        ``thread_id``, which must exist), else created.

        An orchestrated task's thread carries the run's metadata (``task``, ``config_path``,
        ``is_complete``) as ``roost run`` sessions do, besides ``serveTask`` and ``config``.
        """
        from roost.model import Thread

        if task.resumed or task.thread_id:
            try:
                return await self.runtime.registry.get(task.thread)
            except ThreadNotFound:
                if task.thread_id:
                    raise
        now = utc_now()
        metadata: dict[str, Any] = {"serveTask": True, "config": task.config}
        if config is not None:
            metadata.update({"task": task.task, "config_path": config.path, "is_complete": False})
        thread = Thread(
            id=task.id,
            kind="orchestration",
            title=task.task[:120],
            cwd=task.work_dir or self.default_work_dir,
            provider=task.provider or self.provider,
            model=task.model or (self.model if not task.provider else None),
            permission_mode=self.permission_mode,
            created_at=now,
            updated_at=now,
            metadata=metadata,
        )
        return await self.runtime.registry.create(thread, ephemeral=False)
