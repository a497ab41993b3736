"""Shared pieces of the soak suite: iteration counts, the one-line JSON report, process helpers.

``ROOST_SOAK_ITERATIONS`` sets how many iterations each soak test runs (default 2: the short
version that the ordinary test command runs in well under a minute); the README shows the long run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

#: Iterations per soak test (``ROOST_SOAK_ITERATIONS``; 2 for the short run).
ITERATIONS = max(1, int(os.environ.get("ROOST_SOAK_ITERATIONS") or 2))


def alive(pid: int) -> bool:
    """True while ``pid`` runs (zombies count as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def marked_processes(tag: str) -> list[int]:
    """Pids of running tool commands of a run: ``SOAK_TAG=<tag>`` and a ``ROOST_TOOL_MARK`` in their
    environment (Roost itself carries the tag but no marker)."""
    needle = f"SOAK_TAG={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        fields = environ.split(b"\0")
        if needle in fields and any(f.startswith(b"ROOST_TOOL_MARK=") for f in fields) and alive(int(entry)):
            found.append(int(entry))
    return found


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` in bytes (``/proc/<pid>/statm``)."""
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
