"""The store interface: every operation the other rooms may ask of a backend, in one place.

``storage`` is the only room that speaks SQL (DESIGN section 3). The rest of Roost reaches the
database through the operations below, each a function of a backend connection (``ConnT``:
``sqlite3.Connection`` for SQLite) run on a read connection (:meth:`StoreBackend.read`) or in a
write transaction (:meth:`StoreBackend.transaction`, or the group-commit writer). The groups
follow the data: threads (with turns and runs), items, pending inputs, leases, workers,
schedules, daemon tasks, memory and tool processes.

:class:`roost.storage.Store` implements :class:`StoreBackend` for SQLite (the module functions of
this room, as methods); a second backend (PostgreSQL, a later issue) implements the same protocol
with its own connection type. mypy checks the SQLite conformance (``_sqlite_conforms`` below) and
tests/test_store.py checks that the methods are the module functions.

Errors are the ones of :mod:`roost.errors` (``NotFound``, ``Conflict``, ``LeaseHeld``,
``StaleLease``, ``StoreError``...), whatever the backend.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from roost.model import ContextFile, DaemonTask, HeldInput, Item, MemoryEntry, Run, SearchHit, Thread, Turn, Worker

from ._bus import BusMessage, BusNode
from ._objectives import Objective, ObjectiveTask
from ._operations import OPERATIONS as OPERATIONS
from ._schedules2 import JobRun, ScheduledJob
from .leases import Lease

if TYPE_CHECKING:
    from ._store import Store

__all__ = [
    "ConnT",
    "StoreBackend",
    "ThreadStore",
    "ItemStore",
    "InputStore",
    "LeaseStore",
    "WorkerStore",
    "ScheduleStore",
    "TaskStore",
    "MemoryStore",
    "ProcessStore",
    "ObjectiveStore",
    "BusStore",
]

#: A backend's connection type (``sqlite3.Connection`` for SQLite).
ConnT = TypeVar("ConnT")
#: The same, in the groups, which only take connections.
ConnT_contra = TypeVar("ConnT_contra", contravariant=True)


@runtime_checkable
class ThreadStore(Protocol[ConnT_contra]):
    """Threads, their turns and runs."""

    def create_thread(self, conn: ConnT_contra, *, kind: str = ..., id: str | None = ..., **fields: Any) -> Thread: ...
    def get_thread(self, conn: ConnT_contra, thread_id: str) -> Thread: ...
    def list_threads(
        self,
        conn: ConnT_contra,
        *,
        archived: bool | None = ...,
        kind: str | None = ...,
        parent_thread_id: str | None = ...,
        updated_before: str | None = ...,
        limit: int = ...,
    ) -> list[Thread]: ...
    def update_thread(self, conn: ConnT_contra, thread_id: str, **changes: Any) -> Thread: ...
    def delete_thread(self, conn: ConnT_contra, thread_id: str) -> None: ...
    def create_turn(
        self, conn: ConnT_contra, thread_id: str, *, id: str | None = ..., status: str = ..., run_id: str | None = ...
    ) -> Turn: ...
    def get_turn(self, conn: ConnT_contra, turn_id: str) -> Turn: ...
    def list_turns(self, conn: ConnT_contra, thread_id: str, *, status: str | None = ...) -> list[Turn]: ...
    def update_turn(self, conn: ConnT_contra, turn_id: str, **changes: Any) -> Turn: ...
    def create_run(
        self,
        conn: ConnT_contra,
        *,
        thread_id: str | None = ...,
        id: str | None = ...,
        kind: str = ...,
        status: str = ...,
        owner: str | None = ...,
        metadata: dict[str, Any] | None = ...,
    ) -> Run: ...
    def get_run(self, conn: ConnT_contra, run_id: str) -> Run: ...
    def list_runs(self, conn: ConnT_contra, *, thread_id: str | None = ..., status: str | None = ...) -> list[Run]: ...
    def update_run(self, conn: ConnT_contra, run_id: str, **changes: Any) -> Run: ...
    def first_user_text(self, conn: ConnT_contra, thread_id: str) -> str: ...
    def latest_run_status(self, conn: ConnT_contra, thread_id: str) -> str | None: ...
    def count_turns(self, conn: ConnT_contra, thread_id: str) -> int: ...
    def chat_ids_with_title(self, conn: ConnT_contra, needle: str, *, limit: int) -> list[str]: ...
    def page_threads(
        self,
        conn: ConnT_contra,
        *,
        archived: bool | None,
        kind: str | None,
        before: tuple[str, str] | None,
        limit: int | None,
    ) -> list[Thread]: ...
    def chat_threads_with_cwd(self, conn: ConnT_contra) -> list[Thread]: ...


@runtime_checkable
class ItemStore(Protocol[ConnT_contra]):
    """Items of a thread's history and their full-text search."""

    def append_item(
        self,
        conn: ConnT_contra,
        thread_id: str,
        *,
        type: str,
        payload: Any = ...,
        text: str | None = ...,
        turn_id: str | None = ...,
        status: str = ...,
        id: str | None = ...,
    ) -> Item: ...
    def get_item(self, conn: ConnT_contra, item_id: str) -> Item: ...
    def list_items(
        self,
        conn: ConnT_contra,
        thread_id: str,
        *,
        after_seq: int = ...,
        limit: int | None = ...,
        turn_id: str | None = ...,
    ) -> list[Item]: ...
    def update_item(self, conn: ConnT_contra, item_id: str, **changes: Any) -> Item: ...
    def search_items(
        self, conn: ConnT_contra, query: str, *, thread_id: str | None = ..., limit: int = ...
    ) -> list[SearchHit]: ...


@runtime_checkable
class InputStore(Protocol[ConnT_contra]):
    """Pending inputs: queued and steered input held for a thread until it is admitted."""

    def add_held_input(
        self,
        conn: ConnT_contra,
        thread_id: str,
        *,
        kind: str = ...,
        payload: Any = ...,
        held: bool = ...,
        client_id: str | None = ...,
        id: str | None = ...,
    ) -> tuple[HeldInput, bool]: ...
    def list_held_input(self, conn: ConnT_contra, thread_id: str, *, held: bool | None = ...) -> list[HeldInput]: ...
    def update_held_input(self, conn: ConnT_contra, input_id: str, **changes: Any) -> HeldInput: ...
    def remove_held_input(self, conn: ConnT_contra, input_id: str) -> None: ...


@runtime_checkable
class LeaseStore(Protocol[ConnT_contra]):
    """Execution leases with fencing tokens (the lease logic itself; :class:`LeaseKeeper` renews)."""

    def acquire(self, conn: ConnT_contra, key: str, owner: str, ttl: float, *, now: float | None = ...) -> Lease: ...
    def acquire_then(
        self,
        conn: ConnT_contra,
        key: str,
        owner: str,
        ttl: float,
        fn: Callable[..., Any],
        *args: Any,
        now: float | None = ...,
    ) -> tuple[Lease, Any]: ...
    def renew(self, conn: ConnT_contra, lease: Lease, ttl: float | None = ..., *, now: float | None = ...) -> Lease: ...
    def release(self, conn: ConnT_contra, lease: Lease) -> bool: ...
    def hand_over(
        self, conn: ConnT_contra, lease: Lease, successor: str, *, ttl: float | None = ..., now: float | None = ...
    ) -> None: ...
    def check_fence(self, conn: ConnT_contra, key: str, token: int) -> None: ...
    def get_lease(self, conn: ConnT_contra, key: str) -> dict[str, Any] | None: ...


@runtime_checkable
class WorkerStore(Protocol[ConnT_contra]):
    """Worker trees: spawned subagents in spawn order."""

    def create_worker(
        self,
        conn: ConnT_contra,
        *,
        thread_id: str,
        root_thread_id: str,
        parent_id: str | None = ...,
        name: str | None = ...,
        status: str = ...,
        id: str | None = ...,
    ) -> Worker: ...
    def get_worker(self, conn: ConnT_contra, worker_id: str) -> Worker: ...
    def list_workers(self, conn: ConnT_contra, root_thread_id: str, *, status: str | None = ...) -> list[Worker]: ...
    def update_worker(self, conn: ConnT_contra, worker_id: str, **changes: Any) -> Worker: ...
    def claim_queued_worker(self, conn: ConnT_contra, worker_id: str) -> bool: ...
    def queued_worker_roots(self, conn: ConnT_contra) -> list[str]: ...
    def mark_worker_delivered(self, conn: ConnT_contra, worker_id: str) -> bool: ...


@runtime_checkable
class ScheduleStore(Protocol[ConnT_contra]):
    """Scheduled jobs and their run records, at most one per (job, slot)."""

    def bump_schedule_changes(self, conn: ConnT_contra) -> None: ...
    def schedule_changes(self, conn: ConnT_contra) -> int: ...
    def add_job(
        self,
        conn: ConnT_contra,
        *,
        name: str,
        cron: str,
        task: str,
        next_run: str | None,
        description: str | None = ...,
        config: str | None = ...,
        work_dir: str | None = ...,
        catch_up: str = ...,
        overlap: str = ...,
        enabled: bool = ...,
        provider: str | None = ...,
        model: str | None = ...,
    ) -> ScheduledJob: ...
    def get_job(self, conn: ConnT_contra, name: str) -> ScheduledJob: ...
    def list_jobs(
        self, conn: ConnT_contra, *, enabled_only: bool = ..., project: str | None = ...
    ) -> list[ScheduledJob]: ...
    def adopt_job(self, conn: ConnT_contra, schedule_id: str, work_dir: str) -> bool: ...
    def remove_job(self, conn: ConnT_contra, name: str) -> None: ...
    def set_job_enabled(
        self, conn: ConnT_contra, name: str, enabled: bool, *, next_run: str | None
    ) -> ScheduledJob: ...
    def advance_next_run(self, conn: ConnT_contra, schedule_id: str, next_run: str | None) -> None: ...
    def request_run(self, conn: ConnT_contra, name: str) -> JobRun: ...
    def list_requested_runs(self, conn: ConnT_contra) -> list[JobRun]: ...
    def claim_requested_run(self, conn: ConnT_contra, run_id: str, owner: str) -> bool: ...
    def claim_slot(self, conn: ConnT_contra, schedule_id: str, slot: str, owner: str) -> str | None: ...
    def record_skipped(self, conn: ConnT_contra, schedule_id: str, slots: list[str], outcome: str) -> int: ...
    def mark_run_started(self, conn: ConnT_contra, run_id: str, session_id: str, started_at: str) -> None: ...
    def mark_run_finished(self, conn: ConnT_contra, run_id: str, outcome: str, finished_at: str) -> None: ...
    def has_running_run(self, conn: ConnT_contra, schedule_id: str, *, exclude: str | None = ...) -> bool: ...
    def list_open_runs(self, conn: ConnT_contra) -> list[JobRun]: ...
    def list_job_runs(self, conn: ConnT_contra, schedule_id: str, *, limit: int = ...) -> list[JobRun]: ...
    def adopt_schedule_run(self, conn: ConnT_contra, run_id: str, owner: str) -> None: ...
    def schedule_run_status(self, conn: ConnT_contra, run_id: str) -> str | None: ...


@runtime_checkable
class TaskStore(Protocol[ConnT_contra]):
    """The ``serve`` daemon's task queue."""

    def enqueue_daemon_task(
        self, conn: ConnT_contra, *, payload: Any, client_id: str | None = ..., id: str | None = ...
    ) -> tuple[DaemonTask, bool]: ...
    def get_daemon_task(self, conn: ConnT_contra, task_id: str) -> DaemonTask | None: ...
    def list_daemon_tasks(self, conn: ConnT_contra, *, status: str | None = ...) -> list[DaemonTask]: ...
    def update_daemon_task(self, conn: ConnT_contra, task_id: str, **changes: Any) -> DaemonTask: ...


@runtime_checkable
class MemoryStore(Protocol[ConnT_contra]):
    """Memory entries under a scope and key, and context files of a thread."""

    def put_memory(self, conn: ConnT_contra, scope: str, key: str, value: Any) -> MemoryEntry: ...
    def get_memory(self, conn: ConnT_contra, scope: str, key: str) -> MemoryEntry: ...
    def list_memory(self, conn: ConnT_contra, scope: str) -> list[MemoryEntry]: ...
    def delete_memory(self, conn: ConnT_contra, scope: str, key: str) -> bool: ...
    def put_context_file(self, conn: ConnT_contra, thread_id: str, path: str, content: str) -> ContextFile: ...
    def list_context_files(self, conn: ConnT_contra, thread_id: str) -> list[ContextFile]: ...
    def delete_context_file(self, conn: ConnT_contra, thread_id: str, path: str) -> bool: ...
    def memory_value(self, conn: ConnT_contra, scope: str, key: str) -> tuple[bool, Any]: ...
    def memory_scope_counts(self, conn: ConnT_contra, prefix: str) -> list[tuple[str, int]]: ...
    def delete_memory_prefix(self, conn: ConnT_contra, scope: str, key_prefix: str) -> int: ...
    def scope_has_memory(self, conn: ConnT_contra, scope: str) -> bool: ...


@runtime_checkable
class ProcessStore(Protocol[ConnT_contra]):
    """Tool process groups, recorded so a restarted Roost reaps them."""

    def record_tool_process(
        self, conn: ConnT_contra, pgid: int, owner: str, ticks: int, boot: str | None = ..., thread_id: str | None = ...
    ) -> None: ...
    def forget_tool_process(self, conn: ConnT_contra, pgid: int, owner: str) -> bool: ...
    def list_tool_processes(self, conn: ConnT_contra, owner: str | None = ...) -> list[dict]: ...


@runtime_checkable
class ObjectiveStore(Protocol[ConnT_contra]):
    """Objectives, their ordered tasks and each task's outcome and failure counter."""

    def create_objective(
        self, conn: ConnT_contra, *, title: str, tasks: list[str], description: str | None = ..., status: str = ...
    ) -> Objective: ...
    def get_objective(self, conn: ConnT_contra, objective_id: str) -> Objective: ...
    def list_objectives(self, conn: ConnT_contra, *, status: str | None = ...) -> list[Objective]: ...
    def set_objective_status(self, conn: ConnT_contra, objective_id: str, status: str) -> Objective: ...
    def add_objective_task(self, conn: ConnT_contra, objective_id: str, task: str) -> ObjectiveTask: ...
    def start_objective_task(
        self, conn: ConnT_contra, objective_id: str, index: int, session_id: str
    ) -> ObjectiveTask: ...
    def finish_objective_task(
        self, conn: ConnT_contra, objective_id: str, index: int, succeeded: bool
    ) -> ObjectiveTask: ...


@runtime_checkable
class BusStore(Protocol[ConnT_contra]):
    """The node bus: the processes on the store and the messages between them (``_bus``)."""

    def register_bus_node(self, conn: ConnT_contra, node_id: str, kind: str, *, now: float | None = ...) -> None: ...
    def heartbeat_bus_node(self, conn: ConnT_contra, node_id: str, *, now: float | None = ...) -> bool: ...
    def remove_bus_node(self, conn: ConnT_contra, node_id: str) -> None: ...
    def list_bus_nodes(self, conn: ConnT_contra) -> list[BusNode]: ...
    def get_bus_node(self, conn: ConnT_contra, node_id: str) -> BusNode | None: ...
    def prune_bus_nodes(self, conn: ConnT_contra, *, keep: float, now: float | None = ...) -> int: ...
    def post_message(
        self,
        conn: ConnT_contra,
        *,
        target: str,
        sender: str,
        kind: str,
        body: Any,
        reply_to: str | None = ...,
        ttl: float = ...,
        id: str | None = ...,
        now: float | None = ...,
    ) -> str: ...
    def has_pending_messages(self, conn: ConnT_contra, target: str, *, now: float | None = ...) -> bool: ...
    def claim_messages(
        self, conn: ConnT_contra, target: str, *, limit: int = ..., now: float | None = ...
    ) -> list[BusMessage]: ...
    def ack_message(self, conn: ConnT_contra, message_id: str) -> bool: ...
    def cancel_message(self, conn: ConnT_contra, message_id: str) -> bool: ...
    def get_message(self, conn: ConnT_contra, message_id: str) -> BusMessage | None: ...
    def prune_messages(self, conn: ConnT_contra, *, keep: float = ..., now: float | None = ...) -> int: ...
    def bus_listener(self, node_id: str) -> Any: ...


@runtime_checkable
class StoreBackend(
    ThreadStore[ConnT],
    ItemStore[ConnT],
    InputStore[ConnT],
    LeaseStore[ConnT],
    WorkerStore[ConnT],
    ScheduleStore[ConnT],
    TaskStore[ConnT],
    MemoryStore[ConnT],
    ProcessStore[ConnT],
    ObjectiveStore[ConnT],
    BusStore[ConnT],
    Protocol[ConnT],
):
    """A whole store: the operations of every group, plus its connections.

    ``read()`` lends a read-only connection for a block; ``transaction()`` opens a write
    transaction that commits when the block ends normally and rolls back on an exception;
    ``close()`` is idempotent.
    """

    def read(self) -> AbstractContextManager[ConnT]: ...
    def transaction(self) -> AbstractContextManager[ConnT]: ...
    def close(self) -> None: ...


def _sqlite_conforms(store: Store) -> StoreBackend[sqlite3.Connection]:
    """Never called: mypy checks here that the SQLite Store implements the whole interface."""
    return store
