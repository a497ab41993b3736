"""The protocol references in docs/ list exactly what the code handles and sends, so they can't drift.

- docs/app-server.md: the method tables == the handlers registered in the dispatcher; the
  unsupported table == ``UNSUPPORTED_METHODS``; the notification table == the notifications the
  code emits (found in the source) == the schema's notifications; the error table == every wire
  error code.
- docs/wire.md: every event ``type`` the wire dialects build (dict literals ``{"type": ...}`` in
  their source) is in an event table, and every event row is one the code builds; every field of
  every resource item type (``roost/protocol/_wire_types.py``, ``_wire_resources.py``) is named
  in "Item types".
- Links in README.md and docs/ point inside the repository.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import attrs

from roost.errors import PROTOCOL_ERRORS
from roost.protocol import _wire_resources, _wire_types
from roost.protocol._as_schema import (
    METHODS,
    NOTIFICATIONS,
    SERVER_REQUESTS,
    UNSUPPORTED_METHODS,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
ROW = re.compile(r"^\|\s*`([^`]+)`")
NOTIFICATION_NAME = re.compile(r"^(thread|turn|item|run|agent|mcp|config|approval)/[A-Za-z/_-]*[A-Za-z]$")
#: ``{"type": ...}`` values in JSON Schemas of tool parameters, not events.
SCHEMA_WORDS = {"object", "string", "array", "boolean", "number", "integer"}


def sections(path: Path, level: str = "## ") -> dict[str, str]:
    """Heading text -> the text under it (up to the next heading of the same or a higher level)."""
    out: dict[str, str] = {}
    current = None
    for line in path.read_text().splitlines():
        if line.startswith(level) or (line.startswith("#") and len(line) - len(line.lstrip("#")) < len(level) - 1):
            current = line.lstrip("#").strip()
            out[current] = ""
        elif current is not None:
            out[current] += line + "\n"
    return out


def table_names(text: str) -> set[str]:
    """The backticked first cell of each table row."""
    return {m.group(1) for line in text.splitlines() if (m := ROW.match(line))}


def source_constants(paths: list[Path]) -> set[str]:
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return found


def event_types(paths: list[Path]) -> set[str]:
    """The ``type`` values of the dict literals in ``paths``."""
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value == "type" and isinstance(value, ast.Constant) \
                            and isinstance(value.value, str):
                        found.add(value.value)
    return found - SCHEMA_WORDS


# -- app-server -------------------------------------------------------------------------------------

def test_app_server_methods_match_the_dispatcher() -> None:
    parts = sections(DOCS / "app-server.md", "### ")
    documented = table_names(parts["Initialization"])
    for heading in ("Threads", "Turns and pending input", "Runs", "Model selection and engines", "Usage",
                    "Background processes"):
        documented |= table_names(parts[heading])
    assert documented == set(METHODS), (documented ^ set(METHODS))
    assert table_names(parts["Unsupported methods"]) == set(UNSUPPORTED_METHODS)


def test_app_server_notifications_match_the_code() -> None:
    sources = [p for p in sorted((ROOT / "roost").rglob("*.py"))
               if p.name not in ("_as_schema.py", "_as_schema_defs.py")]  # not the schema's own lists
    code = {c for c in source_constants(sources) if NOTIFICATION_NAME.match(c)}
    emitted = code - set(METHODS) - set(UNSUPPORTED_METHODS) - set(SERVER_REQUESTS)
    parts = sections(DOCS / "app-server.md")
    documented = table_names(parts["Notifications"])
    assert emitted <= documented, f"sent but not documented: {sorted(emitted - documented)}"
    assert documented == set(NOTIFICATIONS), documented ^ set(NOTIFICATIONS)
    assert table_names(parts["Server-initiated requests"]) == set(SERVER_REQUESTS)


def test_app_server_error_codes_match_the_code() -> None:
    assert table_names(sections(DOCS / "app-server.md")["Errors"]) == set(PROTOCOL_ERRORS)


# -- wire -------------------------------------------------------------------------------------------

WIRE_SOURCES = [
    *sorted((ROOT / "roost" / "protocol").glob("_repl*.py")),
    ROOT / "roost" / "protocol" / "_bridge.py",
    ROOT / "roost" / "protocol" / "_serve_daemon.py",
    ROOT / "roost" / "protocol" / "_serve_input.py",
    ROOT / "roost" / "protocol" / "_a2a_host.py",
    ROOT / "roost" / "protocol" / "_serve_events.py",
    ROOT / "roost" / "orchestration" / "_run.py",
]
EVENT_SECTIONS = ("Stdio chat events (`roost repl --vscode`)", "Run bridge events (`roost run --bridge`)",
                  "Daemon events (`roost serve`)", "Prompts")


def test_wire_event_types_match_the_code() -> None:
    parts = sections(DOCS / "wire.md", "### ")
    events = set().union(*(table_names(parts[h]) for h in EVENT_SECTIONS))
    inputs = table_names(parts["Input lines (client to Roost)"])
    kinds = {"shell_command", "tool_action", "file_write", "route_approval"}
    code = event_types(WIRE_SOURCES)
    assert code <= events | inputs, f"sent but not documented: {sorted(code - events - inputs)}"
    assert events - kinds <= code, f"documented but never sent: {sorted(events - kinds - code)}"
    assert "`listening`" in (DOCS / "wire.md").read_text()


def test_wire_item_types_document_every_field() -> None:
    text = sections(DOCS / "wire.md", "### ")["Item types"]
    missing = []
    for module in (_wire_types, _wire_resources):
        missing += _undocumented_fields(module, text)
    assert not missing, missing


def _undocumented_fields(module: Any, text: str) -> list[str]:
    missing = []
    for name in module.__all__:
        cls = getattr(module, name)
        if not (isinstance(cls, type) and attrs.has(cls)):
            continue
        for field in attrs.fields(cls):
            if f"`{_wire_types.camel(field.name)}`" not in text:
                missing.append(f"{name}.{_wire_types.camel(field.name)}")
    return missing


# -- links ------------------------------------------------------------------------------------------

def test_links_stay_inside_the_repository() -> None:
    for path in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = path.read_text()
        assert "../shared" not in text, path
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            assert (path.parent / target).resolve().is_relative_to(ROOT), (path, target)
            assert (path.parent / target).exists(), (path, target)
