"""End-to-end: approvals over the real ``roost app-server`` subprocess.

In ``standard`` permission mode a mutating tool (shell, write_file) sends a server-initiated
``approval/request`` only if the client listed it in ``initialize.params.capabilities.reverse_rpc
.methods``; the client answers ``{id, result: {approved: bool}}``. Without the capability the tool is
denied and its result tells the model why.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from _helpers.appserver import open_app_server, scripted_env, script_env
from _helpers.timing import scaled

SCRIPT = """
rules:
  - match: {prompt: "^shell"}
    steps:
      - - {text: "Running."}
        - {tool_call: {name: shell, arguments: {command: "echo approved-$((40 + 2))"}}}
      - - {text: "Shell step done."}
  - match: {prompt: "^write"}
    steps:
      - - {tool_call: {name: write_file, arguments: {path: "notes.txt", content: "new text\\n"}}}
      - - {text: "Write step done."}
default: echo
"""

APPROVALS = {"reverse_rpc": {"methods": ["approval/request"]}}


@pytest.fixture
def env(tmp_path: Path, roost_home: Path) -> dict:
    return script_env(tmp_path, roost_home, SCRIPT)


def approval_requests(client) -> list[dict]:
    return [m for m in client.lines if m.get("method") == "approval/request"]


def tool_item(turn: dict) -> dict:
    return next(i for i in turn["items"] if i["type"] == "tool_call")


async def test_shell_command_approved_and_denied(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize(capabilities=APPROVALS)
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        asked: list[dict] = []
        client.approval_handler = lambda params: asked.append(params) or True
        done = (await client.run_turn(tid, "shell please"))["turn"]
        assert done["status"] == "completed"
        [params] = asked
        tool = tool_item(done)
        assert params["kind"] == "shell_command" and params["command"] == "echo approved-$((40 + 2))"
        assert (params["thread_id"], params["turn_id"], params["item_id"]) == (tid, done["id"], tool["id"])
        assert tool["status"] == "completed" and "approved-42" in tool["output"]
        assert done["items"][-1]["text"] == "Shell step done."
        # the request is a server-initiated request with an id of its own
        [line] = approval_requests(client)
        assert isinstance(line["id"], str) and line["id"]
        client.approval_handler = lambda params: False
        denied = (await client.run_turn(tid, "shell again"))["turn"]
        tool = tool_item(denied)
        assert tool["status"] == "failed" and tool["is_error"] is True
        assert "did not approve" in tool["output"] and "approved-42" not in tool["output"]
        assert tool["metadata"]["denied"] == "user"
        assert denied["status"] == "completed" and denied["items"][-1]["text"] == "Shell step done."


async def test_a_repeated_initialize_keeps_the_capabilities_it_does_not_name(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize(capabilities=APPROVALS)
        again = await client.request("initialize", {"protocol_version": "wuu-app-server/v0.1"})
        assert again["protocol_version"] == "wuu-app-server/v0.1"
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        asked: list[dict] = []
        client.approval_handler = lambda params: asked.append(params) or True
        done = (await client.run_turn(tid, "shell please"))["turn"]
        assert [p["kind"] for p in asked] == ["shell_command"] and "approved-42" in tool_item(done)["output"]
        # naming capabilities again replaces them: without approval/request the tool is denied
        await client.request("initialize", {"capabilities": {}})
        denied = (await client.run_turn(tid, "shell again"))["turn"]
        assert len(asked) == 1 and tool_item(denied)["is_error"] is True


async def test_file_write_fields_and_malformed_answers(env, tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("old text\n")
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize(capabilities=APPROVALS)
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        client.approval_handler = lambda params: None  # answered by hand below
        start = len(client.lines)
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "write it"}))["turn"]
        request = await client.wait_line(lambda m: m.get("method") == "approval/request", start=start)
        params = request["params"]
        assert params["kind"] == "file_write"
        assert params["path"] == str(target) and params["oldContent"] == "old text\n"
        assert params["newContent"] == "new text\n" and params["action"] == "write_file" and params["plugin"]
        # an answer that is not {approved: true} counts as denied
        await client.send({"id": request["id"], "result": {"approved": "yes"}})
        done = (await client.wait_terminal(turn["id"], start=start))["turn"]
        assert tool_item(done)["metadata"]["denied"] == "user" and target.read_text() == "old text\n"
        # an error reply is a denial too; an answer to an unknown id is ignored
        start = len(client.lines)
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "write it"}))["turn"]
        request = await client.wait_line(lambda m: m.get("method") == "approval/request", start=start)
        await client.send({"id": "roost-unknown", "result": {"approved": True}})
        await client.send({"id": request["id"], "error": {"code": "internal_error", "message": "ui crashed"}})
        done = (await client.wait_terminal(turn["id"], start=start))["turn"]
        assert tool_item(done)["status"] == "failed" and target.read_text() == "old text\n"
        # approved: written
        client.approval_handler = lambda params: True
        done = (await client.run_turn(tid, "write it"))["turn"]
        assert tool_item(done)["status"] == "completed" and target.read_text() == "new text\n"
        assert tool_item(done)["metadata"]["diff"]


async def test_without_the_capability_the_tool_is_denied(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize(capabilities={"reverse_rpc": {"methods": ["browser/cdp"]}})
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        client.approval_handler = lambda params: True  # would approve, but must never be asked
        done = (await client.run_turn(tid, "shell please"))["turn"]
        tool = tool_item(done)
        assert tool["status"] == "failed" and "denied" in tool["output"].lower()
        assert tool["metadata"]["denied"] == "unattended_policy"
        # the client is attached: the text says it did not opt in, and how to
        assert "does not accept approval requests" in tool["output"], tool["output"]
        assert '"approval/request" in initialize capabilities.reverse_rpc.methods' in tool["output"]
        assert "attached" not in tool["output"]
        assert approval_requests(client) == []
        assert done["status"] == "completed"
        # read_only refuses without asking; unconfined runs without asking
        ro = (await client.request("thread/start", {"cwd": str(tmp_path), "permission_mode": "read_only"}))["thread"]
        tool = tool_item((await client.run_turn(ro["id"], "write it"))["turn"])
        assert tool["metadata"]["denied"] == "read_only" and not (tmp_path / "notes.txt").exists()
        free = (await client.request("thread/start", {"cwd": str(tmp_path), "permission_mode": "unconfined"}))["thread"]
        tool = tool_item((await client.run_turn(free["id"], "shell please"))["turn"])
        assert tool["status"] == "completed" and "approved-42" in tool["output"]
        assert approval_requests(client) == []


async def test_closing_stdin_mid_approval_interrupts_and_persists(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize(capabilities=APPROVALS)
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        client.approval_handler = lambda params: None
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "write it"}))["turn"]
        await client.wait_line(lambda m: m.get("method") == "approval/request")
        await client.close_stdin()
        done = (await client.wait_terminal(turn["id"]))["turn"]
        assert done["status"] == "interrupted"
        assert tool_item(done)["status"] == "interrupted"
        with trio.fail_after(scaled(20)):
            assert await client.process.wait() == 0
    assert not (tmp_path / "notes.txt").exists()
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": tid})
        stored = snap["turns"][0]
        assert stored["status"] == "interrupted"
        assert [i["type"] for i in stored["items"]] == ["user_message", "tool_call"]
        assert stored["items"][1]["status"] == "interrupted"
        # the next turn's history gives the interrupted call a result; the thread goes on
        client.approval_handler = lambda params: True
        assert (await client.run_turn(tid, "hello again"))["turn"]["status"] == "completed"


async def test_tool_action_kind_for_other_mutating_tools(tmp_path, roost_home):
    """``tool_action`` (plugin, action, detail) is what a mutating tool without its own kind asks.

    No built-in tool uses this kind, so this test serves the real app-server session in process,
    over an in-memory stream, with one extra mutating tool.
    """
    import json

    import trio.testing

    from roost.engines import ProviderSettings
    from roost.protocol._engines import EngineCatalog
    from roost.protocol._serve_appserver import serve_app_server
    from roost.tools import Tool, ToolResult, builtin_tools

    script = tmp_path / "script.yaml"
    script.write_text("""
rules:
  - match: {prompt: "^deploy"}
    steps:
      - - {tool_call: {name: deploy, arguments: {target: "staging", force: true}}}
      - - {text: "Deployed."}
default: echo
""")
    ran: list[dict] = []

    async def deploy(args, ctx):
        ran.append(args)
        return ToolResult(output=f"deployed to {args['target']}")

    tools = builtin_tools()
    tools["deploy"] = Tool(name="deploy", description="Deploy the app.", mutating=True, run=deploy,
                           parameters={"type": "object", "properties": {"target": {"type": "string"},
                                                                        "force": {"type": "boolean"}},
                                       "required": ["target"]})
    engines = EngineCatalog(ProviderSettings(provider="scripted", script=str(script)), pacing=False)
    client, server = trio.testing.memory_stream_pair()
    lines: list[dict] = []
    buffer = b""

    async def next_line(predicate):
        nonlocal buffer
        while True:
            for line in lines:
                if predicate(line):
                    lines.remove(line)
                    return line
            data = await client.receive_some(65536)
            assert data, "server closed its output"
            buffer += data
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                lines.append(json.loads(raw))

    async def send(obj):
        await client.send_all(json.dumps(obj).encode() + b"\n")

    with trio.fail_after(scaled(20)):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve_app_server(server, server, engines=engines, tools=tools,
                                                        db_path=tmp_path / "roost.db"))
            await send({"id": 1, "method": "initialize", "params": {"capabilities": APPROVALS}})
            await next_line(lambda m: m.get("id") == 1)
            await send({"id": 2, "method": "thread/start", "params": {"cwd": str(tmp_path)}})
            tid = (await next_line(lambda m: m.get("id") == 2))["result"]["thread"]["id"]
            await send({"id": 3, "method": "turn/start", "params": {"thread_id": tid, "prompt": "deploy it"}})
            request = await next_line(lambda m: m.get("method") == "approval/request")
            params = request["params"]
            assert params["kind"] == "tool_action" and params["action"] == "deploy" and params["plugin"]
            assert json.loads(params["detail"]) == {"target": "staging", "force": True}
            assert ran == []
            await send({"id": request["id"], "result": {"approved": True}})
            done = await next_line(lambda m: m.get("method") == "turn/completed")
            tool = next(i for i in done["params"]["turn"]["items"] if i["type"] == "tool_call")
            assert tool["output"] == "deployed to staging" and ran == [{"target": "staging", "force": True}]
            await client.send_stream.aclose()  # end of input: the server shuts down


async def test_a_late_answer_to_an_approval_is_logged_at_debug_level(env, tmp_path):
    """A second answer to an approval/request that was already answered gets no reply and does not
    change the decision; with -v stderr names its id (debug level: a late answer is no client bug)."""
    log_file = tmp_path / "stderr.log"
    with log_file.open("wb") as stderr:
        async with open_app_server(env=env, cwd=tmp_path, args=("-v",), stderr=stderr) as client:
            await client.initialize(capabilities=APPROVALS)
            tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
            client.approval_handler = lambda params: True
            done = (await client.run_turn(tid, "shell please"))["turn"]
            [line] = approval_requests(client)
            await client.send({"id": line["id"], "result": {"approved": False}})
            assert (await client.request("thread/list", {})) is not None
    assert done["status"] == "completed" and "approved-42" in tool_item(done)["output"]
    logged = log_file.read_text()
    assert f"server request {line['id']!r}: it is no longer pending" in logged, logged
    assert "no such request was sent" not in logged


async def test_a_forwarded_input_carries_why_its_client_cannot_be_asked():
    """Input forwarded to the node executing the thread (``thread.input`` on the bus) carries the
    origin's ``no_approver``, so a denial there says what is true of the asking client."""
    from roost.actors import Origin
    from roost.actors._remote import ThreadRemote

    class Bus:
        node_id = "node-a"
        sent: dict = {}

        def __init__(self):
            self.handlers = {}

        def on(self, kind, handler, inline=False):
            self.handlers[kind] = handler

        async def request(self, node, kind, body):
            self.sent = body
            return {}

    class Session:
        client_name = "ui"

        def __init__(self, origin):
            self._origin = origin

        def origin(self):
            return self._origin

    bus = Bus()
    remote = ThreadRemote(bus, None, None)
    await remote.forward("node-b", "queue", "thr_1", {"prompt": "x"}, session=Session(Origin(no_approver="why")))
    origin = remote._origin(bus.sent["origin"])
    assert origin.request_approval is None and origin.no_approver == "why" and origin.client_id == "ui"
    # an origin that can be asked is asked; nothing to explain
    await remote.forward("node-b", "queue", "thr_1", {"prompt": "x"},
                         session=Session(Origin(request_approval=lambda params: None)))
    origin = remote._origin(bus.sent["origin"])
    assert origin.request_approval is not None and origin.no_approver is None
