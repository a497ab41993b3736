"""End-to-end: conversation pages (``conversation_history`` on ``thread/resume``) and
``thread/activity/read`` over the real ``roost app-server``."""

from __future__ import annotations

import json
from pathlib import Path

from _helpers.appserver import expect_error, open_app_server, script_env
from _helpers.timing import scaled

SCRIPT = r"""
rules:
  - match: {prompt: "^work"}
    steps:
      - - {text: "Looking."}
        - {tool_call: {name: list_dir, arguments: {path: "."}}}
      - - {tool_call: {name: read_file, arguments: {path: "a.txt"}}}
        - {tool_call: {name: read_file, arguments: {path: "missing.txt"}}}
      - - {text: "All read."}
default: echo
"""


async def test_conversation_pages_and_activity(tmp_path: Path, roost_home: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha\n")
    async with open_app_server(env=script_env(tmp_path, roost_home, SCRIPT), cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        plain = (await client.run_turn(tid, "hello"))["turn"]
        work = (await client.run_turn(tid, "work please"))["turn"]
        detail = work["items"]
        assert [i["type"] for i in detail][:1] == ["user_message"] and detail[-1]["text"] == "All read."
        page = await client.request("thread/resume", {"session_id": tid, "response_only": True,
                                                      "conversation_history": True})
        assert page["items_view"] == "conversation" and page["has_more"] is False
        first, second = page["turns"]
        assert first["items"] == plain["items"] and first["has_final_answer"] is True
        types = [i["type"] for i in second["items"]]
        assert types == ["user_message", "process_summary", "agent_message"] and second["has_final_answer"] is True
        summary = second["items"][1]
        region = detail[1:-1]
        assert summary["id"] == region[0]["id"]
        assert summary["activity"] == {"last_item_id": region[-1]["id"], "item_count": len(region),
                                       "tool_count": 3, "failed_count": 1}
        # the ordinary format is unchanged without the opt-in
        ordinary = await client.request("thread/resume", {"session_id": tid, "response_only": True})
        assert "items_view" not in ordinary and ordinary["turns"][1]["items"] == detail
        # the summary's detail items
        ref = {"thread_id": tid, "turn_id": work["id"], "item_id": summary["id"],
               "last_item_id": summary["activity"]["last_item_id"]}
        activity = await client.request("thread/activity/read", ref)
        assert [i["id"] for i in activity["turn"]["items"]] == [i["id"] for i in region]
        assert activity["next_cursor"] is None and activity["turn"]["id"] == work["id"]
        await expect_error(client, "thread/activity/read", {**ref, "last_item_id": region[0]["id"]},
                           "invalid_params", contains="no longer exists")
        await expect_error(client, "thread/activity/read", {**ref, "turn_id": "turn_nope"}, "turn_not_found")
        await expect_error(client, "thread/activity/read", {**ref, "cursor": "bm9wZQ=="}, "invalid_params")
        # paging: one turn per page, the cursor continues in conversation form
        last = await client.request("thread/resume", {"session_id": tid, "response_only": True,
                                                      "conversation_history": True, "history_page": 1})
        assert [t["id"] for t in last["turns"]] == [work["id"]] and last["has_more"] is True
        older = await client.request("thread/history/read", {"thread_id": tid,
                                                             "history_cursor": last["history_cursor"]})
        assert older["items_view"] == "conversation" and [t["id"] for t in older["turns"]] == [plain["id"]]
        assert older["has_more"] is False and older["history_cursor"] is None
        # an edit removes the boundary (with its turn): reading the summary then fails explicitly
        await client.request("thread/edit-message", {"thread_id": tid, "turn_id": work["id"],
                                                     "item_id": detail[0]["id"]})
        await expect_error(client, "thread/activity/read", ref, "turn_not_found")


def _many_calls_script(calls: int, reads: int) -> str:
    def rule(prompt: str, call: dict, count: int, answer: str) -> dict:
        return {"match": {"prompt": f"^{prompt}"}, "steps": [[{"tool_call": call}] * count, [{"text": answer}]]}

    return json.dumps({"rules": [
        rule("list", {"name": "list_dir", "arguments": {"path": "."}}, calls, "Listed."),
        rule("read", {"name": "read_file", "arguments": {"path": "big.txt", "limit": 1000}}, reads, "Read."),
    ], "default": "echo"})


async def test_activity_pages_hold_at_most_100_items_and_256_kib(tmp_path: Path, roost_home: Path) -> None:
    # ~13 KiB read back: under the 16 KiB threshold of references, so it counts inline
    (tmp_path / "big.txt").write_text("".join(f"line {n:05d} of a big file\n" for n in range(420)))
    script = _many_calls_script(105, 25)
    async with open_app_server(env=script_env(tmp_path, roost_home, script), cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path), "permission_mode": "read_only"}))[
            "thread"]["id"]
        for prompt, count in (("list", 105), ("read", 25)):
            start = len(client.lines)
            sent = (await client.request("turn/start", {"thread_id": tid, "prompt": prompt}))["turn"]
            turn = (await client.wait_terminal(sent["id"], start=start, timeout=scaled(120)))["turn"]
            assert turn["status"] == "completed", turn
            region = turn["items"][1:-1]
            assert len(region) == count and all(i["type"] == "tool_call" for i in region)
            page = await client.request("thread/resume", {"session_id": tid, "response_only": True,
                                                          "conversation_history": True, "history_page": 1})
            summary = page["turns"][-1]["items"][1]
            assert summary["type"] == "process_summary" and summary["activity"]["item_count"] == count
            ref = {"thread_id": tid, "turn_id": turn["id"], "item_id": summary["id"],
                   "last_item_id": summary["activity"]["last_item_id"]}
            seen, sizes, cursor = [], [], None
            while True:
                got = await client.request("thread/activity/read", {**ref, **({"cursor": cursor} if cursor else {})})
                items = got["turn"]["items"]
                assert 1 <= len(items) <= 100
                assert all(isinstance(i["output"], str) for i in items)  # inline, not references
                sizes.append(sum(len(json.dumps(i)) for i in items))
                seen += [i["id"] for i in items]
                cursor = got.get("next_cursor")
                if cursor is None:
                    break
            assert seen == [i["id"] for i in region]  # forward, complete, nothing twice
            assert all(size <= 256 * 1024 for size in sizes)
            if prompt == "list":
                assert len(sizes) == 2  # 100 items, then the last 5
            else:
                assert len(sizes) >= 2  # 25 outputs of ~13 KiB (inline) do not fit one 256 KiB page


async def test_conversation_pages_hold_at_most_100_turns_and_1_mib(tmp_path: Path, roost_home: Path) -> None:
    async with open_app_server(env=script_env(tmp_path, roost_home, "default: echo\n"), cwd=tmp_path) as client:
        await client.initialize()
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        for n in range(102):
            assert (await client.run_turn(tid, f"turn {n}"))["turn"]["status"] == "completed"
        page = await client.request("thread/resume", {"session_id": tid, "response_only": True,
                                                      "conversation_history": True})
        assert len(page["turns"]) == 100 and page["has_more"] is True
        rest = await client.request("thread/history/read", {"thread_id": tid, "history_cursor": page["history_cursor"]})
        assert [t["items"][0]["text"] for t in rest["turns"]] == ["turn 0", "turn 1"] and rest["has_more"] is False
        big = "x" * (200 * 1024)  # echoed: each turn carries about 400 KiB of items
        for n in range(3):
            assert (await client.run_turn(tid, f"{n}{big}"))["turn"]["status"] == "completed"
        page = await client.request("thread/resume", {"session_id": tid, "response_only": True,
                                                      "conversation_history": True})
        assert len(page["turns"]) == 2 and page["has_more"] is True  # a third would pass 1 MiB
        assert sum(len(json.dumps(t)) for t in page["turns"]) <= 1024 * 1024
        assert [t["items"][0]["text"][0] for t in page["turns"]] == ["1", "2"]
        older = await client.request("thread/history/read",
                                     {"thread_id": tid, "history_cursor": page["history_cursor"]})
        assert older["items_view"] == "conversation" and older["turns"][-1]["items"][0]["text"][0] == "0"
