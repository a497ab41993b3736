"""The registry of built-in tools."""

from __future__ import annotations

from roost.tools._files import LIST_DIR, READ_FILE, SEARCH_FILES, WRITE_FILE
from roost.tools._model import Tool
from roost.tools._shell import SHELL

__all__ = ["builtin_tools"]


def builtin_tools() -> dict[str, Tool]:
    """Return the built-in tools by model-facing name.

    Returns:
        A new dict ``{"shell", "read_file", "write_file", "list_dir", "search_files"} -> Tool``;
        callers may add or remove entries without affecting other callers.
    """
    return {tool.name: tool for tool in (SHELL, READ_FILE, WRITE_FILE, LIST_DIR, SEARCH_FILES)}
