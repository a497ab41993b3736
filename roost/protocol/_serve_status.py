"""What a running ``roost serve`` tells about itself: the ``status`` input and the daemon registry.

Issue 17, "Seeing into the daemon". Two pieces, both additive to wire-protocol.md:

* The **status input**: a client sends ``{"type": "status"}`` on the socket (or the WebSocket) and
  gets one ``{"type": "status", ...}`` event back, only on that connection (see
  :func:`status_snapshot` for its fields). A read-only client may ask.
* The **daemon registry**: each daemon writes ``$ROOST_HOME/run/daemons/<pid>.json``
  (``{pid, socket, workDir, httpPort, startedAt, database}``) once it listens and removes it when it stops,
  so ``roost status`` finds every daemon of a home wherever its socket is (``--socket``). A file
  whose process is gone (a daemon killed with SIGKILL) is stale: :func:`registered_daemons` skips
  and removes it.
"""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path
from typing import Any

from roost._json import dumps, loads

log = logging.getLogger("roost.serve")

__all__ = ["register_daemon", "registered_daemons", "registry_dir", "status_snapshot", "unregister_daemon"]


def registry_dir(home: Path) -> Path:
    """``HOME/run/daemons``."""
    return home / "run" / "daemons"


def register_daemon(home: Path, *, socket: str, work_dir: str, http_port: int | None) -> Path:
    """Write this process's registry file (mode 0600); return its path. Raises OSError.

    The file is ``{pid, socket, workDir, httpPort, startedAt, database}``: ``startedAt`` ISO 8601
    UTC, ``database`` the store it uses (:func:`roost.storage.database_label`: no password)."""
    from roost.storage import database_label

    directory = registry_dir(home)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"{os.getpid()}.json"
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    doc = {
        "pid": os.getpid(),
        "socket": socket,
        "workDir": work_dir,
        "httpPort": http_port,
        "startedAt": started,
        "database": database_label(home),
    }
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(dumps(doc))
    os.replace(tmp, path)
    return path


def unregister_daemon(path: Path | None) -> None:
    """Remove a registry file written by :func:`register_daemon` (missing: nothing to do)."""
    if path is not None:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def registered_daemons(home: Path) -> list[dict]:
    """The registry entries of live daemons of ``home``, by start time (stale files removed)."""
    directory = registry_dir(home)
    found = []
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return []
    for path in paths:
        try:
            doc = loads(path.read_bytes())
            pid = int(doc["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not _alive(pid):
            unregister_daemon(path)
            continue
        found.append(doc)
    return sorted(found, key=lambda d: str(d.get("startedAt")))


def _tree(runtime: Any) -> str | None:
    render = getattr(runtime, "render_tree", None)
    try:
        return render() if callable(render) else None
    except Exception:  # noqa: BLE001 - a tree being restructured must not break the status answer
        log.debug("could not render the supervision tree", exc_info=True)
        return None


def status_snapshot(daemon: Any, *, asker: Any = None) -> dict:
    """The ``status`` event of ``daemon`` (a :class:`~roost.protocol._serve_daemon.ServeDaemon`).

    ``asker``, when given, is left out of the clients: the asking connection of ``roost status``,
    which connects only to ask (the input ``{"type": "status", "countSelf": false}``).

    Returns:
        ``{"type": "status", "pid", "workDir", "socket", "httpPort",
        "queue": [{sessionId, task, source, position}],
        "running": [{sessionId, task, source, runsHere, runsOn, runner}],
        "clients": [{client, connections, readOnly}], "tree": TEXT | null,
        "restarts": N, "workers": [{index, pid, alive, startedAt, uptimeSeconds, restarts, lastExit}]}``.
        ``workers`` lists the headless worker processes of ``roost serve --workers N`` (empty
        without). ``running`` lists the tasks this daemon runs and those it dispatched (or
        follows for a client) that another process runs: ``runsHere`` is true for the first,
        ``runsOn`` names the node that runs it (:func:`roost._paths.node_name`, null while not
        known) and ``runner`` its process (the lease owner id of its claim, as
        ``cluster.nodes[].owner``; null before its first claim). ``tree`` is the live
        supervision tree as indented text (the supervisor's ``render_tree``); ``restarts`` counts
        child restarts in it.
    """
    queue = daemon.queue
    queued, running = [], []
    for task in queue.tasks.values():
        entry = {"sessionId": task.id, "task": task.task, "source": task.source}
        if task.status == "queued":
            queued.append({**entry, "position": queue.position(task.id)})
        elif task.status == "running":
            here = queue.runs_here(task.id)
            running.append(
                {
                    **entry,
                    "runsHere": here,
                    "runsOn": task.claimed_node or (queue.node if here else None),
                    "runner": task.claimed_by,
                }
            )
    queued.sort(key=lambda e: e["position"] if e["position"] is not None else 1 << 30)
    clients = []
    for key, client in daemon.clients.items():
        live = [c for c in client.conns if getattr(c, "alive", False) and c is not asker]
        if live:
            clients.append(
                {"client": key, "connections": len(live), "readOnly": all(getattr(c, "read_only", False) for c in live)}
            )
    options = daemon.options
    return {
        "type": "status",
        "pid": os.getpid(),
        "workDir": str(options.work_dir),
        "socket": str(options.socket_path),
        "httpPort": daemon.http_port,
        "queue": queued,
        "running": running,
        "clients": clients,
        "tree": _tree(daemon.runtime),
        "restarts": count_restarts(getattr(daemon.runtime, "root", None)),
        "workers": daemon.workers.views() if getattr(daemon, "workers", None) is not None else [],
    }


def count_restarts(supervisor: Any) -> int:
    """Child restarts anywhere below ``supervisor`` (``which_children()`` views, recursively)."""
    if supervisor is None or not hasattr(supervisor, "which_children"):
        return 0
    total = 0
    try:
        children = supervisor.which_children()
    except Exception:  # noqa: BLE001 - see _tree
        log.debug("could not count restarts", exc_info=True)
        return 0
    for child in children:
        total += int(getattr(child, "restarts", 0) or 0)
        total += count_restarts(getattr(child, "value", None))
    return total
