"""Persistence: the SQLite schema and migrations, the group-commit writer, readers and leases.

Layout: ``_connect`` (connections, ``BEGIN IMMEDIATE``, sqlite3 error translation), ``_schema``
(versioned migrations), ``_writer`` (:class:`StoreWriter`), ``_store`` (:class:`Store`,
:func:`open_store`), ``leases`` and ``_keeper`` (execution leases, :class:`LeaseKeeper`),
``_reconcile``, ``_processes`` (tool process groups, reaped after a crash) and the data modules
``_threads``, ``_items``, ``_workers``, ``_schedules``, ``_memory``: plain functions of a
connection, writers to be passed to :meth:`StoreWriter.submit`, readers to be called on
:meth:`Store.read`.

This room never imports ``roost.actors`` or ``roost.protocol``.

Times: record timestamps are ISO 8601 UTC text (``2026-01-31T12:00:00.000000Z``); lease expiry is
unix wall-clock seconds.
"""

from __future__ import annotations

from ._connect import DEFAULT_BUSY_TIMEOUT as DEFAULT_BUSY_TIMEOUT
from ._connect import connect as connect
from ._connect import immediate as immediate
from ._connect import translate_error as translate_error
from ._items import add_held_input as add_held_input
from ._items import append_item as append_item
from ._items import get_item as get_item
from ._items import list_held_input as list_held_input
from ._items import list_items as list_items
from ._items import remove_held_input as remove_held_input
from ._items import search_items as search_items
from ._items import update_held_input as update_held_input
from ._items import update_item as update_item
from ._keeper import Execution as Execution
from ._keeper import LeaseKeeper as LeaseKeeper
from ._keeper import default_owner as default_owner
from ._memory import delete_context_file as delete_context_file
from ._memory import delete_memory as delete_memory
from ._memory import get_memory as get_memory
from ._memory import list_context_files as list_context_files
from ._memory import list_memory as list_memory
from ._memory import put_context_file as put_context_file
from ._memory import put_memory as put_memory
from ._processes import ProcessHook as ProcessHook
from ._processes import forget_tool_process as forget_tool_process
from ._processes import list_tool_processes as list_tool_processes
from ._processes import reap_tool_processes as reap_tool_processes
from ._processes import record_tool_process as record_tool_process
from ._processes import tool_process_hook as tool_process_hook
from ._reconcile import ReconcileReport as ReconcileReport
from ._reconcile import reconcile as reconcile
from ._rows import new_id as new_id
from ._rows import utc_now as utc_now
from ._schedules import claim_schedule_slot as claim_schedule_slot
from ._schedules import create_schedule as create_schedule
from ._schedules import delete_schedule as delete_schedule
from ._schedules import enqueue_daemon_task as enqueue_daemon_task
from ._schedules import get_schedule as get_schedule
from ._schedules import list_daemon_tasks as list_daemon_tasks
from ._schedules import list_schedule_runs as list_schedule_runs
from ._schedules import list_schedules as list_schedules
from ._schedules import update_daemon_task as update_daemon_task
from ._schedules import update_schedule as update_schedule
from ._schedules import update_schedule_run as update_schedule_run
from ._schema import migrate as migrate
from ._schema import schema_version as schema_version
from ._store import Store as Store
from ._store import open_store as open_store
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
from ._workers import claim_queued_worker as claim_queued_worker
from ._workers import create_worker as create_worker
from ._workers import get_worker as get_worker
from ._workers import list_workers as list_workers
from ._workers import update_worker as update_worker
from ._bgprocs import get_bg_process as get_bg_process
from ._bgprocs import insert_bg_process as insert_bg_process
from ._bgprocs import list_bg_processes as list_bg_processes
from ._bgprocs import mark_lost_bg_processes as mark_lost_bg_processes
from ._bgprocs import running_owners as running_owners
from ._bgprocs import update_bg_process as update_bg_process
from ._blobs import read_blob as read_blob
from ._blobs import read_blob_chunk as read_blob_chunk
from ._usage import list_usage_records as list_usage_records
from ._writer import StoreWriter as StoreWriter
from ._writer import WriterState as WriterState
from ._writer import WriterStats as WriterStats
from .leases import Lease as Lease
from .leases import acquire as acquire
from .leases import check_fence as check_fence
from .leases import fenced as fenced
from .leases import get_lease as get_lease
from .leases import hand_over as hand_over
from .leases import release as release
from .leases import renew as renew
from .leases import thread_lease_key as thread_lease_key

__all__ = [
    "DEFAULT_BUSY_TIMEOUT", "connect", "immediate", "translate_error",
    "Store", "open_store", "migrate", "schema_version",
    "StoreWriter", "WriterState", "WriterStats",
    "Lease", "acquire", "renew", "release", "hand_over", "check_fence", "fenced", "get_lease",
    "thread_lease_key", "LeaseKeeper", "Execution", "default_owner",
    "ReconcileReport", "reconcile", "new_id", "utc_now",
    "create_thread", "get_thread", "list_threads", "update_thread", "delete_thread",
    "create_turn", "get_turn", "list_turns", "update_turn",
    "create_run", "get_run", "list_runs", "update_run",
    "append_item", "get_item", "list_items", "update_item", "search_items",
    "add_held_input", "list_held_input", "update_held_input", "remove_held_input",
    "claim_queued_worker", "list_usage_records", "read_blob", "read_blob_chunk",
    "insert_bg_process", "get_bg_process", "list_bg_processes", "update_bg_process", "mark_lost_bg_processes",
    "running_owners",
    "create_worker", "get_worker", "list_workers", "update_worker",
    "create_schedule", "get_schedule", "list_schedules", "update_schedule", "delete_schedule",
    "claim_schedule_slot", "list_schedule_runs", "update_schedule_run",
    "enqueue_daemon_task", "list_daemon_tasks", "update_daemon_task",
    "put_memory", "get_memory", "list_memory", "delete_memory",
    "put_context_file", "list_context_files", "delete_context_file",
    "ProcessHook", "record_tool_process", "forget_tool_process", "list_tool_processes",
    "reap_tool_processes", "tool_process_hook",
]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("roost.storage._"):
        try:
            _obj.__module__ = __name__
        except (AttributeError, TypeError):
            pass
del _name, _obj
