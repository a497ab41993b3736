"""The root supervision tree of one Roost process (DESIGN.md section 2).

::

    root (one_for_one, intensity 3 per 10 s)
    ├── store_writer     permanent   the store's single writer (SQLite or PostgreSQL), group commit
    ├── lease_keeper     permanent   renews this process's execution leases
    ├── node_heartbeat   permanent   PostgreSQL only: this node's row in ``nodes`` (roost status);
    │                                its clean stop wakes the other nodes (NOTIFY roost_tasks)
    ├── threads          permanent   supervisor of ThreadActors (transient, loaded on demand)
    ├── thread_unloader  permanent   stops ThreadActors idle for ROOST_IDLE_UNLOAD_S (reloaded on use)
    └── node_bus         permanent   where the process is a node (app-server, serve): messages to
                                     and from the other processes on the store (roost.actors.NodeBus)
"""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from roost import _faults as faults
from roost._faults import load_fault_env
from roost._gc import apply_server_gc_policy
from roost._paths import positive_env
from roost.actors import NodeBus, Services, ThreadRegistry, ThreadRemote
from roost.errors import StoreError, StoreReadOnly
from roost.storage import LeaseKeeper, default_owner, open_backend, queued_worker_roots, reconcile, translate_error
from roost.supervisor._spec import ChildSpec, Restart, Strategy
from roost.supervisor._supervisor import Supervisor

__all__ = ["Runtime", "open_runtime", "lease_ttl_from_env", "with_memory_tools", "LEASE_TTL_ENV"]

log = logging.getLogger("roost.supervisor")


@attrs.define(eq=False)
class Runtime:
    """A running Roost process: its store, supervision tree, services and thread registry."""

    store: Any
    root: Supervisor
    services: Services
    registry: ThreadRegistry
    reconciled: Any = None
    #: why the store refuses writes (its :class:`~roost.errors.StoreReadOnly` message), found by
    #: the start-up reconciliation; None: it took the write.
    read_only: str | None = None

    def render_tree(self) -> str:
        """The live supervision tree as text."""
        return self.root.render_tree()


#: Environment variable overriding the execution lease duration, in seconds (tests use a short one).
LEASE_TTL_ENV = "ROOST_LEASE_TTL"


def lease_ttl_from_env(default: float) -> float:
    """Return ``$ROOST_LEASE_TTL`` as seconds (> 0), or ``default`` when it is unset or empty.

    Raises:
        ConfigError: the variable is set but is not a positive number.
    """
    return positive_env(LEASE_TTL_ENV, default, unit="seconds")


@asynccontextmanager
async def open_runtime(
    *,
    engine_for: Any,
    tools: dict[str, Any],
    db_path: Path | None = None,
    database_url: str | None = None,
    owner: str | None = None,
    lease_ttl: float | None = None,
    memory: bool = True,
    node_kind: str | None = None,
    open_store: Callable[[], Any] | None = None,
    writes_required: bool = False,
) -> AsyncIterator[Runtime]:
    """Start the root tree; yield the :class:`Runtime`; stop it in reverse order on exit.

    Start-up reconciliation closes what a dead process left open (running turns -> interrupted,
    workers -> interrupted, its leases released, also unexpired leases of a dead process of this
    host) before any request is served. Root threads with queued worker spawns are loaded (so those
    start) in the background.

    Args:
        engine_for: ``engine_for(thread) -> Engine``.
        tools: model-facing tool name -> Tool (not changed: the runtime's threads get a copy).
        db_path: the SQLite database (default ``$ROOST_HOME/roost.db``), used when no database
            URL is set.
        database_url: a ``postgresql://`` URL (default ``$ROOST_DATABASE_URL``): run on that
            PostgreSQL database, as one node of a cluster (:func:`roost.storage.open_backend`).
        owner: this process's lease owner identity (default :func:`roost.storage.default_owner`,
            ``"<host>:<pid>:<nonce>"``, which lets a successor recognise a killed owner).
        lease_ttl: execution lease duration in seconds (default ``$ROOST_LEASE_TTL`` or 15 s);
            leases are renewed every third of it.
        memory: also offer ``memory_save``, ``memory_recall`` and ``context_read`` over this
            runtime's store (see :func:`with_memory_tools`); False offers ``tools`` alone.
        node_kind: make this process a node of the bus (``"app-server"``, ``"serve"``): input for
            its threads from other processes on the store is delivered here, and this process
            forwards input for threads other nodes execute (:class:`roost.actors.ThreadRemote`).
            None (one-shot commands): not a node.
        open_store: a blocking callable returning the opened store, called in a worker thread
            instead of opening ``database_url`` / ``db_path`` (e.g. joining an opening that began
            earlier, :class:`roost.storage.EarlyStore`); its errors are raised as they are.
        writes_required: the command must write (``roost exec``): a read-only store raises its
            StoreReadOnly, not a warning. False: the runtime serves reads (``Runtime.read_only``).

    Raises:
        StoreError: the database cannot be opened or migrated (on PostgreSQL also
            ``DatabaseUrlInvalid``, ``DatabaseUnreachable``, ``DatabasePermissionDenied``,
            ``SchemaTooNew``: each names the setting).
        ConfigError: ``$ROOST_LEASE_TTL`` is not a positive number.
        StoreReadOnly: ``writes_required`` and the store is read-only (saying what to make writable).
    """
    lease_ttl = lease_ttl_from_env(15.0) if lease_ttl is None else lease_ttl
    store = await trio.to_thread.run_sync(open_store or (lambda: open_backend(database_url, path=db_path)))
    owner = owner or default_owner()
    faults.point("runtime.opened")  # test-only (ROOST_FAULTS): a start failing after the store opened
    if memory:
        tools = with_memory_tools(tools, store)

    report, read_only = await _reconcile_at_start(store, owner, writes_required=writes_required)
    runtime = _assemble(
        store, report, owner=owner, engine_for=engine_for, tools=tools, lease_ttl=lease_ttl, node_kind=node_kind
    )
    runtime.read_only = read_only
    keeper, root = runtime.services.keeper, runtime.root
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(root.run)
            if node_kind is not None:  # a long-running server (app-server, serve, its workers)
                apply_server_gc_policy()
            # Not on the way to the first request: a request for one of those threads loads it
            # itself (the registry loads a thread once).
            nursery.start_soon(_resume_worker_trees, runtime)
            try:
                yield runtime
            finally:
                nursery.cancel_scope.cancel()
    finally:
        keeper.close()
        store.writer.close()
        store.close()


def _assemble(
    store: Any,
    report: Any,
    *,
    owner: str,
    engine_for: Any,
    tools: dict[str, Any],
    lease_ttl: float,
    node_kind: str | None,
) -> Runtime:
    """The root tree over an opened, reconciled store: services, the thread registry, the bus and
    the root's children (not started yet)."""
    keeper = LeaseKeeper(store.writer, owner=owner, ttl=lease_ttl)

    def make_threads() -> Supervisor:
        return Supervisor(name="threads", strategy=Strategy.ONE_FOR_ONE, intensity=50, period=10)

    services = Services(
        store=store, keeper=keeper, owner=owner, engine_for=engine_for, tools=tools, lease_ttl=lease_ttl
    )
    registry = ThreadRegistry(make_threads(), services)
    _join_bus(services, registry, node_kind)
    load_fault_env()
    # Every start is a fresh instance that rebuilds its state: the writer and keeper services keep
    # their queues (and the held executions) across a restart, the registry reloads threads from
    # the store (DESIGN.md section 4, "Restart for real").
    children = _root_children(store, keeper, registry, make_threads, owner, lease_ttl) + _bus_children(services)
    root = Supervisor(children, name="root")
    return Runtime(store=store, root=root, services=services, registry=registry, reconciled=report)


def _root_children(
    store: Any, keeper: LeaseKeeper, registry: ThreadRegistry, make_threads: Any, owner: str, lease_ttl: float
) -> list[ChildSpec]:
    """The root tree's children (see the module docstring), in start order."""
    children = [
        ChildSpec("store_writer", store.writer.serve, restart=Restart.PERMANENT, shutdown_timeout=10),
        ChildSpec("lease_keeper", keeper.serve, restart=Restart.PERMANENT, shutdown_timeout=5),
    ]
    if not hasattr(store, "path"):  # PostgreSQL: one node of a cluster
        # started before the threads, so stopped after them (and after the task queue): its
        # clean-stop write wakes the other nodes once every lease of this node is released
        heartbeat = functools.partial(node_heartbeat, store.writer, owner, lease_ttl)
        children.append(ChildSpec("node_heartbeat", heartbeat, restart=Restart.PERMANENT, shutdown_timeout=5))
    children += [
        ChildSpec(
            "threads",
            functools.partial(registry.run_supervisor, make_threads),
            restart=Restart.PERMANENT,
            shutdown_timeout=30,
        ),
        ChildSpec(
            "thread_unloader",
            functools.partial(registry.run_idle_unloader, idle_s=idle_unload_s()),
            restart=Restart.PERMANENT,
            shutdown_timeout=5,
        ),
    ]
    return children


def _join_bus(services: Services, registry: ThreadRegistry, node_kind: str | None) -> None:
    """Make this process a node of the bus (``services.bus``, ``services.remote``) when ``node_kind``."""
    if node_kind is not None:
        services.bus = NodeBus(services.store, services.owner, node_kind)
        services.remote = ThreadRemote(services.bus, registry, services)


def _bus_children(services: Services) -> list[ChildSpec]:
    """The ``node_bus`` child of a node (none for a process that is not one)."""
    if services.bus is None:
        return []
    return [ChildSpec("node_bus", services.bus.serve, restart=Restart.PERMANENT, shutdown_timeout=5)]


async def _reconcile_at_start(store: Any, owner: str, *, writes_required: bool = False) -> tuple[Any, str | None]:
    """Start-up reconciliation (:func:`roost.storage.reconcile`): ``(report, read_only)``; the
    report is None when it failed (logged: not fatal), ``read_only`` the message when the store
    refused the write as read-only.

    Raises:
        StoreReadOnly: the store is read-only and ``writes_required``.
    """

    def _reconcile() -> Any:
        with store.transaction() as conn:
            return reconcile(conn, owner)

    try:
        return await trio.to_thread.run_sync(_reconcile), None
    except sqlite3.Error as exc:
        # Expected on a read-only or full database: one line, no traceback (issue 18, finding 6).
        error: StoreError = translate_error(exc)
    except StoreError as exc:
        error = exc
    except Exception:
        # Not fatal (e.g. the database stayed locked): leases still expire on their own, and each
        # admission settles the turns a dead execution left running on its thread.
        log.warning("start-up reconciliation failed", exc_info=True)
        return None, None
    if isinstance(error, StoreReadOnly) and writes_required:
        store.close()
        raise error  # the command reports it (once)
    log.warning("start-up reconciliation failed: %s", error)
    return None, str(error) if isinstance(error, StoreReadOnly) else None


async def _resume_worker_trees(runtime: Runtime) -> None:
    """Load the root threads that have queued worker spawns, so those start (claimed once each)."""
    store = runtime.store

    def roots() -> list[str]:
        with store.read() as conn:
            return queued_worker_roots(conn)

    try:
        thread_ids = await trio.to_thread.run_sync(roots)
    except Exception:
        log.exception("could not look for queued worker spawns")
        return
    for thread_id in thread_ids:
        try:
            await runtime.registry.get(thread_id)
        except Exception:
            log.exception("could not resume the worker tree of thread %s", thread_id)


async def node_heartbeat(
    writer: Any, owner: str, ttl: float, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Keep this node's ``nodes`` row fresh (:func:`roost.storage.beat_node`) every third of
    ``ttl`` seconds until cancelled, then delete it (a clean stop) and, in the same transaction,
    wake the other nodes' idle claimers (:func:`roost.storage.wake_task_claimers`: ``NOTIFY
    roost_tasks``), so they resume the tasks this node stopped at once rather than at their next
    poll; restartable. The root starts it before the threads and the task queue, so it stops
    after them: by then their task and thread leases are released.

    A failed beat is logged and retried at the next interval: the row only ages (``roost status``
    shows the node as gone after ``ttl``), nothing else depends on it.
    """
    from roost.storage import beat_node, forget_node, wake_task_claimers

    def stop(conn: Any) -> None:
        forget_node(conn, owner)
        wake_task_claimers(conn, "*", owner)  # (which task does not matter: they claim in order)

    task_status.started()
    started_at: float | None = None
    try:
        while True:
            try:
                clock = await writer.submit(beat_node, owner, ttl, started_at=started_at)
                started_at = clock if started_at is None else started_at
            except StoreError as exc:
                log.warning("node heartbeat failed: %s", exc)
            await trio.sleep(ttl / 3)
    finally:
        with trio.move_on_after(2) as scope:
            scope.shield = True
            try:
                await writer.submit(stop)
            except StoreError:
                pass  # the row ages out: status shows the node gone after its ttl


def with_memory_tools(tools: dict[str, Any], store: Any) -> dict[str, Any]:
    """Return ``tools`` plus the memory tools over ``store`` (a new dict; ``tools`` is not changed).

    The memory tools (:func:`roost.tools.memory_tools`: ``memory_save``, ``memory_recall``,
    ``context_read``) take each call's agent from ``ToolContext.agent``, so one set serves every
    thread. A name ``tools`` already has keeps its tool (a caller's own ``memory_save`` wins).
    """
    from roost.tools import memory_tools

    extra = {name: tool for name, tool in memory_tools(store).items() if name not in tools}
    return {**tools, **extra}


def idle_unload_s() -> float:
    """Seconds a thread stays idle before its actor is unloaded: ``ROOST_IDLE_UNLOAD_S`` (300)."""
    return positive_env("ROOST_IDLE_UNLOAD_S", 300.0, unit="seconds")
