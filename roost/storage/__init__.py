"""Persistence: the SQLite and PostgreSQL schemas and migrations, the group-commit writers,
readers and leases.

Layout: ``_connect`` (connections, ``BEGIN IMMEDIATE``, sqlite3 error translation), ``_schema``
(versioned migrations), ``_writer`` (:class:`StoreWriter`), ``_store`` (:class:`Store`,
:func:`open_store`), ``leases`` and ``_keeper`` (execution leases, :class:`LeaseKeeper`),
``_reconcile``, ``_processes`` (tool process groups, reaped after a crash), ``_interface`` (the
store interface, :class:`StoreBackend`, which :class:`Store` implements through ``_sqlite_ops``;
its operation names are in ``_operations``)
and the data modules ``_threads``, ``_items``, ``_workers``, ``_schedules2``, ``_tasks``,
``_memory``, ``_queries``, ``_cluster`` (the shared task queue's claims, node heartbeats),
``_bus`` (the node bus, one implementation for both backends):
plain functions of a connection, writers to be passed to
:meth:`StoreWriter.submit`, readers to be called on :meth:`Store.read`. The ``_pg_*`` modules are
the PostgreSQL backend (:class:`PostgresStore`); every public data function here takes either
backend's connection (``_dispatch``, ``_portable``), so :func:`open_backend` picks the backend.

This room never imports ``roost.actors`` or ``roost.protocol``.

Times: record timestamps are ISO 8601 UTC text (``2026-01-31T12:00:00.000000Z``); lease expiry is
unix wall-clock seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roost._lazy import attach as _attach
from roost._lazy import publish as _publish

from ._bgprocs import get_bg_process as get_bg_process
from ._bgprocs import insert_bg_process as insert_bg_process
from ._bgprocs import list_bg_processes as list_bg_processes
from ._bgprocs import mark_lost_bg_processes as mark_lost_bg_processes
from ._bgprocs import received_bg_processes as received_bg_processes
from ._bgprocs import record_bg_exit as record_bg_exit
from ._bgprocs import running_owners as running_owners
from ._bgprocs import update_bg_process as update_bg_process
from ._blobs import read_blob as read_blob
from ._blobs import read_blob_chunk as read_blob_chunk
from ._bus import BUS_OPERATIONS as _BUS_OPERATIONS
from ._bus import BusMessage as BusMessage
from ._bus import BusNode as BusNode
from ._bus import ack_message as ack_message
from ._bus import cancel_message as cancel_message
from ._bus import claim_messages as claim_messages
from ._bus import get_bus_node as get_bus_node
from ._bus import get_message as get_message
from ._bus import has_pending_messages as has_pending_messages
from ._bus import heartbeat_bus_node as heartbeat_bus_node
from ._bus import list_bus_nodes as list_bus_nodes
from ._bus import post_message as post_message
from ._bus import prune_bus_nodes as prune_bus_nodes
from ._bus import prune_messages as prune_messages
from ._bus import register_bus_node as register_bus_node
from ._bus import remove_bus_node as remove_bus_node
from ._cluster import beat_node as beat_node
from ._cluster import claim_daemon_task as claim_daemon_task
from ._cluster import db_clock as db_clock
from ._cluster import forget_node as forget_node
from ._cluster import list_nodes as list_nodes
from ._cluster import owner_gone as owner_gone
from ._cluster import queue_depth as queue_depth
from ._cluster import task_lease_key as task_lease_key
from ._cluster import task_wake_listener as task_wake_listener
from ._cluster import wake_task_claimers as wake_task_claimers
from ._cluster import withdraw_daemon_task as withdraw_daemon_task
from ._connect import DEFAULT_BUSY_TIMEOUT as DEFAULT_BUSY_TIMEOUT
from ._connect import connect as connect
from ._connect import immediate as immediate
from ._connect import translate_error as translate_error
from ._dispatch import by_connection as _by_connection
from ._items import add_held_input as add_held_input
from ._items import append_item as append_item
from ._items import discard_in_progress_item as discard_in_progress_item
from ._items import get_item as get_item
from ._items import list_held_input as list_held_input
from ._items import list_items as list_items
from ._items import put_item as put_item
from ._items import remove_held_input as remove_held_input
from ._items import search_items as search_items
from ._items import update_held_input as update_held_input
from ._items import update_item as update_item
from ._memory import delete_context_file as delete_context_file
from ._memory import delete_memory as delete_memory
from ._memory import get_memory as get_memory
from ._memory import list_context_files as list_context_files
from ._memory import list_memory as list_memory
from ._memory import put_context_file as put_context_file
from ._memory import put_memory as put_memory
from ._objectives import MAX_FAILURES as MAX_FAILURES
from ._objectives import Objective as Objective
from ._objectives import ObjectiveTask as ObjectiveTask
from ._objectives import add_objective_task as add_objective_task
from ._objectives import create_objective as create_objective
from ._objectives import finish_objective_task as finish_objective_task
from ._objectives import get_objective as get_objective
from ._objectives import list_objectives as list_objectives
from ._objectives import set_objective_status as set_objective_status
from ._objectives import start_objective_task as start_objective_task
from ._operations import OPERATIONS as OPERATIONS
from ._queries import adopt_schedule_run as adopt_schedule_run
from ._queries import chat_ids_with_title as chat_ids_with_title
from ._queries import chat_threads_with_cwd as chat_threads_with_cwd
from ._queries import count_turns as count_turns
from ._queries import delete_memory_prefix as delete_memory_prefix
from ._queries import first_user_text as first_user_text
from ._queries import latest_run_status as latest_run_status
from ._queries import mark_worker_delivered as mark_worker_delivered
from ._queries import memory_scope_counts as memory_scope_counts
from ._queries import memory_value as memory_value
from ._queries import page_threads as page_threads
from ._queries import queued_worker_roots as queued_worker_roots
from ._queries import read_snapshot as read_snapshot
from ._queries import schedule_run_status as schedule_run_status
from ._queries import scope_has_memory as scope_has_memory
from ._rows import iso_from_unix as iso_from_unix
from ._rows import new_id as new_id
from ._rows import utc_now as utc_now
from ._schedules2 import JobRun as JobRun
from ._schedules2 import ScheduledJob as ScheduledJob
from ._schedules2 import add_job as add_job
from ._schedules2 import adopt_job as adopt_job
from ._schedules2 import advance_next_run as advance_next_run
from ._schedules2 import bump_schedule_changes as bump_schedule_changes
from ._schedules2 import claim_requested_run as claim_requested_run
from ._schedules2 import claim_slot as claim_slot
from ._schedules2 import get_job as get_job
from ._schedules2 import has_running_run as has_running_run
from ._schedules2 import list_job_runs as list_job_runs
from ._schedules2 import list_jobs as list_jobs
from ._schedules2 import list_open_runs as list_open_runs
from ._schedules2 import list_requested_runs as list_requested_runs
from ._schedules2 import mark_run_finished as mark_run_finished
from ._schedules2 import mark_run_started as mark_run_started
from ._schedules2 import record_skipped as record_skipped
from ._schedules2 import remove_job as remove_job
from ._schedules2 import request_run as request_run
from ._schedules2 import schedule_changes as schedule_changes
from ._schedules2 import schedule_snapshot as schedule_snapshot
from ._schedules2 import set_job_enabled as set_job_enabled
from ._schema import migrate as migrate
from ._schema import schema_version as schema_version
from ._store import Store as Store
from ._store import open_store as open_store
from ._tasks import enqueue_daemon_task as enqueue_daemon_task
from ._tasks import get_daemon_task as get_daemon_task
from ._tasks import list_daemon_tasks as list_daemon_tasks
from ._tasks import update_daemon_task as update_daemon_task
from ._thread_state import interrupt_open_items as interrupt_open_items
from ._thread_state import thread_changed_since as thread_changed_since
from ._thread_state import thread_has_workers as thread_has_workers
from ._threads import create_run as create_run
from ._threads import create_thread as create_thread
from ._threads import create_turn as create_turn
from ._threads import delete_thread as delete_thread
from ._threads import get_run as get_run
from ._threads import get_thread as get_thread
from ._threads import get_turn as get_turn
from ._threads import list_runs as list_runs
from ._threads import list_threads as list_threads
from ._threads import list_turns as list_turns
from ._threads import update_run as update_run
from ._threads import update_thread as update_thread
from ._threads import update_turn as update_turn
from ._usage import list_usage_records as list_usage_records
from ._workers import claim_queued_worker as claim_queued_worker
from ._workers import create_worker as create_worker
from ._workers import get_worker as get_worker
from ._workers import list_workers as list_workers
from ._workers import update_worker as update_worker
from .leases import Lease as Lease
from .leases import acquire as acquire
from .leases import acquire_then as acquire_then
from .leases import check_fence as check_fence
from .leases import fenced as fenced
from .leases import get_lease as get_lease
from .leases import hand_over as hand_over
from .leases import release as release
from .leases import renew as renew
from .leases import thread_lease_key as thread_lease_key

# The data functions run on either backend's connection (roost/storage/_dispatch.py); the lease
# functions, the node bus, reconcile and the portable modules choose by connection themselves.
_LEASE_OPS = ("acquire", "acquire_then", "renew", "release", "hand_over", "check_fence", "get_lease")
_CHOOSE_THEMSELVES = frozenset((*_LEASE_OPS, *_BUS_OPERATIONS))
for _name in (*OPERATIONS, "put_item"):
    if _name in globals() and _name not in _CHOOSE_THEMSELVES:
        globals()[_name] = _by_connection(globals()[_name])
del _name

if TYPE_CHECKING:
    from ._interface import BusStore as BusStore
    from ._interface import ConnT as ConnT
    from ._interface import InputStore as InputStore
    from ._interface import ItemStore as ItemStore
    from ._interface import LeaseStore as LeaseStore
    from ._interface import MemoryStore as MemoryStore
    from ._interface import ObjectiveStore as ObjectiveStore
    from ._interface import ProcessStore as ProcessStore
    from ._interface import ScheduleStore as ScheduleStore
    from ._interface import StoreBackend as StoreBackend
    from ._interface import TaskStore as TaskStore
    from ._interface import ThreadStore as ThreadStore
    from ._interface import WorkerStore as WorkerStore
    from ._keeper import Execution as Execution
    from ._keeper import LeaseKeeper as LeaseKeeper
    from ._owner import default_owner as default_owner
    from ._processes import ProcessHook as ProcessHook
    from ._processes import forget_tool_process as forget_tool_process
    from ._processes import list_tool_processes as list_tool_processes
    from ._processes import reap_tool_processes as reap_tool_processes
    from ._processes import record_tool_process as record_tool_process
    from ._processes import tool_process_hook as tool_process_hook
    from ._reconcile import ReconcileReport as ReconcileReport
    from ._reconcile import reconcile as reconcile
    from ._writer import StoreWriter as StoreWriter
    from ._writer import WriterState as WriterState
    from ._writer import WriterStats as WriterStats

#: Exports whose modules import trio (the writer, the lease keeper, tool process groups and the
#: reconciliation that reaps them): loaded on first access (PEP 562), so a blocking CLI command
#: that only reads the store does not import the async runtime; and the store interface's Protocol
#: classes (``_interface``: a few ms of typing machinery, used by type checks and conformance
#: tests; the operation names the dispatch below needs are in ``_operations``).
_LAZY = {
    "BusStore": "roost.storage._interface",
    "ConnT": "roost.storage._interface",
    "InputStore": "roost.storage._interface",
    "ItemStore": "roost.storage._interface",
    "LeaseStore": "roost.storage._interface",
    "MemoryStore": "roost.storage._interface",
    "ObjectiveStore": "roost.storage._interface",
    "ProcessStore": "roost.storage._interface",
    "ScheduleStore": "roost.storage._interface",
    "StoreBackend": "roost.storage._interface",
    "TaskStore": "roost.storage._interface",
    "ThreadStore": "roost.storage._interface",
    "WorkerStore": "roost.storage._interface",
    "Execution": "roost.storage._keeper",
    "LeaseKeeper": "roost.storage._keeper",
    "default_owner": "roost.storage._owner",
    "ProcessHook": "roost.storage._processes",
    "forget_tool_process": "roost.storage._processes",
    "list_tool_processes": "roost.storage._processes",
    "reap_tool_processes": "roost.storage._processes",
    "record_tool_process": "roost.storage._processes",
    "tool_process_hook": "roost.storage._processes",
    "ReconcileReport": "roost.storage._reconcile",
    "reconcile": "roost.storage._reconcile",
    "StoreWriter": "roost.storage._writer",
    "WriterState": "roost.storage._writer",
    "WriterStats": "roost.storage._writer",
}

__all__ = [
    "adopt_job",
    "StoreBackend",
    "ConnT",
    "OPERATIONS",
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
    "DEFAULT_BUSY_TIMEOUT",
    "connect",
    "immediate",
    "translate_error",
    "Store",
    "open_store",
    "migrate",
    "schema_version",
    "StoreWriter",
    "WriterState",
    "WriterStats",
    "Lease",
    "acquire",
    "acquire_then",
    "renew",
    "release",
    "hand_over",
    "check_fence",
    "fenced",
    "get_lease",
    "thread_lease_key",
    "LeaseKeeper",
    "Execution",
    "default_owner",
    "ReconcileReport",
    "reconcile",
    "new_id",
    "utc_now",
    "iso_from_unix",
    "thread_has_workers",
    "thread_changed_since",
    "interrupt_open_items",
    "create_thread",
    "get_thread",
    "list_threads",
    "update_thread",
    "delete_thread",
    "create_turn",
    "get_turn",
    "list_turns",
    "update_turn",
    "create_run",
    "get_run",
    "list_runs",
    "update_run",
    "append_item",
    "get_item",
    "list_items",
    "update_item",
    "put_item",
    "discard_in_progress_item",
    "search_items",
    "add_held_input",
    "list_held_input",
    "update_held_input",
    "remove_held_input",
    "claim_queued_worker",
    "list_usage_records",
    "read_blob",
    "read_blob_chunk",
    "insert_bg_process",
    "get_bg_process",
    "list_bg_processes",
    "received_bg_processes",
    "update_bg_process",
    "record_bg_exit",
    "mark_lost_bg_processes",
    "running_owners",
    "create_worker",
    "get_worker",
    "list_workers",
    "update_worker",
    "ScheduledJob",
    "JobRun",
    "add_job",
    "get_job",
    "list_jobs",
    "remove_job",
    "set_job_enabled",
    "bump_schedule_changes",
    "schedule_changes",
    "schedule_snapshot",
    "advance_next_run",
    "request_run",
    "list_requested_runs",
    "claim_requested_run",
    "claim_slot",
    "record_skipped",
    "mark_run_started",
    "mark_run_finished",
    "has_running_run",
    "list_open_runs",
    "list_job_runs",
    "enqueue_daemon_task",
    "beat_node",
    "claim_daemon_task",
    "withdraw_daemon_task",
    "task_wake_listener",
    "wake_task_claimers",
    "db_clock",
    "forget_node",
    "list_nodes",
    "owner_gone",
    "queue_depth",
    "task_lease_key",
    "get_daemon_task",
    "list_daemon_tasks",
    "update_daemon_task",
    "queued_worker_roots",
    "read_snapshot",
    "mark_worker_delivered",
    "first_user_text",
    "latest_run_status",
    "count_turns",
    "chat_ids_with_title",
    "page_threads",
    "chat_threads_with_cwd",
    "adopt_schedule_run",
    "schedule_run_status",
    "memory_value",
    "memory_scope_counts",
    "delete_memory_prefix",
    "scope_has_memory",
    "put_memory",
    "get_memory",
    "list_memory",
    "delete_memory",
    "put_context_file",
    "list_context_files",
    "delete_context_file",
    "ProcessHook",
    "record_tool_process",
    "forget_tool_process",
    "list_tool_processes",
    "reap_tool_processes",
    "tool_process_hook",
    "Objective",
    "ObjectiveTask",
    "MAX_FAILURES",
    "create_objective",
    "get_objective",
    "list_objectives",
    "set_objective_status",
    "add_objective_task",
    "start_objective_task",
    "finish_objective_task",
    "BusMessage",
    "BusNode",
    "BusStore",
    *_BUS_OPERATIONS,
]


if TYPE_CHECKING:  # PostgreSQL (psycopg) loads only when a postgresql:// URL is opened
    from ._backend import EarlyStore as EarlyStore
    from ._backend import configured_database_url as configured_database_url
    from ._backend import database_label as database_label
    from ._backend import open_backend as open_backend
    from ._pg_connect import DATABASE_URL_ENV as DATABASE_URL_ENV
    from ._pg_connect import redact_url as redact_url
    from ._pg_connect import translate_pg_error as translate_pg_error
    from ._pg_schema import migrate_pg as migrate_pg
    from ._pg_schema import pg_migrations as pg_migrations
    from ._pg_schema import pg_schema_version as pg_schema_version
    from ._pg_store import PostgresStore as PostgresStore
    from ._pg_store import open_postgres_store as open_postgres_store

_LAZY.update(
    {
        "open_backend": "roost.storage._backend",
        "configured_database_url": "roost.storage._backend",
        "database_label": "roost.storage._backend",
        "EarlyStore": "roost.storage._backend",
        "DATABASE_URL_ENV": "roost.storage._pg_connect",
        "redact_url": "roost.storage._pg_connect",
        "translate_pg_error": "roost.storage._pg_connect",
        "migrate_pg": "roost.storage._pg_schema",
        "pg_migrations": "roost.storage._pg_schema",
        "pg_schema_version": "roost.storage._pg_schema",
        "PostgresStore": "roost.storage._pg_store",
        "open_postgres_store": "roost.storage._pg_store",
    }
)

__all__ += [
    "open_backend",
    "configured_database_url",
    "database_label",
    "EarlyStore",
    "migrate_pg",
    "DATABASE_URL_ENV",
    "redact_url",
    "translate_pg_error",
    "pg_migrations",
    "pg_schema_version",
    "PostgresStore",
    "open_postgres_store",
]


def _fix_module_metadata(names: list[str]) -> None:
    _publish(globals(), names)


__getattr__, __dir__ = _attach(globals(), _LAZY, on_load=_fix_module_metadata)
_fix_module_metadata([n for n in __all__ if n not in _LAZY])
