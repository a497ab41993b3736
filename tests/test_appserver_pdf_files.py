"""PDFs as ``files`` (app-server-protocol.md, "Attachments": "the file path supports PDFs"), end to
end: the real ``roost app-server`` against a local mock of each provider, asserting the request
body is that provider's documented file input (Anthropic Messages ``document`` block with a base64
source; OpenAI Responses ``input_file`` with ``file_data``; Chat Completions ``file`` part with
``file_data``), that the PDF is stored once (sha256) and sent again from the store after a
restart, and that a model or engine that cannot take it gets a clear error.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sqlite3
from pathlib import Path

import pytest
from _helpers.appserver import expect_error, open_app_server
from _helpers.sse_server import Reply, json_reply, open_sse_server, sse

PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"
PDF_B64 = base64.b64encode(PDF).decode()
DATA_URL = "data:application/pdf;base64," + PDF_B64
FILE = {"media_type": "application/pdf", "data": PDF_B64, "filename": "report.pdf"}


def ev(kind: str, **data) -> str:
    return f"event: {kind}\ndata: " + json.dumps({"type": kind, **data}) + "\n\n"


def _anthropic_ok() -> Reply:
    return Reply(
        chunks=sse(
            ev("message_start", message={"id": "m", "usage": {"input_tokens": 1}}),
            ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "Read it."}),
            ev("content_block_stop", index=0),
            ev("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 2}),
            ev("message_stop"),
        )
    )


def _chat_ok() -> Reply:
    chunk = {"id": "c", "choices": [{"index": 0, "delta": {"content": "Read it."}, "finish_reason": "stop"}]}
    return Reply(chunks=sse("data: " + json.dumps(chunk) + "\n\n", "data: [DONE]\n\n"))


def _responses_ok() -> Reply:
    return Reply(
        chunks=sse(
            ev("response.output_text.delta", item_id="m", output_index=0, content_index=0, delta="Read it."),
            ev(
                "response.completed", response={"status": "completed", "usage": {"input_tokens": 1, "output_tokens": 2}}
            ),
        )
    )


def _anthropic_user(body: dict) -> list:
    return body["messages"][0]["content"]


def _chat_user(body: dict) -> list:
    return next(m for m in body["messages"] if m["role"] == "user")["content"]


def _responses_user(body: dict) -> list:
    return body["input"][0]["content"]


CASES = {
    "anthropic": (
        "",
        _anthropic_ok,
        _anthropic_user,
        {
            "type": "document",
            "title": "report.pdf",
            "source": {"type": "base64", "media_type": "application/pdf", "data": PDF_B64},
        },
    ),
    "openai": (
        "/v1",
        _chat_ok,
        _chat_user,
        {"type": "file", "file": {"filename": "report.pdf", "file_data": DATA_URL}},
    ),
    "openai-responses": (
        "/v1",
        _responses_ok,
        _responses_user,
        {"type": "input_file", "filename": "report.pdf", "file_data": DATA_URL},
    ),
}


def _env(home: Path, provider: str, base_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
    env.update(
        ROOST_HOME=str(home),
        ROOST_PROVIDER=provider,
        ROOST_BASE_URL=base_url,
        ROOST_MODEL="m",
        OPENAI_API_KEY="sk-test",
        ANTHROPIC_API_KEY="ak-test",
    )
    return env


@pytest.mark.parametrize("provider", sorted(CASES))
async def test_a_pdf_file_reaches_each_provider_in_its_documented_form(tmp_path: Path, provider: str) -> None:
    suffix, ok, user_content, expected = CASES[provider]
    async with open_sse_server() as server:
        server.add(ok(), ok())
        env = _env(tmp_path / "home", provider, server.base_url + suffix)
        async with open_app_server(env=env, cwd=tmp_path) as client:
            await client.initialize()
            tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
            end = await client.run_turn(tid, "summarise the report", files=[FILE])
            assert end["turn"]["status"] == "completed", end
            user = end["turn"]["items"][0]
            assert user["type"] == "user_message" and user["text"] == "summarise the report"
            assert "images" not in user
            assert [(f["media_type"], f["filename"]) for f in user["files"]] == [("application/pdf", "report.pdf")]
            digest = hashlib.sha256(PDF).hexdigest()
            assert user["files"][0]["sha256"] == digest
            # the stored bytes are read back by identity (content_index 0: no images before it)
            read = await client.request(
                "thread/attachment/read",
                {
                    "kind": "artifact",
                    "thread_id": tid,
                    "turn_id": end["turn"]["id"],
                    "item_id": user["id"],
                    "content_index": 0,
                    "sha256": digest,
                },
            )
            assert base64.b64decode(read["data"]) == PDF and read["content_type"] == "application/pdf"
        async with open_app_server(env=env, cwd=tmp_path) as client:  # a new process: history from the store
            await client.initialize()
            snap = await client.request("thread/resume", {"session_id": tid, "response_only": True})
            stored = snap["turns"][0]["items"][0]["files"][0]
            assert stored["sha256"] == digest and stored["data"] == PDF_B64
            again = await client.run_turn(tid, "and the conclusion?")
            assert again["turn"]["status"] == "completed", again
    db = sqlite3.connect(tmp_path / "home" / "roost.db")
    try:  # stored once, by sha256, and not inline in the item
        assert db.execute("SELECT sha256, content_type, size FROM blobs").fetchall() == [
            (digest, "application/pdf", len(PDF))]
        payloads = [row[0] for row in db.execute("SELECT payload FROM items WHERE type = 'user_message'")]
        assert len(payloads) == 2 and all(PDF_B64 not in p for p in payloads)
    finally:
        db.close()
    first, second = (json.loads(r.body) for r in server.requests)
    assert expected in user_content(first)
    assert expected in user_content(second)  # the earlier message still carries its PDF


async def test_a_model_that_refuses_the_pdf_fails_the_turn_saying_so(tmp_path: Path) -> None:
    async with open_sse_server() as server:
        server.add(
            json_reply(
                400,
                b'{"error":{"message":"Invalid content type. file is not supported","type":"invalid_request_error"}}',
            )
        )
        env = _env(tmp_path / "home", "openai", server.base_url + "/v1")
        async with open_app_server(env=env, cwd=tmp_path) as client:
            await client.initialize()
            tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
            end = await client.run_turn(tid, "read", files=[FILE])
            # and the server keeps serving: a turn without the file works
            server.add(_chat_ok())
            plain = await client.run_turn(tid, "no file now")
    error = end["turn"]["error"]
    assert end["turn"]["status"] == "failed" and error["category"] == "invalid_request"
    assert "file is not supported" in error["message"] and "carried a PDF file" in error["message"]
    assert error["recovery"]["stop_reason"] == "non_retryable"
    assert plain["turn"]["status"] == "completed"


async def test_pdf_input_is_checked_before_it_is_accepted(tmp_path: Path) -> None:
    from _helpers.appserver import scripted_env

    async with open_app_server(env=scripted_env(tmp_path / "home"), cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        for method in ("turn/start", "turn/queue", "turn/steer", "run/start"):  # scripted: reads no files
            await expect_error(
                client,
                method,
                {"thread_id": tid, "prompt": "x", "files": [FILE]},
                "unsupported",
                contains="cannot send application/pdf files",
            )
        not_pdf = {**FILE, "data": base64.b64encode(b"GIF89a").decode()}
        await expect_error(
            client,
            "turn/start",
            {"thread_id": tid, "prompt": "x", "files": [not_pdf]},
            "invalid_params",
            contains="not a PDF",
        )
        snap = await client.request("thread/resume", {"session_id": tid, "response_only": True})
        assert snap["turns"] == [] and snap["pending_user_messages"] == [] and snap["held_user_messages"] == []
    db = sqlite3.connect(tmp_path / "home" / "roost.db")
    try:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)  # run/start recorded no run
    finally:
        db.close()


async def test_a_deferring_client_gets_the_pdf_as_an_attachment_reference(tmp_path: Path) -> None:
    image = {"media_type": "image/png", "data": base64.b64encode(b"\x89PNG\r\n\x1a\nnot really").decode()}
    async with open_sse_server() as server:
        server.add(_anthropic_ok())
        env = _env(tmp_path / "home", "anthropic", server.base_url)
        async with open_app_server(env=env, cwd=tmp_path) as client:
            await client.initialize(capabilities={"deferred_notification_content": True})
            tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
            end = await client.run_turn(tid, "both", files=[FILE], images=[image])
            user = end["turn"]["items"][0]
            (ref,) = user["files"]  # after the one image: content_index 1
            assert ref["type"] == "attachment_ref" and ref["content_index"] == 1 and "data" not in ref
            assert ref["media_type"] == "application/pdf" and ref["size"] == len(PDF)
            read = await client.request("thread/attachment/read", {
                "kind": ref["kind"], "thread_id": tid, "turn_id": ref["turn_id"], "item_id": ref["item_id"],
                "content_index": ref["content_index"], "sha256": ref["sha256"]})
            assert base64.b64decode(read["data"]) == PDF and read["next_offset"] is None
    body = json.loads(server.requests[0].body)
    assert [b["type"] for b in body["messages"][0]["content"]] == ["document", "image", "text"]
