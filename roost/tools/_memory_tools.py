"""Memory and context: typed memory entries per agent, imported reference material per project.

Both live in the store's ``memory`` table (``scope``, ``key``, JSON ``value``):

* **Memory** (wire-protocol.md "Memory"): scope ``memory`` is the shared store, scope
  ``memory:agent:<name>`` an agent's own; the key is the entry's name and the value
  ``{guid, name, type, description, body}`` with type one of :data:`MEMORY_TYPES`.
* **Context** (wire-protocol.md "ContextItem"): scope ``context:<absolute project dir>``, key the
  item's name, value ``{description, sourcePath, importedAt, files: [{relativePath, sizeBytes}]}``;
  each file's text is kept under scope ``context-files:<project dir>`` and key
  ``<name>/<relativePath>`` as ``{"text": ..., "binary": bool}``.

The data functions (``*_rows`` readers, ``*_write`` writers) take a connection of either backend like the
storage room's functions: pass writers to ``store.writer.submit`` or call them under
``store.transaction()``; call readers on ``store.read()``. :func:`memory_tools` builds the
model-facing tools ``memory_save``, ``memory_recall`` and ``context_read`` (not mutating: they only
change Roost's own store). A tool call's memory scope is its ``ToolContext.agent`` (the orchestration
agent running it), else the ``agent`` the tools were built for, else the shared store; recalling
reads the agent's own entries and the shared ones.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import trio

from roost.errors import ToolError
from roost.storage import (
    delete_memory,
    delete_memory_prefix,
    list_memory,
    memory_scope_counts,
    memory_value,
    put_memory,
    scope_has_memory,
    utc_now,
)
from roost.tools._model import Tool, ToolContext, ToolResult
from roost.tools._output import cap_text

__all__ = [
    "MEMORY_TYPES",
    "SHARED_MEMORY_SCOPE",
    "memory_scope",
    "context_scope",
    "context_files_scope",
    "save_memory",
    "memory_entries",
    "memory_agents",
    "forget_memory",
    "scan_context_dir",
    "import_context",
    "context_items",
    "remove_context",
    "read_context_file",
    "recall_entries",
    "memory_tools",
    "MAX_CONTEXT_BYTES",
]

#: The memory types of wire-protocol.md "Memory".
MEMORY_TYPES = ("user", "feedback", "project", "reference")
SHARED_MEMORY_SCOPE = "memory"
_AGENT_PREFIX = "memory:agent:"
#: Most bytes one context import may hold (all files together): 64 MiB.
MAX_CONTEXT_BYTES = 64 * 2**20
_SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".roost"})
_SNIFF = 8192


def memory_scope(agent: str | None) -> str:
    """Return the memory scope of ``agent`` (``None``: the shared store)."""
    return SHARED_MEMORY_SCOPE if not agent else _AGENT_PREFIX + agent


def context_scope(project: Path | str) -> str:
    """Return the context scope of a project directory (made absolute)."""
    return "context:" + os.path.abspath(project)


def context_files_scope(project: Path | str) -> str:
    """Return the scope holding the text of a project's context files."""
    return "context-files:" + os.path.abspath(project)


# -- memory -------------------------------------------------------------------------------------


def save_memory(conn: Any, *, agent: str | None, name: str, type: str, description: str, body: str) -> dict[str, Any]:
    """Insert or replace the entry ``name`` of ``agent``'s store (write); a replaced entry keeps its guid.

    Returns:
        The stored value ``{guid, name, type, description, body}``.

    Raises:
        ToolError: an empty name or an unknown type.
    """
    name = name.strip()
    if not name:
        raise ToolError("a memory needs a non-empty name")
    if type not in MEMORY_TYPES:
        raise ToolError(f"memory type must be one of {', '.join(MEMORY_TYPES)}, not {type!r}")
    scope = memory_scope(agent)
    _, old = memory_value(conn, scope, name)
    guid = old.get("guid") if isinstance(old, dict) else None
    value = {"guid": guid or str(uuid.uuid4()), "name": name, "type": type, "description": description, "body": body}
    put_memory(conn, scope, name, value)
    return value


def memory_entries(conn: Any, agent: str | None) -> list[dict[str, Any]]:
    """Return ``agent``'s entries ``{guid, name, type, description, body}`` by name (read-only)."""
    out = []
    for entry in list_memory(conn, memory_scope(agent)):
        value = entry.value if isinstance(entry.value, dict) else {"body": str(entry.value)}
        out.append(
            {
                "guid": str(value.get("guid") or entry.id),
                "name": str(value.get("name") or entry.key),
                "type": str(value.get("type") or "reference"),
                "description": str(value.get("description") or ""),
                "body": str(value.get("body") or ""),
            }
        )
    return out


def memory_agents(conn: Any) -> list[tuple[str, int]]:
    """Return ``(agent, count)`` for each agent with at least one memory, by name (read-only)."""
    return memory_scope_counts(conn, _AGENT_PREFIX)


def forget_memory(conn: Any, *, agent: str | None, name: str) -> bool:
    """Delete the entry ``name`` of ``agent``'s store (write). Returns whether there was one."""
    return delete_memory(conn, memory_scope(agent), name)


# -- context ------------------------------------------------------------------------------------


def scan_context_dir(source: Path) -> list[tuple[str, Path, int]]:
    """Return ``(relative_path, path, size_bytes)`` of each regular file under ``source`` (blocking).

    ``source`` may be one file. Version-control and cache directories are skipped, as are symbolic
    links. Sorted by relative path (``/`` separators).

    Raises:
        ToolError: ``source`` does not exist, or the files exceed :data:`MAX_CONTEXT_BYTES`.
    """
    source = source.resolve()
    if source.is_file():
        found = [(source.name, source, source.stat().st_size)]
    elif source.is_dir():
        found = []
        for root, dirs, files in os.walk(source):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
            for fname in files:
                path = Path(root) / fname
                if path.is_symlink() or not path.is_file():
                    continue
                found.append((path.relative_to(source).as_posix(), path, path.stat().st_size))
        found.sort()
    else:
        raise ToolError(f"{str(source)!r} does not exist")
    total = sum(size for _, _, size in found)
    if total > MAX_CONTEXT_BYTES:
        raise ToolError(f"{str(source)!r} holds {total} bytes, more than the {MAX_CONTEXT_BYTES} a context item may")
    return found


def import_context(
    conn: Any,
    *,
    project: Path,
    name: str,
    description: str | None,
    source: Path,
    files: list[tuple[str, bytes]],
    replace: bool = False,
) -> dict[str, Any]:
    """Store a context item and its files' text (write).

    Args:
        project: the project directory (scopes the item).
        files: ``(relative_path, content bytes)``; text is decoded as UTF-8 (invalid bytes
            replaced); a file with a NUL byte in its first 8 KiB is recorded as binary, without text.
        replace: replace an item of the same name instead of failing.

    Returns:
        The manifest ``{description, sourcePath, importedAt, files: [{relativePath, sizeBytes}]}``.

    Raises:
        ToolError: the name is empty or taken (without ``replace``).
    """
    name = name.strip()
    if not name or "/" in name:
        raise ToolError("a context item needs a non-empty name without '/'")
    scope = context_scope(project)
    exists, _ = memory_value(conn, scope, name)
    if exists and not replace:
        raise ToolError(f"context item {name!r} exists (remove it first, or use --force)")
    remove_context(conn, project=project, name=name)
    manifest = {
        "description": description,
        "sourcePath": str(source.resolve()),
        "importedAt": utc_now(),
        "files": [{"relativePath": rel, "sizeBytes": len(data)} for rel, data in files],
    }
    put_memory(conn, scope, name, manifest)
    fscope = context_files_scope(project)
    for rel, data in files:
        binary = b"\0" in data[:_SNIFF]
        put_memory(
            conn,
            fscope,
            f"{name}/{rel}",
            {"text": None if binary else data.decode("utf-8", "replace"), "binary": binary},
        )
    return manifest


def context_items(conn: Any, project: Path) -> list[tuple[str, dict[str, Any]]]:
    """Return ``(name, manifest)`` of a project's context items by name (read-only)."""
    return [(e.key, e.value if isinstance(e.value, dict) else {}) for e in list_memory(conn, context_scope(project))]


def remove_context(conn: Any, *, project: Path, name: str) -> bool:
    """Remove a context item and its files' text (write). Returns whether the item existed."""
    existed = delete_memory(conn, context_scope(project), name)
    prefix = f"{name}/"
    delete_memory_prefix(conn, context_files_scope(project), prefix)
    return existed


def read_context_file(conn: Any, project: Path, name: str, relative_path: str) -> dict[str, Any] | None:
    """Return ``{"text", "binary"}`` of one context file, or ``None`` (read-only)."""
    _, value = memory_value(conn, context_files_scope(project), f"{name}/{relative_path}")
    return value if isinstance(value, dict) else None


# -- tools --------------------------------------------------------------------------------------


def _project_with_context(conn: Any, cwd: Path) -> Path:
    """The nearest of ``cwd`` and its parents that has context items (else ``cwd``)."""
    for candidate in (cwd, *cwd.parents):
        if scope_has_memory(conn, context_scope(candidate)):
            return candidate
    return cwd


def recall_entries(conn: Any, agent: str | None) -> list[dict[str, Any]]:
    """Return the entries ``agent`` recalls: its own, then the shared ones it does not shadow (read-only).

    An agent sees its own store (scope ``memory:agent:<name>``) and the shared one (scope
    ``memory``): the shared store is where people put what every agent should know (``roost memory``
    without ``--agent``), so an agent recalling only its own entries would miss it. An own entry hides
    a shared entry of the same name. With ``agent`` None only the shared store is read.

    Returns:
        ``{guid, name, type, description, body, shared: bool}`` dicts: the agent's own entries by
        name, then the shared ones by name.
    """
    own = [{**e, "shared": False} for e in memory_entries(conn, agent)] if agent else []
    names = {e["name"] for e in own}
    shared = [{**e, "shared": True} for e in memory_entries(conn, None) if e["name"] not in names]
    return own + shared


def _matches(entry: dict[str, Any], words: list[str], kind: str | None) -> bool:
    """Whether ``entry`` has type ``kind`` (any when empty) and contains every one of ``words``."""
    if kind and entry["type"] != kind:
        return False
    haystack = f"{entry['name']} {entry['description']} {entry['body']}".lower()
    return all(w in haystack for w in words)


def _format_entry(entry: dict[str, Any]) -> str:
    """One recalled entry as Markdown: ``## name (type[, shared])``, description, body."""
    label = f"{entry['type']}, shared" if entry.get("shared") else entry["type"]
    return f"## {entry['name']} ({label})\n{entry['description']}\n\n{entry['body']}"


def memory_tools(store: Any, *, agent: str | None = None) -> dict[str, Tool]:
    """Return the tools ``memory_save``, ``memory_recall`` and ``context_read`` by name.

    Args:
        store: the running :class:`roost.storage.Store` (its writer must be running: saves go
            through ``store.writer.submit``; reads use ``store.read()`` in a worker thread).
        agent: whose memory the tools use when a call's ``ToolContext.agent`` is None (``None``:
            the shared store). Each call uses ``ctx.agent`` first, so one set of tools registered
            for a whole runtime serves every orchestration agent with its own memory.
            ``memory_save`` writes to that agent's store; ``memory_recall`` reads it and the shared
            store (see :func:`recall_entries`). Context is found from the call's
            ``ToolContext.cwd`` (the nearest directory, going up, with imported context).

    Cancellation: a cancelled save may still commit (the writer owns the transaction); reads are
    abandoned.
    """

    def agent_of(ctx: ToolContext) -> str | None:
        return ctx.agent or agent or None

    async def read(fn: Any, *args: Any) -> Any:
        def run() -> Any:
            with store.read() as conn:
                return fn(conn, *args)

        return await trio.to_thread.run_sync(run, abandon_on_cancel=True)

    async def save(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        who = agent_of(ctx)
        value = await store.writer.submit(
            lambda conn: save_memory(
                conn,
                agent=who,
                name=args["name"],
                type=args["type"],
                description=args.get("description") or "",
                body=args["body"],
            )
        )
        return ToolResult(
            output=f"saved memory {value['name']!r} ({value['type']})", metadata={"guid": value["guid"], "agent": who}
        )

    async def recall(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        entries = await read(recall_entries, agent_of(ctx))
        words = (args.get("query") or "").lower().split()
        hits = [e for e in entries if _matches(e, words, args.get("type"))]
        if not hits:
            return ToolResult(output="no matching memories")
        text = "\n\n".join(_format_entry(e) for e in hits)
        return ToolResult(output=cap_text(text, ctx.output_cap_bytes)[0])

    async def context_read(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        def run() -> str:
            with store.read() as conn:
                return _read_context(conn, ctx.cwd, args)

        text = await trio.to_thread.run_sync(run, abandon_on_cancel=True)
        return ToolResult(output=cap_text(text, ctx.output_cap_bytes)[0])

    tools = _memory_tool_specs(save, recall, context_read)
    return {t.name: t for t in tools}


def _memory_tool_specs(save: Any, recall: Any, context_read: Any) -> list[Tool]:
    """The three tools around their ``run`` functions: names, descriptions, parameter schemas."""
    string = {"type": "string"}
    tools = [
        Tool(
            name="memory_save",
            mutating=False,
            run=save,
            description=(
                "Remember something for later sessions. type: user (about the user), feedback (how to "
                "work), project (facts about this project) or reference (where to find things)."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "A short unique name; saving it again replaces it."},
                    "type": {"type": "string", "enum": list(MEMORY_TYPES)},
                    "description": {"type": "string", "description": "A one-line summary."},
                    "body": string,
                },
                "required": ["name", "type", "body"],
            },
        ),
        Tool(
            name="memory_recall",
            mutating=False,
            run=recall,
            description=(
                "Recall remembered entries (your own and the shared ones); all of them, or those "
                "matching every word of query (and type, when given)."
            ),
            parameters={
                "type": "object",
                "properties": {"query": string, "type": {"type": "string", "enum": list(MEMORY_TYPES)}},
            },
        ),
        Tool(
            name="context_read",
            mutating=False,
            run=context_read,
            description=(
                "Read reference material imported into this project's context: without name, list the "
                "items; with name, list its files; with name and path, read one file."
            ),
            parameters={"type": "object", "properties": {"name": string, "path": string}},
        ),
    ]
    return tools


def _read_context(conn: Any, cwd: Any, args: dict[str, Any]) -> str:
    """``context_read``'s answer: the project's context items, an item's files, or one file.

    Raises:
        ToolError: no such item or file, or a binary file.
    """
    project = _project_with_context(conn, cwd.resolve())
    items = dict(context_items(conn, project))
    name, path = args.get("name"), args.get("path")
    if not name:
        if not items:
            return "no context has been imported for this project"
        return "\n".join(
            f"{n}: {m.get('description') or ''} ({len(m.get('files') or [])} files)" for n, m in items.items()
        )
    if name not in items:
        raise ToolError(f"no context item {name!r}; known: {', '.join(items) or 'none'}")
    if not path:
        return "\n".join(f"{f['relativePath']} ({f['sizeBytes']} bytes)" for f in items[name].get("files") or [])
    content = read_context_file(conn, project, name, path)
    if content is None:
        raise ToolError(f"no file {path!r} in context item {name!r}")
    if content.get("binary"):
        raise ToolError(f"{path!r} in context item {name!r} is a binary file")
    return content.get("text") or ""
