"""End-to-end: the app-server session methods (initialize, shutdown, thread/*) over the real
``roost app-server`` subprocess, failure paths included."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import trio

from _helpers.appserver import RemoteError, open_app_server, scripted_env, expect_error, script_env
from _helpers.timing import scaled

SCRIPT = """
rules:
  - match: {prompt: "^slow"}
    steps:
      - - {text: "one two three four five six seven eight nine ten", tokens_per_second: 4}
default: echo
"""


@pytest.fixture
def env(tmp_path: Path, roost_home: Path) -> dict:
    return script_env(tmp_path, roost_home, SCRIPT)




def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    out = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


# -- initialize / shutdown ------------------------------------------------------------------------


async def test_initialize_result_capabilities_and_shutdown(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        # protocol_version must match exactly; a bad capabilities shape is invalid_params
        await expect_error(client, "initialize", {"protocol_version": "wuu-app-server/v0.2"}, "invalid_params",
                           contains="wuu-app-server/v0.1")
        await expect_error(client, "initialize", {"capabilities": {"reverse_rpc": {"methods": "approval/request"}}},
                           "invalid_params")
        await expect_error(client, "initialize", {"protocol_version": "wuu-app-server/v0.1", "extra": 1},
                           "invalid_params", contains="extra")
        init = await client.initialize(client={"name": "tests", "version": "1"},
                                       capabilities={"reverse_rpc": {"methods": ["approval/request"]}})
        assert init["protocol_version"] == "wuu-app-server/v0.1"
        assert init["status"] == "ready" and init["issues"] == []
        for key in ("core", "runtime_host", "workspace", "model", "permissions", "extensions", "features",
                    "max_parallel"):
            assert key in init, key
        assert init["core"]["name"] == "roost"
        assert init["runtime_host"]["kind"] == "local"
        assert init["model"]["provider"] == "scripted"
        assert set(init["permissions"]["modes"]) == {"read_only", "standard", "unconfined"}
        assert isinstance(init["max_parallel"], int) and init["max_parallel"] >= 1
        # initialize without a protocol_version is accepted
        assert (await client.request("initialize", {}))["status"] == "ready"
        await expect_error(client, "shutdown", {"now": True}, "invalid_params")
        assert await client.request("shutdown") == {"ok": True}
        # the server exits by itself although stdin is still open
        with trio.fail_after(scaled(20)):
            code = await client.process.wait()
        assert code == 0


# -- thread/start -------------------------------------------------------------------------------


async def test_start_selection_persistent_and_ephemeral(env, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        start = len(client.lines)
        thread = (await client.request("thread/start", {
            "cwd": str(work), "model": "model-a", "effort": "high", "permission_mode": "read_only",
            "title": "Selection", "model_options": {"speed": "fast"}, "workspace_id": "ws-1",
        }))["thread"]
        assert thread["cwd"] == str(work) and thread["model"] == "model-a" and thread["effort"] == "high"
        assert thread["permission_mode"] == "read_only" and thread["provider"] == "scripted"
        assert thread["ephemeral"] is False and thread["status"] == "idle"
        assert thread["model_options"] == {"speed": "fast"} and thread["workspace_id"] == "ws-1"
        started = await client.wait_for("thread/started", start=start)
        assert started["thread"]["id"] == thread["id"]
        default = (await client.request("thread/start", {}))["thread"]
        assert default["permission_mode"] == "standard" and default["cwd"] == str(tmp_path)
        ephemeral = (await client.request("thread/start", {"ephemeral": True, "cwd": str(work)}))["thread"]
        assert ephemeral["ephemeral"] is True
        done = await client.run_turn(ephemeral["id"], "in memory")
        assert done["turn"]["status"] == "completed"
        # failure paths: nothing is created
        await expect_error(client, "thread/start", {"cwd": "relative/dir"}, "invalid_params")
        await expect_error(client, "thread/start", {"cwd": str(tmp_path / "missing")}, "invalid_params")
        await expect_error(client, "thread/start", {"permission_mode": "root"}, "invalid_params")
        error = await expect_error(client, "thread/start", {"provider": "nope"}, "invalid_params",
                                   contains="unknown provider 'nope' (from the thread/start param provider)")
        assert "--provider" not in error["message"]  # the request param is the source, not a flag
        await expect_error(client, "thread/start", {"engine": "codex"}, "unsupported")
        await expect_error(client, "thread/start", {"approve_for_me": True}, "unsupported")
        await expect_error(client, "thread/start", {"base_revision": "HEAD"}, "invalid_params",
                           contains="worktree")
        await expect_error(client, "thread/start", {"workspace": "worktree", "ephemeral": True}, "invalid_params")
        await expect_error(client, "thread/start", {"workspace": "elsewhere"}, "invalid_params")
        await expect_error(client, "thread/start", {"model_options": {"speed": 1}}, "invalid_params")
        listed = (await client.request("thread/listAll"))["threads"]
        assert {t["id"] for t in listed} == {thread["id"], default["id"], ephemeral["id"]}
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": thread["id"]})
        restored = snap["thread"]
        for key in ("cwd", "model", "effort", "permission_mode", "title", "model_options", "workspace_id"):
            assert restored[key] == thread[key], key
        await expect_error(client, "thread/resume", {"session_id": ephemeral["id"]}, "thread_not_found")
        listed = (await client.request("thread/listAll"))["threads"]
        assert {t["id"] for t in listed} == {thread["id"], default["id"]}


async def test_worktree_threads(env, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "file.txt").write_text("v1\n")
    git(repo, "add", "file.txt")
    git(repo, "commit", "-q", "-m", "one")
    first = git(repo, "rev-parse", "HEAD")
    git(repo, "tag", "v1")
    (repo / "file.txt").write_text("v2\n")
    git(repo, "commit", "-q", "-am", "two")
    head = git(repo, "rev-parse", "HEAD")
    plain = tmp_path / "plain"
    plain.mkdir()
    worktrees = Path(env["ROOST_HOME"]) / "worktrees"
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        # outside a git repository, and an unknown revision: no thread, no worktree
        await expect_error(client, "thread/start", {"cwd": str(plain), "workspace": "worktree"},
                           "invalid_params", contains="git repository")
        await expect_error(client, "thread/start", {"cwd": str(repo), "workspace": "worktree",
                                                    "base_revision": "no-such-branch"},
                           "invalid_params", contains="no-such-branch")
        assert (await client.request("thread/listAll"))["threads"] == []
        assert not worktrees.exists() or list(worktrees.iterdir()) == []
        assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
        # HEAD by default; a tag as base_revision
        at_head = (await client.request("thread/start", {"cwd": str(repo), "workspace": "worktree"}))["thread"]
        info = at_head["worktree"]
        assert info["base_commit"] == head and info["base_repository"] == str(repo)
        assert at_head["cwd"] == info["path"] and Path(info["path"]).is_dir()
        assert (Path(info["path"]) / "file.txt").read_text() == "v2\n"
        at_tag = (await client.request("thread/start", {"cwd": str(repo), "workspace": "worktree",
                                                        "base_revision": "v1"}))["thread"]
        path = Path(at_tag["worktree"]["path"])
        assert at_tag["worktree"]["base_commit"] == first
        assert (path / "file.txt").read_text() == "v1\n"
        assert git(path, "rev-parse", "HEAD") == first
        assert git(path, "rev-parse", "--abbrev-ref", "HEAD") == "HEAD"  # detached
        # the project's own checkout is untouched
        assert git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main"
        assert (repo / "file.txt").read_text() == "v2\n"
        # a turn runs in the worktree
        (path / "only-here.txt").write_text("x")
        done = await client.run_turn(at_tag["id"], "hello worktree")
        assert done["turn"]["status"] == "completed"
        snap = await client.request("thread/resume", {"session_id": at_tag["id"], "response_only": True})
        assert snap["thread"]["worktree"] == at_tag["worktree"]
        # deleting a thread removes its clean worktree; one with local changes is kept
        gone = await client.request("thread/delete", {"thread_id": at_head["id"]})
        assert gone["worktree"] == {"path": info["path"], "removed": True} and not Path(info["path"]).exists()
        kept = await client.request("thread/delete", {"thread_id": at_tag["id"]})
        assert kept["worktree"]["removed"] is False and (path / "only-here.txt").exists()
        assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 2


# -- thread/resume and history pages ------------------------------------------------------------


async def test_resume_most_recent_for_workspace_and_history_paging(env, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    async with open_app_server(env=env, cwd=a) as client:
        await client.initialize()
        await expect_error(client, "thread/resume", {}, "thread_not_found")
        older = (await client.request("thread/start", {"cwd": str(a)}))["thread"]
        newer = (await client.request("thread/start", {"cwd": str(a)}))["thread"]
        in_b = (await client.request("thread/start", {"cwd": str(b)}))["thread"]
        # a turn makes the older thread the most recent of workspace a
        prompts = [f"message number {n}" for n in range(5)]
        for prompt in prompts:
            assert (await client.run_turn(older["id"], prompt))["turn"]["status"] == "completed"
        start = len(client.lines)
        snap = await client.request("thread/resume", {})  # the server's cwd is workspace a
        assert snap["thread"]["id"] == older["id"]
        assert len(snap["turns"]) == 5 and snap["has_more"] is False
        assert snap["pending_user_messages"] == [] and snap["held_user_messages"] == []
        resumed = await client.wait_for("thread/resumed", start=start)
        assert resumed["thread"]["id"] == older["id"]
        assert (await client.request("thread/resume", {"cwd": str(b)}))["thread"]["id"] == in_b["id"]
        assert newer["id"] != older["id"]
        # response_only: no thread/resumed for the requester
        start = len(client.lines)
        await client.request("thread/resume", {"session_id": older["id"], "response_only": True})
        await client.request("thread/list")  # a later response: everything before it has been read
        assert not [m for m in client.lines[start:] if m.get("method") == "thread/resumed"]
        # bounded history and the opaque cursor
        page = await client.request("thread/resume", {"session_id": older["id"], "history_page": {"turns": 2},
                                                      "response_only": True})
        texts = [t["items"][0]["text"] for t in page["turns"]]
        assert texts == prompts[3:] and page["has_more"] is True and page["history_cursor"]
        seen = list(texts)
        cursor = page["history_cursor"]
        while cursor:
            more = await client.request("thread/history/read", {"thread_id": older["id"], "history_cursor": cursor,
                                                                "limit": 2})
            seen = [t["items"][0]["text"] for t in more["turns"]] + seen
            cursor = more["history_cursor"]
        assert seen == prompts
        latest = await client.request("thread/history/read", {"thread_id": older["id"], "limit": 1})
        assert [t["items"][0]["text"] for t in latest["turns"]] == prompts[-1:]
        # whole snapshot pages: no cursor
        whole = await client.request("thread/resume", {"session_id": older["id"], "history_page": True,
                                                       "response_only": True})
        assert len(whole["turns"]) == 5 and whole["history_cursor"] is None
        # bad cursors and limits
        await expect_error(client, "thread/history/read", {"thread_id": older["id"], "history_cursor": "garbage"},
                           "invalid_params")
        await expect_error(client, "thread/history/read", {"thread_id": newer["id"], "history_cursor":
                                                           page["history_cursor"]}, "invalid_params")
        await expect_error(client, "thread/history/read", {"thread_id": older["id"], "limit": 101}, "invalid_params")
        await expect_error(client, "thread/resume", {"session_id": older["id"], "history_page": {"turns": 0}},
                           "invalid_params")
        await expect_error(client, "thread/resume", {"session_id": "thr_nope"}, "thread_not_found")
        await expect_error(client, "thread/history/read", {"thread_id": "thr_nope"}, "thread_not_found")


async def test_history_page_and_cursor_errors_name_the_documented_fields(env, tmp_path):
    """A bad ``history_page`` is reported as ``history_page.limit`` (its documented field), the
    older ``{turns: N}`` spelling still works, and an empty ``history_cursor`` is not taken for an
    absent one."""
    async with open_app_server(env=env, cwd=tmp_path) as client:
        tid = (await client.request("thread/start", {"cwd": str(tmp_path)}))["thread"]["id"]
        for n in range(3):
            assert (await client.run_turn(tid, f"turn {n}"))["turn"]["status"] == "completed"
        for method in ("thread/resume", "thread/fork"):
            ref = {"session_id": tid} if method == "thread/resume" else {"thread_id": tid}
            for page in ({"limit": 0}, {"limit": 101}, {"turns": 0}, {"limit": "2"}):
                error = await expect_error(client, method, {**ref, "history_page": page}, "invalid_params",
                                           contains="history_page.limit")
                assert "turns must" not in error["message"], error
            await expect_error(client, method, {**ref, "history_page": "all"}, "invalid_params",
                               contains="{limit: N}")
            await expect_error(client, method, {**ref, "history_page": {"count": 2}}, "invalid_params",
                               contains="{limit: N}")
            for page in ({"limit": 2}, {"turns": 2}, 2):  # what was accepted still is
                result = await client.request(method, {**ref, "history_page": page})
                assert len(result["turns"]) == 2 and result["has_more"] is True, (method, page)
        # no cursor (omitted or null): the most recent page; an empty one is an error
        for params in ({}, {"history_cursor": None}):
            latest = await client.request("thread/history/read", {"thread_id": tid, "limit": 1, **params})
            assert [t["items"][0]["text"] for t in latest["turns"]] == ["turn 2"]
        for key in ("history_cursor", "cursor"):
            await expect_error(client, "thread/history/read", {"thread_id": tid, key: ""}, "invalid_params",
                               contains=f"{key} must be the opaque string a page returned")


# -- listing, organising, search ----------------------------------------------------------------


async def test_list_rename_pin_archive(env, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        t1 = (await client.request("thread/start", {"cwd": str(a)}))["thread"]
        t2 = (await client.request("thread/start", {"cwd": str(a)}))["thread"]
        t3 = (await client.request("thread/start", {"cwd": str(b)}))["thread"]
        eph = (await client.request("thread/start", {"cwd": str(b), "ephemeral": True}))["thread"]
        ids = lambda r: [t["id"] for t in r["threads"]]  # noqa: E731
        everything = await client.request("thread/list")
        assert set(ids(everything)) == {t1["id"], t2["id"], t3["id"], eph["id"]}
        assert set(ids(await client.request("thread/list", {"cwd": str(a)}))) == {t1["id"], t2["id"]}
        assert set(ids(await client.request("thread/list", {"cwd": str(b)}))) == {t3["id"], eph["id"]}
        # paging with an opaque cursor: every persisted thread once, newest first
        page = await client.request("thread/list", {"limit": 1})
        seen = ids(page)
        while page["next_cursor"]:
            page = await client.request("thread/list", {"limit": 1, "cursor": page["next_cursor"]})
            seen += ids(page)
        assert sorted(seen) == sorted([t1["id"], t2["id"], t3["id"], eph["id"]]) and len(seen) == 4
        await expect_error(client, "thread/list", {"cursor": "bogus"}, "invalid_params")
        await expect_error(client, "thread/list", {"limit": 0}, "invalid_params")
        await expect_error(client, "thread/listAll", {"limit": 100000}, "invalid_params")
        # rename, pin: results and thread/updated
        start = len(client.lines)
        renamed = (await client.request("thread/rename", {"thread_id": t1["id"], "title": "  Design notes "}))["thread"]
        assert renamed["title"] == "Design notes"
        updated = await client.wait_for("thread/updated", start=start)
        assert updated["thread"]["title"] == "Design notes"
        assert (await client.request("thread/pin", {"thread_id": t1["id"]}))["thread"]["pinned"] is True
        unpinned = (await client.request("thread/pin", {"thread_id": t2["id"], "pinned": False}))["thread"]
        assert unpinned["pinned"] is False
        await expect_error(client, "thread/rename", {"thread_id": t1["id"]}, "invalid_params")
        await expect_error(client, "thread/rename", {"thread_id": "thr_nope", "title": "x"}, "thread_not_found")
        # archive: out of thread/list, into listArchived; listAll keeps both
        archived = (await client.request("thread/archive", {"thread_id": t2["id"]}))["thread"]
        assert archived["archived"] is True
        assert t2["id"] not in ids(await client.request("thread/list"))
        assert ids(await client.request("thread/listArchived")) == [t2["id"]]
        assert t2["id"] in ids(await client.request("thread/listAll"))
        # an archived thread is read-only until restored
        await expect_error(client, "turn/start", {"thread_id": t2["id"], "prompt": "hi"}, "read_only")
        await expect_error(client, "turn/queue", {"thread_id": t2["id"], "prompt": "hi"}, "read_only")
        await client.request("thread/archive", {"thread_id": t2["id"], "archived": False})
        assert (await client.run_turn(t2["id"], "restored"))["turn"]["status"] == "completed"
        assert ids(await client.request("thread/listArchived")) == []
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        listed = {t["id"]: t for t in (await client.request("thread/list"))["threads"]}
        assert listed[t1["id"]]["title"] == "Design notes" and listed[t1["id"]]["pinned"] is True
        assert eph["id"] not in listed


async def test_search(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        t1 = (await client.request("thread/start", {"title": "Kayak trip"}))["thread"]
        t2 = (await client.request("thread/start", {}))["thread"]
        t3 = (await client.request("thread/start", {}))["thread"]
        await client.run_turn(t2["id"], "the zebra crossing is closed")
        await client.run_turn(t3["id"], "a quiet zebra sleeps")
        await client.request("thread/archive", {"thread_id": t3["id"]})
        hits = (await client.request("thread/search", {"query": "zebra"}))["results"]
        by_id = {h["thread"]["id"]: h for h in hits}
        assert set(by_id) == {t2["id"], t3["id"]}  # archived conversations are found by a query
        assert "zebra" in by_id[t2["id"]]["snippet"]
        assert isinstance(by_id[t2["id"]]["message_seq"], int)
        # message_seq addresses the persisted message
        snap = await client.request("thread/resume", {"session_id": t2["id"], "response_only": True})
        seqs = {i["seq"] for t in snap["turns"] for i in t["items"]}
        assert by_id[t2["id"]]["message_seq"] in seqs
        # a title hit has no address
        title = (await client.request("thread/search", {"query": "kayak"}))["results"]
        assert [h["thread"]["id"] for h in title] == [t1["id"]] and "message_seq" not in title[0]
        # FTS operators in the query are literal, not syntax
        assert (await client.request("thread/search", {"query": 'zebra" OR "x'}))["results"] == []
        # the empty query: unarchived suggestions without addresses
        empty = (await client.request("thread/search", {"query": ""}))["results"]
        assert {h["thread"]["id"] for h in empty} == {t1["id"], t2["id"]}
        assert all("message_seq" not in h for h in empty)
        assert len((await client.request("thread/search", {"query": "zebra", "limit": 1}))["results"]) == 1
        await expect_error(client, "thread/search", {"query": "zebra", "limit": 101}, "invalid_params")
        await expect_error(client, "thread/search", {}, "invalid_params")


async def test_delete(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        keep = (await client.request("thread/start", {}))["thread"]
        await client.run_turn(keep["id"], "precious history")
        # only_if_archived on a thread that is not archived: rejected, history intact
        await expect_error(client, "thread/delete", {"thread_id": keep["id"], "only_if_archived": True},
                           "invalid_params", contains="not archived")
        snap = await client.request("thread/resume", {"session_id": keep["id"], "response_only": True})
        assert snap["turns"][0]["items"][0]["text"] == "precious history"
        # a running thread is rejected
        busy = (await client.request("thread/start", {}))["thread"]
        turn = (await client.request("turn/start", {"thread_id": busy["id"], "prompt": "slow reply"}))["turn"]
        await client.wait_for("item/agentMessage/delta", lambda p: p["turn_id"] == turn["id"])
        await expect_error(client, "thread/delete", {"thread_id": busy["id"]}, "thread_busy")
        await expect_error(client, "thread/archive", {"thread_id": busy["id"]}, "thread_busy")
        await client.request("turn/interrupt", {"thread_id": busy["id"]})
        await client.wait_terminal(turn["id"])
        assert await client.request("thread/delete", {"thread_id": busy["id"]}) == {"thread_id": busy["id"]}
        # archived, then deleted with the guard
        await client.request("thread/archive", {"thread_id": keep["id"]})
        assert await client.request("thread/delete", {"thread_id": keep["id"], "only_if_archived": True}) \
            == {"thread_id": keep["id"]}
        await expect_error(client, "thread/resume", {"session_id": keep["id"]}, "thread_not_found")
        await expect_error(client, "thread/delete", {"thread_id": keep["id"]}, "thread_not_found")
        assert (await client.request("thread/search", {"query": "precious"}))["results"] == []
        eph = (await client.request("thread/start", {"ephemeral": True}))["thread"]
        await expect_error(client, "thread/delete", {"thread_id": eph["id"], "only_if_archived": True},
                           "invalid_params")
        assert await client.request("thread/delete", {"thread_id": eph["id"]}) == {"thread_id": eph["id"]}
        assert (await client.request("thread/listAll"))["threads"] == []
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        await expect_error(client, "thread/resume", {"session_id": keep["id"]}, "thread_not_found")


# -- fork and edit-message ----------------------------------------------------------------------


async def test_fork(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        src = (await client.request("thread/start", {"model": "m-1", "permission_mode": "read_only",
                                                     "title": "Source"}))["thread"]
        turns = [(await client.run_turn(src["id"], f"step {n}"))["turn"] for n in range(3)]
        start = len(client.lines)
        whole = await client.request("thread/fork", {"thread_id": src["id"]})
        fork = whole["thread"]
        assert fork["id"] != src["id"] and fork["parent_thread_id"] == src["id"]
        assert (fork["model"], fork["permission_mode"], fork["title"]) == ("m-1", "read_only", "Source (fork)")
        assert [t["items"][0]["text"] for t in whole["turns"]] == ["step 0", "step 1", "step 2"]
        assert whole["worktree"] is None
        started = await client.wait_for("thread/started", start=start)
        assert started["thread"]["id"] == fork["id"]
        # cut after a turn, and after an item (the user message of turn 1)
        at_turn = await client.request("thread/fork", {"thread_id": src["id"], "turn_id": turns[0]["id"]})
        assert [t["items"][0]["text"] for t in at_turn["turns"]] == ["step 0"]
        user_1 = turns[1]["items"][0]["id"]
        at_item = await client.request("thread/fork", {"thread_id": src["id"], "item_id": user_1})
        assert [[i["type"] for i in t["items"]] for t in at_item["turns"]] == [
            ["user_message", "agent_message"], ["user_message"]]
        # history_page: bounded turns and a cursor, also in thread/started
        start = len(client.lines)
        paged = await client.request("thread/fork", {"thread_id": src["id"], "history_page": {"turns": 1}})
        assert [t["items"][0]["text"] for t in paged["turns"]] == ["step 2"] and paged["history_cursor"]
        note = await client.wait_for("thread/started", start=start)
        assert len(note["turns"]) == 1 and note["history_cursor"] == paged["history_cursor"]
        older = await client.request("thread/history/read", {"thread_id": paged["thread"]["id"],
                                                             "history_cursor": paged["history_cursor"]})
        assert [t["items"][0]["text"] for t in older["turns"]] == ["step 0", "step 1"]
        # the fork goes on alone; the source is unchanged
        await client.run_turn(at_turn["thread"]["id"], "fork only")
        snap = await client.request("thread/resume", {"session_id": src["id"], "response_only": True})
        assert len(snap["turns"]) == 3
        # failure paths
        await expect_error(client, "thread/fork", {"thread_id": src["id"], "turn_id": "turn_nope"}, "turn_not_found")
        await expect_error(client, "thread/fork", {"thread_id": src["id"], "item_id": "item_nope"}, "invalid_params")
        await expect_error(client, "thread/fork", {"thread_id": src["id"], "turn_id": turns[0]["id"],
                                                   "item_id": user_1}, "invalid_params")
        await expect_error(client, "thread/fork", {"thread_id": src["id"], "mode": "native"}, "unsupported")
        await expect_error(client, "thread/fork", {"thread_id": "thr_nope"}, "thread_not_found")
        # an ephemeral thread forks into an ephemeral thread with the copied history
        eph = (await client.request("thread/start", {"ephemeral": True}))["thread"]
        await client.run_turn(eph["id"], "remember me")
        eph_fork = await client.request("thread/fork", {"thread_id": eph["id"]})
        assert eph_fork["thread"]["ephemeral"] is True
        assert eph_fork["turns"][0]["items"][0]["text"] == "remember me"
        fork_id = at_turn["thread"]["id"]
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": fork_id})
        assert [t["items"][0]["text"] for t in snap["turns"]] == ["step 0", "fork only"]


async def test_edit_message_rewinds_the_conversation(env, tmp_path):
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        thread = (await client.request("thread/start", {}))["thread"]
        tid = thread["id"]
        t1 = (await client.run_turn(tid, "alpha"))["turn"]
        t2 = (await client.run_turn(tid, "beta gamma", client_id="draft-1"))["turn"]
        t3 = (await client.run_turn(tid, "unicorn delta"))["turn"]
        # failure paths first: nothing changes
        await expect_error(client, "thread/edit-message", {"thread_id": tid, "turn_id": "turn_nope",
                                                           "item_id": "x"}, "turn_not_found")
        await expect_error(client, "thread/edit-message", {"thread_id": tid, "turn_id": t2["id"],
                                                           "item_id": t2["items"][1]["id"]}, "invalid_params",
                           contains="user message")
        await expect_error(client, "thread/edit-message", {"thread_id": tid, "turn_id": t2["id"],
                                                           "item_id": t1["items"][0]["id"]}, "invalid_params")
        await expect_error(client, "thread/edit-message", {"thread_id": tid, "turn_id": t2["id"]}, "invalid_params")
        await expect_error(client, "thread/edit-message", {"thread_id": "thr_nope", "turn_id": t2["id"],
                                                           "item_id": "x"}, "thread_not_found")
        start = len(client.lines)
        edited = await client.request("thread/edit-message", {"thread_id": tid, "turn_id": t2["id"],
                                                              "item_id": t2["items"][0]["id"]})
        assert edited["draft"]["prompt"] == "beta gamma" and edited["draft"]["client_id"] == "draft-1"
        assert [t["id"] for t in edited["turns"]] == [t1["id"]]
        assert set(edited["retracted_turn_ids"]) == {t2["id"], t3["id"]}
        assert edited["thread"]["id"] == tid
        await client.wait_for("thread/updated", lambda p: p["thread"]["id"] == tid, start=start)
        # the model's history no longer has the retracted messages: sending the same text again
        # costs exactly as many input tokens as the first time (the scripted engine counts words)
        again = (await client.run_turn(tid, "beta gamma"))["turn"]
        assert again["usage"]["input_tokens"] == t2["usage"]["input_tokens"]
        snap = await client.request("thread/resume", {"session_id": tid, "response_only": True})
        assert [t["items"][0]["text"] for t in snap["turns"]] == ["alpha", "beta gamma"]
        assert (await client.request("thread/search", {"query": "unicorn"}))["results"] == []
        # editing the first message of a turn that keeps nothing else; while running: thread_busy
        turn = (await client.request("turn/start", {"thread_id": tid, "prompt": "slow reply"}))["turn"]
        await client.wait_for("item/agentMessage/delta", lambda p: p["turn_id"] == turn["id"])
        await expect_error(client, "thread/edit-message", {"thread_id": tid, "turn_id": t1["id"],
                                                           "item_id": t1["items"][0]["id"]}, "thread_busy")
        await client.request("turn/interrupt", {"thread_id": tid})
        await client.wait_terminal(turn["id"])
    async with open_app_server(env=env, cwd=tmp_path) as client:
        await client.initialize()
        snap = await client.request("thread/resume", {"session_id": tid})
        assert [t["items"][0]["text"] for t in snap["turns"]] == ["alpha", "beta gamma", "slow reply"]
        pages = await client.request("thread/history/read", {"thread_id": tid})
        assert [t["id"] for t in pages["turns"]] == [t["id"] for t in snap["turns"]]
        assert (await client.request("thread/search", {"query": "unicorn"}))["results"] == []
        edited = await client.request("thread/edit-message", {"thread_id": tid, "turn_id": t1["id"],
                                                              "item_id": t1["items"][0]["id"]})
        assert edited["turns"] == [] and edited["draft"]["prompt"] == "alpha"
        fresh = (await client.run_turn(tid, "alpha"))["turn"]
        assert fresh["usage"]["input_tokens"] == t1["usage"]["input_tokens"]
    # the audit transcript keeps every record
    import sqlite3

    db = sqlite3.connect(Path(env["ROOST_HOME"]) / "roost.db")
    statuses = [r[0] for r in db.execute("SELECT status FROM items WHERE thread_id = ? ORDER BY seq", (tid,))]
    db.close()
    assert statuses.count("retracted") >= 6 and len(statuses) >= 10


async def test_resume_most_recent_counts_loaded_ephemeral_threads(env, tmp_path):
    """An ephemeral thread has no row: thread/resume without an id finds it through the registry's
    views when it is the most recently updated of the workspace, and skips it in another one."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    async with open_app_server(env=env, cwd=a) as client:
        await client.initialize()
        stored = (await client.request("thread/start", {"cwd": str(a)}))["thread"]
        await client.request("thread/start", {"cwd": str(b), "ephemeral": True})
        snap = await client.request("thread/resume", {})
        assert snap["thread"]["id"] == stored["id"]  # the ephemeral one is in workspace b
        ephemeral = (await client.request("thread/start", {"cwd": str(a), "ephemeral": True}))["thread"]
        assert (await client.run_turn(ephemeral["id"], "hello"))["turn"]["status"] == "completed"
        snap = await client.request("thread/resume", {})
        assert snap["thread"]["id"] == ephemeral["id"]
