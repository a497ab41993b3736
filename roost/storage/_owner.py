"""The lease owner identity of a process (trio-free: ``roost app-server`` reports it in its
early ``initialize`` answer, before the event loop exists)."""

from __future__ import annotations

import os
import uuid

from .leases import hostname

__all__ = ["default_owner"]


def default_owner() -> str:
    """Return a lease owner identity unique to this process: ``"<host>:<pid>:<8 hex>"``."""
    return f"{hostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
