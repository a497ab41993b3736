"""Handing freed heap memory back to the operating system after a large reply (issue 18, finding 5).

CPython returns the buffers of a large reply (its deltas, the joined text, the encoded rows and
lines) to the C allocator, which keeps them mapped: glibc grows its heaps and per-thread arenas and
gives pages back only from the top of the main heap. :func:`release_memory` calls glibc's
``malloc_trim(0)``, which returns every free page of every arena (``madvise``), so the resident size
falls back once a large reply has settled. It is a no-op off Linux or without glibc. One call costs
about a millisecond per 100 MiB of heap, so callers use it after a large reply, never per line:
:func:`note_large_output` is that rule for a turn's output.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable

__all__ = ["LARGE_OUTPUT_BYTES", "note_large_output", "release_memory"]

#: A turn output (characters of text) at least this long trims the heap when the turn ends (1 MiB).
LARGE_OUTPUT_BYTES = 1 << 20


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_memory() -> None:
    """Hand freed heap memory back to the OS (glibc ``malloc_trim(0)``; a no-op elsewhere).

    Source: glibc manual, ``malloc_trim`` (since 2.8 it releases free pages of all arenas).
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def note_large_output(chars: int) -> bool:
    """Trim the heap when a finished output of ``chars`` characters was large; return whether it did."""
    if chars < LARGE_OUTPUT_BYTES:
        return False
    release_memory()
    return True
