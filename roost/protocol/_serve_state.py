"""The daemon's settings (:class:`ServeOptions`) and its per-client record (:class:`ClientState`)."""

from __future__ import annotations

import ssl
from pathlib import Path

import attrs
import trio

from roost.actors import ConnectionActor
from roost.protocol._outbox import DEFAULT_OUTBOX_LINES
from roost.protocol._serve_auth import ServeAuth
from roost.protocol._serve_prompts import Pending

__all__ = ["ServeOptions", "ClientState"]


@attrs.define(kw_only=True)
class ServeOptions:
    """The daemon's settings (see ``roost serve --help`` for each)."""

    socket_path: Path
    work_dir: Path
    http_port: int | None = None
    host: str = "127.0.0.1"
    ssl_context: ssl.SSLContext | None = None
    auth: ServeAuth = attrs.field(factory=ServeAuth)
    reconnect_grace: float = 30.0
    unattended_policy: str = "deny"
    max_concurrent: int = 1
    max_queued: int = 1000
    outbox_lines: int = DEFAULT_OUTBOX_LINES
    kick_grace: float = 10.0
    permission_mode: str = "standard"
    warn_threshold: int | None = None
    agent_name: str = "assistant"
    #: the orchestration config (absolute path) of tasks dispatched without one (``-c``); None: one agent
    config: str | None = None
    #: host the daemon's agents over A2A on the HTTP port (``--a2a``, roost.protocol._a2a_host)
    a2a: bool = False
    #: add ``"t"`` (unix seconds, float) to each broadcast event when it is emitted (benchmarks)
    stamp_events: bool = False
    #: a headless worker of ``roost serve --workers`` (no listeners, no clients; ``--worker``)
    headless: bool = False
    #: whether this process's runners claim tasks (hidden ``--no-claim``: a front door only)
    claims: bool = True


@attrs.define(eq=False)
class ClientState:
    """One client: every connection with its key (the newest is the live one), its approvals."""

    key: str
    client_id: str | None
    anonymous: bool
    conns: list = attrs.field(factory=list)
    approval_lock: trio.Lock = attrs.field(factory=trio.Lock)
    pending: Pending | None = None
    changed: trio.Event = attrs.field(factory=trio.Event)

    def live(self) -> ConnectionActor | None:
        for conn in reversed(self.conns):
            if conn.alive:
                return conn
        return None

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()
