"""Unit tests of the serve daemon's pure parts: event translation, tokens, client ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from roost.errors import ConfigError
from roost.protocol._serve_auth import ServeAuth, bearer_token, parse_client_id
from roost.protocol._serve_events import TaskEventTranslator, approval_event, args_summary, result_event


def test_translation_of_a_turn() -> None:
    t = TaskEventTranslator("s1", "assistant", warn_threshold=100)
    assert t.translate("turn/started", {"turn": {"id": "t"}}) == [
        {"type": "agent_starting", "agent": "assistant", "sessionId": "s1"}]
    assert t.translate("item/agentMessage/delta", {"delta": "hi"}) == [
        {"type": "token", "sessionId": "s1", "agent": "assistant", "text": "hi"}]
    assert t.translate("item/started", {"item": {"id": "i1", "type": "tool_call", "name": "shell"}}) == []
    assert t.translate("item/toolCall/delta", {"item_id": "i1", "delta": '{"command": "ls -la"}'}) == []
    [calling] = t.translate("item/toolCall/outputDelta", {"item_id": "i1", "delta": "x"})
    assert calling == {"type": "tool_calling", "agent": "assistant", "tool": "shell", "argsSummary": "ls -la",
                       "sessionId": "s1"}
    # announced once only, also when it completes
    assert t.translate("item/completed", {"item": {"id": "i1", "type": "tool_call", "name": "shell"}}) == []
    assert t.translate("turn/usage", {"usage": {"input_tokens": 99}}) == []
    [warning] = t.translate("turn/usage", {"usage": {"input_tokens": 150}})
    assert warning["type"] == "token_budget_warning" and warning["warnThreshold"] == 100
    assert t.translate("turn/usage", {"usage": {"input_tokens": 300}}) == []
    assert t.translate("item/reasoning/delta", {"delta": "hmm"}) == []


def test_args_summary_and_events() -> None:
    assert args_summary({"path": "a.txt", "limit": 5}) == '{"path":"a.txt","limit":5}'
    assert len(args_summary({"command": "x" * 500})) == 120
    assert args_summary(None) == ""
    event = approval_event("s", {"thread_id": "t", "turn_id": "u", "item_id": "i", "kind": "shell_command",
                                 "command": "rm -rf x"})
    assert event == {"type": "approval_request", "kind": "shell_command", "command": "rm -rf x", "sessionId": "s"}
    result = result_event(session_id="s", task="t", succeeded=False, error_message=None, last_agent=None,
                          last_message=None)
    assert set(result) == {"type", "sessionId", "task", "succeeded", "errorMessage", "lastAgent", "lastMessage"}


def test_tokens(tmp_path: Path) -> None:
    assert ServeAuth.load(environ={}).check(None) is not None          # no token configured: open
    file = tmp_path / "tokens"
    file.write_text("# comment\n\nfull aaa\nread bbb\nfull ccc\n")
    auth = ServeAuth.load(tokens_file=file, environ={"ROOST_SERVE_TOKEN": "ddd"})
    assert auth.check(None) is None and auth.check("zzz") is None
    assert not auth.check("aaa").read_only and not auth.check("ccc").read_only and not auth.check("ddd").read_only
    assert auth.check("bbb").read_only
    assert auth.check("aaa").scope != auth.check("ccc").scope
    refused = {
        "admin eee\n": "expected 'full <token>'",
        "ccc\n": "expected 'full <token>'",  # a bare word: a token, or a role without its token?
        "read\n": "a role needs its token",
        "full\n": "a role needs its token",
        "full t1\nread t1\n": "both a full and a read token",
        "": "names no token",
        "# only a comment\n\n": "names no token",
    }
    for text, message in refused.items():
        file.write_text(text)
        with pytest.raises(ConfigError, match=message):
            ServeAuth.load(tokens_file=file, environ={})
    file.write_text("read ddd\n")  # the environment's full token listed as a read one
    with pytest.raises(ConfigError, match="both a full and a read token"):
        ServeAuth.load(tokens_file=file, environ={"ROOST_SERVE_TOKEN": "ddd"})
    assert ServeAuth.load(environ={"FUSERAFT_SERVE_TOKEN": "x"}).check("x") is not None


def test_headers() -> None:
    assert bearer_token("Bearer abc") == "abc" and bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None and bearer_token(None) is None and bearer_token("Bearer ") is None
    assert parse_client_id(None) is None and parse_client_id("a-B_9") == "a-B_9"
    for bad in ("", "a b", "x" * 65, "é"):
        with pytest.raises(ValueError):
            parse_client_id(bad)


def test_announce_never_sends_a_nameless_tool_call() -> None:
    t = TaskEventTranslator("s1", "Planner", orchestrated=True)
    # a route approval has no tool call (no item id): nothing to announce
    assert t.announce(None) == []
    # an item whose name is not known yet stays unannounced until a notification names it
    assert t.announce("i1") == []
    assert t.translate("item/toolCall/delta", {"item_id": "i1", "delta": '{"path": "."}'}) == []
    assert t.translate("item/completed", {"item": {"id": "i1", "type": "tool_call", "name": "list_dir"}}) == [
        {"type": "tool_calling", "agent": "Planner", "tool": "list_dir", "argsSummary": ".", "sessionId": "s1"}]
    assert t.translate("item/started", {"item": {"id": "i2", "type": "tool_call", "name": "shell"}}) == []
    assert [e["tool"] for e in t.announce("i2")] == ["shell"]
    assert t.announce("i2") == []


def test_a_headless_worker_and_a_daemon_without_clients_render_nothing(monkeypatch) -> None:
    """A worker of ``roost serve --workers`` has no clients (the front door renders what it
    relays): it translates no notification; with no client attached an event is not encoded."""
    import types

    import roost.protocol._serve_daemon as serve_daemon
    from roost.protocol._serve_daemon import ServeDaemon

    def unused(*_args):
        raise AssertionError("rendered for nobody")

    monkeypatch.setattr(serve_daemon, "dumps_line", unused)
    daemon = types.SimpleNamespace(
        options=types.SimpleNamespace(headless=True, stamp_events=False),
        metrics=None,
        connections=set(),
        events_broadcast=0,
        _translator=unused,
    )
    task = types.SimpleNamespace(id="task_1")
    ServeDaemon.task_notification(daemon, task, "item/agentMessage/delta", {"item_id": "i", "delta": "tok "})
    ServeDaemon.broadcast(daemon, {"type": "token", "sessionId": "task_1", "text": "tok "})
    assert daemon.events_broadcast == 0

    sent: list[str] = []
    daemon.connections = [types.SimpleNamespace(send_line=sent.append)]
    monkeypatch.setattr(serve_daemon, "dumps_line", lambda event: f"{event['type']}\n")
    ServeDaemon.broadcast(daemon, {"type": "token", "sessionId": "task_1", "text": "tok "})
    assert sent == ["token\n"] and daemon.events_broadcast == 1
