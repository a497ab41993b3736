"""Small shared helpers for the scripts in ``benchmarks/``: memory, CPU time, percentiles, output.

Every benchmark script prints exactly one JSON line of figures to stdout (:func:`emit`); anything
else (progress, warnings) goes to stderr. Its module docstring says what the line holds (an
"Output" part naming each field and its unit) and its ``--help`` shows that docstring as written
(:func:`arg_parser`).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from collections.abc import Sequence
from typing import Any

from roost._json import dumps_line

__all__ = ["arg_parser", "at_least_one", "peak_rss_bytes", "current_rss_bytes", "cpu_seconds", "percentile", "emit"]

_PAGE = os.sysconf("SC_PAGE_SIZE")


def arg_parser(doc: str | None, **kwargs: Any) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` whose ``--help`` shows the script's docstring ``doc`` as written (its
    field lists unwrapped), so that it says what each field of the JSON line means, in which unit."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)


def at_least_one(parser: argparse.ArgumentParser, **sizes: int) -> None:
    """Exit with ``parser``'s usage error (status 2) naming the first of ``sizes`` (option name,
    ``_`` for ``-``: value) below 1; a size of 0 or less would hang or divide by zero later."""
    for name, value in sizes.items():
        if value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, not {value}")


def peak_rss_bytes() -> int:
    """Return this process's peak resident set size in bytes (``getrusage`` ``ru_maxrss``).

    Linux reports ``ru_maxrss`` in KiB, macOS in bytes; both are converted to bytes.
    """
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def current_rss_bytes() -> int:
    """Return this process's current resident set size in bytes (``/proc/self/statm``, Linux).

    Falls back to :func:`peak_rss_bytes` where ``/proc`` is missing (the figure is then a peak).
    """
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return peak_rss_bytes()


def cpu_seconds() -> float:
    """Return the CPU time (user + system) this process has used so far, in seconds."""
    return time.process_time()


def percentile(values: Sequence[float], p: float) -> float:
    """Return the ``p``-th percentile of ``values`` by linear interpolation between ranks.

    Args:
        values: the samples (any order; not modified).
        p: the percentile, 0 to 100 inclusive.

    Returns:
        The interpolated value (same unit as the samples).

    Raises:
        ValueError: ``values`` is empty or ``p`` is outside 0..100.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"p must be within 0..100, got {p!r}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def emit(figures: dict[str, Any]) -> None:
    """Write ``figures`` as the script's one JSON line on stdout and flush it."""
    sys.stdout.buffer.write(dumps_line(figures))
    sys.stdout.flush()
