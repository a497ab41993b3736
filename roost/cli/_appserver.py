"""``roost app-server``: the app-server protocol over stdio."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from roost.cli._engine_options import EngineFlags, engine_options
from roost.errors import ConfigError


def _engines(
    flags: EngineFlags,
    *,
    allow_scripted_default: bool = False,
    pacing: bool = True,
    resolve_options: dict[str, Any] | None = None,
) -> Any:
    from roost.protocol import EngineCatalog

    options = dict(resolve_options or {})
    try:
        settings = flags.resolve(allow_scripted_default=allow_scripted_default, **options)
        return EngineCatalog(settings, pacing=pacing, resolve_options=options)
    except ConfigError as exc:
        return EngineCatalog(None, setup_error=str(exc), pacing=pacing, resolve_options=options)


def hosted_options(
    host: str, instance_id: str | None, workspace_id: str | None, workdir: str | None, config: str | None
) -> tuple[dict | None, dict[str, Any], Path]:
    """Check the hosted-mode options (app-server-protocol.md, "Hosted processes").

    Returns:
        ``(host, resolve_options, config file)``: ``host`` is ``{kind: "cloud", instance_id,
        workspace_id}`` or None (local); ``resolve_options`` for :func:`roost.config.resolve_provider`
        (cloud: only the ``--config`` file and no ``ROOST_PROVIDER``-style variables, so nothing is
        made from ambient state; API key variables are still read, the host injects secrets).

    Raises:
        click.UsageError: cloud mode without every one of --instance-id, --workspace-id, --workdir,
            --config (all missing ones are named), identity options in local mode, a --workdir that
            is not a directory or a --config that is not a file.
    """
    from roost.config import PROVIDER_ENV_VARS

    given = {"--instance-id": instance_id, "--workspace-id": workspace_id, "--workdir": workdir, "--config": config}
    if host == "cloud":
        missing = [name for name, value in given.items() if not value]
        if missing:
            raise click.UsageError(
                f"--host cloud requires {', '.join(missing)} (explicit identity and "
                "configuration; nothing is taken from the host's ambient state)"
            )
    elif instance_id or workspace_id:
        raise click.UsageError("--instance-id and --workspace-id apply only with --host cloud")
    if workdir is not None and not Path(workdir).is_dir():
        raise click.UsageError(f"--workdir {workdir!r} is not a directory")
    if config is not None and not Path(config).is_file():
        raise click.UsageError(f"--config {config!r} is not a file")
    home = Path(os.environ.get("ROOST_HOME") or Path.home() / ".roost").expanduser()
    path = Path(config).absolute() if config else home / "config.toml"
    options: dict[str, Any] = {"config_path": path}
    if host != "cloud":
        return None, options, path
    options["env"] = {k: v for k, v in os.environ.items() if k not in PROVIDER_ENV_VARS}
    return {"kind": "cloud", "instance_id": instance_id, "workspace_id": workspace_id}, options, path


def setup_logging(verbose: bool) -> None:
    """Logs go to stderr only: stdout carries protocol lines."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@click.command("app-server", short_help="Serve the app-server protocol as JSONL over stdin/stdout.")
@engine_options
@click.option("-v", "--verbose", is_flag=True, help="Log debug output to stderr.")
@click.option(
    "--print-schema", is_flag=True, help="Print the JSON Schema (draft 2020-12) of the app-server messages and exit."
)
@click.option(
    "--host",
    "host_kind",
    type=click.Choice(["local", "cloud"]),
    default="local",
    show_default=True,
    help="local, or cloud (hosted: needs --instance-id, --workspace-id, --workdir and --config).",
)
@click.option(
    "--instance-id", metavar="ID", default=None, help="Cloud mode: this instance's id (reported by initialize)."
)
@click.option(
    "--workspace-id",
    metavar="ID",
    default=None,
    help="Cloud mode: the workspace id (reported by initialize; the default of new threads).",
)
@click.option("--workdir", metavar="DIR", default=None, help="The working directory (workspace root) to serve.")
@click.option(
    "--config",
    "config_file",
    metavar="FILE",
    default=None,
    help="The configuration file to read and watch (TOML, or JSON for a .json name); default $ROOST_HOME/config.toml.",
)
def app_server_command(
    engine_flags: EngineFlags,
    verbose: bool,
    print_schema: bool,
    host_kind: str,
    instance_id: str | None,
    workspace_id: str | None,
    workdir: str | None,
    config_file: str | None,
) -> None:
    """Serve the app-server protocol as JSONL over stdin/stdout.

    The protocol version string "wuu-app-server/v0.1" and every method and field name are those of
    the app-server contract Roost implements (docs/app-server.md); clients written for it send
    them unchanged.

    Requests are {id, method, params}; responses echo the id; notifications carry a method and
    params. Stdout carries protocol lines only; logs go to stderr. End of input (or SIGTERM) shuts
    down cleanly: running turns are interrupted and persisted. With no provider configured, initialize reports
    status "needs_setup" with the settings to set. Request lines may be up to 64 MiB
    (ROOST_MAX_LINE_BYTES lowers the limit).

    The configuration file is watched: an edit that cannot be loaded sends config/error (once per
    distinct document; turns and configuration changes are refused until it is repaired), a
    repaired or changed file sends config/changed.

    --host cloud runs a hosted instance: --instance-id, --workspace-id, --workdir and --config are
    all required, provider selection comes only from flags and that file (ROOST_PROVIDER and the
    other selection variables are ignored), and initialize reports runtime_host {kind: "cloud",
    instance_id, workspace_id}. Transport authentication, tenant isolation and secrets remain the
    host's.

    --print-schema prints the schema (request params generated from the server's own parameter
    checks; results and notifications hand-written) and exits without serving.

    Exit status: 0 after end of input, shutdown or SIGTERM (and after --print-schema), and when
    the client closed stdout (one line on stderr: "the client closed stdout"); 1 when the
    stdio connection crashed (a bug: running turns are interrupted and saved, the reason is
    logged and printed on stderr; the connection is not reopened); 2 for bad options (cloud mode
    without its required options) or when the runtime cannot start (for example, the state
    directory is not writable); 3 when the client stopped reading stdout and was disconnected
    (the slow-consumer policy: "the client stopped reading stdout (its outbox overflowed)";
    running turns are interrupted and saved, and stdout ends at a line boundary). A
    configuration file that cannot be loaded at start (not valid TOML, an unknown key, a
    malformed table, a value of the wrong type) does not stop the server:
    initialize answers status "needs_setup" with the reason, config/error follows, and
    repairing the file recovers.
    """
    if print_schema:
        import json

        from roost.protocol import app_server_schema

        click.echo(json.dumps(app_server_schema(), indent=2))
        return
    host, resolve_options, config_path = hosted_options(host_kind, instance_id, workspace_id, workdir, config_file)
    if workdir is not None:
        os.chdir(workdir)
    setup_logging(verbose)
    mcp_servers, broken = _configured_servers(config_path)
    from roost.storage import EarlyStore

    early_store = EarlyStore()  # opens (on a fresh home: migrates) while the protocol modules load
    engines = _engines(engine_flags, resolve_options=resolve_options)
    if broken is not None and engines.default is not None:  # not expected: resolve reads the same file
        engines.default, engines.setup_error = None, str(broken)

    def resolve() -> Any:
        return engine_flags.resolve(**resolve_options)

    _run_app_server(
        engines=engines,
        host=host,
        watch_config=(config_path, resolve),
        mcp_servers=mcp_servers,
        open_store=early_store,
        early=_answer_early(early_store, engines, host),
        workers=True,
    )


def _configured_servers(config_path: Path) -> tuple[list[Any], ConfigError | None]:
    """``([mcp_servers] of the file, None)``, or ``([], the error)`` for a file that cannot be
    loaded: the session reports that, as a reload would (app-server-protocol.md, "Transport and
    initialization": the connection works, the configuration needs attention), so initialize
    answers needs_setup, config/error follows and a repaired file recovers."""
    from roost.config import configured_mcp_servers

    try:
        return configured_mcp_servers(config_path), None
    except ConfigError as exc:
        return [], exc


def _answer_early(early_store: Any, engines: Any, host: dict | None) -> Any:
    """Answer a waiting first ``initialize`` before trio and the runtime load
    (:func:`roost.protocol.answer_initialize_early`), once the store has opened; a store that
    failed to open answers nothing here (the start reports it as before: exit 2)."""
    from roost.protocol import EarlyInitialize, answer_initialize_early

    if not early_store.opened():
        return EarlyInitialize()
    try:
        store = early_store()
        probe = getattr(store, "write_refusal", None)  # (SQLite: a read-only home is an issue to report)
        return answer_initialize_early(engines=engines, host=host, store_issue=probe)
    except OSError:  # the client closed stdout (EPIPE; EBADF: never opened): as run_main does, exit 0
        from roost.protocol import silence_stdout

        silence_stdout()
        click.echo("roost app-server: the client closed stdout; the session ends", err=True)
        sys.exit(0)


def _run_app_server(**serve_options: Any) -> None:
    """Run :func:`_serve_stdio` to its end; exit 1 (with the reason on stderr) when the stdio
    connection crashed, after the runtime has stopped. A start that fails after ``initialize`` was
    answered early also tells the client (:func:`_report_after_early_answer`)."""
    crashed: list[BaseException] = []
    too_slow: list[BaseException] = []
    failed: list[BaseException] = []

    async def serve() -> None:
        from roost.protocol import StdioClientTooSlow, StdioConnectionCrashed

        try:
            await _serve_stdio(**serve_options)
        except* StdioConnectionCrashed as group:  # logged where it happened
            crashed.extend(group.exceptions)
        except* StdioClientTooSlow as group:
            too_slow.extend(group.exceptions)

    async def main() -> None:
        try:
            await serve()
        except BaseException as exc:
            failed.append(exc)
            raise

    from roost.cli._runner import leaf_exception, run_main

    early = serve_options.get("early")
    try:
        run_main(main, command="app-server")
    except BaseException:
        if failed and early is not None and early.owner is not None and not early.applied:
            _report_after_early_answer(leaf_exception(failed[0]))
        raise
    if crashed:
        click.echo(f"roost app-server: error: {crashed[0]}; exiting", err=True)
        sys.exit(1)
    if too_slow:
        click.echo(f"roost app-server: error: {leaf_exception(too_slow[0])}; exiting", err=True)
        sys.exit(3)


def _report_after_early_answer(exc: BaseException) -> None:
    """The runtime failed to start after ``initialize`` was answered early: the client also gets
    the failure in the protocol's shape, ``{"id": null, "error": {code, message}}`` (as for a line
    no request can be named for). The process then ends as such a start always did: a
    :class:`~roost.errors.RoostError` is one stderr line and exit status 2, anything else a
    traceback and exit status 1."""
    from roost._json import dumps_line
    from roost.protocol import wire_error

    with contextlib.suppress(OSError):  # the client closed stdout: the stderr line still says it
        os.set_blocking(1, True)
        os.write(1, dumps_line({"id": None, "error": wire_error(exc, context="start-up")}))


async def _serve_stdio(**serve_options: Any) -> None:
    """Serve the app-server on this process's stdin/stdout until end of input; SIGTERM ends input
    like EOF (running turns are interrupted and persisted). ``serve_options``: the keyword
    arguments of :func:`roost.protocol.serve_app_server` besides its streams."""
    import trio

    from roost.protocol import PrefixedReceiveStream, open_stdio_stream, serve_app_server

    stream = open_stdio_stream()
    early = serve_options.get("early")
    receive = PrefixedReceiveStream(early.prefix if early is not None else b"", stream.receive_stream)
    async with trio.open_nursery() as nursery:

        async def stop_on_sigterm() -> None:
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    await receive.aclose()
                    return

        nursery.start_soon(stop_on_sigterm)
        await serve_app_server(receive, stream.send_stream, **serve_options)
        nursery.cancel_scope.cancel()
