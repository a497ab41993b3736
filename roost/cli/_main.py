"""The ``roost`` command group and its sub-commands' registration."""

from __future__ import annotations

import functools
import importlib
import os
import sys
from typing import Any

import click

from roost import __version__

#: Sub-command name -> (module, attribute): each module is imported only when its command runs
#: (or for ``roost --help``), so a quick ``roost sessions --json`` does not import the runtime,
#: the engines and the daemon.
_COMMANDS = {
    "demo": ("roost.cli._demo", "demo_command"),
    "app-server": ("roost.cli._appserver", "app_server_command"),
    "exec": ("roost.cli._exec", "exec_command"),
    "serve": ("roost.cli._serve", "serve_command"),
    "attach": ("roost.cli._attach", "attach_command"),
    "repl": ("roost.cli._repl", "repl_command"),
    "run": ("roost.cli._run", "run_command"),
    "schedule": ("roost.cli._schedule", "schedule_command"),
    "status": ("roost.cli._status", "status_command"),
    "sessions": ("roost.cli._res_sessions", "sessions_command"),
    "memory": ("roost.cli._res_memory", "memory_group"),
    "context": ("roost.cli._res_memory", "context_group"),
    "plugins": ("roost.cli._res_config", "plugins_command"),
    "config": ("roost.cli._res_config", "config_command"),
    "validate": ("roost.cli._res_config", "validate_command"),
    "init": ("roost.cli._res_config", "init_command"),
    "models": ("roost.cli._models", "models_command"),
    "objective": ("roost.cli._objective", "objective_group"),
    "db": ("roost.cli._db", "db_group"),
}

#: The commands that read the numeric tuning variables (ROOST_LEASE_TTL, ROOST_MAX_LINE_BYTES, ...):
#: each checks them all when it starts (after its own arguments parsed, so --help still works).
_READS_TUNING_ENV = frozenset({"demo", "app-server", "exec", "serve", "attach", "repl", "run"})


#: The commands that open the store: each (and each sub-command of a group) takes
#: ``--database-url URL`` (PostgreSQL, issue 13), exported as ``$ROOST_DATABASE_URL`` for the
#: command (and the processes it starts) before it runs; unset, ``$ROOST_DATABASE_URL`` or the
#: SQLite file ``$ROOST_HOME/roost.db`` is used (:func:`roost.storage.open_backend`).
_OPENS_STORE = frozenset(
    {
        "demo",
        "app-server",
        "exec",
        "serve",
        "repl",
        "run",
        "schedule",
        "status",
        "sessions",
        "memory",
        "context",
        "objective",
    }
)


def _export_database_url(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        from roost.storage import DATABASE_URL_ENV

        os.environ[DATABASE_URL_ENV] = value


def _add_database_url(command: click.Command) -> None:
    """Give ``command`` (every leaf command of a group) the ``--database-url`` option."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_database_url(sub)
        return
    if any(p.name == "database_url" for p in command.params):
        return
    command.params.append(
        click.Option(
            ["--database-url", "database_url"],
            metavar="URL",
            expose_value=False,
            is_eager=True,
            callback=_export_database_url,
            help="postgresql://user:password@host:port/dbname: run on this PostgreSQL database"
            " (default: $ROOST_DATABASE_URL; unset: the SQLite file $ROOST_HOME/roost.db).",
        )
    )


def _checking_env(name: str, callback: Any) -> Any:
    """``callback`` preceded by :func:`roost._paths.check_env_settings`: an invalid variable is
    one line on stderr and exit status 2 (a configuration error), before anything starts."""

    @functools.wraps(callback)
    def checked(*args: Any, **kwargs: Any) -> Any:
        from roost._paths import check_env_settings
        from roost.errors import ConfigError

        try:
            check_env_settings()
        except ConfigError as exc:
            click.echo(f"roost {name}: {exc}", err=True)
            sys.exit(2)
        return callback(*args, **kwargs)

    checked.__roost_env_checked__ = True  # type: ignore[attr-defined]
    return checked


class _LazyGroup(click.Group):
    """A click group whose sub-commands are imported on first use (click's documented
    "lazily loading subcommands" pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module = importlib.import_module(target[0])
        command: click.Command = getattr(module, target[1])
        callback = command.callback
        if cmd_name in _READS_TUNING_ENV and callback is not None and not hasattr(callback, "__roost_env_checked__"):
            command.callback = _checking_env(cmd_name, callback)
        if cmd_name in _OPENS_STORE:
            _add_database_url(command)
        return command

    def invoke(self, ctx: click.Context) -> object:
        """Run the sub-command; an expected failure that escaped it becomes one line.

        A :class:`~roost.errors.RoostError` (an unusable ``ROOST_HOME``, a read-only or full
        database, bad settings), alone or as the only leaf of trio's exception groups, is printed
        as ``roost COMMAND: error: ...`` on stderr with exit status 2 (the set-up status every
        command's help documents), never as a traceback. A ``BrokenPipeError`` while stdout's
        reader is gone (``roost sessions --json | head -c 1``) is a quiet exit 0, as
        :func:`roost.cli._runner.run_main` makes it for the trio commands (click alone exits 1);
        a broken pipe of anything else (a socket) is not stdout's and propagates. Anything else
        propagates unchanged.
        """
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - re-raised unless it is an expected failure
            from roost.errors import RoostError

            leaf = exc
            while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
                leaf = leaf.exceptions[0]
            if isinstance(leaf, BrokenPipeError) and _stdout_reader_gone():
                from roost.protocol import silence_stdout

                silence_stdout()  # so the exit-time flush of what is left stays quiet
                raise SystemExit(0) from None
            if not isinstance(leaf, RoostError):
                raise
            name = ctx.invoked_subcommand or (ctx.protected_args[0] if ctx.protected_args else "")
            click.echo(f"roost {name}: error: {leaf}", err=True)
            raise SystemExit(2) from None


def _stdout_reader_gone() -> bool:
    """Whether stdout (file descriptor 1) is a pipe or socket whose reader went away: ``poll``
    reports an error or hang-up on it. False when that cannot be told (no poll, no descriptor)."""
    import select

    try:
        poller = select.poll()
        poller.register(1, select.POLLOUT)
        events = poller.poll(0)
    except (AttributeError, OSError, ValueError):
        return False
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in events)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "-V", "--version", prog_name="roost")
def main() -> None:
    """Roost: a trio runtime for LLM agents.

    One process hosts many threads (conversations), their turns, worker trees of subagents, cron
    schedules and client connections, each a supervised actor. State lives in SQLite at
    $ROOST_HOME/roost.db (ROOST_HOME defaults to ~/.roost).

    The protocols (app-server, wire) are described in docs/ of the repository; names such as
    FUSERAFT_SERVE_TOKEN, Fuseraft-Client-Id and wuu-app-server/v0.1 are those contracts' names,
    kept for their clients (each FUSERAFT_* variable also has a ROOST_* twin).

    Exit status: each command's --help gives its own. Common to all: 2 for a usage error or an
    unusable ROOST_HOME, database or configuration (a --json resource query: 1 with an error
    envelope, as the wire protocol fixes); a closed stdout (its reader went away, as in `| head`) is
    a quiet exit 0 for a command that worked, except `roost exec` (1: its turn was interrupted).
    """
