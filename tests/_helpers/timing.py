"""Test deadlines that scale with the machine's load: one environment variable for the whole suite.

``ROOST_TEST_TIMEOUT_SCALE`` (a positive float, default 1) multiplies every deadline the test
helpers hold (``fail_after`` around waits on the real ``roost`` command, shutdown grace periods).
A loaded or slow machine sets it to 2 or 3 instead of turning the suite flaky::

    ROOST_TEST_TIMEOUT_SCALE=3 python3 scripts/dev.py test

Deadlines are bounds on waits that synchronise on events; they never decide a test's outcome by
themselves, so scaling them up only makes a hung test take longer to report.
"""

from __future__ import annotations

import os

__all__ = ["TIMEOUT_SCALE", "scaled"]


def _scale() -> float:
    raw = os.environ.get("ROOST_TEST_TIMEOUT_SCALE", "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        raise RuntimeError(f"ROOST_TEST_TIMEOUT_SCALE must be a positive number, not {raw!r}") from None
    if not value > 0:
        raise RuntimeError(f"ROOST_TEST_TIMEOUT_SCALE must be a positive number, not {raw!r}")
    return value


#: The factor applied to every helper deadline (read once, at import).
TIMEOUT_SCALE = _scale()


def scaled(seconds: float) -> float:
    """``seconds`` times ``ROOST_TEST_TIMEOUT_SCALE`` (the deadline to use on this machine)."""
    return seconds * TIMEOUT_SCALE
