"""``user_input.images`` on ``roost repl --vscode`` (and app-server ``turn/start`` images) reach the
providers in their documented request formats, end to end through the real commands against local
HTTP servers: OpenAI Chat ``image_url`` content parts, OpenAI Responses ``input_image``, Anthropic
``image`` blocks with a base64 source. The scripted engine shows what it received (``{images}``); a
model configured as not taking images, or a provider refusing them, gets an ``error`` event and the
chat goes on."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import pytest
from _helpers.appserver import open_app_server, script_env
from _helpers.sse_server import Reply, json_reply, open_sse_server, sse
from test_repl import open_repl

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="
URL = f"data:image/png;base64,{PNG}"
IMAGES = [{"name": "dot.png", "data": URL}]


def _chat(text: str) -> Reply:
    chunk = {"id": "c", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    end = {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    return Reply(chunks=sse(f"data: {json.dumps(chunk)}\n\n", f"data: {json.dumps(end)}\n\n", "data: [DONE]\n\n"))


def _ev(kind: str, **data) -> str:
    return f"event: {kind}\ndata: " + json.dumps({"type": kind, **data}) + "\n\n"


def _responses(text: str) -> Reply:
    return Reply(
        chunks=sse(
            _ev("response.output_text.delta", item_id="m", output_index=0, content_index=0, delta=text),
            _ev(
                "response.completed",
                response={"id": "r", "status": "completed", "usage": {"input_tokens": 3, "output_tokens": 1}},
            ),
        )
    )


def _anthropic(text: str) -> Reply:
    return Reply(
        chunks=sse(
            _ev("message_start", message={"id": "m", "usage": {"input_tokens": 1}}),
            _ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            _ev("content_block_delta", index=0, delta={"type": "text_delta", "text": text}),
            _ev("content_block_stop", index=0),
            _ev("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 2}),
            _ev("message_stop"),
        )
    )


def _env(home: Path, provider: str, base_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROOST_", "FUSERAFT_"))}
    env.update(
        ROOST_HOME=str(home),
        ROOST_PROVIDER=provider,
        ROOST_BASE_URL=base_url,
        ROOST_MODEL="m",
        OPENAI_API_KEY="sk-test",
        ANTHROPIC_API_KEY="ak-test",
    )
    return env


def _chat_image(body: dict) -> list:
    user = [m for m in body["messages"] if m["role"] == "user"][-1]
    return [p for p in user["content"] if p["type"] == "image_url"] if isinstance(user["content"], list) else []


def _responses_image(body: dict) -> list:
    user = [i for i in body["input"] if i.get("role") == "user"][-1]
    return [p for p in user["content"] if p["type"] == "input_image"]


def _anthropic_image(body: dict) -> list:
    user = [m for m in body["messages"] if m["role"] == "user"][-1]
    return [b for b in user["content"] if b["type"] == "image"]


CASES = {
    "openai": ("/v1", _chat, _chat_image, [{"type": "image_url", "image_url": {"url": URL}}]),
    "openai-responses": ("/v1", _responses, _responses_image, [{"type": "input_image", "image_url": URL}]),
    "anthropic": (
        "",
        _anthropic,
        _anthropic_image,
        [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}],
    ),
}


@pytest.mark.parametrize("provider", list(CASES))
async def test_repl_images_reach_the_provider_in_its_format(provider: str, tmp_path: Path) -> None:
    suffix, reply, parts, expected = CASES[provider]
    async with open_sse_server() as server:
        server.add(reply("A dot."), reply("Plain."))
        env = _env(tmp_path / "home", provider, server.base_url + suffix)
        async with open_repl(env, tmp_path) as repl:
            await repl.wait("ready")
            start = await repl.say("what is this?", images=IMAGES)
            end = await repl.wait("message_end", start=start)
            assert "".join(e["text"] for e in repl.events[start : end["_index"]] if e["type"] == "token") == "A dot."
            start = await repl.say("and now?")
            await repl.wait("message_end", start=start)
            assert await repl.close() == 0
    first, second = (json.loads(r.body) for r in server.requests)
    assert parts(first) == expected
    assert json.dumps(first).count("what is this?") == 1
    assert parts(second) == [] and json.dumps(second).count(PNG) == 1  # the earlier turn keeps its image


async def test_scripted_engine_shows_the_images_it_received(tmp_path: Path, roost_home: Path) -> None:
    env = script_env(tmp_path, roost_home, 'rules:\n  - steps: [[{text: "saw {images}"}]]\n')
    digest = hashlib.sha256(base64.b64decode(PNG)).hexdigest()[:12]
    async with open_repl(env, tmp_path) as repl:
        await repl.wait("ready")
        start = await repl.say("look", images=IMAGES + [{"name": "b.png", "data": URL}])
        end = await repl.wait("message_end", start=start)
        text = "".join(e["text"] for e in repl.events[start : end["_index"]] if e["type"] == "token")
        size = len(base64.b64decode(PNG))
        assert text == f"saw 2 image(s): image/png {size} bytes sha256:{digest}, image/png {size} bytes sha256:{digest}"
        start = await repl.say("no pictures")
        end = await repl.wait("message_end", start=start)
        assert "saw no images" == "".join(e["text"] for e in repl.events[start : end["_index"]] if e["type"] == "token")
        start = await repl.say("bad", images=[{"name": "x", "data": "not a data url"}])
        assert "base64 data URL" in (await repl.wait("error", start=start))["text"]
        assert await repl.close() == 0


async def test_a_model_that_takes_no_images_gets_an_error_event_and_nothing_is_sent(tmp_path: Path) -> None:
    async with open_sse_server() as server:
        server.add(_chat("text only"))
        env = _env(tmp_path / "home", "openai", server.base_url + "/v1")
        (tmp_path / "home").mkdir()
        (tmp_path / "home" / "config.toml").write_text("[provider]\nimages = false\n")
        async with open_repl(env, tmp_path) as repl:
            await repl.wait("ready")
            start = await repl.say("what is this?", images=IMAGES)
            error = await repl.wait("error", start=start)
            assert "does not take images" in error["text"] and "'m'" in error["text"]
            assert "message_end" not in repl.types(start)
            start = await repl.say("just text")
            await repl.wait("message_end", start=start)
            assert await repl.close() == 0
    assert len(server.requests) == 1 and PNG not in server.requests[0].body.decode()


async def test_a_provider_refusing_images_is_an_error_event_not_a_crash(tmp_path: Path) -> None:
    refusal = json.dumps(
        {"error": {"message": "this model does not support image input", "type": "invalid_request_error"}}
    ).encode()
    async with open_sse_server() as server:
        server.add(json_reply(400, refusal))
        env = _env(tmp_path / "home", "openai", server.base_url + "/v1")
        async with open_repl(env, tmp_path) as repl:
            await repl.wait("ready")
            start = await repl.say("what is this?", images=IMAGES)
            error = await repl.wait("error", start=start)
            assert "does not support image input" in error["text"]
            start = await repl.say("/status")
            await repl.wait("status", start=start)
            assert await repl.close() == 0


async def test_app_server_turn_start_images_reach_the_provider(tmp_path: Path) -> None:
    async with open_sse_server() as server:
        server.add(_chat("seen"))
        env = _env(tmp_path / "home", "openai", server.base_url + "/v1")
        async with open_app_server(env=env, cwd=tmp_path) as client:
            await client.initialize()
            thread = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]
            done = await client.run_turn(thread["id"], "describe", images=[{"media_type": "image/png", "data": PNG}])
            assert done["turn"]["status"] == "completed", done
    assert _chat_image(json.loads(server.requests[0].body)) == [{"type": "image_url", "image_url": {"url": URL}}]
