"""`roost run` on and off a terminal (issue 17): approvals asked on a TTY, the unattended policy,
permission modes, denials reported and never a clean success, streamed text, documented exit codes."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import time
from pathlib import Path

from _helpers.appserver import roost_argv
from _helpers.timing import scaled

CONFIG = """
Orchestration:
  Name: Solo
  Agents:
    - {Name: Developer, Instructions: "You write files.", Plugins: [files]}
  Selection: {Type: sequential}
  Termination: {Type: maxiterations, MaxIterations: 1}
"""

SCRIPT = """
rules:
  - match: {agent: Developer}
    steps:
      - - {text: "Writing the file."}
        - {tool_call: {name: write_file, arguments: {path: "a.txt", content: "hi"}}}
      - - {text: "Finished: {tool_output}", deltas: 4}
default: echo
"""


def _setup(tmp_path: Path) -> tuple[Path, dict]:
    config = tmp_path / "solo.yaml"
    config.write_text(CONFIG)
    script = tmp_path / "script.yaml"
    script.write_text(SCRIPT)
    env = dict(os.environ, ROOST_PROVIDER="scripted", ROOST_SCRIPT=str(script))
    return config, env


def _run(tmp_path: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*roost_argv(), "run", *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=scaled(60), check=False)


def _run_on_a_pty(tmp_path: Path, env: dict, args: list[str], answers: dict[bytes, bytes]) -> tuple[int, str]:
    """Run `roost run ARGS` with stdin, stdout and stderr on a pseudo-terminal; when the output
    shows a key of ``answers``, type its value. Returns (exit status, everything it printed)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([*roost_argv(), "run", *args], env=dict(env, TERM="xterm", COLUMNS="100"),
                            cwd=tmp_path, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out = b""
    pending = dict(answers)
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:   # EIO: the child closed the terminal
                    break
                if not data:
                    break
                out += data
                for prompt in list(pending):
                    if prompt in out:
                        os.write(master, pending.pop(prompt))
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=scaled(30))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, out.decode("utf-8", "replace")


def test_on_a_terminal_each_approval_is_asked_and_text_streams(tmp_path: Path) -> None:
    config, env = _setup(tmp_path)
    code, out = _run_on_a_pty(tmp_path, env, ["-c", str(config), "write it"], {b"[y/N]": b"y\n"})
    assert code == 0, out
    assert "approve" in out and "a.txt" in out
    assert (tmp_path / "a.txt").read_text() == "hi"
    assert "Developer: Writing the file." in out and "Finished:" in out
    assert "ok: write_file" in out and "| created a.txt" in out   # tool activity, as exec shows it
    assert "[Developer is done]" not in out   # no pause after turns without --hitl
    assert "denied" not in out


def test_on_a_terminal_a_denial_is_reported_and_is_not_a_clean_success(tmp_path: Path) -> None:
    config, env = _setup(tmp_path)
    code, out = _run_on_a_pty(tmp_path, env, ["-c", str(config), "write it"], {b"[y/N]": b"n\n"})
    assert code == 3, out
    assert not (tmp_path / "a.txt").exists()
    assert "x denied write_file" in out or "x denied file" in out, out
    assert "all 1 action it asked for were denied" in out


def test_without_a_terminal_the_unattended_policy_denies_and_says_how_to_approve(tmp_path: Path) -> None:
    config, env = _setup(tmp_path)
    done = _run(tmp_path, env, "-c", str(config), "write it")
    assert done.returncode == 3, done.stderr
    assert not (tmp_path / "a.txt").exists()
    assert "x denied" in done.stdout and "nobody to ask" in done.stdout
    assert done.stderr.count("--unattended-policy allow") == 1 and "--hitl" in done.stderr
    as_json = _run(tmp_path, env, "--json", "-c", str(config), "write it")
    result = json.loads(as_json.stdout)
    assert as_json.returncode == 3 and result["exitCode"] == 3
    assert result["deniedActions"] == 1 and result["approvedActions"] == 0 and result["allActionsDenied"] is True


def test_unattended_allow_and_permission_modes(tmp_path: Path) -> None:
    config, env = _setup(tmp_path)
    allowed = _run(tmp_path, env, "--unattended-policy", "allow", "-c", str(config), "write it")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert (tmp_path / "a.txt").read_text() == "hi" and "denied" not in allowed.stdout
    (tmp_path / "a.txt").unlink()
    unconfined = _run(tmp_path, env, "--permission-mode", "unconfined", "--json", "-c", str(config), "write it")
    assert unconfined.returncode == 0 and (tmp_path / "a.txt").exists()
    assert json.loads(unconfined.stdout)["deniedActions"] == 0
    (tmp_path / "a.txt").unlink()
    read_only = _run(tmp_path, env, "--permission-mode", "read_only", "--json", "-c", str(config), "write it")
    assert not (tmp_path / "a.txt").exists()
    assert json.loads(read_only.stdout)["deniedActions"] == 0   # refused by the mode, never asked
    assert "--unattended-policy" not in read_only.stderr


def test_exit_statuses_match_the_help(tmp_path: Path) -> None:
    config, env = _setup(tmp_path)
    help_text = subprocess.run([*roost_argv(), "run", "--help"], capture_output=True, text=True, check=False).stdout
    for line in ("0    the run completed", "1    it failed", "2    usage or set-up error",
                 "3    it completed, but every action", "130  interrupted"):
        assert line in help_text
    no_provider = dict(env)
    no_provider.pop("ROOST_PROVIDER")
    no_provider.pop("ROOST_SCRIPT")
    setup = _run(tmp_path, no_provider, "-c", str(config), "write it")
    assert setup.returncode == 2 and "Traceback" not in setup.stderr
    missing = _run(tmp_path, env, "-c", str(tmp_path / "nope.yaml"), "write it")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    usage = _run(tmp_path, env, "--bridge", "--unattended-policy", "allow", "-c", str(config), "x")
    assert usage.returncode == 2
