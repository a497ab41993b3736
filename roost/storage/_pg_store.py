"""The PostgreSQL store: a connection pool, migrations on open, and the store interface.

Every operation of :class:`roost.storage.StoreBackend` is implemented on PostgreSQL (issue 13,
foundation): ``_pg_threads`` (threads, turns, runs and their queries), ``_pg_items`` (items,
search, held input), ``_pg_leases``, ``_pg_memory`` (memory, context files, the daemon task
queue), ``_pg_workers`` (worker trees, tool process records) and ``_pg_schedules``; the node bus
is one implementation for both backends (``_bus``; ``_pg_bus`` is its ``LISTEN`` connection); plus
connections, the versioned migrations, the group-commit writer (:class:`PgWriter`, which
:class:`roost.storage.LeaseKeeper` also drives) and start-up reconciliation (``reconcile``).
The rest of Roost reaches it through :func:`roost.storage.open_backend`; the room's public data
functions take either backend's connection (``_dispatch``), so the daemon, ``roost serve`` and
the CLI run unchanged on PostgreSQL.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import psycopg

from roost.errors import StoreClosed, StoreError

from . import (
    _pg_bus,
    _pg_items,
    _pg_leases,
    _pg_memory,
    _pg_objectives,
    _pg_schedules,
    _pg_threads,
    _pg_workers,
    _processes,
)
from ._bus import BusOperations
from ._pg_connect import connect_pg, open_pool, translate_pg_error, validate_url
from ._pg_reconcile import reconcile_pg
from ._pg_schema import migrate_pg
from ._pg_writer import PgWriter

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    from ._interface import StoreBackend

__all__ = ["PostgresStore", "open_postgres_store"]


class PostgresStore(BusOperations):
    """An open Roost database on a PostgreSQL server. Create it with :func:`open_postgres_store`.

    The node bus operations are the same functions as on SQLite (:class:`BusOperations`); its
    wake-up is :meth:`bus_listener`.

    Attributes:
        url: the database URL (holds the password: show it with ``redact_url``).
        writer: the process's :class:`PgWriter` (start it with ``nursery.start(store.writer.run)``).
    """

    # threads, turns, runs (ThreadStore)
    create_objective = staticmethod(_pg_objectives.create_objective)
    get_objective = staticmethod(_pg_objectives.get_objective)
    list_objectives = staticmethod(_pg_objectives.list_objectives)
    set_objective_status = staticmethod(_pg_objectives.set_objective_status)
    add_objective_task = staticmethod(_pg_objectives.add_objective_task)
    start_objective_task = staticmethod(_pg_objectives.start_objective_task)
    finish_objective_task = staticmethod(_pg_objectives.finish_objective_task)
    create_thread = staticmethod(_pg_threads.create_thread)
    get_thread = staticmethod(_pg_threads.get_thread)
    list_threads = staticmethod(_pg_threads.list_threads)
    update_thread = staticmethod(_pg_threads.update_thread)
    delete_thread = staticmethod(_pg_threads.delete_thread)
    create_turn = staticmethod(_pg_threads.create_turn)
    get_turn = staticmethod(_pg_threads.get_turn)
    list_turns = staticmethod(_pg_threads.list_turns)
    update_turn = staticmethod(_pg_threads.update_turn)
    create_run = staticmethod(_pg_threads.create_run)
    get_run = staticmethod(_pg_threads.get_run)
    list_runs = staticmethod(_pg_threads.list_runs)
    update_run = staticmethod(_pg_threads.update_run)
    first_user_text = staticmethod(_pg_threads.first_user_text)
    latest_run_status = staticmethod(_pg_threads.latest_run_status)
    count_turns = staticmethod(_pg_threads.count_turns)
    chat_ids_with_title = staticmethod(_pg_threads.chat_ids_with_title)
    page_threads = staticmethod(_pg_threads.page_threads)
    chat_threads_with_cwd = staticmethod(_pg_threads.chat_threads_with_cwd)
    # items (ItemStore) and pending inputs (InputStore)
    append_item = staticmethod(_pg_items.append_item)
    get_item = staticmethod(_pg_items.get_item)
    list_items = staticmethod(_pg_items.list_items)
    update_item = staticmethod(_pg_items.update_item)
    search_items = staticmethod(_pg_items.search_items)
    add_held_input = staticmethod(_pg_items.add_held_input)
    list_held_input = staticmethod(_pg_items.list_held_input)
    update_held_input = staticmethod(_pg_items.update_held_input)
    remove_held_input = staticmethod(_pg_items.remove_held_input)
    # memory and context files (MemoryStore)
    put_memory = staticmethod(_pg_memory.put_memory)
    get_memory = staticmethod(_pg_memory.get_memory)
    list_memory = staticmethod(_pg_memory.list_memory)
    delete_memory = staticmethod(_pg_memory.delete_memory)
    put_context_file = staticmethod(_pg_memory.put_context_file)
    list_context_files = staticmethod(_pg_memory.list_context_files)
    delete_context_file = staticmethod(_pg_memory.delete_context_file)
    memory_value = staticmethod(_pg_memory.memory_value)
    memory_scope_counts = staticmethod(_pg_memory.memory_scope_counts)
    delete_memory_prefix = staticmethod(_pg_memory.delete_memory_prefix)
    scope_has_memory = staticmethod(_pg_memory.scope_has_memory)
    # the daemon task queue (TaskStore)
    enqueue_daemon_task = staticmethod(_pg_memory.enqueue_daemon_task)
    get_daemon_task = staticmethod(_pg_memory.get_daemon_task)
    list_daemon_tasks = staticmethod(_pg_memory.list_daemon_tasks)
    update_daemon_task = staticmethod(_pg_memory.update_daemon_task)
    # worker trees (WorkerStore)
    create_worker = staticmethod(_pg_workers.create_worker)
    get_worker = staticmethod(_pg_workers.get_worker)
    list_workers = staticmethod(_pg_workers.list_workers)
    update_worker = staticmethod(_pg_workers.update_worker)
    claim_queued_worker = staticmethod(_pg_workers.claim_queued_worker)
    queued_worker_roots = staticmethod(_pg_workers.queued_worker_roots)
    mark_worker_delivered = staticmethod(_pg_workers.mark_worker_delivered)
    # tool process records (ProcessStore)
    record_tool_process = staticmethod(_processes.record_tool_process)  # portable SQL, both backends
    forget_tool_process = staticmethod(_processes.forget_tool_process)
    list_tool_processes = staticmethod(_processes.list_tool_processes)
    # schedules and their run records (ScheduleStore)
    bump_schedule_changes = staticmethod(_pg_schedules.bump_schedule_changes)
    schedule_changes = staticmethod(_pg_schedules.schedule_changes)
    add_job = staticmethod(_pg_schedules.add_job)
    get_job = staticmethod(_pg_schedules.get_job)
    list_jobs = staticmethod(_pg_schedules.list_jobs)
    adopt_job = staticmethod(_pg_schedules.adopt_job)
    remove_job = staticmethod(_pg_schedules.remove_job)
    set_job_enabled = staticmethod(_pg_schedules.set_job_enabled)
    advance_next_run = staticmethod(_pg_schedules.advance_next_run)
    request_run = staticmethod(_pg_schedules.request_run)
    list_requested_runs = staticmethod(_pg_schedules.list_requested_runs)
    claim_requested_run = staticmethod(_pg_schedules.claim_requested_run)
    claim_slot = staticmethod(_pg_schedules.claim_slot)
    record_skipped = staticmethod(_pg_schedules.record_skipped)
    mark_run_started = staticmethod(_pg_schedules.mark_run_started)
    mark_run_finished = staticmethod(_pg_schedules.mark_run_finished)
    has_running_run = staticmethod(_pg_schedules.has_running_run)
    list_open_runs = staticmethod(_pg_schedules.list_open_runs)
    list_job_runs = staticmethod(_pg_schedules.list_job_runs)
    adopt_schedule_run = staticmethod(_pg_schedules.adopt_schedule_run)
    schedule_run_status = staticmethod(_pg_schedules.schedule_run_status)
    # leases (LeaseStore)
    acquire = staticmethod(_pg_leases.acquire)
    acquire_then = staticmethod(_pg_leases.acquire_then)
    renew = staticmethod(_pg_leases.renew)
    release = staticmethod(_pg_leases.release)
    hand_over = staticmethod(_pg_leases.hand_over)
    check_fence = staticmethod(_pg_leases.check_fence)
    get_lease = staticmethod(_pg_leases.get_lease)
    fenced = staticmethod(_pg_leases.fenced)
    reconcile = staticmethod(reconcile_pg)
    db_now = staticmethod(_pg_leases.db_now)
    live_lease_owners = staticmethod(_pg_leases.live_lease_owners)

    def __init__(self, url: str, pool: ConnectionPool, *, batch_max: int = 512, queue_size: int = 4096) -> None:
        self.url = url
        self._pool = pool
        self._closed = False
        self.writer = PgWriter(self, batch_max=batch_max, queue_size=queue_size)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        if self._closed:
            raise StoreClosed("the store is closed")
        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as exc:
            raise translate_pg_error(exc, self.url) from exc

    @contextlib.contextmanager
    def read(self) -> Iterator[psycopg.Connection]:
        """Lend a connection for reads, in a ``READ ONLY`` transaction ended with the block.

        Blocking; offload from trio with ``trio.to_thread.run_sync``.

        Raises:
            StoreClosed: the store is closed.
            DatabaseUnreachable: the server went away.
        """
        with self._connection() as conn:
            with conn.transaction():
                conn.execute("SET TRANSACTION READ ONLY")
                yield conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        """Run the block in one write transaction: committed when it ends normally, rolled back
        on an exception (``READ COMMITTED``; the lease operations lock their rows).

        Raises:
            StoreClosed: the store is closed.
            DatabaseUnreachable: the server went away.
            StoreError: the commit failed.
        """
        with self._connection() as conn:
            with conn.transaction():
                yield conn

    def bus_listener(self, node_id: str) -> _pg_bus.PgBusListener:
        """A :class:`PgBusListener` (``LISTEN roost_bus``) for node ``node_id``; close it when done."""
        return _pg_bus.PgBusListener(self.url, node_id)

    def close(self) -> None:
        """Close the pool (idempotent)."""
        if not self._closed:
            self._closed = True
            self._pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_postgres_store(
    url: str, *, max_connections: int = 8, batch_max: int = 512, queue_size: int = 4096
) -> PostgresStore:
    """Connect to ``url``, bring its schema up to date and return a :class:`PostgresStore`.

    Blocking (migrations run here). Safe to call from several processes at once.

    Args:
        url: ``postgresql://user:password@host:port/dbname``.
        max_connections: the pool's size.
        batch_max: most writes per group commit of the writer (as :func:`open_store`).
        queue_size: bound of the writer's queue (as :func:`open_store`).

    Raises:
        DatabaseUrlInvalid: the URL is malformed.
        DatabaseUnreachable: no server answers, or it refused the login or the database name.
        DatabasePermissionDenied: the role may not connect or create Roost's tables.
        SchemaTooNew: a newer Roost migrated this database.
        MigrationError: a migration failed (nothing of it applied).
    """
    validate_url(url)
    conn = connect_pg(url)
    try:
        migrate_pg(conn, url)
    finally:
        conn.close()
    try:
        pool = open_pool(url, max_size=max_connections)
    except psycopg.Error as exc:
        raise translate_pg_error(exc, url) from exc
    except StoreError:
        raise
    return PostgresStore(url, pool, batch_max=batch_max, queue_size=queue_size)


def _pg_conforms(store: PostgresStore) -> StoreBackend[psycopg.Connection]:
    """Never called: mypy checks here that PostgresStore implements the whole store interface."""
    return store
