"""The first ``initialize`` of ``roost app-server``, answered before trio and the runtime load (issue 19).

A client spawns ``roost app-server`` and writes ``initialize`` at once; importing trio and the
runtime takes most of the start-up. Its answer needs neither: the server description
(:func:`server_description`) is the provider settings, the host identity, the lease owner id the
runtime will use, and environment settings. So ``roost app-server``, once its options, its
configuration file and the store (opened and migrated: the failures a start reports) are known
good, reads what stdin already holds without blocking (:func:`answer_initialize_early`). When
that starts with one complete ``initialize`` request of the plain form every client sends, it
writes the exact response the session would (same encoder, same fields) and hands the state the
request set to the session (:meth:`EarlyInitialize.apply`). Every byte read from stdin is handed
to the line decoder ahead of the rest of the input (:class:`PrefixedReceiveStream`), so nothing
is lost or read twice; any other first line (or none yet) is left to the session as before.

Nothing here imports trio: it runs before the event loop exists.
"""

from __future__ import annotations

import os
import select
from typing import Any

import attrs

from roost import __version__
from roost._json import JSONDecodeError, dumps_line, loads
from roost._paths import positive_env, tree_settings

__all__ = ["EarlyInitialize", "PROTOCOL_VERSION", "answer_initialize_early", "server_description"]

#: The app-server contract's version string (app-server-protocol.md, "Transport and initialization").
PROTOCOL_VERSION = "wuu-app-server/v0.1"

#: The longest first line answered early (a real ``initialize`` is a few hundred bytes).
_EARLY_LINE_MAX = 1 << 20


def server_description(
    *,
    settings: Any,
    host: dict | None,
    owner: str,
    setup_issues: list[str],
    config_error: str | None = None,
    store_issue: str | None = None,
) -> dict:
    """The ``initialize`` result (docs/app-server.md, "Initialization").

    Args:
        settings: the default ProviderSettings, or None (no engine configured).
        host: hosted mode's ``{kind: "cloud", instance_id, workspace_id}``; None: ``{kind:
            "local", instance_id: owner}``.
        owner: the runtime's lease owner id (``runtime.services.owner``).
        setup_issues: why no engine is usable (``status: needs_setup`` when any).
        config_error: a rejected configuration edit (reported as one more issue).
        store_issue: why the store refuses writes (a read-only ``$ROOST_HOME``: one more issue;
            reads are served, each write answers ``storage_read_only``).
    """
    from roost.protocol._catalog import catalog_providers

    host = host or {"kind": "local", "instance_id": owner}
    workspace: dict = {"root": os.getcwd()}
    if host.get("workspace_id"):
        workspace["id"] = host["workspace_id"]
    issues = list(setup_issues)
    if config_error:  # a rejected configuration edit: the previous model stays for display
        issues.append(f"the configuration file was rejected: {config_error}")
    if store_issue:
        issues.append(f"the store refuses writes (each answers storage_read_only; reads are served): {store_issue}")
    return {
        "protocol_version": PROTOCOL_VERSION,
        "status": "needs_setup" if issues else "ready",
        "issues": issues,
        "server": {"name": "roost", "version": __version__},
        "core": {"name": "roost", "version": __version__, "engine": "roost"},
        "runtime_host": dict(host),
        "workspace": workspace,
        "model": settings.describe() if settings is not None else None,
        "permissions": {"modes": ["read_only", "standard", "unconfined"], "default": "standard"},
        "extensions": [],
        "features": {
            "ephemeral_threads": True,
            "worktrees": True,
            "runs": True,
            "steering": True,
            "held_input": True,
            "reverse_rpc": ["approval/request"],
        },
        # the effective limit of concurrently running workers per tree (ROOST_MAX_PARALLEL)
        "max_parallel": tree_settings()[0],
        "catalog_providers": catalog_providers(),
    }


@attrs.define
class EarlyInitialize:
    """What :func:`answer_initialize_early` read from stdin and, if it answered, the state the
    request set (as the ``initialize`` handler sets it: ``roost.protocol._as_threads``).

    Attributes:
        prefix: the bytes read from fd 0 and not yet consumed (the line decoder gets them first).
        owner: the lease owner id the answer reported (the runtime must use it); None: no answer.
        capabilities, reverse_methods, client_name: what the answered request set.
    """

    prefix: bytes = b""
    owner: str | None = None
    capabilities: dict = attrs.field(factory=dict)
    reverse_methods: set[str] = attrs.field(factory=set)
    client_name: str = "client"
    #: the answered request itself (the worker processes of :mod:`roost.protocol._as_workers`
    #: are initialized with it too)
    frame: dict | None = None
    #: set by :meth:`apply`: the runtime started and the session, about to serve, took the answered state
    applied: bool = False

    def apply(self, session: Any) -> None:
        """Put ``session`` in the state after the answered ``initialize`` (nothing if none was)."""
        if self.owner is None:
            return
        self.applied = True
        session.capabilities = self.capabilities
        session.reverse_methods = set(self.reverse_methods)
        session.client_name = self.client_name
        session.initialized = True
        session.answered_early = True
        session.announce_pending = True  # mcp/status/updated, as after the handler's answer
        session.answered_initialize.set()
        router = getattr(session, "router", None)
        if router is not None and self.frame is not None:  # replayed to each worker, as a handled one
            router.route(self.frame.get("id"), "initialize", self.frame.get("params"), self.frame)


def _read_available(fd: int) -> tuple[bytes, bool]:
    """What ``fd`` holds now, without waiting, up to the first newline or :data:`_EARLY_LINE_MAX`
    bytes; and whether end of input was seen."""
    data = bytearray()
    while b"\n" not in data and len(data) <= _EARLY_LINE_MAX:
        try:
            if not select.select([fd], [], [], 0)[0]:
                break
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            return bytes(data), True
        data += chunk
    return bytes(data), False


def _plain_initialize(line: bytes) -> tuple[Any, EarlyInitialize] | None:
    """``(id, state)`` when ``line`` is an ``initialize`` request that the handler would accept,
    in the plain form (only the documented envelope and params members); else None (the session
    answers it, with its own checks and errors)."""
    limit = positive_env("ROOST_MAX_LINE_BYTES", _EARLY_LINE_MAX, integer=True)
    if len(line) > min(limit, _EARLY_LINE_MAX) or b"\r" in line:
        return None
    try:
        frame = loads(line)
    except JSONDecodeError:
        return None
    if type(frame) is not dict or not set(frame) <= {"id", "method", "params"} or frame.get("method") != "initialize":
        return None
    rid, params = frame.get("id"), frame.get("params")
    if type(rid) not in (int, str) or (type(rid) is int and abs(rid) >= 1 << 63):
        return None
    params = {} if params is None else params
    if type(params) is not dict or not set(params) <= {"protocol_version", "client", "capabilities"}:
        return None
    p = {k: v for k, v in params.items() if v is not None}
    if p.get("protocol_version", PROTOCOL_VERSION) != PROTOCOL_VERSION:
        return None
    client, capabilities = p.get("client", {}), p.get("capabilities", {})
    if type(client) is not dict or type(capabilities) is not dict:
        return None
    if any(client.get(key) is not None and type(client.get(key)) is not str for key in ("name", "version")):
        return None  # the session's invalid_params
    if type(capabilities.get("deferred_notification_content")) not in (bool, type(None)):
        return None  # the session's invalid_params
    reverse = capabilities.get("reverse_rpc") or {}
    methods = (reverse.get("methods") or []) if type(reverse) is dict else None
    if type(methods) is not list or not all(type(m) is str for m in methods):
        return None
    name = str(client.get("name") or "client")
    return rid, EarlyInitialize(capabilities=capabilities, reverse_methods=set(methods), client_name=name, frame=frame)


def answer_initialize_early(
    *, engines: Any, host: dict | None, fd_in: int = 0, fd_out: int = 1, store_issue: Any = None
) -> EarlyInitialize:
    """Answer the first request on ``fd_in`` if it is a plain ``initialize`` already waiting there.

    Call it only once everything a start can fail on has been checked (options, configuration
    file, store): after the answer only the runtime's own start remains. Reads without waiting;
    writes the response (``{"id", "result"}`` in the session's encoding) to ``fd_out``.

    Args:
        engines: the :class:`~roost.protocol._engines.EngineCatalog` the session will use.
        host: as for :func:`server_description`.
        store_issue: ``store_issue() -> str | None``, called once when answering: why the store
            refuses writes (:func:`server_description`'s ``store_issue``); None: nothing to report.

    Returns:
        The bytes read (after the answered line, if any) and the answered state (``owner`` None:
        nothing was answered).
    """
    data, _ = _read_available(fd_in)
    line, newline, rest = data.partition(b"\n")
    found = _plain_initialize(line) if newline else None
    if found is None:
        return EarlyInitialize(prefix=data)
    from roost.storage import default_owner

    rid, state = found
    state.prefix, state.owner = rest, default_owner()
    setup = [engines.setup_error] if engines.setup_error else []
    result = server_description(
        settings=engines.default,
        host=host,
        owner=state.owner,
        setup_issues=setup,
        config_error=getattr(engines, "config_error", None),
        store_issue=store_issue() if store_issue is not None else None,
    )
    out = memoryview(dumps_line({"id": rid, "result": result}))
    while out:
        out = out[os.write(fd_out, out) :]
    return state
