"""Tests for roost.tools: the tool model, argument validation, the permission policy and file tools."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

import roost.tools as tools
from roost.errors import InvalidToolArguments, ToolError
from roost.tools import Tool, ToolContext, ToolResult, builtin_tools, run_tool, validate_args
from _helpers.timing import scaled

BUILTINS = builtin_tools()


def _ctx(tmp_path: Path, **kw) -> ToolContext:
    kw.setdefault("permission_mode", "unconfined")
    return ToolContext(cwd=tmp_path, **kw)


class _Approver:
    """A request_approval callable that records requests and answers ``answer``."""

    def __init__(self, answer):
        self.answer = answer
        self.requests: list[tuple[str, dict]] = []

    async def __call__(self, kind, fields):
        self.requests.append((kind, fields))
        return self.answer


def _fake_tool(*, mutating: bool, approval_kind=None, raises: BaseException | None = None):
    calls: list[dict] = []

    async def run(args, ctx):
        calls.append(args)
        if raises is not None:
            raise raises
        return ToolResult(output=f"ran {args['x']}")

    tool = Tool(
        name="fake",
        description="a fake tool",
        parameters={
            "type": "object",
            "properties": {"x": {"type": "integer"}, "y": {"type": "string", "default": "d"}},
            "required": ["x"],
            "additionalProperties": False,
        },
        mutating=mutating,
        approval_kind=approval_kind,
        run=run,
    )
    return tool, calls


# -- model ----------------------------------------------------------------------------------------


def test_exports_are_public():
    for name in tools.__all__:
        assert hasattr(tools, name)
    assert Tool.__module__ == "roost.tools"
    assert run_tool.__module__ == "roost.tools"


def test_builtin_names_and_parameters():
    assert set(BUILTINS) == {"shell", "read_file", "write_file", "list_dir", "search_files"}
    props = {name: set(t.parameters["properties"]) for name, t in BUILTINS.items()}
    assert props == {
        "shell": {"command", "timeout_s", "background"},
        "read_file": {"path", "offset", "limit"},
        "write_file": {"path", "content"},
        "list_dir": {"path"},
        "search_files": {"pattern", "path"},
    }
    assert {n for n, t in BUILTINS.items() if t.mutating} == {"shell", "write_file"}
    assert BUILTINS["shell"].approval_kind == "shell_command"
    assert BUILTINS["write_file"].approval_kind == "file_write"
    assert BUILTINS["shell"].schema()["name"] == "shell"
    builtin_tools().pop("shell")
    assert "shell" in builtin_tools()  # each call returns a fresh dict


def test_context_validation(tmp_path):
    with pytest.raises(ValueError):
        ToolContext(cwd=tmp_path, permission_mode="yolo")
    with pytest.raises(ValueError):
        ToolContext(cwd=tmp_path, unattended_policy="maybe")
    with pytest.raises(TypeError):
        ToolContext(cwd=str(tmp_path))
    ctx = ToolContext(cwd=tmp_path)
    assert (ctx.permission_mode, ctx.unattended_policy) == ("standard", "deny")
    assert ctx.output_cap_bytes == 64 * 1024
    assert ctx.kill_grace_s == 2.0


# -- validation -----------------------------------------------------------------------------------

_SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 10},
        "s": {"type": "string", "enum": ["a", "b"]},
        "f": {"type": "number", "default": 1.5},
    },
    "required": ["n"],
    "additionalProperties": False,
}


def test_validate_fills_defaults_and_converts_integral_floats():
    assert validate_args({"n": 2.0}, _SCHEMA) == {"n": 2, "f": 1.5}
    assert validate_args({"n": 3, "s": "a", "f": 2}, _SCHEMA) == {"n": 3, "s": "a", "f": 2}


@pytest.mark.parametrize(
    "args, field",
    [
        ({}, "n"),
        ({"n": None}, "n"),
        ({"n": "1"}, "n"),
        ({"n": True}, "n"),
        ({"n": 1.5}, "n"),
        ({"n": 0}, "n"),
        ({"n": 11}, "n"),
        ({"n": 1, "s": "c"}, "s"),
        ({"n": 1, "f": False}, "f"),
        ({"n": 1, "zzz": 1}, "zzz"),
        ([1], None),
    ],
)
def test_validate_names_the_bad_field(args, field):
    with pytest.raises(InvalidToolArguments) as info:
        validate_args(args, _SCHEMA)
    assert info.value.field == field
    assert isinstance(info.value, ToolError)


async def test_run_tool_invalid_arguments_result(tmp_path):
    tool, calls = _fake_tool(mutating=False)
    result = await run_tool(tool, {"x": "nope"}, _ctx(tmp_path))
    assert result.is_error
    assert result.metadata["invalid_field"] == "x"
    assert "'x'" in result.output
    assert calls == []


# -- permission matrix ----------------------------------------------------------------------------

_MATRIX = [
    # mode, mutating, approver answer (or "absent"), unattended policy, runs?, denied reason
    ("read_only", False, "absent", "deny", True, None),
    ("read_only", True, True, "allow", False, "read_only"),
    ("standard", False, "absent", "deny", True, None),
    ("standard", True, True, "deny", True, None),
    ("standard", True, False, "allow", False, "user"),
    ("standard", True, "absent", "deny", False, "unattended_policy"),
    ("standard", True, "absent", "allow", True, None),
    ("standard", True, None, "deny", False, "unattended_policy"),
    ("standard", True, None, "allow", True, None),
    ("unconfined", True, "absent", "deny", True, None),
    ("unconfined", True, False, "deny", True, None),
]


@pytest.mark.parametrize("mode, mutating, answer, policy, runs, denied", _MATRIX)
async def test_permission_matrix(tmp_path, mode, mutating, answer, policy, runs, denied):
    tool, calls = _fake_tool(mutating=mutating)
    approver = None if answer == "absent" else _Approver(answer)
    ctx = _ctx(tmp_path, permission_mode=mode, request_approval=approver, unattended_policy=policy)
    result = await run_tool(tool, {"x": 7}, ctx)
    assert bool(calls) == runs
    assert result.is_error == (not runs)
    assert result.metadata.get("denied") == denied
    if runs:
        assert result.output == "ran 7"
    else:
        assert result.output.startswith(("Refused", "Denied"))
    asked = approver.requests if approver is not None else []
    # Only standard mode asks, and only for mutating tools.
    assert bool(asked) == (mode == "standard" and mutating and approver is not None)


async def test_denial_messages_tell_the_model_why(tmp_path):
    tool, _ = _fake_tool(mutating=True)
    denied = await run_tool(tool, {"x": 1}, _ctx(tmp_path, permission_mode="standard",
                                                 request_approval=_Approver(False)))
    assert "did not approve" in denied.output
    unattended = await run_tool(tool, {"x": 1}, _ctx(tmp_path, permission_mode="standard"))
    assert "no client is attached" in unattended.output and "deny" in unattended.output
    assert "unconfined" in unattended.output  # and what would let it run
    # an origin that knows why it cannot be asked says that instead
    why = "the client that started this turn does not accept approval requests"
    unasked = await run_tool(tool, {"x": 1}, _ctx(tmp_path, permission_mode="standard", no_approver=why))
    assert why in unasked.output and "attached" not in unasked.output
    assert unasked.metadata["denied"] == "unattended_policy"
    refused = await run_tool(tool, {"x": 1}, _ctx(tmp_path, permission_mode="read_only"))
    assert "read_only" in refused.output


async def test_default_tool_action_fields(tmp_path):
    tool, _ = _fake_tool(mutating=True)
    approver = _Approver(True)
    await run_tool(tool, {"x": 5}, _ctx(tmp_path, permission_mode="standard", request_approval=approver))
    [(kind, fields)] = approver.requests
    assert kind == "tool_action"
    assert set(fields) == {"plugin", "action", "detail"}
    assert fields["action"] == "fake"
    assert '"x":5' in fields["detail"]


async def test_shell_approval_fields(tmp_path):
    approver = _Approver(False)
    ctx = _ctx(tmp_path, permission_mode="standard", request_approval=approver)
    result = await run_tool(BUILTINS["shell"], {"command": "touch f"}, ctx)
    assert result.metadata["denied"] == "user"
    assert approver.requests == [("shell_command", {"command": "touch f"})]
    assert not (tmp_path / "f").exists()


async def test_write_file_approval_fields(tmp_path):
    (tmp_path / "a.txt").write_text("old\n")
    approver = _Approver(True)
    ctx = _ctx(tmp_path, permission_mode="standard", request_approval=approver)
    with trio.fail_after(scaled(10)):
        result = await run_tool(BUILTINS["write_file"], {"path": "a.txt", "content": "new\n"}, ctx)
    assert not result.is_error
    [(kind, fields)] = approver.requests
    assert kind == "file_write"
    assert fields == {
        "plugin": "files",
        "action": "write_file",
        "path": str(tmp_path / "a.txt"),
        "oldContent": "old\n",
        "newContent": "new\n",
    }
    assert (tmp_path / "a.txt").read_text() == "new\n"


async def test_approval_failure_is_an_error_result(tmp_path):
    async def broken(kind, fields):
        raise RuntimeError("client went away")

    tool, calls = _fake_tool(mutating=True)
    ctx = _ctx(tmp_path, permission_mode="standard", request_approval=broken)
    result = await run_tool(tool, {"x": 1}, ctx)
    assert result.is_error and result.metadata["denied"] == "approval_failed"
    assert "client went away" in result.output
    assert calls == []


async def test_cancelled_approval_wait_propagates(tmp_path):
    started = trio.Event()

    async def slow(kind, fields):
        started.set()
        await trio.sleep_forever()

    tool, calls = _fake_tool(mutating=True)
    ctx = _ctx(tmp_path, permission_mode="standard", request_approval=slow)
    raised = []
    with trio.fail_after(scaled(5)):
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def call():
                with scope:
                    try:
                        await run_tool(tool, {"x": 1}, ctx)
                    except BaseException as exc:
                        raised.append(exc)
                        raise

            nursery.start_soon(call)
            await started.wait()
            scope.cancel()
    assert len(raised) == 1 and isinstance(raised[0], trio.Cancelled)
    assert calls == []


# -- tool failures --------------------------------------------------------------------------------


async def test_tool_error_becomes_error_result(tmp_path):
    tool, _ = _fake_tool(mutating=False, raises=ToolError("disk on fire"))
    result = await run_tool(tool, {"x": 1}, _ctx(tmp_path))
    assert result.is_error and result.output == "fake failed: disk on fire"


async def test_unexpected_exception_becomes_error_result(tmp_path):
    tool, _ = _fake_tool(mutating=False, raises=KeyError("k"))
    result = await run_tool(tool, {"x": 1}, _ctx(tmp_path))
    assert result.is_error
    assert "KeyError" in result.output
    assert result.metadata["exception"] == "KeyError"


async def test_cancelled_inside_tool_propagates(tmp_path):
    async def run(args, ctx):
        await trio.sleep_forever()

    tool = Tool(name="t", description="", parameters={"type": "object"}, mutating=False, run=run)
    with trio.move_on_after(0) as scope:  # not a deadline
        await run_tool(tool, {}, _ctx(tmp_path))
        pytest.fail("run_tool returned after cancellation")
    assert scope.cancelled_caught


# -- read_file ------------------------------------------------------------------------------------


async def _call(tmp_path: Path, name: str, args: dict, **kw) -> ToolResult:
    with trio.fail_after(scaled(10)):
        return await run_tool(BUILTINS[name], args, _ctx(tmp_path, **kw))


async def test_read_file_numbered_lines_with_offset_and_limit(tmp_path):
    (tmp_path / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    result = await _call(tmp_path, "read_file", {"path": "f.txt", "offset": 3, "limit": 2})
    assert not result.is_error
    assert result.output.splitlines()[:2] == ["     3\tline 3", "     4\tline 4"]
    assert "offset=5" in result.output
    assert result.metadata["total_lines"] == 10
    assert (result.metadata["start_line"], result.metadata["end_line"]) == (3, 4)
    assert result.metadata["truncated"] is True
    whole = await _call(tmp_path, "read_file", {"path": str(tmp_path / "f.txt")})
    assert len(whole.output.splitlines()) == 10
    assert whole.metadata["truncated"] is False


async def test_read_file_edge_cases(tmp_path):
    (tmp_path / "empty").write_text("")
    (tmp_path / "bin").write_bytes(b"\x7fELF\0\0\0")
    (tmp_path / "d").mkdir()
    (tmp_path / "crlf").write_bytes(b"a\r\nb\r\n")
    assert (await _call(tmp_path, "read_file", {"path": "empty"})).output == "[empty file]"
    past = await _call(tmp_path, "read_file", {"path": "crlf", "offset": 9})
    assert "past the end" in past.output
    assert (await _call(tmp_path, "read_file", {"path": "crlf"})).output == "     1\ta\n     2\tb"
    for path, text in [("missing", "No such file"), ("bin", "binary"), ("d", "directory")]:
        result = await _call(tmp_path, "read_file", {"path": path})
        assert result.is_error and text in result.output, path


async def test_read_file_output_cap(tmp_path):
    (tmp_path / "big").write_text("x" * 500 + "\n" * 1000)
    result = await _call(tmp_path, "read_file", {"path": "big"}, output_cap_bytes=300)
    assert result.metadata["truncated"] is True
    assert "output truncated" in result.output


# -- write_file -----------------------------------------------------------------------------------


async def test_write_file_creates_parents_and_diff(tmp_path):
    result = await _call(tmp_path, "write_file", {"path": "a/b/c.txt", "content": "one\ntwo\n"})
    assert not result.is_error
    assert (tmp_path / "a/b/c.txt").read_text() == "one\ntwo\n"
    assert result.metadata["created"] is True
    assert result.metadata["added"] == 2 and result.metadata["removed"] == 0
    assert "+++ b/a/b/c.txt" in result.metadata["diff"]
    assert result.output.startswith("created a/b/c.txt")


async def test_write_file_replaces_with_unified_diff_and_keeps_mode(tmp_path):
    target = tmp_path / "s.sh"
    target.write_text("#!/bin/sh\necho old\n")
    os.chmod(target, 0o750)
    result = await _call(tmp_path, "write_file", {"path": "s.sh", "content": "#!/bin/sh\necho new"})
    diff = result.metadata["diff"]
    assert diff.startswith("--- a/s.sh\n+++ b/s.sh\n")
    assert "-echo old\n" in diff and "+echo new\n\\ No newline at end of file\n" in diff
    assert (result.metadata["added"], result.metadata["removed"]) == (1, 1)
    assert result.metadata["created"] is False
    assert target.read_text() == "#!/bin/sh\necho new"
    assert target.stat().st_mode & 0o777 == 0o750
    assert not list(tmp_path.glob(".s.sh*"))  # no temp file left behind


async def test_write_file_onto_directory_is_an_error(tmp_path):
    (tmp_path / "d").mkdir()
    result = await _call(tmp_path, "write_file", {"path": "d", "content": "x"})
    assert result.is_error and "directory" in result.output


# -- list_dir -------------------------------------------------------------------------------------


async def test_list_dir(tmp_path):
    tmp_path = tmp_path / "ws"
    tmp_path.mkdir()
    (tmp_path / "b.txt").write_text("")
    (tmp_path / "a").mkdir()
    (tmp_path / "c").write_text("")
    result = await _call(tmp_path, "list_dir", {})
    assert result.output == "a/\nb.txt\nc"
    assert result.metadata["count"] == 3
    (tmp_path / "a" / "inner").write_text("")
    assert (await _call(tmp_path, "list_dir", {"path": "a"})).output == "inner"
    missing = await _call(tmp_path, "list_dir", {"path": "zzz"})
    assert missing.is_error and "No such file" in missing.output
    not_dir = await _call(tmp_path, "list_dir", {"path": "c"})
    assert not_dir.is_error and "not a directory" in not_dir.output


# -- search_files ---------------------------------------------------------------------------------


async def test_search_files_skips_git_and_binary(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("def alpha():\n    return 1\n# alpha again\n")
    (tmp_path / "notes.txt").write_text("nothing here\nALPHA upper\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("alpha in git\n")
    (tmp_path / "blob.bin").write_bytes(b"alpha\0\x01")
    result = await _call(tmp_path, "search_files", {"pattern": r"alpha"})
    assert result.output.splitlines() == ["src/m.py:1:def alpha():", "src/m.py:3:# alpha again"]
    assert result.metadata["matches"] == 2
    ci = await _call(tmp_path, "search_files", {"pattern": r"(?i)alpha", "path": "notes.txt"})
    assert ci.output == "notes.txt:2:ALPHA upper"


async def test_search_files_caps_matches(tmp_path):
    (tmp_path / "many.txt").write_text("hit\n" * 1000)
    result = await _call(tmp_path, "search_files", {"pattern": "hit"})
    assert result.metadata["matches"] == 200
    assert result.metadata["truncated"] is True
    assert "stopped at 200 matches" in result.output


async def test_search_files_errors(tmp_path):
    bad = await _call(tmp_path, "search_files", {"pattern": "("})
    assert bad.is_error and "invalid regular expression" in bad.output
    missing = await _call(tmp_path, "search_files", {"pattern": "x", "path": "nope"})
    assert missing.is_error and "does not exist" in missing.output
    none = await _call(tmp_path, "search_files", {"pattern": "zzz"})
    assert not none.is_error and none.output.startswith("[no matches")


async def test_read_only_mode_allows_reading_tools(tmp_path):
    (tmp_path / "f").write_text("hello\n")
    result = await _call(tmp_path, "read_file", {"path": "f"}, permission_mode="read_only")
    assert not result.is_error
    refused = await _call(tmp_path, "write_file", {"path": "f", "content": "x"}, permission_mode="read_only")
    assert refused.metadata["denied"] == "read_only"
    assert (tmp_path / "f").read_text() == "hello\n"


# -- output buffer --------------------------------------------------------------------------------


def test_output_buffer_keeps_head_and_tail():
    buf = tools.OutputBuffer(10)
    for chunk in (b"abc", b"defgh", b"ijklmnop", b"qr"):
        buf.add(chunk)
    assert buf.total_bytes == 18
    assert buf.truncated
    text = buf.text()
    assert text.startswith("abcde\n") and text.endswith("\nnopqr")
    assert "8 of 18 bytes omitted" in text
    small = tools.OutputBuffer(10)
    small.add(b"0123456789")
    assert not small.truncated and small.text() == "0123456789"
