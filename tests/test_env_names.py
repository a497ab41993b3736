"""The contract's environment variables and their ``ROOST_*`` twins, end to end through the real command.

wire-protocol.md names ``FUSERAFT_SERVE_TOKEN`` and ``FUSERAFT_VSCODE_QUESTIONS`` (clients written
for it set them); Roost accepts both those and ``ROOST_SERVE_TOKEN`` / ``ROOST_VSCODE_QUESTIONS``
(docs/wire.md, "Names"). Each spelling is tested alone, and ``--help`` names the contract.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from _helpers.appserver import roost_argv, script_env
from _helpers.cli import walk_commands
from _helpers.serve_client import open_daemon
from test_repl import open_repl
from trio_websocket import ConnectionRejected

ASK = """
rules:
  - match: {prompt: "^ask"}
    steps:
      - - {tool_call: {name: ask_user, arguments: {question: "Which colour?", options: [red, blue], allowOther: false}}}
      - - {text: "Noted: {tool_output}"}
default: echo
"""

TOKEN_NAMES = ["FUSERAFT_SERVE_TOKEN", "ROOST_SERVE_TOKEN"]
QUESTION_NAMES = ["FUSERAFT_VSCODE_QUESTIONS", "ROOST_VSCODE_QUESTIONS"]


@pytest.mark.parametrize("name", TOKEN_NAMES)
async def test_serve_token_from_either_variable(name: str, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"default": "echo"}))
    # start_daemon clears both spellings, then sets only this one
    async with open_daemon(script=script, env={name: "tok-123"}) as daemon:
        with pytest.raises(ConnectionRejected) as info:
            async with daemon.ws(token=None):
                pass
        assert info.value.status_code == 401
        async with daemon.ws(token="tok-123") as client:
            hello = await client.wait_for("hello")
            assert hello["readOnly"] is False


@pytest.mark.parametrize("name", QUESTION_NAMES)
async def test_vscode_questions_from_either_variable(name: str, tmp_path: Path, roost_home: Path) -> None:
    env = script_env(tmp_path, roost_home, ASK)
    for other in QUESTION_NAMES:
        env.pop(other, None)
    env[name] = "1"
    async with open_repl(env, tmp_path) as repl:
        await repl.wait("ready")
        start = await repl.say("ask me")
        question = await repl.wait("question", start=start)
        assert question["question"] == "Which colour?"
        await repl.send({"type": "question_response", "answer": "red"})
        await repl.wait("message_end", start=start)
        assert await repl.close() == 0


def _help(*args: str) -> str:
    out = subprocess.run([*roost_argv(), *args, "--help"], check=False, capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    return " ".join(out.stdout.split())


def test_help_names_the_contract_of_each_name() -> None:
    serve = _help("serve")
    for needle in ("FUSERAFT_SERVE_TOKEN", "ROOST_SERVE_TOKEN", "wire protocol", "/mcp", "schedule",
                   "Exit status"):
        assert needle in serve, needle
    attach = _help("attach")
    assert "Fuseraft-Client-Id" in attach and "wire protocol's name" in attach
    repl = _help("repl")
    assert "FUSERAFT_VSCODE_QUESTIONS" in repl and "ROOST_VSCODE_QUESTIONS" in repl and "wire protocol" in repl
    app_server = _help("app-server")
    assert "wuu-app-server/v0.1" in app_server and "app-server contract" in app_server
    assert "--print-schema" in app_server and "Exit status" in app_server


def test_every_command_documents_its_options_and_exit_status() -> None:
    """Each `roost` command's --help explains every option and says what the exit status means."""
    import click

    from roost.cli._main import main

    problems: list[str] = []
    for names, command in walk_commands(main):
        path = " ".join(("roost", *names))
        text = f"{command.help or ''} {command.epilog or ''}".lower()
        if not isinstance(command, click.Group) and "exit" not in text:
            problems.append(f"{path}: no exit status")
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden and not param.help:
                problems.append(f"{path} {param.opts[0]}: no help")
    assert not problems, problems


def test_no_help_text_shows_raw_rst_or_exit_statuses_that_do_not_apply() -> None:
    """`schedule disable --help` showed ``disabled NAME``; `schedule list/enable --help`
    listed an invalid cron and an empty --task among their failures."""
    import click

    from roost.cli._main import main

    ctx = click.Context(main)
    raw: list[str] = []
    for names, command in walk_commands(main):
        text = f"{command.help or ''} {command.epilog or ''} " + " ".join(
            getattr(p, "help", None) or "" for p in command.params)
        if "``" in text or ":func:" in text or ":class:" in text:
            raw.append(" ".join(("roost", *names)))
    assert raw == []
    schedule = main.get_command(ctx, "schedule")
    for name in ("list", "enable", "disable", "remove", "run"):
        epilog = schedule.get_command(ctx, name).epilog
        assert "Exit status" in epilog and "cron" not in epilog and "--task" not in epilog, name
    assert "cron" in schedule.get_command(ctx, "add").epilog


def test_readme_lists_every_variable_a_command_option_reads() -> None:
    """Each environment variable a ``roost`` option falls back to (click ``envvar``, e.g.
    ``roost serve --workers``' ROOST_SERVE_WORKERS) has a row in README.md's "Environment
    variables" table."""
    from roost.cli import main

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    table = readme.partition("## Environment variables")[2].partition("\n\n")[2].partition("\n\n")[0]
    rows = {line.split("|")[1] for line in table.splitlines() if line.startswith("| `")}

    read = {}
    for _, command in walk_commands(main):
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            for name in [envvar] if isinstance(envvar, str) else envvar or []:
                read[name] = f"{command.name} {param.opts[-1]}"
    assert "ROOST_SERVE_WORKERS" in read
    missing = {name: option for name, option in read.items() if not any(f"`{name}`" in row for row in rows)}
    assert not missing, f"README's environment table lacks {missing}"
