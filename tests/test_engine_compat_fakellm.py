"""Compatibility suite: Roost against an OpenAI/Anthropic-compatible server someone else wrote.

The server is `fakellm` (PyPI, a test extra): a mock of the OpenAI Chat Completions and Anthropic
Messages HTTP APIs driven by rules, serving without model weights. It streams text word by word
and tool calls as fragments (one index per parallel call, arguments in pieces), and counts the
requests of a conversation (keyed by its first user message), so a rule can answer round N of a
tool loop, and only when the tool results it expects came back.

Through the real `roost exec` and `roost app-server`: streaming text, parallel tool calls and a
tool loop, on the `openai` and the `anthropic` providers. A rule that does not match falls back to
fakellm's echo, so a result paired with the wrong call (or lost) fails the final text check.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio
from _helpers.appserver import open_app_server, roost_argv
from _helpers.timing import scaled

pytest.importorskip("fakellm")

RULES = """
rules:
  - name: hello
    when: {messages_contain: "say hello"}
    respond: {content: "Hello from a server Roost did not write, one word at a time."}
  - name: parallel-reads
    when: {messages_contain: "read both files", turn: 1}
    respond:
      tool_calls:
        - {name: read_file, arguments: {path: "alpha.txt"}}
        - {name: read_file, arguments: {path: "beta.txt"}}
  - name: then-list
    when: {messages_contain: "read both files", turn: 2, tool_result_contains: "beta-content"}
    respond:
      tool_calls:
        - {name: list_dir, arguments: {path: "."}}
  - name: done
    when: {messages_contain: "read both files", turn: 3, tool_result_contains: "alpha.txt"}
    respond: {content: "Loop done: both files read and the directory listed."}
"""

FINAL = "Loop done: both files read and the directory listed."


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def fakellm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Run `fakellm serve` for this module; yield its base URL (without ``/v1``)."""
    root = tmp_path_factory.mktemp("fakellm")
    (root / "fakellm.yaml").write_text(RULES)
    port = _free_port()
    exe = Path(sys.executable).with_name("fakellm")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "fakellm.cli"]
    proc = subprocess.Popen([*argv, "serve", "--port", str(port), "--config", str(root / "fakellm.yaml")],
                            cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    started = threading.Event()
    log: list[str] = []

    def watch() -> None:  # uvicorn logs "Application startup complete." once it accepts requests
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line)
            if "startup complete" in line.lower():
                started.set()

    threading.Thread(target=watch, daemon=True).start()
    try:
        if not started.wait(60):
            raise RuntimeError("fakellm did not start: " + "".join(log))
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def workdir(tmp_path: Path, fakellm: str) -> Path:
    httpx.post(fakellm + "/_fakellm/reset").raise_for_status()  # turn counters start again
    (tmp_path / "alpha.txt").write_text("alpha-content\n")
    (tmp_path / "beta.txt").write_text("beta-content\n")
    return tmp_path


def _env(home: Path, provider: str, base_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
    env.update(ROOST_HOME=str(home), ROOST_PROVIDER=provider, ROOST_BASE_URL=base_url, ROOST_MODEL="fake-model",
               OPENAI_API_KEY="not-used", ANTHROPIC_API_KEY="not-used")
    return env


def _base(fakellm: str, provider: str) -> str:
    return fakellm + "/v1" if provider == "openai" else fakellm


async def _exec(env: dict, cwd: Path, prompt: str) -> list[dict]:
    with trio.fail_after(scaled(90)):
        done = await trio.run_process([*roost_argv(), "exec", "--json", prompt], env=env, cwd=str(cwd),
                                      capture_stdout=True, capture_stderr=True, check=False,
                                      stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr.decode()
    return [json.loads(line) for line in done.stdout.decode().splitlines()]


def _completed(lines: list[dict], kind: str) -> list[dict]:
    return [m["params"]["item"] for m in lines
            if m.get("method") == "item/completed" and m["params"]["item"]["type"] == kind]


def _check_tool_loop(lines: list[dict]) -> None:
    calls = _completed(lines, "tool_call")
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("read_file", {"path": "alpha.txt"}), ("read_file", {"path": "beta.txt"}), ("list_dir", {"path": "."})]
    assert len({c["call_id"] for c in calls}) == 3 and not any(c.get("is_error") for c in calls)
    assert "alpha-content" in calls[0]["output"] and "beta-content" in calls[1]["output"]
    assert _completed(lines, "agent_message")[-1]["text"] == FINAL


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_exec_streams_text(workdir: Path, fakellm: str, provider: str) -> None:
    lines = await _exec(_env(workdir / "home", provider, _base(fakellm, provider)), workdir, "say hello")
    deltas = [m["params"]["delta"] for m in lines if m.get("method") == "item/agentMessage/delta"]
    text = "Hello from a server Roost did not write, one word at a time."
    assert len(deltas) > 5 and "".join(deltas) == text
    assert _completed(lines, "agent_message")[-1]["text"] == text
    assert lines[-1]["method"] == "turn/completed"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_exec_parallel_tool_calls_and_a_tool_loop(workdir: Path, fakellm: str, provider: str) -> None:
    lines = await _exec(_env(workdir / "home", provider, _base(fakellm, provider)), workdir, "read both files")
    _check_tool_loop(lines)
    assert lines[-1]["method"] == "turn/completed"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_app_server_streaming_parallel_calls_and_tool_loop(workdir: Path, fakellm: str, provider: str) -> None:
    env = _env(workdir / "home", provider, _base(fakellm, provider))
    async with open_app_server(env=env, cwd=workdir) as client:
        await client.initialize()
        chat = (await client.request("thread/start", {"cwd": str(workdir)}))["thread"]
        start = len(client.lines)
        hello = await client.run_turn(chat["id"], "say hello")
        assert hello["turn"]["status"] == "completed", hello
        deltas = [m["params"]["delta"] for m in client.lines[start:] if m.get("method") == "item/agentMessage/delta"]
        assert len(deltas) > 5 and "".join(deltas) == "Hello from a server Roost did not write, one word at a time."
        # fakellm counts rounds per conversation (its first user message): the loop gets its own thread
        worker = (await client.request("thread/start", {"cwd": str(workdir)}))["thread"]
        start = len(client.lines)
        loop = await client.run_turn(worker["id"], "read both files")
        assert loop["turn"]["status"] == "completed", loop
        _check_tool_loop(client.lines[start:])
