"""Idle unload: a quiet thread's actor stops, and the next use loads it again from the store."""

from __future__ import annotations

import trio

from roost.actors._messages import Origin, StartTurn, Subscribe
from roost.engines import ProviderSettings
from roost.model import Thread
from roost.protocol._engines import EngineCatalog
from roost.storage._rows import new_id, utc_now
from roost.supervisor._root import open_runtime
from roost.tools import builtin_tools
from _helpers.timing import scaled


class Sink:
    def deliver(self, line: bytes) -> None:
        pass


async def test_idle_threads_unload_and_reload(tmp_path, roost_home, monkeypatch):
    monkeypatch.setenv("ROOST_IDLE_UNLOAD_S", "0.05")
    engines = EngineCatalog(ProviderSettings(provider="scripted", script="demo", source="default"), pacing=False)
    async with open_runtime(engine_for=engines.engine_for, tools=builtin_tools()) as runtime:
        now = utc_now()
        quiet = Thread(id=new_id("thr"), cwd=str(tmp_path), provider="scripted", created_at=now, updated_at=now)
        watched = Thread(id=new_id("thr"), cwd=str(tmp_path), provider="scripted", created_at=now, updated_at=now)
        actor = await runtime.registry.create(quiet, ephemeral=False)
        other = await runtime.registry.create(watched, ephemeral=False)
        await other.ref.ask(Subscribe(Sink()))  # a subscribed thread is never unloaded
        turn = await actor.ref.ask(StartTurn(prompt="hello", origin=Origin()))
        await actor.wait_turn_end(turn["id"])
        with trio.fail_after(scaled(10)):
            while quiet.id in runtime.registry.actors:
                await trio.sleep(0.02)
        assert actor.state.value == "stopped"
        assert watched.id in runtime.registry.actors
        again = await runtime.registry.get(quiet.id)  # loaded from the store, history intact
        assert again is not actor and [i["type"] for i in again.items] == ["user_message", "agent_message"]
        assert "thread_unloader" in runtime.render_tree()
    await engines.aclose()
