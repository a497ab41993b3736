"""Hop timestamps of an interrupt, for latency work under load (issue 19).

Off unless ``ROOST_TRACE_HOPS`` names a file (read once, at import). Then :func:`hop` appends one
JSON line per hop, ``{"hop": NAME, "turn": TURN_ID, "t": SECONDS}``, where ``t`` is
``time.monotonic()``: ``CLOCK_MONOTONIC`` on Linux, the clock of a client's ``time.monotonic()``
and ``time.perf_counter()`` on the same machine, so a client can place each hop between its own
write of ``turn/interrupt`` and its read of the terminal notification
(``benchmarks/bench_appserver.py --trace-hops``). The hops, in the order an interrupt takes them:

``interrupt_read``
    the app-server's reader has the ``turn/interrupt`` request (``turn``: its ``turn_id``, if any);
``turn_cancelled``
    the turn's cancel scope is cancelled;
``turn_unwound``
    the turn's body has unwound and its clean-up starts;
``settle_begin`` / ``settle_end``
    the write persisting the turn's end is submitted / has committed (or failed);
``terminal_emitted``
    the terminal ``turn/completed`` is queued for the clients.

Session 27 traced these hops under the peers harness's saturated phase and found the cancel
waiting for httpcore's clean-up and the settle write for the worker thread (docs/operations.md,
"Tracing an interrupt"). A failure to open or write the file is logged once and turns tracing off.
"""

from __future__ import annotations

import json
import os
import time
from typing import TextIO

__all__ = ["TRACE_ENV", "enabled", "hop"]

#: The environment variable naming the trace file.
TRACE_ENV = "ROOST_TRACE_HOPS"

_path: str | None = os.environ.get(TRACE_ENV) or None
_file: TextIO | None = None


def enabled() -> bool:
    """Whether hops are being traced (``ROOST_TRACE_HOPS`` set and the file writable so far)."""
    return _path is not None


def hop(name: str, turn: str | None) -> None:
    """Append hop ``name`` of turn ``turn`` (None: unknown) with the time now; nothing when off.

    Never raises: an OSError is logged once and turns tracing off for the process.
    """
    global _file, _path
    if _path is None:
        return
    try:
        if _file is None:
            _file = open(_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (kept open: one line a hop)
        _file.write(json.dumps({"hop": name, "turn": turn, "t": time.monotonic()}) + "\n")
    except OSError as exc:
        import logging  # (not at import: the start-up of a command loads logging only if it logs)

        logging.getLogger("roost").warning("%s: cannot write %s (%s); hop tracing is off", TRACE_ENV, _path, exc)
        _path = None
