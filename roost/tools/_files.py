"""File tools: ``read_file``, ``write_file``, ``list_dir`` and ``search_files``.

Paths in arguments are relative to ``ToolContext.cwd`` (absolute paths and ``~`` are accepted as
given). Blocking file-system work runs in a worker thread; OS errors become
:class:`roost.errors.ToolError` with a message for the model.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

import trio

from roost.errors import ToolError
from roost.tools._model import Tool, ToolContext, ToolResult
from roost.tools._output import cap_text

__all__ = ["READ_FILE", "WRITE_FILE", "LIST_DIR", "SEARCH_FILES", "resolve_path", "unified_diff"]

#: Bytes sniffed at the start of a file to tell binary (a NUL byte) from text.
_SNIFF_BYTES = 8192
#: Default and largest number of lines ``read_file`` returns.
_READ_DEFAULT_LINES = 2000
_READ_MAX_LINES = 100_000
#: Characters of one line shown by ``read_file`` / ``search_files`` before it is cut.
_LINE_CHARS = 2000
_MATCH_LINE_CHARS = 500
#: Most entries ``list_dir`` shows and most matches ``search_files`` returns.
_LIST_MAX_ENTRIES = 1000
_SEARCH_MAX_MATCHES = 200
#: Files larger than this (bytes) are skipped by ``search_files``.
_SEARCH_MAX_FILE_BYTES = 8 * 2**20
#: Directory names ``search_files`` never descends into.
_SKIP_DIRS = frozenset({".git", ".hg", ".svn"})


def resolve_path(ctx: ToolContext, path: str) -> Path:
    """Return ``path`` resolved against ``ctx.cwd`` (``~`` expanded; absolute paths kept)."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        p = ctx.cwd / p
    return Path(os.path.normpath(p))


def _os_error(action: str, path: Path, exc: OSError) -> ToolError:
    reason = exc.strerror or type(exc).__name__
    return ToolError(f"cannot {action} {str(path)!r}: {reason}")


def _is_binary(head: bytes) -> bool:
    return b"\0" in head


# -- read_file ----------------------------------------------------------------------------------


def _read_lines(path: Path, offset: int, limit: int) -> tuple[list[str], int]:
    """Return lines ``offset..offset+limit-1`` (1-based) and the file's total line count."""
    try:
        with open(path, "rb") as f:
            if _is_binary(f.read(_SNIFF_BYTES)):
                raise ToolError(f"{str(path)!r} is a binary file")
            f.seek(0)
            selected: list[str] = []
            total = 0
            for total, raw in enumerate(f, start=1):
                if offset <= total < offset + limit:
                    selected.append(raw.decode("utf-8", "replace").rstrip("\r\n"))
            return selected, total
    except IsADirectoryError as exc:
        raise ToolError(f"{str(path)!r} is a directory; use list_dir") from exc
    except OSError as exc:
        raise _os_error("read", path, exc) from exc


async def _read_file(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    path = resolve_path(ctx, args["path"])
    offset: int = args["offset"]
    limit: int = args["limit"]
    lines, total = await trio.to_thread.run_sync(_read_lines, path, offset, limit)
    body = []
    for number, line in enumerate(lines, start=offset):
        if len(line) > _LINE_CHARS:
            line = line[:_LINE_CHARS] + " [line cut]"
        body.append(f"{number:6}\t{line}")
    text = "\n".join(body)
    end = offset + len(lines) - 1
    if total == 0:
        text = "[empty file]"
    elif not lines:
        text = f"[offset {offset} is past the end of the file ({total} lines)]"
    elif end < total:
        text += f"\n[lines {offset}-{end} of {total}; read on with offset={end + 1}]"
    text, cut = cap_text(text, ctx.output_cap_bytes)
    return ToolResult(
        output=text,
        metadata={
            "path": str(path),
            "start_line": offset,
            "end_line": max(end, offset - 1),
            "total_lines": total,
            "truncated": cut or end < total,
        },
    )


READ_FILE = Tool(
    name="read_file",
    description=(
        "Read a text file. Returns numbered lines starting at line `offset` (1-based), at most "
        "`limit` lines. `path` is relative to the working directory."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the working directory."},
            "offset": {
                "type": "integer",
                "description": "First line to return (1-based).",
                "minimum": 1,
                "default": 1,
            },
            "limit": {
                "type": "integer",
                "description": "Most lines to return.",
                "minimum": 1,
                "maximum": _READ_MAX_LINES,
                "default": _READ_DEFAULT_LINES,
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    },
    mutating=False,
    run=_read_file,
)


# -- write_file ---------------------------------------------------------------------------------


def _read_old(path: Path) -> str | None:
    """Return the current text of ``path``, or None when it does not exist."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except IsADirectoryError as exc:
        raise ToolError(f"{str(path)!r} is a directory") from exc
    except OSError as exc:
        raise _os_error("read", path, exc) from exc
    return data.decode("utf-8", "replace")


def _write_atomic(path: Path, content: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = None
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            pass
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(content.encode("utf-8"))
            if mode is not None:
                os.chmod(tmp, mode)
            else:
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise _os_error("write", path, exc) from exc


def _display_path(ctx: ToolContext, path: Path) -> str:
    try:
        return str(path.relative_to(ctx.cwd))
    except ValueError:
        return str(path)


def unified_diff(old: str, new: str, name: str) -> tuple[str, int, int]:
    """Return the unified diff (difflib) of ``old`` -> ``new`` and its added/removed line counts."""
    lines = list(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{name}",
            tofile=f"b/{name}",
        )
    )
    added = sum(1 for x in lines if x.startswith("+") and not x.startswith("+++"))
    removed = sum(1 for x in lines if x.startswith("-") and not x.startswith("---"))
    diff = "".join(x if x.endswith("\n") else x + "\n\\ No newline at end of file\n" for x in lines)
    return diff, added, removed


async def _write_file(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    path = resolve_path(ctx, args["path"])
    content: str = args["content"]
    old = await trio.to_thread.run_sync(_read_old, path)
    await trio.to_thread.run_sync(_write_atomic, path, content)
    name = _display_path(ctx, path)
    diff, added, removed = unified_diff(old or "", content, name)
    verb = "created" if old is None else "wrote"
    return ToolResult(
        output=f"{verb} {name} ({len(content.encode('utf-8'))} bytes, +{added} -{removed} lines)",
        metadata={
            "path": str(path),
            "created": old is None,
            "diff": diff,
            "added": added,
            "removed": removed,
        },
    )


async def _write_file_approval(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    path = resolve_path(ctx, args["path"])
    old = await trio.to_thread.run_sync(_read_old, path)
    return {
        "plugin": "files",
        "action": "write_file",
        "path": str(path),
        "oldContent": old or "",
        "newContent": args["content"],
    }


WRITE_FILE = Tool(
    name="write_file",
    description=(
        "Write `content` to a text file, replacing it if it exists and creating missing parent "
        "directories. `path` is relative to the working directory."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the working directory."},
            "content": {"type": "string", "description": "The complete new content of the file."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    mutating=True,
    approval_kind="file_write",
    run=_write_file,
    approval_fields=_write_file_approval,
)


# -- list_dir -----------------------------------------------------------------------------------


def _list(path: Path) -> list[str]:
    try:
        with os.scandir(path) as it:
            entries = []
            for entry in it:
                try:
                    is_dir = entry.is_dir()
                except OSError:
                    is_dir = False
                entries.append(entry.name + ("/" if is_dir else ""))
    except NotADirectoryError as exc:
        raise ToolError(f"{str(path)!r} is not a directory") from exc
    except OSError as exc:
        raise _os_error("list", path, exc) from exc
    entries.sort()
    return entries


async def _list_dir(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    path = resolve_path(ctx, args["path"])
    entries = await trio.to_thread.run_sync(_list, path)
    shown = entries[:_LIST_MAX_ENTRIES]
    text = "\n".join(shown) if shown else "[empty directory]"
    if len(entries) > len(shown):
        text += f"\n[{len(entries) - len(shown)} more entries not shown]"
    return ToolResult(
        output=text,
        metadata={"path": str(path), "count": len(entries), "truncated": len(entries) > len(shown)},
    )


LIST_DIR = Tool(
    name="list_dir",
    description=(
        "List a directory's entries, sorted by name; directories end with '/'. `path` is "
        "relative to the working directory."
    ),
    parameters={
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "Directory path, relative to the working directory.",
                "default": ".",
            },
        },
        "required": [],
        "additionalProperties": False,
    },
    mutating=False,
    run=_list_dir,
)


# -- search_files -------------------------------------------------------------------------------


def _search(root: Path, regex: re.Pattern[str], stop: threading.Event) -> tuple[list[str], int, bool]:
    """Return ``(matches, files_scanned, capped)``; matches are ``relpath:line:text``."""
    matches: list[str] = []
    scanned = 0
    if root.is_file():
        walk: Any = [(str(root.parent), [], [root.name])]
        base = root.parent
    elif root.is_dir():
        walk = os.walk(root)
        base = root
    else:
        raise ToolError(f"{str(root)!r} does not exist")
    for dirpath, dirnames, filenames in walk:
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for filename in sorted(filenames):
            if stop.is_set():
                return matches, scanned, False
            full = os.path.join(dirpath, filename)
            try:
                if os.path.getsize(full) > _SEARCH_MAX_FILE_BYTES:
                    continue
                with open(full, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if _is_binary(data[:_SNIFF_BYTES]):
                continue
            scanned += 1
            rel = os.path.relpath(full, base)
            for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
                if regex.search(line):
                    if len(line) > _MATCH_LINE_CHARS:
                        line = line[:_MATCH_LINE_CHARS] + " [line cut]"
                    matches.append(f"{rel}:{number}:{line}")
                    if len(matches) >= _SEARCH_MAX_MATCHES:
                        return matches, scanned, True
    return matches, scanned, False


async def _search_files(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    try:
        regex = re.compile(args["pattern"])
    except re.error as exc:
        raise ToolError(f"invalid regular expression in 'pattern': {exc}") from exc
    root = resolve_path(ctx, args["path"])
    stop = threading.Event()
    try:
        matches, scanned, capped = await trio.to_thread.run_sync(_search, root, regex, stop, abandon_on_cancel=True)
    finally:
        stop.set()  # an abandoned walk stops at its next file
    text = "\n".join(matches) if matches else f"[no matches in {scanned} files]"
    if capped:
        text += f"\n[stopped at {_SEARCH_MAX_MATCHES} matches; narrow the pattern or path]"
    text, cut = cap_text(text, ctx.output_cap_bytes)
    return ToolResult(
        output=text,
        metadata={
            "path": str(root),
            "matches": len(matches),
            "files_scanned": scanned,
            "truncated": capped or cut,
        },
    )


SEARCH_FILES = Tool(
    name="search_files",
    description=(
        "Search text files under `path` for lines matching the regular expression `pattern` "
        "(Python syntax). Skips .git and binary files. Returns `path:line:text` per match."
    ),
    parameters={
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "A regular expression."},
            "path": {
                "type": "string",
                "description": "Directory or file to search, relative to the working directory.",
                "default": ".",
            },
        },
        "required": ["pattern"],
        "additionalProperties": False,
    },
    mutating=False,
    run=_search_files,
)
