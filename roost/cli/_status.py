"""``roost status``: the daemons of this ``$ROOST_HOME``, their queues, clients and trees, and the schedules.

Issue 17. Each running ``roost serve`` is found by its registry file
(:mod:`roost.protocol._serve_status`) and asked over its Unix socket with the additive
``{"type": "status"}`` input; the schedules are read from the database, so they are shown (with
their last and next runs) even when no daemon runs.

``--json`` prints one line ``{"protocolVersion": 1, "home", "database", "warnings", "daemons":
[STATUS...], "schedules": [ScheduledJob...], "cluster"?}``. ``database`` is the database read
(:func:`roost.storage.database_label`; null when there is no SQLite file and no URL: a read-only
command never creates one); ``warnings`` has a line for each other database the running
daemons of this home use (their registry entries' ``database``). ``cluster`` (on PostgreSQL
only, issue 13) is ``{"database" (password hidden), "nodes": [{owner, host, pid, startedAt,
lastSeen, ageSeconds, uptimeSeconds, alive, state, leases, runningTasks}], "queue": {queued,
running}}``: every node of the database, from its heartbeat row (ISO 8601 UTC times on the
database clock), whatever its ``$ROOST_HOME`` or host; ``state`` is ``gone`` once the heartbeat
is a ttl old or its process, of this host, is gone, and a node gone for 10 ttls is no longer
listed (:func:`roost.storage.list_nodes`); each STATUS is the daemon's ``status`` event (see
:func:`roost.protocol._serve_status.status_snapshot`) or, for a daemon that did not answer,
``{"pid", "socket", "workDir", "httpPort", "database", "error"}``.

Exit status: 0 (also with no daemon running); 2 when ``$ROOST_HOME`` or its database is unusable
(with ``--json`` also the error envelope ``{"protocolVersion": 1, "error"}`` on stdout).
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


def _from_store(home: Any) -> tuple[list[dict], dict[str, Any] | None, bool]:
    """The schedules, on PostgreSQL the cluster (``{database, nodes, queue}``: every node's
    heartbeat on the database clock with its live leases, and the shared queue's depth), and
    whether a database was read: a read-only command never creates the SQLite file, so with no
    URL and no ``HOME/roost.db`` there is nothing to read (no schedules, no cluster, False)."""
    from roost import storage as db
    from roost.cli._schedule import job_item
    from roost.storage import configured_database_url, open_backend

    if configured_database_url() is None and not (home / "roost.db").exists():
        return [], None, False
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
    return [job_item(j, now) for j in jobs], cluster, True


def _database_warnings(read: str, entries: list[dict]) -> list[str]:
    """One line for each database the running daemons of this home use (their registry entries'
    ``database``) that is not ``read``, the one this command read."""
    others = sorted({str(e["database"]) for e in entries if e.get("database") and e["database"] != read})
    return [
        f"the daemons of this home use the database {other}, not {read}: pass --database-url URL"
        " or set ROOST_DATABASE_URL to see their schedules and cluster"
        for other in others
    ]


def _print_cluster(cluster: dict) -> None:
    queue = cluster["queue"]
    click.echo(f"cluster on {cluster['database']}: queued {queue['queued']}, running {queue['running']}")
    for n in cluster["nodes"]:
        state = n["state"]
        click.echo(
            f"  node {n['owner']} ({state}, host {n['host']} pid {n['pid']}, seen {n['ageSeconds']:.1f} s ago)"
            f" running {len(n.get('runningTasks') or [])}, leases {len(n['leases'])}"
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
    here = [t for t in running if t.get("runsHere", True)]  # (a daemon of before runsHere: all its own)
    away = len(running) - len(here)
    elsewhere = f" (+{away} of its clients running on other processes)" if away else ""
    click.echo(
        f"  running {len(here)}, queued {len(queued)}, clients {len(clients)},"
        f" restarts {d.get('restarts', 0)}{elsewhere}"
    )
    for w in d.get("workers") or []:
        state = f"pid {w['pid']}" if w.get("alive") else f"not running (last exit {w.get('lastExit')})"
        click.echo(f"    worker {w['index']}: {state}, restarts {w.get('restarts', 0)}")
    for t in running:
        where = "" if t.get("runsHere", True) else f" on {t.get('runsOn') or '?'} (process {t.get('runner') or '?'})"
        click.echo(f"    running {t['sessionId']} ({t['source']}){where}: {t['task'][:60]}")
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


@click.command("status", short_help="Show the daemons and schedules of this ROOST_HOME.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line (daemons and schedules).")
def status_command(as_json: bool) -> None:
    """Show the daemons of this ROOST_HOME (queue, running tasks, attached clients, supervision
    tree) and the schedules with their last and next runs. Works with no daemon running (then
    it says so and still lists the schedules). On PostgreSQL (--database-url or
    ROOST_DATABASE_URL) it also lists the cluster: every node, its live leases and tasks, the
    queue depth. It only reads: without a URL and without $ROOST_HOME/roost.db it creates
    nothing, and when this home's daemons use another database it says which.

    Exit status: 0 (also for a ROOST_HOME that does not exist yet); 2 when ROOST_HOME or its
    database is unusable (a file, a file in its path, a directory it cannot read); 130 on Ctrl-C."""
    from roost._paths import roost_home
    from roost.protocol import registered_daemons
    from roost.storage import database_label

    try:
        home = roost_home(create=False)
        schedules, cluster, found = _from_store(home)
    except RoostError as exc:
        if as_json:  # the error envelope on stdout, as every --json query (wire.md "Resource queries")
            from roost.cli._res_common import write_line
            from roost.protocol import error_envelope

            write_line(error_envelope(str(exc)))
        else:  # --json: the envelope alone says it (not the same line twice)
            click.echo(f"roost status: error: {exc}", err=True)
        sys.exit(2)
    entries = registered_daemons(home)
    database = database_label(home) if found else None
    warnings = _database_warnings(database_label(home), entries)
    try:
        daemons = _ask_all(entries)
    except KeyboardInterrupt:
        click.echo("roost status: interrupted", err=True)
        sys.exit(130)
    for line in warnings:
        click.echo(f"roost status: warning: {line}", err=True)
    _show(home, daemons, schedules, as_json, cluster, database=database, warnings=warnings)


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
                    "database": entry.get("database"),
                    "error": str(exc) or type(exc).__name__,
                }
            )
    return daemons


def _show(
    home: Any,
    daemons: list[dict[str, Any]],
    schedules: list[dict],
    as_json: bool,
    cluster: dict | None,
    *,
    database: str | None,
    warnings: list[str],
) -> None:
    if as_json:
        body = {
            "protocolVersion": 1,
            "home": str(home),
            "database": database,
            "warnings": warnings,
            "daemons": daemons,
            "schedules": schedules,
        }
        if cluster is not None:
            body["cluster"] = cluster
        from roost.cli._res_common import write_line

        write_line(dumps_line(body))
        return
    click.echo(f"ROOST_HOME {home}")
    click.echo(f"database: {database}" if database else "database: none yet (no SQLite file, no URL set)")
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
