"""``roost demo``: the runtime on the scripted engine, start to finish, with no network or setup."""

from __future__ import annotations

from pathlib import Path

import click

from roost.cli._render import TextRenderer

DEMO_PROMPTS = (
    "hello",
    "run a shell command",
    "put a team of workers on this directory",
)


@click.command("demo", short_help="Run Roost's offline demo on the built-in scripted engine.")
@click.option(
    "--cwd",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Working directory the demo's tools see (default: the current one).",
)
@click.option("--no-color", is_flag=True, help="Plain output without ANSI colours.")
def demo_command(cwd: Path | None, no_color: bool) -> None:
    """Run Roost's offline demo on the built-in scripted engine.

    Starts the runtime (store writer, lease keeper, thread supervisor), prints the live supervision
    tree, runs a few turns that stream text and call tools (a shell command goes through the
    approval path, which the demo answers itself), then puts a tree of workers (subagents, two
    levels deep) on the working directory, with live progress, and prints their combined result.
    Every actor stops cleanly at the end. State is kept in $ROOST_HOME/roost.db like any session.

    Exit status: 0 when the demo finished; 2 when the runtime cannot start (for example, an
    unwritable $ROOST_HOME).
    """
    from roost.actors import Origin, StartTurn, Subscribe
    from roost.engines import ProviderSettings
    from roost.model import Thread
    from roost.protocol import EngineCatalog
    from roost.storage import new_id, utc_now
    from roost.supervisor import open_runtime
    from roost.tools import builtin_tools

    workdir = (cwd or Path.cwd()).resolve()
    renderer = TextRenderer(color=False if no_color else None)
    engines = EngineCatalog(ProviderSettings(provider="scripted", script="demo", source="default"))

    async def approve(params: dict) -> bool:
        renderer._end_text()
        detail = params.get("command") or params.get("path") or params.get("action")
        click.echo(f"[approval requested: {params['kind']} {detail!r} -> the demo approves it]")
        return True

    async def main() -> None:
        async with open_runtime(engine_for=engines.engine_for, tools=builtin_tools()) as runtime:
            click.echo("Roost demo: scripted engine, no network.\n\nSupervision tree:")
            click.echo(runtime.render_tree())
            now = utc_now()
            thread = Thread(
                id=new_id("thr"),
                title="roost demo",
                cwd=str(workdir),
                provider="scripted",
                permission_mode="standard",
                created_at=now,
                updated_at=now,
            )
            actor = await runtime.registry.create(thread, ephemeral=False)
            await actor.ref.ask(Subscribe(renderer))
            origin = Origin(client_id="demo", request_approval=approve)
            click.echo(f"\nThread {thread.id} in {workdir}\n")
            for prompt in DEMO_PROMPTS:
                turn = await actor.ref.ask(StartTurn(prompt=prompt, origin=origin))
                await actor.wait_turn_end(turn["id"])
                click.echo("")
            workers = len(runtime.registry.loaded()) - 1  # each worker runs in a thread of its own
            click.echo(f"Supervision tree (live: the demo's thread and its {workers} workers' threads):")
            click.echo(runtime.render_tree())
        await engines.aclose()
        click.echo("\nAll actors stopped cleanly. Try `roost app-server` next; see README.md.")

    from roost.cli._runner import run_main

    run_main(main, command="demo")
