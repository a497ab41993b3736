"""The ``roost`` command line (click). Each sub-command lives in its own private module."""

from __future__ import annotations

from roost.cli._main import main

__all__ = ["main"]
