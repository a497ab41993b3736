"""``roost app-server``: the app-server protocol over stdio."""

from __future__ import annotations

import logging
import signal
import sys
from typing import Any

import click
import trio

from roost.cli._engine_options import EngineFlags, engine_options
from roost.errors import ConfigError


def _engines(flags: EngineFlags, *, allow_scripted_default: bool = False, pacing: bool = True) -> Any:
    from roost.protocol import EngineCatalog

    try:
        settings = flags.resolve(allow_scripted_default=allow_scripted_default)
        return EngineCatalog(settings, pacing=pacing)
    except ConfigError as exc:
        return EngineCatalog(None, setup_error=str(exc), pacing=pacing)


def setup_logging(verbose: bool) -> None:
    """Logs go to stderr only: stdout carries protocol lines."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@click.command("app-server")
@engine_options
@click.option("-v", "--verbose", is_flag=True, help="Log debug output to stderr.")
@click.option("--print-schema", is_flag=True,
              help="Print the JSON Schema (draft 2020-12) of the app-server messages and exit.")
def app_server_command(engine_flags: EngineFlags, verbose: bool, print_schema: bool) -> None:
    """Serve the app-server protocol as JSONL over stdin/stdout.

    The protocol version string "wuu-app-server/v0.1" and every method and field name are those of
    the app-server contract Roost implements (docs/app-server.md); clients written for it send
    them unchanged.

    Requests are {id, method, params}; responses echo the id; notifications carry a method and
    params. Stdout carries protocol lines only; logs go to stderr. End of input (or SIGTERM) shuts
    down cleanly: running turns are interrupted and persisted. With no provider configured, initialize reports
    status "needs_setup" with the settings to set. Request lines may be up to 64 MiB
    (ROOST_MAX_LINE_BYTES lowers the limit).

    --print-schema prints the schema (request params generated from the server's own parameter
    checks; results and notifications hand-written) and exits without serving.

    Exit status: 0 after end of input, shutdown or SIGTERM (and after --print-schema); 2 when the
    runtime cannot start (for example, the state directory is not writable).
    """
    if print_schema:
        import json

        from roost.protocol import app_server_schema

        click.echo(json.dumps(app_server_schema(), indent=2))
        return
    from roost.protocol import open_stdio_stream
    from roost.protocol import serve_app_server

    setup_logging(verbose)
    engines = _engines(engine_flags)

    async def main() -> None:
        stream = open_stdio_stream()
        async with trio.open_nursery() as nursery:
            async def stop_on_sigterm() -> None:
                # SIGTERM ends input like EOF: running turns are interrupted and persisted.
                with trio.open_signal_receiver(signal.SIGTERM) as signals:
                    async for _ in signals:
                        await stream.receive_stream.aclose()
                        return

            nursery.start_soon(stop_on_sigterm)
            await serve_app_server(stream.receive_stream, stream.send_stream, engines=engines)
            nursery.cancel_scope.cancel()

    from roost.cli._runner import run_main

    run_main(main, command="app-server")
