"""``roost schedule ...``: cron jobs, edited directly in the database (no daemon needed).

Mutations (``add``, ``remove``, ``enable``, ``disable``, ``run``) report success by exit status
(wire-protocol.md "Resource queries"; without ``--json``, each also prints one line: ``added NAME:
next run ...``, ``removed NAME``, ``enabled NAME: next run ...``, ``disabled NAME ...``, and ``run``
says on stderr whether a running daemon starts it); a failure exits 1, with
``--json`` after printing the error envelope ``{"protocolVersion":1,"error":...}``. ``list --json``
prints ``ScheduledJob`` items ordered by next run. Each mutation bumps the ``schedule_changes``
counter in its transaction, so a running ``roost serve`` scheduler picks it up (see :mod:`roost.actors._scheduler`).
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from roost import storage as db
from roost._json import dumps_line
from roost.engines import PROVIDERS
from roost.errors import RoostError
from roost.scheduling import format_slot, parse_cron, parse_slot
from roost.storage import open_backend

log = logging.getLogger("roost.cli")

__all__ = ["schedule_command", "job_item"]

#: wire-protocol.md "Versioning".
PROTOCOL_VERSION = 1

UTC = datetime.UTC

_json_option = click.option(
    "--json", "as_json", is_flag=True, help="On failure print one wire-protocol error envelope (exit 1)."
)


def _fail(as_json: bool, command: str, message: str) -> None:
    if as_json:
        from roost.cli._res_common import write_line

        write_line(dumps_line({"protocolVersion": PROTOCOL_VERSION, "error": message}))
    else:
        click.echo(f"roost schedule {command}: {message}", err=True)
    sys.exit(1)


def _open_store(as_json: bool, command: str, *, read_only_ok: bool = False) -> Any:
    """The configured store; one that cannot be opened (an unusable ROOST_HOME or database) is
    reported by ``fail_setup``: exit status 2, or 1 with ``--json`` (wire-protocol.md)."""
    from roost.cli._res_common import fail_setup

    try:
        return open_backend(read_only_ok=read_only_ok)
    except RoostError as exc:
        fail_setup(f"schedule {command}", str(exc), as_json=as_json)


def _mutate(as_json: bool, command: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn(conn, ...)`` in one write transaction; on a Roost error, fail (exit 1; a store that
    cannot be opened exits 2 without ``--json``)."""
    store = _open_store(as_json, command)
    try:
        try:
            with store.transaction() as conn:
                return fn(conn, *args, **kwargs)
        finally:
            store.close()
    except (RoostError, ValueError) as exc:
        from roost.cli._res_common import fail_setup, is_setup_error

        if is_setup_error(exc):  # e.g. a read-only home: exit 2, like roost exec
            fail_setup(f"schedule {command}", str(exc), as_json=as_json)
        _fail(as_json, command, str(exc))


def job_item(job: db.ScheduledJob, now: datetime.datetime) -> dict[str, Any]:
    """Render a job as a wire-protocol ``ScheduledJob`` (camelCase; nullable fields present).

    ``due``: enabled and its next run time has passed. A disabled job has no next run
    (``nextRun`` null). ``catchUp``, ``overlap``, ``provider``, ``model`` and ``lastResult`` (how the latest run ended:
    ``succeeded``, ``failed``, ``interrupted``, ``missed``, ``overlap``, or ``running``) are
    additive fields beyond the spec.
    """
    next_run = parse_slot(job.next_run) if job.next_run and job.enabled else None
    return {
        "name": job.name,
        "description": job.description,
        "cron": job.cron,
        "task": job.task,
        "config": job.config,
        "workDir": job.work_dir,
        "enabled": job.enabled,
        "due": bool(job.enabled and next_run is not None and next_run <= now),
        "createdAt": job.created_at,
        "lastRun": job.last_run,
        "nextRun": job.next_run if job.enabled else None,
        "lastResult": job.last_result,
        "catchUp": job.catch_up,
        "overlap": job.overlap,
        "provider": job.provider,
        "model": job.model,
    }


@click.group("schedule", short_help="Manage the cron schedules that start runs in `roost serve`.")
def schedule_command() -> None:
    """Cron schedules that start runs in `roost serve` (5-field cron, UTC).

    `list --json` prints the wire protocol's ScheduledJob items (docs/wire.md).

    Exit status: 0 on success; 1 on failure (each sub-command's --help says which; with --json an
    error envelope); 2 for a usage error, or without --json an unusable ROOST_HOME or database
    (with --json: exit 1, as the wire protocol fixes).
    """


@schedule_command.command("add", short_help="Add schedule NAME.")
@click.argument("name")
@click.option("--cron", "cron", required=True, help='5-field cron expression, UTC, e.g. "0 9 * * 1-5".')
@click.option("--task", required=True, help="The task text each run starts with.")
@click.option(
    "--config",
    type=click.Path(),
    default=None,
    help="Orchestration config (YAML) the run's team of agents follows; checked now, stored as an "
    "absolute path (default: the daemon's `roost serve -c`, else one agent).",
)
@click.option(
    "--work-dir",
    type=click.Path(),
    default=None,
    help="The project directory: the run works in it, and only the `roost serve` of this "
    "work directory fires the schedule; must exist, stored as an absolute path "
    "(default: the current directory).",
)
@click.option("--description", default=None, help="A one-line description, reported by `schedule list --json`.")
@click.option(
    "--catch-up",
    type=click.Choice(["once", "none"]),
    default="once",
    show_default=True,
    help="Slots missed while no daemon ran: run the latest once, or none.",
)
@click.option(
    "--overlap",
    type=click.Choice(["skip", "queue"]),
    default="skip",
    show_default=True,
    help="A slot due while the previous run still runs: skip it, or queue it.",
)
@click.option(
    "--provider",
    type=click.Choice(PROVIDERS),
    default=None,
    help="The model provider its runs use (default: the daemon's).",
)
@click.option("--model", default=None, help="The model id its runs use (default: the daemon's, or the provider's).")
@_json_option
def add_command(
    name: str,
    cron: str,
    task: str,
    config: str | None,
    work_dir: str | None,
    description: str | None,
    catch_up: str,
    overlap: str,
    provider: str | None,
    model: str | None,
    as_json: bool,
) -> None:
    """Add schedule NAME. An expression that can never fire (February 31) is refused, and so are an
    unusable --config (missing, unparsable or with errors) and a --work-dir that is not an existing
    directory: nothing is stored then. The config's agent models (provider, API key variable) are
    not checked here: the daemon's environment and provider settings decide them, and each run
    that cannot use them fails with the reason.

    A schedule belongs to its work directory (--work-dir, default the current one): projects
    share $ROOST_HOME, and each `roost serve` fires only the schedules of its own --work-dir.
    --provider/--model are stored with the schedule and select the model of its runs (a
    single agent's turn; the agents of a --config keep their own Models); the daemon's
    environment supplies the API key."""
    now = datetime.datetime.now(UTC)
    try:
        expr = parse_cron(cron, now=now)
        next_run = format_slot(expr.next_after(now))
    except ValueError as exc:
        _fail(as_json, "add", str(exc))
        return
    if not name.strip():
        _fail(as_json, "add", "the name must not be empty")
    if not task.strip():
        _fail(as_json, "add", "the --task must not be empty: it is the text each run starts with")
    config = _checked_config(as_json, config)
    work = _checked_work_dir(as_json, work_dir or os.getcwd())
    _mutate(
        as_json,
        "add",
        db.add_job,
        name=name,
        cron=expr.text,
        task=task,
        next_run=next_run,
        description=description,
        config=config,
        work_dir=work,
        catch_up=catch_up,
        overlap=overlap,
        provider=provider,
        model=model,
    )
    if not as_json:
        click.echo(f"added {name}: next run {next_run}")


def _checked_work_dir(as_json: bool, work_dir: str | None) -> str | None:
    """The absolute path of an existing directory (None without one); anything else fails the
    command (exit 1, see :func:`_fail`)."""
    if not work_dir:
        return None
    path = os.path.realpath(os.path.expanduser(work_dir))  # as `roost serve` resolves its own
    if not os.path.exists(path):
        _fail(as_json, "add", f"invalid --work-dir: {path} does not exist")
    if not os.path.isdir(path):
        _fail(as_json, "add", f"invalid --work-dir: {path} is not a directory")
    return path


def _checked_config(as_json: bool, config: str | None) -> str | None:
    """The absolute path of a valid orchestration config (None without one); an unusable one
    fails the command (exit 1, see :func:`_fail`) naming every error."""
    if config is None:
        return None
    from roost.errors import ConfigError
    from roost.orchestration import load_config_file

    path = os.path.abspath(os.path.expanduser(config))
    try:
        load_config_file(path)
    except ConfigError as exc:
        _fail(as_json, "add", f"invalid --config: {exc}")
    return path


@schedule_command.command("list", short_help="List schedules, ordered by next run.")
@click.option("--json", "as_json", is_flag=True, help="Print one wire-protocol JSON line ({protocolVersion, items}).")
def list_command(as_json: bool) -> None:
    """List schedules, ordered by next run."""
    store = _open_store(as_json, "list", read_only_ok=True)  # reads work on a read-only home
    try:
        try:
            with store.read() as conn:
                jobs = db.list_jobs(conn)
        finally:
            store.close()
    except RoostError as exc:
        _fail(as_json, "list", str(exc))
        return
    now = datetime.datetime.now(UTC)
    items = [job_item(j, now) for j in jobs]
    if as_json:
        from roost.cli._res_common import write_line

        write_line(dumps_line({"protocolVersion": PROTOCOL_VERSION, "items": items}))
        return
    if not items:
        click.echo("no schedules")
        return
    for line in _table(items):
        click.echo(line)


def _table(items: list[dict[str, Any]]) -> list[str]:
    """``schedule list``'s text lines: one per ScheduledJob item, its columns (name, cron, state,
    next run, last run and result, work directory, task) each as wide as its widest cell plus two
    spaces, so a long name or cron expression (``*/15 9-17 * * mon-fri``) never runs into the next
    column; the task (its first 60 characters) ends the line."""
    rows = []
    for it in items:
        state = ("enabled" if it["enabled"] else "disabled") + (" due" if it["due"] else "")
        nxt = it["nextRun"] or ("-" if not it["enabled"] else "never")
        last = f"{it['lastRun']} {it['lastResult'] or ''}".strip() if it["lastRun"] else (it["lastResult"] or "-")
        where = it["workDir"] or "(first daemon)"
        rows.append([it["name"], it["cron"], state, f"next {nxt}", f"last {last}", f"in {where}", it["task"][:60]])
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]) - 1)] if rows else []
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)), row[-1]]) for row in rows]


@schedule_command.command("remove", short_help="Remove schedule NAME and its run records.")
@click.argument("name")
@_json_option
def remove_command(name: str, as_json: bool) -> None:
    """Remove schedule NAME and its run records; prints "removed NAME" (nothing with --json)."""
    _mutate(as_json, "remove", db.remove_job, name)
    if not as_json:
        click.echo(f"removed {name}")


@schedule_command.command("enable", short_help="Enable schedule NAME from its next slot (no catch-up).")
@click.argument("name")
@_json_option
def enable_command(name: str, as_json: bool) -> None:
    """Enable schedule NAME; its next run is the first slot from now (no catch-up of the pause).
    Prints "enabled NAME: next run ..." (nothing with --json)."""
    next_runs: list[str | None] = []

    def enable(conn: Any) -> None:
        job = db.get_job(conn, name)
        now = datetime.datetime.now(UTC)
        try:
            next_run: str | None = format_slot(parse_cron(job.cron, now=now).next_after(now))
        except ValueError:
            next_run = None  # an old row that can never fire: enabled, but never due
        db.set_job_enabled(conn, name, True, next_run=next_run)
        next_runs.append(next_run)

    _mutate(as_json, "enable", enable)
    if not as_json:
        when = next_runs[-1] if next_runs and next_runs[-1] else "never (its cron expression has no future slot)"
        click.echo(f"enabled {name}: next run {when}")


@schedule_command.command("disable", short_help="Disable schedule NAME (a run in progress goes on).")
@click.argument("name")
@_json_option
def disable_command(name: str, as_json: bool) -> None:
    """Disable schedule NAME (a run in progress is not stopped); prints "disabled NAME"
    (nothing with --json)."""
    _mutate(as_json, "disable", db.set_job_enabled, name, False, next_run=None)
    if not as_json:
        click.echo(f"disabled {name} (a run in progress is not stopped)")


@schedule_command.command("run", short_help="Have `roost serve` fire schedule NAME now.")
@click.argument("name")
@_json_option
def run_command(name: str, as_json: bool) -> None:
    """Fire schedule NAME now: the running `roost serve` of its work directory dispatches it
    once. With no such daemon running, the request is kept and the next one started dispatches it.

    Prints one line on stderr saying which (nothing with --json)."""
    run = _mutate(as_json, "run", db.request_run, name)
    if as_json:
        return
    work_dir = _mutate(as_json, "run", lambda conn: db.get_job(conn, name).work_dir)
    others = _other_daemons(work_dir)
    try:
        claimed = others is False or _claimed_soon(run.id)
    except KeyboardInterrupt:  # the request is stored either way
        click.echo(f"run of {name} requested (not waiting to see a daemon take it)", err=True)
        sys.exit(130)
    if claimed:
        click.echo(f"run of {name} requested; the running daemon starts it", err=True)
    elif others:
        click.echo(
            f"run of {name} requested; no roost serve is running for {work_dir} (only for other "
            f"projects): it starts when `roost serve --work-dir {work_dir}` runs",
            err=True,
        )
    else:
        click.echo(f"run of {name} requested; no roost serve is running: it starts when one does", err=True)


def _other_daemons(work_dir: str | None) -> bool | None:
    """``False`` when a registered daemon of ``work_dir`` runs (it fires the schedule), ``True``
    when only daemons of other projects run, ``None`` when no daemon is seen (issue 17)."""
    from roost._paths import roost_home
    from roost.protocol import registered_daemons

    try:
        daemons = registered_daemons(roost_home())
    except RoostError:
        daemons = []
    if any(work_dir is None or d.get("workDir") == work_dir for d in daemons):
        return False
    return True if daemons or _daemon_running() else None


#: How long ``schedule run`` waits for a daemon it cannot see by its lock to claim the request
#: (a scheduler notices a change within its ``change_poll`` of 1 s).
CLAIM_WAIT = 2.5


def _daemon_running() -> bool:
    """Whether a ``roost serve`` holds the single-daemon lock of a socket in ``$ROOST_HOME/run``.

    ``roost serve`` takes an exclusive ``flock`` on ``SOCKET.lock`` for its whole life (see
    ``claim_socket_path``); a lock file whose socket exists and whose lock cannot be shared is held
    by a live daemon. (A daemon given ``--socket`` outside ``$ROOST_HOME/run`` is not seen here.)
    """
    import errno
    import fcntl

    from roost._paths import roost_home

    try:
        locks = sorted((roost_home() / "run").glob("*.lock"))
    except (RoostError, OSError):
        log.debug("could not look for a daemon's socket lock", exc_info=True)
        return False
    for lock in locks:
        if not os.path.exists(str(lock)[: -len(".lock")]):
            continue  # no socket: its daemon is gone (a daemon keeps its socket while it runs)
        try:
            fd = os.open(lock, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return True
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return False


def _claimed_soon(run_id: str) -> bool:
    """Whether a daemon's scheduler claims manual run ``run_id`` within :data:`CLAIM_WAIT` seconds
    (a daemon whose socket lies outside ``$ROOST_HOME/run``)."""
    import time

    deadline = time.monotonic() + CLAIM_WAIT
    try:
        store = open_backend()
    except RoostError:
        log.debug("could not open the store to wait for a claim", exc_info=True)
        return False
    try:
        while True:
            with store.read() as conn:
                status = db.schedule_run_status(conn, run_id)
            if status != "requested":
                return status is not None
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
    except Exception:  # noqa: BLE001 - only the message depends on it; the request is stored
        log.debug("could not wait for the daemon's claim", exc_info=True)
        return False
    finally:
        store.close()


#: What makes each sub-command fail (exit status 1), as its --help says; besides, for each, an
#: unusable ROOST_HOME or database (exit status 2 without --json, 1 with it).
_FAILURES = {
    "add": "an invalid or never-firing cron expression, an empty name or --task, a name already "
    "taken, an unusable --work-dir or --config",
    "list": None,
}

#: Each sub-command's --help ends with its own exit statuses (issue 17: every command documents them).
for _name, _command in schedule_command.commands.items():
    _what = _FAILURES.get(_name, "an unknown name")
    _command.epilog = _command.epilog or (
        f"Exit status: 0 on success; 1 on failure ({_what + '; ' if _what else ''}with --json an error "
        "envelope on stdout); 2 for a usage error, or without --json an unusable ROOST_HOME or database "
        "(with --json: exit 1, as the wire protocol fixes)."
    )
del _name, _command, _what
