"""Sans-IO parts of `roost repl --vscode`: the notification translator and the prompt broker."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from roost.protocol._repl_events import TOOL_OUTPUT_CHARS, ChatTranslator, replay_event, tool_summary
from roost.protocol._repl_prompts import PromptBroker, questions_enabled


def _turn(tid: str = "turn_1", status: str = "completed", **extra) -> dict:
    return {"turn": {"id": tid, "status": status, "usage": {"input_tokens": 10, "output_tokens": 4,
                                                            "cached_tokens": 3}, **extra}}


def test_a_turn_with_tools_and_file_writes(tmp_path: Path):
    t = ChatTranslator(cwd=tmp_path, turn_index=5)
    t.expect_turn()
    assert t.busy
    assert t.translate("turn/started", _turn()) == [{"type": "turn_start", "text": ""}]
    assert t.translate("item/reasoning/delta", {"delta": "hm"}) == [{"type": "thinking", "text": "hm"}]
    assert t.translate("item/agentMessage/delta", {"delta": "Hi"}) == [{"type": "token", "text": "Hi"}]
    assert t.translate("item/started", {"item": {"id": "i1", "type": "tool_call", "name": "shell"}}) == []
    assert t.translate("item/toolCall/delta", {"item_id": "i1", "delta": '{"command":'}) == []
    assert t.translate("item/toolCall/delta", {"item_id": "i1", "delta": '"ls\\n-la"}'}) == []
    # output streaming announces the call (once), with the arguments accumulated from deltas
    call = t.translate("item/toolCall/outputDelta", {"item_id": "i1", "delta": "x"})
    assert call == [{"type": "tool_call", "id": "i1", "name": "shell", "summary": "shell: ls -la",
                     "args": {"command": "ls\n-la"}}]
    assert t.translate("item/toolCall/outputDelta", {"item_id": "i1", "delta": "y"}) == []
    done = t.translate("item/completed", {"item": {"id": "i1", "type": "tool_call", "name": "shell",
                                                   "arguments": {"command": "ls\n-la"},
                                                   "output": "z" * (TOOL_OUTPUT_CHARS + 5), "is_error": False}})
    assert [e["type"] for e in done] == ["tool_result"]
    assert done[0]["ok"] is True and len(done[0]["output"]) == TOOL_OUTPUT_CHARS
    # write_file: created, then modified in the same turn stays an addition; another file modified
    for item_id, path, created in (("w1", "a.txt", True), ("w2", "a.txt", False), ("w3", "b.txt", False)):
        t.translate("item/started", {"item": {"id": item_id, "type": "tool_call", "name": "write_file"}})
        events = t.translate("item/completed", {"item": {
            "id": item_id, "type": "tool_call", "name": "write_file", "arguments": {"path": path, "content": "q"},
            "output": "ok", "metadata": {"path": str(tmp_path / path), "created": created, "added": 1,
                                         "removed": 0 if created else 1}}})
        assert [e["type"] for e in events] == ["tool_call", "tool_result", "file_changed"]
    assert events[-1] == {"type": "file_changed", "path": "b.txt", "sigil": "M", "added": 1, "removed": 1}
    end = t.translate("turn/completed", _turn())
    assert end == [
        {"type": "file_changes", "changes": [{"sigil": "A", "path": "a.txt"}, {"sigil": "M", "path": "b.txt"}]},
        {"type": "message_end", "turnIndex": 5, "toolCalls": ["shell", "write_file", "write_file", "write_file"],
         "inputTokens": 10, "outputTokens": 4, "cachedInputTokens": 3, "cumulativeCacheReadTokens": 3},
    ]
    assert not t.busy and t.turn_index == 6 and t.input_tokens == 10


def test_failed_interrupted_steered_and_carried(tmp_path: Path):
    t = ChatTranslator(cwd=tmp_path)
    t.expect_turn()
    t.translate("turn/started", _turn("t1"))
    assert t.translate("turn/error", _turn("t1", "failed", error={"category": "rate_limit", "message": "slow"})) \
        == [{"type": "error", "text": "rate_limit: slow"}]
    t.expect_turn(carried_text="later")
    assert t.translate("turn/started", _turn("t2")) == [{"type": "turn_start", "text": "later"}]
    assert t.translate("turn/steered", {"input": {"id": "in1"}}) == [
        {"type": "interjection", "status": "joined", "count": 1}]
    # a call that never got its result is still announced before the end
    t.translate("item/started", {"item": {"id": "c1", "type": "tool_call", "name": "list_dir"}})
    assert t.translate("turn/held", {"input": {"id": "in2", "prompt": "p"}}) == []
    assert t.translate("turn/completed", _turn("t2", "interrupted")) == [
        {"type": "tool_call", "id": "c1", "name": "list_dir", "summary": "list_dir"}, {"type": "cancelled"}]
    assert t.held == [{"id": "in2", "prompt": "p"}] and t.turn_index == 2
    # a terminal event of another turn is not this chat's
    t.expect_turn()
    t.translate("turn/started", _turn("t3"))
    assert t.translate("turn/completed", _turn("other")) == []
    assert t.busy


def test_tool_summary_and_replay():
    assert tool_summary("write_file", {"path": "a/b.py", "content": "x"}) == "write_file: a/b.py"
    assert tool_summary("x", {"n": 1}) == 'x: {"n":1}'
    long = tool_summary("shell", {"command": "echo " + "y" * 500})
    assert len(long) == 120 and long.endswith("…")
    assert tool_summary("noargs", None) == "noargs"
    snapshot = {"turns": [
        {"items": [{"type": "user_message", "text": "hi"}, {"type": "agent_message", "text": "a"},
                   {"type": "tool_call", "name": "shell"}, {"type": "user_message", "text": "steer"},
                   {"type": "agent_message", "text": "b"}]},
        {"items": [{"type": "user_message", "text": "worker", "source_id": "roost:agent_result"},
                   {"type": "compaction"}]},
    ]}
    assert replay_event(snapshot) == {"type": "replay", "total": 2, "compacted": True, "turns": [
        {"user": "hi", "assistant": "a\n\nb", "toolCalls": ["shell"]},
        {"user": "", "assistant": "", "toolCalls": []}]}
    assert replay_event(snapshot, limit=1)["turns"] == [{"user": "", "assistant": "", "toolCalls": []}]


def test_questions_enabled_accepts_both_spellings():
    assert questions_enabled({"FUSERAFT_VSCODE_QUESTIONS": "1"})
    assert questions_enabled({"ROOST_VSCODE_QUESTIONS": "1"})
    assert not questions_enabled({"FUSERAFT_VSCODE_QUESTIONS": "0"})
    assert not questions_enabled({})


async def test_broker_one_prompt_at_a_time_and_malformed_denies():
    sent: list[dict] = []
    announced: list = []
    broker = PromptBroker(sent.append, before_prompt=announced.append)
    results: dict = {}
    assert not broker.answer({"type": "approval_response", "approved": True})  # nothing pending
    async with trio.open_nursery() as nursery:
        async def approve(name: str, item: str) -> None:
            results[name] = await broker.request_approval(
                {"thread_id": "t", "turn_id": "u", "item_id": item, "kind": "shell_command", "command": name})

        nursery.start_soon(approve, "first", "i1")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(approve, "second", "i2")
        await trio.testing.wait_all_tasks_blocked()
        assert sent == [{"type": "approval_request", "kind": "shell_command", "command": "first"}]
        assert announced == ["i1"] and broker.pending_kind == "approval"
        assert not broker.answer({"type": "question_response", "answer": "x"})  # wrong kind
        assert broker.answer({"type": "approval_response", "approved": "yes"})   # malformed: denied
        await trio.testing.wait_all_tasks_blocked()
        assert len(sent) == 2 and sent[1]["command"] == "second"
        assert broker.answer({"type": "approval_response", "approved": True})
    assert results == {"first": False, "second": True}

    async with trio.open_nursery() as nursery:
        async def ask() -> None:
            results["q"] = await broker.ask_question("Why?", ["a"], True)

        nursery.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        assert sent[-1] == {"type": "question", "question": "Why?", "options": ["a"], "allowOther": True}
        broker.close()  # the chat ends: the pending prompt gets no answer
    assert results["q"] is None
    assert await broker.request_approval({"kind": "shell_command", "command": "x"}) is None


def test_assistant_replies_for_copy():
    from roost.protocol._repl_events import assistant_replies

    def turn(*items: dict) -> dict:
        return {"id": "t", "items": list(items)}

    snapshot = {"turns": [
        turn({"type": "user_message", "text": "hi"}, {"type": "agent_message", "text": "Hello."}),
        turn({"type": "user_message", "text": "go"}, {"type": "agent_message", "text": "Writing."},
             {"type": "tool_call", "name": "write_file"}, {"type": "agent_message", "text": "Done."}),
        turn({"type": "user_message", "text": "interrupted early"}),  # no reply: left out
        turn({"type": "user_message", "text": "x"}, {"type": "agent_message", "text": ""}),
    ]}
    assert assistant_replies(snapshot) == ["Hello.", "Writing.\n\nDone."]
    assert assistant_replies({"turns": []}) == []
    assert assistant_replies({}) == []
