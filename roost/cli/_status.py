"""``roost status``: the daemons of this ``$ROOST_HOME``, their queues, clients and trees, and the schedules.

Issue 17. Each running ``roost serve`` is found by its registry file
(:mod:`roost.protocol._serve_status`) and asked over its Unix socket with the additive
``{"type": "status"}`` input; the schedules are read from the database, so they are shown (with
their last and next runs) even when no daemon runs.

``--json`` prints one line ``{"protocolVersion": 1, "home", "daemons": [STATUS...], "schedules":
[ScheduledJob...], "cluster"?}``; ``cluster`` (on PostgreSQL only, issue 13) is ``{"database"
(password hidden), "nodes": [{owner, host, pid, startedAt, lastSeen, ageSeconds, alive, state,
leases}], "queue": {queued, running}}``: every node of the database, from its heartbeat row
(times on the database clock), whatever its ``$ROOST_HOME`` or host; ``state`` is ``gone`` once
the heartbeat is a ttl old, and a node gone for 10 ttls is no longer listed
(:func:`roost.storage.list_nodes`); each STATUS is the daemon's ``status`` event (see
:func:`roost.protocol._serve_status.status_snapshot`) or, for a daemon that did not answer,
``{"pid", "socket", "workDir", "error"}``.

Exit status: 0 (also with no daemon running); 2 when ``$ROOST_HOME`` or its database is unusable.
"""

from __future__ import annotations

import datetime
import socket
import sys
from typing import Any

import click

from roost._json import dumps_line, loads
from roost.errors import RoostError

__all__ = ["ask_status", "status_command"]

#: Seconds to wait for a daemon's answer.
TIMEOUT = 5.0


def ask_status(socket_path: str, *, timeout: float = TIMEOUT) -> dict:
    """Connect to a daemon's socket, send ``{"type": "status"}`` and return its ``status`` event.

    Raises:
        OSError: cannot connect, or the daemon closed or did not answer within ``timeout`` s.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(b'{"type":"status","countSelf":false}\n')  # this connection is not a client
        buffer = b""
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise OSError("the daemon closed the connection before answering")
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                try:
                    event = loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("type") == "status":
                    return event


def _from_store() -> tuple[list[dict], dict[str, Any] | None]:
    """The schedules, and on PostgreSQL the cluster (``{database, nodes, queue}``: every node's
    heartbeat on the database clock with its live leases, and the shared queue's depth)."""
    from roost import storage as db
    from roost.cli._schedule import job_item
    from roost.storage import open_backend

    store = open_backend(read_only_ok=True)  # reads work on a read-only home
    cluster = None
    try:
        with store.read() as conn:
            jobs = db.list_jobs(conn)
            if not hasattr(store, "path"):  # a PostgreSQL store: a cluster of nodes
                from roost.storage import redact_url

                cluster = {
                    "database": redact_url(store.url),
                    "nodes": db.list_nodes(conn),
                    "queue": db.queue_depth(conn),
                }
    finally:
        store.close()
    now = datetime.datetime.now(datetime.UTC)
    return [job_item(j, now) for j in jobs], cluster


def _print_cluster(cluster: dict) -> None:
    queue = cluster["queue"]
    click.echo(f"cluster on {cluster['database']}: queued {queue['queued']}, running {queue['running']}")
    for n in cluster["nodes"]:
        state = n["state"]
        click.echo(
            f"  node {n['owner']} ({state}, host {n['host']} pid {n['pid']}, seen {n['ageSeconds']:.1f} s ago)"
            f" leases {len(n['leases'])}"
        )
        for key in n["leases"]:
            click.echo(f"    {key}")


def _print_daemon(d: dict) -> None:
    click.echo(f"daemon pid {d.get('pid')}  work dir {d.get('workDir')}")
    click.echo(f"  socket {d.get('socket')}" + (f"  http port {d['httpPort']}" if d.get("httpPort") else ""))
    if "error" in d:
        click.echo(f"  not answering: {d['error']}")
        return
    running, queued, clients = d.get("running") or [], d.get("queue") or [], d.get("clients") or []
    click.echo(
        f"  running {len(running)}, queued {len(queued)}, clients {len(clients)}, restarts {d.get('restarts', 0)}"
    )
    for w in d.get("workers") or []:
        state = f"pid {w['pid']}" if w.get("alive") else f"not running (last exit {w.get('lastExit')})"
        click.echo(f"    worker {w['index']}: {state}, restarts {w.get('restarts', 0)}")
    for t in running:
        click.echo(f"    running {t['sessionId']} ({t['source']}): {t['task'][:60]}")
    for t in queued:
        click.echo(f"    queued #{t['position']} {t['sessionId']} ({t['source']}): {t['task'][:60]}")
    for c in clients:
        click.echo(
            f"    client {c['client']} ({c['connections']} connection{'s' if c['connections'] != 1 else ''}"
            f"{', read-only' if c['readOnly'] else ''})"
        )
    if d.get("tree"):
        click.echo("  supervision tree:")
        for line in str(d["tree"]).splitlines():
            click.echo(f"    {line}")


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line (daemons and schedules).")
def status_command(as_json: bool) -> None:
    """Show the daemons of this ROOST_HOME (queue, running tasks, attached clients, supervision
    tree) and the schedules with their last and next runs. Works with no daemon running (then
    it says so and still lists the schedules). On PostgreSQL (--database-url or
    ROOST_DATABASE_URL) it also lists the cluster: every node, its live leases, the queue depth.

    Exit status: 0; 2 when ROOST_HOME or its database is unusable; 130 on Ctrl-C."""
    from roost._paths import roost_home
    from roost.protocol import registered_daemons

    try:
        home = roost_home()
        schedules, cluster = _from_store()
    except RoostError as exc:
        click.echo(f"roost status: error: {exc}", err=True)
        sys.exit(2)
    try:
        daemons = _ask_all(registered_daemons(home))
    except KeyboardInterrupt:
        click.echo("roost status: interrupted", err=True)
        sys.exit(130)
    _show(home, daemons, schedules, as_json, cluster)


def _ask_all(entries: list[dict]) -> list[dict[str, Any]]:
    """Each registered daemon's ``status`` answer, or its registry entry with ``error``."""
    daemons: list[dict[str, Any]] = []
    for entry in entries:
        try:
            daemons.append(ask_status(str(entry["socket"])))
        except OSError as exc:
            daemons.append(
                {
                    "pid": entry.get("pid"),
                    "socket": entry.get("socket"),
                    "workDir": entry.get("workDir"),
                    "httpPort": entry.get("httpPort"),
                    "error": str(exc) or type(exc).__name__,
                }
            )
    return daemons


def _show(home: Any, daemons: list[dict[str, Any]], schedules: list[dict], as_json: bool, cluster: dict | None) -> None:
    if as_json:
        body = {"protocolVersion": 1, "home": str(home), "daemons": daemons, "schedules": schedules}
        if cluster is not None:
            body["cluster"] = cluster
        sys.stdout.buffer.write(dumps_line(body))
        sys.stdout.flush()
        return
    click.echo(f"ROOST_HOME {home}")
    if cluster is not None:
        _print_cluster(cluster)
    if not daemons:
        click.echo("no roost serve is running for this home (start one with: roost serve)")
    for d in daemons:
        _print_daemon(d)
    if not schedules:
        click.echo("no schedules")
        return
    click.echo("schedules:")
    for it in schedules:
        state = "enabled" if it["enabled"] else "disabled"
        last = f"{it['lastRun']} {it.get('lastResult') or ''}".strip() if it["lastRun"] else "-"
        click.echo(f"  {it['name']:<20} {state:<8} next {it['nextRun'] or '-'}  last {last}  in {it['workDir'] or '-'}")
