"""The `roost` command itself: --version, --help, and the demo run end to end."""

from __future__ import annotations

import subprocess

import click
import pytest
from click.testing import CliRunner

from _helpers.cli import walk_commands

from roost import __version__
from roost.cli import main


def run(cmd, *args, env=None, cwd=None, timeout=120):
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def test_version_and_help(roost_cmd):
    out = run(roost_cmd, "--version")
    assert out.returncode == 0 and __version__ in out.stdout
    helped = run(roost_cmd, "--help")
    assert helped.returncode == 0
    for command in ("app-server", "demo", "models"):
        assert command in helped.stdout
    sub = run(roost_cmd, "app-server", "--help")
    assert sub.returncode == 0 and "needs_setup" in sub.stdout


def _groups(group: click.Group):
    """``(path, group)`` for ``roost`` and each of its command groups."""
    return [(path, command) for path, command in walk_commands(group) if isinstance(command, click.Group)]


def _summaries(text: str) -> dict[str, str]:
    """Command name -> its summary in the "Commands:" list of a help text (wrapped lines joined)."""
    rows: dict[str, str] = {}
    last = None
    for line in text.partition("\nCommands:\n")[2].splitlines():
        if not line.strip():
            break
        if line.startswith("  ") and not line.startswith("   "):
            last, _, summary = line.strip().partition(" ")
            rows[last] = summary.strip()
        elif last is not None:
            rows[last] += " " + line.strip()
    return rows


@pytest.mark.parametrize("width", [60, 80, 120])
def test_command_lists_show_whole_sentences(width):
    """Each command's summary in ``roost --help`` (and in each group's --help) is a whole sentence
    at any terminal width: click cuts a too-long first sentence with "...", a short_help it keeps."""
    for path, group in _groups(main):
        out = CliRunner().invoke(main, [*path, "--help"], terminal_width=width)
        assert out.exit_code == 0, out.output
        rows = _summaries(out.output)
        assert set(rows) == set(group.list_commands(click.Context(group))), (path, out.output)
        for name, summary in rows.items():
            assert summary.endswith(".") and not summary.endswith("..."), (path, name, summary)


def test_demo_runs_offline_and_exits_cleanly(roost_cmd, tmp_path, roost_home):
    (tmp_path / "notes.txt").write_text("hello")
    out = run(roost_cmd, "demo", "--no-color", "--cwd", str(tmp_path))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "store_writer" in text and "lease_keeper" in text and "threads" in text
    assert text.count("[turn completed") == 3
    assert "notes.txt" in text                       # the list_dir tool saw the work dir
    assert "approval requested: shell_command" in text
    # the worker tree: two levels, live progress, and the combined result at the end
    assert "worker scout (depth 1): running" in text
    assert "worker mapper (depth 2): completed" in text
    assert "worker reader (depth 1): completed" in text
    assert "Combined result from the team" in text
    # the live tree: the demo's thread and one thread per worker (scout, reader, mapper)
    assert "the demo's thread and its 3 workers' threads" in text and text.count("thread:thr_") == 4
    assert "All actors stopped cleanly" in text
    assert (roost_home / "roost.db").exists()


@pytest.mark.parametrize("width", [60, 100])
def test_serve_help_shows_the_listening_line_as_the_json_it_prints(width, monkeypatch):
    """The example ``listening`` line in ``roost serve --help`` is valid JSON (click does not rewrap
    it) with exactly the fields the daemon prints."""
    import io
    import json
    import sys
    from types import SimpleNamespace

    from roost.cli._serve import _announce_listening

    out = CliRunner().invoke(main, ["serve", "--help"], terminal_width=width)
    assert out.exit_code == 0, out.output
    lines = [line.strip() for line in out.output.splitlines() if '"listening"' in line]
    assert len(lines) == 1, out.output
    example = json.loads(lines[0])
    stdout = io.TextIOWrapper(io.BytesIO())
    monkeypatch.setattr(sys, "stdout", stdout)
    _announce_listening(SimpleNamespace(socket_path="/s.sock", work_dir="/w"), SimpleNamespace(http_port=1))
    printed = json.loads(stdout.buffer.getvalue())
    assert example["type"] == printed["type"] == "listening"
    assert set(example) == set(printed)
    assert {k: type(v) for k, v in example.items()} == {k: type(v) for k, v in printed.items()}


def test_serve_http_port_help_names_every_endpoint_of_the_port():
    """``--http-port`` serves more than the WebSocket: its help names each path of the port
    (roost/protocol/_serve_http.py routes /attach, /mcp, /metrics and, with --a2a, /a2a/)."""
    from roost.cli._serve import serve_command

    option = next(p for p in serve_command.params if p.name == "http_port")
    for path in ("/attach", "/mcp", "/metrics", "/a2a/"):
        assert path in option.help, path
