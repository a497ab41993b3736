"""End-to-end: ``config/model/update`` and ``engine/list`` over the real ``roost app-server``
subprocess; plus the wire form of the error codes that no single stdio client can provoke
(checked in process, through the session's own dispatch)."""

from __future__ import annotations

import trio
import os
from pathlib import Path

import pytest

from _helpers.appserver import RemoteError, open_app_server, scripted_env, expect_error, script_env

SCRIPT = """
rules:
  - match: {prompt: "^gated"}
    steps:
      - - {tool_call: {name: write_file, arguments: {path: "gated.txt", content: "hello"}}}
      - - {text: "Wrote it."}
default: echo
"""

APPROVALS = {"reverse_rpc": {"methods": ["approval/request"]}}


@pytest.fixture
def env(tmp_path: Path, roost_home: Path) -> dict:
    return script_env(tmp_path, roost_home, SCRIPT)




async def test_thread_scope_selection(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize(capabilities=APPROVALS)
        thread = (await client.request("thread/start", {"cwd": str(tmp_path), "model": "m-1", "effort": "high",
                                                        "model_options": {"speed": "fast"}}))["thread"]
        tid = thread["id"]
        other = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]
        start = len(client.lines)
        reply = await client.request("config/model/update", {"thread_id": tid, "permission_mode": "read_only"})
        assert reply["thread"]["permission_mode"] == "read_only"
        assert reply["thread"]["model"] == "m-1" and reply["thread"]["effort"] == "high"  # omitted fields inherit
        assert reply["model"]["provider"] == "scripted"  # the workspace summary, unchanged
        updated = await client.wait_for("thread/updated", lambda p: p["thread"]["id"] == tid, start=start)
        assert updated["thread"]["permission_mode"] == "read_only"
        # the selection is re-resolved at execution: the next turn runs read_only (no approval asked)
        client.approval_handler = lambda params: True
        done = (await client.run_turn(tid, "gated write"))["turn"]
        tool = next(i for i in done["items"] if i["type"] == "tool_call")
        assert tool["metadata"]["denied"] == "read_only" and not (tmp_path / "gated.txt").exists()
        assert not [m for m in client.lines if m.get("method") == "approval/request"]
        # changing the model clears the dependent effort and options; model_options {} clears
        changed = (await client.request("config/model/update", {"thread_id": tid, "model": "m-2"}))["thread"]
        assert (changed["model"], changed["effort"], changed["model_options"]) == ("m-2", None, {})
        changed = (await client.request("config/model/update", {"thread_id": tid, "effort": "low",
                                                                "model_options": {"a": "b"}}))["thread"]
        assert (changed["effort"], changed["model_options"]) == ("low", {"a": "b"})
        changed = (await client.request("config/model/update", {"thread_id": tid, "model_options": {}}))["thread"]
        assert changed["model_options"] == {} and changed["effort"] == "low"
        reset = (await client.request("config/model/update", {"thread_id": tid, "reset_model": True}))["thread"]
        assert reset["model"] is None and reset["effort"] is None
        # other conversations are untouched
        snap = await client.request("thread/resume", {"session_id": other["id"], "response_only": True})
        assert snap["thread"]["permission_mode"] == "standard"
        # failure paths
        await expect_error(client, "config/model/update", {"thread_id": tid}, "invalid_params", contains="nothing")
        await expect_error(client, "config/model/update", {"thread_id": tid, "permission_mode": "god"},
                           "invalid_params")
        await expect_error(client, "config/model/update", {"thread_id": tid, "provider": "nope"}, "invalid_params")
        await expect_error(client, "config/model/update", {"thread_id": tid, "model": "x", "api_key": "sk-1"},
                           "invalid_params", contains="workspace")
        await expect_error(client, "config/model/update", {"thread_id": tid, "variant": "max"}, "unsupported")
        await expect_error(client, "config/model/update", {"thread_id": "thr_nope", "model": "x"}, "thread_not_found")
        await expect_error(client, "config/model/update", {"thread_id": tid, "model": "x", "speed": 1},
                           "invalid_params", contains="speed")
        # thread_busy while the conversation executes
        await client.request("config/model/update", {"thread_id": tid, "permission_mode": "standard"})
        client.approval_handler = lambda params: None
        start = len(client.lines)
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "gated write"}))["turn"]
        request = await client.wait_line(lambda m: m.get("method") == "approval/request", start=start)
        await expect_error(client, "config/model/update", {"thread_id": tid, "model": "m-3"}, "thread_busy")
        await client.send({"id": request["id"], "result": {"approved": True}})
        await client.wait_terminal(turn["id"], start=start)
        assert (tmp_path / "gated.txt").read_text() == "hello"
        changed = (await client.request("config/model/update", {"thread_id": tid, "model": "m-3"}))["thread"]
        assert changed["model"] == "m-3"
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": tid})
        assert (snap["thread"]["model"], snap["thread"]["permission_mode"]) == ("m-3", "standard")


async def test_workspace_scope_defaults(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        before = (await client.request("thread/start", {}))["thread"]
        await expect_error(client, "config/model/update", {"effort": "high"}, "invalid_params", contains="model")
        await expect_error(client, "config/model/update", {"model": "x", "base_url": "http://x", "api_key": "k"},
                           "unsupported")
        await expect_error(client, "config/model/update", {"model": "x", "reset_model": True}, "invalid_params")
        await expect_error(client, "config/model/update", {"model": "x", "provider": "anthropic"}, "invalid_params",
                           contains="API key")
        reply = await client.request("config/model/update", {"model": "ws-model", "permission_mode": "read_only",
                                                             "effort": "medium"})
        assert reply["model"]["model"] == "ws-model" and reply["model"]["provider"] == "scripted"
        assert reply["defaults"] == {"permission_mode": "read_only", "effort": "medium"}
        after = (await client.request("thread/start", {}))["thread"]
        assert (after["model"], after["permission_mode"], after["effort"]) == ("ws-model", "read_only", "medium")
        explicit = (await client.request("thread/start", {"permission_mode": "unconfined"}))["thread"]
        assert explicit["permission_mode"] == "unconfined"
        # existing conversations keep their saved selections
        snap = await client.request("thread/resume", {"session_id": before["id"], "response_only": True})
        assert snap["thread"]["model"] is None and snap["thread"]["permission_mode"] == "standard"
        assert (await client.request("initialize", {}))["model"]["model"] == "ws-model"
        assert (await client.run_turn(after["id"], "on the new default"))["turn"]["status"] == "completed"


async def test_engine_list(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        listed = await client.request("engine/list", {"cwd": str(tmp_path)})
        engines = {e["id"]: e for e in listed["engines"]}
        builtin = engines["roost"]
        assert builtin["enabled"] is True and builtin["binary_ok"] is True
        assert builtin["models_status"] == "ready" and any(m["current"] for m in builtin["models"])
        assert {r["id"]: r["label"] for r in builtin["permission_modes"]} == {
            "standard": "Standard", "read_only": "Read only", "unconfined": "Unconfined"}
        providers = {p["id"]: p for p in builtin["providers"]}
        assert providers["scripted"]["default"] is True and providers["scripted"]["available"] is True
        assert set(providers) == {"scripted", "openai", "openai-responses", "anthropic"}
        assert all("api_key" not in p for p in builtin["providers"])
        for name in ("codex", "claude", "opencode", "acp"):
            assert engines[name]["enabled"] is False and engines[name]["models_status"] == "unsupported"
            assert "unsupported" in engines[name]["error"]
        assert listed["settings"]["default_engine"] == "roost"
        deferred = await client.request("engine/list", {"include_models": False})
        assert all(e["models_status"] == "deferred" and "models" not in e for e in deferred["engines"])
        await expect_error(client, "engine/list", {"include_quota": True}, "unsupported")
        await expect_error(client, "engine/list", {"refresh": True}, "invalid_params")
        await expect_error(client, "thread/start", {"engine": "claude"}, "unsupported")


async def test_needs_setup_then_configured_over_the_protocol(tmp_path, roost_home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_PROVIDER")}
    env["ROOST_HOME"] = str(roost_home)
    async with open_app_server(env=env, cwd=tmp_path) as client:
        init = await client.initialize()
        assert init["status"] == "needs_setup" and init["issues"]
        listed = await client.request("engine/list")
        assert listed["engines"][0]["enabled"] is False and listed["engines"][0]["models_status"] == "error"
        await expect_error(client, "config/model/update", {"model": "demo"}, "invalid_params", contains="provider")
        reply = await client.request("config/model/update", {"provider": "scripted", "model": "demo"})
        assert reply["model"]["provider"] == "scripted"
        assert (await client.request("initialize", {}))["status"] == "ready"
        thread = (await client.request("thread/start", {}))["thread"]
        assert thread["provider"] == "scripted"
        assert (await client.run_turn(thread["id"], "now it works"))["turn"]["status"] == "completed"


# -- the wire form of every error code (in process) ---------------------------------------------


async def test_every_error_code_on_the_wire(monkeypatch):
    from roost import errors
    from roost._json import loads
    from roost.protocol import _serve_appserver  # noqa: F401  (registers the methods)
    from roost.protocol._appserver import METHODS, AppServerSession
    from roost.protocol._engines import EngineCatalog
    from roost.protocol._framing import FrameError

    raised = {
        "t/overloaded": (errors.MailboxFull("thread mailbox is full"), "server_overloaded"),
        "t/store-full": (errors.StoreFull("writer queue is full"), "server_overloaded"),
        "t/bug": (ValueError("boom"), "internal_error"),
        "t/run": (errors.RunNotFound("no run run_1"), "run_not_found"),
        "t/attached": (errors.RunNotAttached("run_1 belongs to another app-server"), "run_not_attached"),
        "t/stale": (errors.StaleTurn("turn_1 is not current"), "stale_turn"),
        "t/read-only": (errors.ReadOnly("archived"), "read_only"),
        "t/missing-row": (errors.NotFound("no threads row", kind="threads"), "thread_not_found"),
        "t/missing-other": (errors.NotFound("no such memory"), "not_found"),
        "t/config": (errors.ConfigError("bad config"), "invalid_params"),
    }
    for name, (exc, _code) in raised.items():
        async def handler(session, params, exc=exc):
            raise exc
        monkeypatch.setitem(METHODS, name, handler)
    session = AppServerSession(runtime=None, engines=EngineCatalog(None, setup_error="not configured"))
    frames = [FrameError("line exceeds 10 bytes", oversized=True), [1], {"id": 1.5, "method": "x"},
              {"id": "m", "method": "no/such"}, {"id": "p", "method": "thread/list", "params": [1]}]
    frames += [{"id": name, "method": name} for name in raised]
    for frame in frames:
        await session._on_frame(frame)
    session.outbox.close()

    class Capture(trio.abc.SendStream):
        def __init__(self) -> None:
            self.data = b""

        async def send_all(self, data) -> None:
            self.data += bytes(data)

        async def wait_send_all_might_not_block(self) -> None:
            pass

        async def aclose(self) -> None:
            pass

    sink = Capture()
    await session.outbox.run_writer(sink)   # drains what is queued and returns (closed)
    lines = [loads(line) for line in sink.data.splitlines()]
    codes = [line["error"]["code"] for line in lines]
    assert codes == ["parse_error", "invalid_request", "invalid_request", "method_not_found", "invalid_params",
                     *[code for _exc, code in raised.values()]]
    assert all(set(line["error"]) == {"code", "message"} and line["error"]["message"] for line in lines)
    assert [line["id"] for line in lines[5:]] == list(raised)
    # every wire code is covered: here, or end to end (thread_busy, turn_not_found, unsupported)
    assert {c.code for c in errors.PROTOCOL_ERRORS.values()} <= set(codes) | {"thread_busy", "turn_not_found",
                                                                              "unsupported"}


async def test_model_catalog_directory(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        init = await client.initialize()
        directory = init["catalog_providers"]
        names = [p["name"] for p in directory]
        assert names == sorted(names, key=str.lower) and len(directory) >= 5
        assert all(p["type"] == "openai" and p["base_url"].startswith("http") and p["model_count"] >= 1
                   and "models" not in p for p in directory)
        listed = (await client.request("config/model-catalog/providers", {}))["providers"]
        assert listed == directory
        (deepseek,) = (await client.request("config/model-catalog/providers", {"provider": "deepseek"}))["providers"]
        assert deepseek["base_url"] == "https://api.deepseek.com" and deepseek["default_model"] == "deepseek-chat"
        assert [m["id"] for m in deepseek["models"]][0] == deepseek["default_model"]
        assert len(deepseek["models"]) == deepseek["model_count"]
        await expect_error(client, "config/model-catalog/providers", {"provider": "nope"}, "invalid_params",
                           contains="deepseek")
        refreshed = await client.request("config/model-catalog/refresh", {})
        assert refreshed["catalog_providers"] == directory
        assert refreshed["counts"]["catalog_providers"] == len(directory)
        assert refreshed["counts"]["providers"] == len(refreshed["providers"]) >= 1
        assert refreshed["providers"][0]["id"] == "scripted" and refreshed["providers"][0]["default"] is True
