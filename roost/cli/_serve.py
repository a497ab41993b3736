"""``roost serve``: the daemon many clients attach to (Unix socket + WebSocket ``/attach``).

wire-protocol.md, "Live sessions" and "Daemon events (serve socket)"; the mechanics are in
:mod:`roost.protocol._serve_daemon`. On start the daemon prints one JSON line to stdout,
``{"type": "listening", "protocolVersion": 1, "socket": PATH, "httpPort": PORT|null, "pid": PID}``,
and then logs only to stderr.

Exit status: 0 after SIGINT/SIGTERM (tasks still queued or running are kept in the store and resumed
by the next daemon), 1 when another daemon owns the socket path, the --http-port cannot be listened
on (in use, privileged, not an address of this host) or on a runtime error, 2 on a configuration
error (no provider, a missing or broken scripted --script, unreadable tokens or TLS files, a
malformed ``[mcp_servers]`` table, an unusable ``-c`` orchestration config, or one with an agent
whose model cannot be used, e.g. an unset API key variable).
"""

from __future__ import annotations

import logging
import os
import signal
import ssl
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import trio

from roost._json import dumps_line
from roost.cli._appserver import setup_logging
from roost.cli._engine_options import EngineFlags, engine_options
from roost.cli._params import PROCESS_COUNT, SECONDS
from roost.errors import ConfigError, RoostError

if TYPE_CHECKING:
    from roost.protocol import EngineCatalog, ServeOptions

__all__ = ["serve_command", "run_serve"]

log = logging.getLogger("roost.serve")
#: The type of the options naming an existing file (TLS certificate and key, tokens file).
_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def _mcp_servers(options: ServeOptions) -> list[Any]:
    """The daemon's MCP servers: ``config.toml``'s ``[mcp_servers]``, then the ``McpServers`` of
    the default orchestration config (``-c``), which wins on a shared name.

    Raises:
        ConfigError: a malformed ``[mcp_servers]`` table or default config.
    """
    from roost.config import configured_mcp_servers
    from roost.orchestration import load_config_file

    servers = {s.name: s for s in configured_mcp_servers()}
    if options.config:
        servers.update({s.name: s for s in load_config_file(options.config).mcp_servers})
    return list(servers.values())


class _McpOrchestrations:
    """``roost.orchestration`` for the task queue, with each run's agents given the daemon's MCP
    servers' ``Plugins`` groups (a ``Plugins: [server]`` entry stands for all of that server's
    tools); the servers of a task's config that the daemon does not run (another name, or the
    same name configured differently) are started for that run by its Orchestrator."""

    def __init__(self, mcp: Any) -> None:
        import roost.orchestration

        orchestrator = roost.orchestration.Orchestrator

        def make(config: Any, *args: Any, **kwargs: Any) -> Any:
            own = [s for s in config.mcp_servers if s.name not in mcp.states or mcp.states[s.name].config != s]
            groups = {name: tools for name, tools in mcp.groups().items() if name not in {s.name for s in own}}
            return orchestrator(config, *args, tool_groups=groups, mcp_servers=own, **kwargs)

        self.load_config_file = roost.orchestration.load_config_file
        self.Orchestrator: Any = make


async def run_serve(
    options: ServeOptions, engines: EngineCatalog, auto_objectives: tuple[str, ...] = (), workers: int = 1
) -> int:
    """Run the daemon until SIGINT/SIGTERM; return the exit status.

    ``auto_objectives``: the ``--auto-objective`` ids (see :func:`_start_objectives`).
    ``workers``: processes running tasks, this one included (``--workers``; see
    :mod:`roost.cli._serve_workers`).

    Raises:
        DaemonRunning: another daemon owns the socket path (nothing was started).
    """
    from roost.plugins import open_mcp_host
    from roost.protocol import DaemonMetrics, ServeDaemon, claim_socket_path, install_a2a
    from roost.supervisor import open_runtime
    from roost.tools import ask_user_tool, builtin_tools

    _probe_http_port(options)  # a busy port is one line (exit 1), before any child starts
    lock_fd = claim_socket_path(options.socket_path)
    registered: Path | None = None
    try:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            metrics = DaemonMetrics()
            # ask_user asks each task's dispatching client (roost.protocol._serve_prompts)
            tools = {**builtin_tools(), "ask_user": ask_user_tool()}
            async with (
                open_mcp_host(_mcp_servers(options)) as mcp,
                open_runtime(engine_for=metrics.meter(engines.engine_for), tools=tools, node_kind="serve") as runtime,
            ):
                mcp.attach(runtime.services.tools)
                default = engines.default
                daemon = ServeDaemon(
                    runtime,
                    options,
                    provider=default.provider if default else None,
                    model=default.model if default else None,
                    engines=engines,
                )
                daemon.metrics = metrics
                daemon.queue.orchestrations = _McpOrchestrations(mcp)
                if options.a2a:
                    install_a2a(daemon)
                metrics.bind(daemon)
                daemon.queue.on_accepted = lambda task: metrics.task_accepted(task.source)
                async with trio.open_nursery() as nursery:
                    await nursery.start(daemon.run)
                    await _start_scheduler(runtime, daemon)
                    registered = _register(options, daemon)
                    await _start_objectives(runtime, daemon, auto_objectives)
                    if workers > 1:
                        from roost.cli._serve_workers import WorkerPool, worker_argv

                        daemon.workers = WorkerPool(worker_argv(sys.argv[1:]), workers - 1, daemon.queue)
                        await nursery.start(daemon.workers.run)
                    _announce_listening(options, daemon)
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        break
        return 0
    finally:
        from roost.protocol import unregister_daemon

        unregister_daemon(registered)
        await engines.aclose()
        os.close(lock_fd)


def _announce_listening(options: Any, daemon: Any) -> None:
    """The ``listening`` line on stdout (what scripts and tests wait for) and its log event."""
    sys.stdout.buffer.write(
        dumps_line(
            {
                "type": "listening",
                "protocolVersion": 1,
                "socket": str(options.socket_path),
                "httpPort": daemon.http_port,
                "pid": os.getpid(),
            }
        )
    )
    sys.stdout.buffer.flush()
    log.info(
        "daemon listening on %s (http port %s), work dir %s",
        options.socket_path,
        daemon.http_port,
        options.work_dir,
        extra={
            "event": "daemon_started",
            "socket": str(options.socket_path),
            "http_port": daemon.http_port,
            "work_dir": str(options.work_dir),
        },
    )


def _register(options: Any, daemon: Any) -> Path | None:
    """Write the daemon registry file ``roost status`` finds this daemon by (None: could not)."""
    from roost._paths import roost_home
    from roost.protocol import register_daemon

    try:
        return register_daemon(
            roost_home(), socket=str(options.socket_path), work_dir=str(options.work_dir), http_port=daemon.http_port
        )
    except (OSError, RoostError) as exc:
        log.warning("could not register the daemon for roost status: %s", exc)
        return None


async def _start_scheduler(runtime: Any, daemon: Any) -> None:
    """Start the cron Scheduler as a permanent child of the root supervisor; it fires due
    schedule slots as tasks of this daemon's TaskQueue (approvals follow the unattended policy)."""
    from roost.actors import Scheduler, TaskOutcomes
    from roost.supervisor import ChildSpec, Restart

    daemon.outcomes = TaskOutcomes(daemon.queue.lookup)

    def scheduler() -> Scheduler:  # a fresh actor per (re)start; it re-adopts its open runs
        return Scheduler(
            runtime.store,
            dispatch=daemon.queue.dispatch,
            wait_task=daemon.outcomes.wait,
            owner=runtime.services.owner,
            project=str(daemon.options.work_dir),
        )

    await runtime.root.start_child(
        ChildSpec.of_factory("scheduler", scheduler, restart=Restart.PERMANENT, shutdown_timeout=10)
    )


def _probe_http_port(options: ServeOptions) -> None:
    """Bind ``--http-port`` once and let it go, so a port in use (or privileged) fails the start
    with the ``OSError`` :func:`_exit_for` turns into one line, instead of a crashing listener
    child of the supervision tree. Port 0 (any free port) cannot be busy.

    Raises:
        OSError: the port cannot be bound (EADDRINUSE, EACCES, EADDRNOTAVAIL ...).
    """
    import socket

    if not options.http_port:
        return
    for family, kind, proto, _name, address in socket.getaddrinfo(
        options.host, options.http_port, type=socket.SOCK_STREAM
    ):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as trio's listeners do
            probe.bind(address)


async def _start_objectives(runtime: Any, daemon: Any, auto_objectives: tuple[str, ...]) -> None:
    """Start the ObjectiveRunner as a permanent child of the root supervisor: it records the
    outcomes of objective tasks and, for ``auto_objectives``, dispatches the next remaining task
    when the daemon is idle, broadcasting ``auto_dispatched`` (wire-protocol.md appendix)."""
    from roost.actors import ObjectiveRunner
    from roost.protocol import auto_dispatched_event
    from roost.supervisor import ChildSpec, Restart

    def idle() -> bool:
        return not any(t.status in ("queued", "running") for t in daemon.queue.tasks.values())

    def announce(session_id: str, objective_id: str, task: str) -> None:
        daemon.broadcast(auto_dispatched_event(session_id=session_id, objective_id=objective_id, task=task))

    async def start_runner(*, task_status: Any) -> None:
        runner = ObjectiveRunner(
            runtime.store,
            dispatch=daemon.queue.dispatch,
            wait_task=daemon.outcomes.wait,
            announce=announce,
            idle=idle,
            auto_objectives=auto_objectives,
        )
        await runner.run(task_status=task_status)

    await runtime.root.start_child(
        ChildSpec("objectives", start_runner, restart=Restart.PERMANENT, shutdown_timeout=10)
    )


def _check_config(path: Path | None, engines: Any) -> str | None:
    """Validate the ``-c`` orchestration config and its agents' models; return its path or None.

    Each agent's model is resolved against ``engines`` (the daemon's
    :class:`~roost.protocol._engines.EngineCatalog`), as ``roost run`` does before a run, so a
    config whose agents cannot run (unknown provider, unset API key variable, unusable engine) is
    refused at start instead of failing every task.

    Raises:
        ConfigError: (``ConfigInvalid``) the file is missing, unparsable or has errors, or an
            agent's model cannot be used (the message names the agent).
    """
    if path is None:
        return None
    from roost.errors import InvalidParams
    from roost.orchestration import load_config_file, resolve_agents

    absolute = os.path.abspath(os.path.expanduser(str(path)))
    config = load_config_file(absolute)
    try:
        resolve_agents(config, engines)
    except (ConfigError, InvalidParams) as exc:
        raise ConfigError(f"{absolute}: {exc}") from None
    return absolute


@click.command("serve", short_help="Run the daemon: clients attach to it and dispatch tasks.")
@engine_options
@click.option(
    "-c",
    "--config",
    "config",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Orchestration config (YAML) that runs each task dispatched without its own (client "
    "user_input, MCP dispatch_task, schedules without --config); checked at start, "
    "with each agent's model (provider, API key variable). "
    "Without it such a task is one agent's turn.",
)
@click.option(
    "--work-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Directory tasks run in; also names the default socket (default: the current directory).",
)
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Unix socket path (default $ROOST_HOME/run/<hash of the work dir>.sock).",
)
@click.option(
    "--http-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Also serve HTTP on HOST:PORT (0 picks a free port): WebSocket clients at /attach, the MCP "
    "tools at /mcp, Prometheus metrics at /metrics and, with --a2a, the A2A agents at /a2a/NAME/ "
    "(with --tls-cert: wss:// and https://).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface for --http-port.")
@click.option("--tls-cert", type=_FILE, help="PEM certificate: serve wss:// (needs --tls-key).")
@click.option("--tls-key", type=_FILE, help="PEM private key for --tls-cert.")
@click.option("--tokens-file", type=_FILE, help="Bearer tokens, one per line: 'full <token>' or 'read <token>'.")
@click.option(
    "--reconnect-grace",
    type=SECONDS,
    default=30.0,
    show_default=True,
    help="Seconds a pending approval waits for its client to reconnect.",
)
@click.option(
    "--unattended-policy",
    type=click.Choice(["deny", "allow"]),
    default="deny",
    show_default=True,
    help="Answer to an approval nobody can be asked.",
)
@click.option("--max-concurrent", type=click.IntRange(1), default=1, show_default=True, help="Tasks running at once.")
@click.option(
    "--max-queued",
    type=click.IntRange(1),
    default=1000,
    show_default=True,
    help="Queued tasks allowed before user_input gets server_overloaded.",
)
@click.option(
    "--permission-mode",
    type=click.Choice(["read_only", "standard", "unconfined"]),
    default="standard",
    show_default=True,
    help="What task tools may do; standard asks approval.",
)
@click.option(
    "--token-warn-threshold",
    type=click.IntRange(1),
    default=None,
    help="Input tokens at which a task sends token_budget_warning once.",
)
@click.option(
    "--auto-objective",
    "auto_objectives",
    multiple=True,
    metavar="ID",
    help="When idle, run the next remaining task of this active objective (repeatable; "
    "see `roost objective`); a task failing 3 times in a row is skipped.",
)
@click.option(
    "--outbox-lines",
    type=click.IntRange(1),
    default=None,
    hidden=True,
    help="Lines a client's outbox holds before it counts as a slow consumer.",
)
@click.option(
    "--kick-grace",
    type=SECONDS,
    default=10.0,
    hidden=True,
    help="Seconds a slow consumer may still read what was queued before it is closed.",
)
@click.option(
    "--stamp-events",
    is_flag=True,
    hidden=True,
    help="Add the emit time (unix seconds) as 't' to broadcast events (benchmarks).",
)
@click.option(
    "--a2a",
    is_flag=True,
    help="Host the agents as A2A agents on the --http-port (cards at /a2a/NAME/.well-known/agent-card.json).",
)
@click.option(
    "--workers",
    type=PROCESS_COUNT,
    metavar="N|auto",
    default=None,
    envvar="ROOST_SERVE_WORKERS",
    help="Processes that run tasks: this front door plus N-1 headless workers on the same store, "
    "restarted when they die, stopped with it (env ROOST_SERVE_WORKERS); 'auto' is one per usable "
    "core; up to 4 per core are accepted (8 on smaller machines). Default 1: tasks mostly wait on the "
    "model, so one process serves many; raise it when tasks are CPU-bound or the daemon saturates a core.",
)
@click.option("--worker", is_flag=True, hidden=True, help="Run as a headless worker of a front door.")
@click.option("--no-claim", is_flag=True, hidden=True, help="Run no tasks here (a front door only).")
@click.option("-v", "--verbose", is_flag=True, help="Log debug output to stderr.")
def serve_command(
    engine_flags: EngineFlags,
    config: Path | None,
    work_dir: Path | None,
    socket_path: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    tokens_file: Path | None,
    token_warn_threshold: int | None,
    auto_objectives: tuple[str, ...],
    outbox_lines: int | None,
    workers: int | None,
    worker: bool,
    no_claim: bool,
    verbose: bool,
    **flags: Any,
) -> None:
    """Run the daemon: clients attach over the Unix socket or the WebSocket and dispatch tasks.

    Speaks the wire protocol's daemon events (docs/wire.md). Each user_input (or plain text line)
    becomes a task, run FIFO by --max-concurrent runners on its own thread, by the team of agents
    of the -c orchestration config (or one agent without it). Progress events go to every client;
    approvals (also agent handoffs that need a human) and results only to the client that sent
    the task.

    \b
    Endpoints:
      Unix socket                 --socket (default under $ROOST_HOME/run/); no token
      ws://HOST:PORT/attach       with --http-port; the same events, one per text message
      http://HOST:PORT/mcp        with --http-port; MCP tools dispatch_task, get_status, get_result
      http://HOST:PORT/metrics    with --http-port; Prometheus metrics (GET)
      http://HOST:PORT/a2a/NAME/  with --a2a; A2A agent NAME (message/send, message/stream,
                                  tasks/get, tasks/cancel, tasks/resubscribe); the default
                                  agent's card is also at /.well-known/agent-card.json

    FUSERAFT_SERVE_TOKEN (the wire protocol's name; ROOST_SERVE_TOKEN is Roost's twin) or
    --tokens-file sets the bearer tokens required on every HTTP endpoint: /attach, /mcp, /a2a/
    and its agent cards, /metrics. Fuseraft-Client-Id (the wire protocol's name) is the header a
    WebSocket client sends to keep its tasks across reconnects.

    It fires the cron schedules of its own --work-dir in UTC, each slot at most once (`roost schedule
    --help`). Logs: readable lines on stderr and JSON lines in $ROOST_HOME/logs/roost.log (-v adds
    debug). `roost status` shows the daemon.

    \b
    Once it listens, its first stdout line is one JSON object (httpPort null without --http-port):
      {"type":"listening","protocolVersion":1,"socket":"/srv/.roost/run/d1f0.sock","httpPort":8787,"pid":42}

    \b
    Exit status:
      0  stopped by SIGINT/SIGTERM (queued and running tasks resume with the next daemon)
      1  another daemon owns the socket, the HTTP port cannot be listened on, or a runtime error
      2  configuration error (no provider, a broken --script, unusable -c config or [mcp_servers],
         tokens or TLS files, a socket path too long, a database URL that is wrong or unreachable)
    """
    from roost.protocol import DEFAULT_OUTBOX_LINES, ServeOptions, default_socket_path

    _start_logging(verbose, worker)
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if flags["a2a"] and flags["http_port"] is None:
        raise click.UsageError("--a2a serves on the HTTP port: give --http-port (0 picks a free one)")
    engines, config_path, auth, context = _start_settings(engine_flags, config, tokens_file, tls_cert, tls_key)
    directory = (work_dir or Path(os.getcwd())).resolve()
    options = ServeOptions(  # flags: the options named as ServeOptions fields (http_port, host, a2a, ...)
        socket_path=(socket_path or default_socket_path(directory)).absolute(),
        work_dir=directory,
        ssl_context=context,
        auth=auth,
        outbox_lines=outbox_lines or DEFAULT_OUTBOX_LINES,
        warn_threshold=token_warn_threshold,
        config=config_path,
        headless=worker,
        claims=not no_claim,
        **flags,
    )
    _check_socket_path(options.socket_path, engines)
    sys.exit(_run_process(options, engines, auto_objectives, workers or 1, worker=worker))


def _run_process(options: Any, engines: Any, auto_objectives: tuple[str, ...], workers: int, *, worker: bool) -> int:
    """Run the daemon (or, with ``worker``, one headless worker of a front door); its exit status."""
    try:
        if worker:
            from roost.cli._serve_workers import run_worker

            return int(trio.run(run_worker, options, engines))
        return int(trio.run(run_serve, options, engines, auto_objectives, workers))
    except BaseException as exc:  # an expected failure becomes one line; anything else is re-raised
        return _exit_for(exc, options)


def _start_logging(verbose: bool, worker: bool = False) -> None:
    """Log to stderr and to ``$ROOST_HOME/logs/`` (:func:`roost.cli._logs.log_path`; stderr only when unusable)."""
    from roost._paths import roost_home
    from roost.cli._logs import setup_daemon_logging, worker_index

    try:
        setup_daemon_logging(verbose, roost_home(), worker_index() if worker else None)
    except RoostError:
        setup_logging(verbose)  # an unusable ROOST_HOME is reported when the store opens


def _start_settings(
    engine_flags: EngineFlags,
    config: Path | None,
    tokens_file: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
) -> tuple[Any, str | None, Any, ssl.SSLContext | None]:
    """``(engines, config path, auth, TLS context)`` of ``roost serve``'s flags; a configuration
    error (no provider, a missing or broken --script, an unusable -c config, tokens or TLS files)
    is one line on stderr and exit status 2."""
    from roost.protocol import EngineCatalog, ServeAuth

    engines = None
    try:
        settings = engine_flags.resolve()
        engines = EngineCatalog(settings)
        if settings is not None and settings.provider == "scripted" and engines.default is None:
            # a missing or broken --script: fail at start as `roost exec` does, not on every task
            raise ConfigError(engines.setup_error or "the scripted engine's script is unusable")
        config_path = _check_config(config, engines)
        auth = ServeAuth.load(tokens_file=tokens_file)
        context = None
        if tls_cert is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            try:
                context.load_cert_chain(str(tls_cert), str(tls_key))
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"cannot load the TLS certificate/key: {exc}") from exc
    except ConfigError as exc:
        if engines is not None:
            trio.run(engines.aclose)
        click.echo(f"roost serve: error: {exc}", err=True)
        sys.exit(2)
    return engines, config_path, auth, context


def _check_socket_path(path: Path, engines: Any) -> None:
    """Exit with status 2 (one line on stderr) when ``path`` does not fit a Unix socket address."""
    if len(os.fsencode(str(path))) > 107:  # sun_path is 108 bytes with its NUL
        click.echo(
            f"roost serve: the socket path is too long for a Unix socket ({path}); give a shorter one with --socket",
            err=True,
        )
        trio.run(engines.aclose)
        sys.exit(2)


def _exit_for(exc: BaseException, options: Any) -> int:
    """Print the one line for an expected start/run failure of the daemon and return its exit
    status (see the module docstring); re-raise anything unexpected."""
    import errno

    from roost.cli._runner import leaf_exception
    from roost.errors import DatabaseSettingError
    from roost.protocol import DaemonRunning

    leaf = leaf_exception(exc)
    if isinstance(leaf, DaemonRunning):
        click.echo(f"roost serve: {leaf}", err=True)
        return 1
    if isinstance(leaf, OSError) and leaf.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
        where = f"{options.host}:{options.http_port}"
        why = {
            errno.EADDRINUSE: "the port is in use by another process",
            errno.EACCES: "permission denied (ports below 1024 need privileges)",
            errno.EADDRNOTAVAIL: f"{options.host} is not an address of this host",
        }[leaf.errno]
        click.echo(
            f"roost serve: cannot listen on {where}: {why}; choose another --http-port (0 picks a free one) or --host",
            err=True,
        )
        return 1
    if isinstance(leaf, (DatabaseSettingError, ConfigError)):  # e.g. [mcp_servers]: a configuration error
        click.echo(f"roost serve: {leaf}", err=True)
        return 2
    if isinstance(leaf, RoostError):
        click.echo(f"roost serve: {leaf} ({type(leaf).__name__})", err=True)
        return 1
    if isinstance(leaf, KeyboardInterrupt):
        return 0
    raise exc
