"""The ``roost`` command line (click). Each sub-command lives in its own private module."""

from __future__ import annotations

from roost.cli._main import main

from roost.cli._render import silence_stdout as silence_stdout

__all__ = [
    "silence_stdout",
"main"]
