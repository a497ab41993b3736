"""Compaction: a thread's model-facing history replaced by a model-written summary.

In-process: a runtime on the scripted engine (wrapped to capture every EngineRequest), a few
turns, ``Compact``, then the next turn's request and a reload from the store (a new runtime on the
same ROOST_HOME). End to end: the real ``roost repl --vscode`` process and ``/compact``.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
import trio
import yaml

from _helpers.appserver import script_env
from test_repl import open_repl

from roost.actors._compact import COMPACTION_PROMPT, COMPACTOR_AGENT, compact_thread
from roost.actors._messages import Compact, InterruptTurn, Origin, StartTurn
from roost.actors._views import SUMMARY_PREFIX, history_from_items
from roost.engines._scripted import ScriptedEngine, parse_script
from roost.engines._types import AgentMessage, UserMessage
from roost.errors import InvalidParams, ThreadBusy
from roost.model import Thread
from roost.storage._rows import new_id, utc_now
from roost.supervisor._root import open_runtime
from roost.tools import builtin_tools
from _helpers.timing import scaled

SCRIPT = """
rules:
  - match: {agent: compactor}
    steps:
      - - {text: "SUMMARY of {prompt}"}
  - match: {prompt: "^slow"}
    steps:
      - - {text: "a b c d e f g h i j k l m n o p q r s t u v w x y z", tokens_per_second: 5}
  - match: {prompt: "^fail"}
    steps:
      - - {error: {category: rate_limit, message: "slow down"}}
default: echo
"""


class CapturingEngine:
    """A scripted engine that records every request it is asked (``requests``, in order)."""

    def __init__(self, script: str) -> None:
        self.inner = ScriptedEngine(parse_script(yaml.safe_load(script)))
        self.requests: list = []

    def stream(self, request: Any) -> Any:
        self.requests.append(request)
        return self.inner.stream(request)

    async def aclose(self) -> None:
        pass


@asynccontextmanager
async def runtime_with(engine: CapturingEngine) -> AsyncIterator[Any]:
    async with open_runtime(engine_for=lambda thread: engine, tools=builtin_tools(), memory=False) as runtime:
        yield runtime


async def new_thread(runtime: Any, cwd: Path, *, ephemeral: bool = False) -> Any:
    now = utc_now()
    thread = Thread(id=new_id("thr"), kind="chat", cwd=str(cwd), provider="scripted", created_at=now, updated_at=now)
    return await runtime.registry.create(thread, ephemeral=ephemeral)


async def turn(actor: Any, prompt: str) -> dict:
    started = await actor.ref.ask(StartTurn(prompt=prompt, origin=Origin()))
    with trio.fail_after(scaled(10)):
        return await actor.wait_turn_end(started["id"])


def test_history_starts_at_the_latest_compaction() -> None:
    items = [
        {"id": "1", "type": "user_message", "text": "one", "status": "completed"},
        {"id": "2", "type": "agent_message", "text": "reply one", "status": "completed"},
        {"id": "3", "type": "compaction", "text": "first summary", "status": "completed"},
        {"id": "4", "type": "user_message", "text": "two", "status": "completed"},
        {"id": "5", "type": "compaction", "text": "second summary", "status": "completed"},
        {"id": "6", "type": "user_message", "text": "three", "status": "completed"},
        {"id": "7", "type": "agent_message", "text": "reply three", "status": "completed"},
    ]
    assert history_from_items(items) == [
        UserMessage(text=SUMMARY_PREFIX + "second summary", synthetic=True),
        UserMessage(text="three"), AgentMessage(text="reply three"),
    ]
    # a compaction that never completed does not count
    broken = items[:4] + [dict(items[4], status="failed")]
    assert history_from_items(broken)[0] == UserMessage(text=SUMMARY_PREFIX + "first summary", synthetic=True)


async def test_compaction_replaces_the_history_and_survives_a_reload(tmp_path: Path) -> None:
    engine = CapturingEngine(SCRIPT)
    async with runtime_with(engine) as runtime:
        actor = await new_thread(runtime, tmp_path)
        with pytest.raises(InvalidParams):  # an empty chat has nothing to compact
            await actor.ref.ask(Compact())
        for prompt in ("first question", "second question"):
            assert (await turn(actor, prompt))["status"] == "completed"
        events: list[dict] = []
        actor.hub.subscribe(_Sink(events))
        with trio.fail_after(scaled(10)):
            item = await compact_thread(actor, instructions="keep the questions")
        summary_request = engine.requests[-1]
        assert summary_request.agent == COMPACTOR_AGENT and summary_request.tools == ()
        assert summary_request.history[-1].text.startswith(COMPACTION_PROMPT)
        assert summary_request.history[-1].text.endswith("Additional instructions: keep the questions")
        assert [m.text for m in summary_request.history[:-1]] == [
            "first question", "first question", "second question", "second question"]
        assert item["type"] == "compaction" and item["status"] == "completed" and item["seq"]
        assert item["text"] == f"SUMMARY of {summary_request.history[-1].text}"
        assert item["instructions"] == "keep the questions"
        # the compaction was a turn of its own: started, its item, completed (no user message)
        methods = [e["method"] for e in events]
        assert methods[0] == "turn/started" and methods[-1] == "turn/completed"
        assert [e["params"]["item"]["type"] for e in events if e["method"] == "item/completed"] == ["compaction"]
        assert actor.turns[-1]["status"] == "completed"
        summary = UserMessage(text=SUMMARY_PREFIX + item["text"], synthetic=True)
        assert actor.history == [summary]
        # nothing new to compact now
        with pytest.raises(InvalidParams):
            await actor.ref.ask(Compact())
        # the next turn's model call starts with the summary, then the new prompt
        await turn(actor, "third question")
        assert list(engine.requests[-1].history) == [summary, UserMessage(text="third question")]
        live_history = list(actor.history)
        live_items = [i["id"] for i in actor.items]
        thread_id = actor.thread.id
        assert len(live_items) == 7  # the transcript keeps every item
    async with runtime_with(engine) as runtime:  # a new runtime on the same ROOST_HOME
        again = await runtime.registry.get(thread_id)
        assert again.history == live_history
        assert [i["id"] for i in again.items] == live_items
        await turn(again, "fourth question")
        assert engine.requests[-1].history[0] == summary


async def test_compaction_is_refused_while_a_turn_runs_and_can_be_interrupted(tmp_path: Path) -> None:
    engine = CapturingEngine(SCRIPT.replace('{text: "SUMMARY of {prompt}"}',
                                            '{text: "s u m m a r y", tokens_per_second: 2}'))
    async with runtime_with(engine) as runtime:
        actor = await new_thread(runtime, tmp_path)
        await turn(actor, "hello")
        started = await actor.ref.ask(StartTurn(prompt="slow reply", origin=Origin()))
        with pytest.raises(ThreadBusy):
            await actor.ref.ask(Compact())
        await actor.ref.ask(InterruptTurn())
        with trio.fail_after(scaled(10)):
            await actor.wait_turn_end(started["id"])
        before = list(actor.history)
        reply = await actor.ref.ask(Compact())
        assert reply["type"] == "compaction" and reply["status"] == "in_progress"
        with pytest.raises(ThreadBusy):  # the compaction is the running turn
            await actor.ref.ask(StartTurn(prompt="meanwhile", origin=Origin()))
        assert (await actor.ref.ask(InterruptTurn()))["interrupted"] is True
        with trio.fail_after(scaled(10)):
            ended = await actor.wait_turn_end(reply["turn_id"])
        assert ended["status"] == "interrupted"
        assert actor.history == before  # nothing half-written
        assert not any(i["type"] == "compaction" for i in actor.items)
        thread_id = actor.thread.id
    async with runtime_with(engine) as runtime:
        again = await runtime.registry.get(thread_id)
        assert not any(i["type"] == "compaction" for i in again.items)
        assert again.history == before


async def test_a_failed_summary_leaves_the_history_alone(tmp_path: Path) -> None:
    engine = CapturingEngine(SCRIPT.replace('{text: "SUMMARY of {prompt}"}',
                                            '{error: {category: provider, message: "boom"}}'))
    async with runtime_with(engine) as runtime:
        actor = await new_thread(runtime, tmp_path, ephemeral=True)
        await turn(actor, "hello")
        before = list(actor.history)
        reply = await actor.ref.ask(Compact())
        with trio.fail_after(scaled(10)):
            ended = await actor.wait_turn_end(reply["turn_id"])
        assert ended["status"] == "failed" and ended["error"]["message"] == "boom"
        assert actor.history == before
        await turn(actor, "still works")
        assert engine.requests[-1].history[-1] == UserMessage(text="still works")


class _Sink:
    def __init__(self, events: list[dict]) -> None:
        self.events = events

    def deliver(self, line: bytes) -> None:
        import json

        self.events.append(json.loads(line))


# -- end to end: roost repl --vscode -------------------------------------------------------------


@pytest.fixture
def env(tmp_path: Path, roost_home: Path) -> dict:
    return script_env(tmp_path, roost_home, SCRIPT)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


async def test_repl_compact(env: dict, work: Path) -> None:
    async with open_repl(env, work) as repl:
        await repl.wait("ready")
        # an empty chat has nothing to compact
        start = await repl.say("/compact")
        error = await repl.wait("error", start=start)
        assert "nothing to compact" in error["text"]
        assert "message_end" not in repl.types(start)
        for text in ("first", "second"):
            start = await repl.say(text)
            await repl.wait("message_end", start=start)
        start = await repl.say("/compact keep it short")
        end = await repl.wait("message_end", start=start)
        kinds = repl.types(start, end["_index"] + 1)
        assert kinds == ["compacted", "message_end"]
        assert end["toolCalls"] == [] and end["turnIndex"] == 2
        # another turn works, and the model saw the summary instead of the history
        start = await repl.say("third")
        end = await repl.wait("message_end", start=start)
        assert end["turnIndex"] == 3
        tokens = "".join(e["text"] for e in repl.events[start:end["_index"]] if e["type"] == "token")
        assert tokens == "third"
        # mid-reply, /compact is refused
        start = await repl.say("slow reply")
        await repl.wait("token", start=start)
        at = await repl.say("/compact")
        assert "while a reply is streaming" in (await repl.wait("error", start=at))["text"]
        await repl.send({"type": "interrupt"})
        await repl.wait("cancelled", start=start)
        # /help lists it
        start = await repl.say("/help")
        assert "/compact" in (await repl.wait("text", start=start))["text"]
        assert await repl.close() == 0
        session = repl.events[0]["sessionId"]
    async with open_repl(env, work, "--resume", session) as repl:
        replay = await repl.wait("replay")
        assert replay["compacted"] is True and replay["total"] == 5
        assert await repl.close() == 0


def test_translator_turns_a_compaction_turn_into_compacted_and_message_end(tmp_path: Path) -> None:
    from roost.protocol._repl_events import ChatTranslator

    t = ChatTranslator(cwd=tmp_path, turn_index=2)
    t.expect_compaction()
    assert t.busy
    assert t.translate("turn/started", {"turn": {"id": "turn_c"}}) == []  # no turn_start
    item = {"id": "item_c", "type": "compaction", "status": "completed", "text": "short"}
    assert t.translate("item/completed", {"item": item}) == [{"type": "compacted"}]
    end = t.translate("turn/completed", {"turn": {"id": "turn_c", "status": "completed",
                                                 "usage": {"input_tokens": 900, "output_tokens": 40}}})
    assert [e["type"] for e in end] == ["message_end"] and end[0]["turnIndex"] == 2
    assert end[0]["toolCalls"] == [] and not t.busy and t.turn_index == 3
    assert t.last_input_tokens == 40  # the context now holds about the summary
    # the next turn is an ordinary one again
    t.expect_turn()
    assert t.translate("turn/started", {"turn": {"id": "turn_d"}}) == [{"type": "turn_start", "text": ""}]
