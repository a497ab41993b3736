"""The `roost` command itself: --version, --help, and the demo run end to end."""

from __future__ import annotations

import subprocess

from roost import __version__


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
