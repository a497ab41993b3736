"""The ``roost`` command group and its sub-commands' registration."""

from __future__ import annotations

import click

from roost import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "-V", "--version", prog_name="roost")
def main() -> None:
    """Roost: a trio runtime for LLM agents.

    One process hosts many threads (conversations), their turns, worker trees of subagents, cron
    schedules and client connections, each a supervised actor. State lives in SQLite at
    $ROOST_HOME/roost.db (ROOST_HOME defaults to ~/.roost).
    """


def _register() -> None:
    from roost.cli._appserver import app_server_command

    from roost.cli._demo import demo_command

    main.add_command(app_server_command)
    main.add_command(demo_command)
    from roost.cli._exec import exec_command
    main.add_command(exec_command)
    from roost.cli._schedule import schedule_command
    main.add_command(schedule_command)
    from roost.cli._serve import serve_command
    main.add_command(serve_command)
    from roost.cli._resources import register_resources
    register_resources(main)
    from roost.cli._attach import attach_command
    main.add_command(attach_command)
    from roost.cli._repl import repl_command
    main.add_command(repl_command)
    from roost.cli._run import run_command
    main.add_command(run_command)
    try:
        from roost.cli._models import models_command

        main.add_command(models_command)
    except ImportError:
        pass


_register()
