"""``roost models``: list the configured provider's models."""

from __future__ import annotations

import sys

import click
import trio

from roost._json import dumps_line
from roost.cli._engine_options import EngineFlags, engine_options
from roost.engines import ModelInfo, open_engine
from roost.errors import ConfigError, EngineFailure

__all__ = ["models_command", "PROTOCOL_VERSION"]

#: wire-protocol.md "Versioning".
PROTOCOL_VERSION = 1


async def _list(flags: EngineFlags) -> list[ModelInfo]:
    engine = open_engine(flags.resolve())
    try:
        return await engine.list_models()
    finally:
        await engine.aclose()


@click.command("models", short_help="List the models of the configured provider.")
@engine_options
@click.option("--json", "as_json", is_flag=True, help="Print one wire-protocol JSON line ({protocolVersion, items}).")
def models_command(engine_flags: EngineFlags, as_json: bool) -> None:
    """List the models of the configured provider.

    OpenAI-compatible servers and Anthropic are asked for GET /v1/models; the scripted provider
    lists its script names. Never starts a setup wizard: with no provider configured this is an
    error (exit status 1), an error envelope with --json.

    Exit status: 0 on success; 1 when no provider is configured or it cannot be reached; 2 for a
    usage error.
    """
    try:
        models = trio.run(_list, engine_flags)
    except (ConfigError, EngineFailure) as exc:
        if as_json:
            from roost.cli._res_common import write_line

            write_line(dumps_line({"protocolVersion": PROTOCOL_VERSION, "error": str(exc)}))
        else:
            click.echo(f"roost models: {exc}", err=True)
        sys.exit(1)
    if as_json:
        items = [{"id": m.id, "current": m.current} for m in models]
        from roost.cli._res_common import write_line

        write_line(dumps_line({"protocolVersion": PROTOCOL_VERSION, "items": items}))
        return
    for m in models:
        click.echo(f"{'*' if m.current else ' '} {m.id}")
