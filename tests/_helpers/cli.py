"""Running `roost` commands in tests: as the real process, or in-process through click."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import click
import trio

from _helpers.appserver import roost_argv
from _helpers.timing import scaled


async def roost(env: dict, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    with trio.fail_after(scaled(30)):
        return await trio.run_process([*roost_argv(), *args], env=env, cwd=str(cwd), capture_stdout=True,
                                      capture_stderr=True, check=False, stdin=subprocess.DEVNULL)

def _cli_sync(args: tuple[str, ...], cwd: Path, env: dict | None) -> subprocess.CompletedProcess:
    from click.testing import CliRunner

    from roost.cli._main import main

    old = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    finally:
        os.chdir(old)
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout_bytes, result.stderr_bytes)


async def cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a `roost` command in this process (the same click entry point, without a process start)."""
    with trio.fail_after(scaled(30)):
        return await trio.to_thread.run_sync(_cli_sync, args, cwd, env)


async def roost_all(env: dict, *commands: tuple[str, ...], cwd: Path) -> list[subprocess.CompletedProcess]:
    """Run commands in order: the first as the real `roost` process, the others in-process (:func:`cli`)."""
    results = [await roost(env, *commands[0], cwd=cwd)]
    for args in commands[1:]:
        results.append(await cli(*args, cwd=cwd))
    return results


def walk_commands(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """``(path, command)`` for ``command`` and every command under it, depth first, each group
    before its commands (``path``: the names after ``roost``, ``()`` for ``command`` itself)."""
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, (*path, name)
            yield from walk_commands(sub, (*path, name))
