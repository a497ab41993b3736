"""The root supervision tree of one Roost process (DESIGN.md section 2).

::

    root (one_for_one, intensity 3 per 10 s)
    ├── store_writer     permanent   the single SQLite writer, group commit
    ├── lease_keeper     permanent   renews this process's execution leases
    └── threads          permanent   supervisor of ThreadActors (transient, loaded on demand)
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import attrs
import trio

from roost.actors._registry import ThreadRegistry
from roost.actors._services import Services
from roost.storage import LeaseKeeper, open_store, reconcile
from roost.supervisor._spec import ChildSpec, Restart, Strategy
from roost.supervisor._supervisor import Supervisor

__all__ = ["Runtime", "open_runtime"]


@attrs.define(eq=False)
class Runtime:
    """A running Roost process: its store, supervision tree, services and thread registry."""

    store: Any
    root: Supervisor
    services: Services
    registry: ThreadRegistry
    reconciled: Any = None

    def render_tree(self) -> str:
        """The live supervision tree as text."""
        return self.root.render_tree()


@asynccontextmanager
async def open_runtime(
    *, engine_for: Any, tools: dict[str, Any], db_path: Path | None = None, owner: str | None = None,
    lease_ttl: float = 15.0,
) -> AsyncIterator[Runtime]:
    """Start the root tree; yield the :class:`Runtime`; stop it in reverse order on exit.

    Start-up reconciliation closes what a dead process left open (running turns -> interrupted,
    workers -> interrupted, its leases released) before any request is served.

    Raises:
        StoreError: the database cannot be opened or migrated.
    """
    store = await trio.to_thread.run_sync(lambda: open_store(db_path))
    owner = owner or f"roost-{os.getpid()}-{os.urandom(3).hex()}"

    def _reconcile() -> Any:
        with store.transaction() as conn:
            return reconcile(conn, owner)

    try:
        report = await trio.to_thread.run_sync(_reconcile)
    except Exception:
        report = None
    keeper = LeaseKeeper(store.writer, owner=owner, ttl=lease_ttl)
    threads = Supervisor(name="threads", strategy=Strategy.ONE_FOR_ONE, intensity=50, period=10)
    services = Services(store=store, keeper=keeper, owner=owner, engine_for=engine_for, tools=tools,
                        lease_ttl=lease_ttl)
    registry = ThreadRegistry(threads, services)

    async def run_threads(*, task_status: Any) -> None:
        await threads.run(task_status=task_status)

    root = Supervisor(
        [
            ChildSpec("store_writer", store.writer.run, restart=Restart.PERMANENT, shutdown_timeout=10),
            ChildSpec("lease_keeper", keeper.run, restart=Restart.PERMANENT, shutdown_timeout=5),
            ChildSpec("threads", run_threads, restart=Restart.PERMANENT, shutdown_timeout=30),
        ],
        name="root",
    )
    runtime = Runtime(store=store, root=root, services=services, registry=registry, reconciled=report)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(root.run)
            try:
                yield runtime
            finally:
                nursery.cancel_scope.cancel()
    finally:
        store.close()
