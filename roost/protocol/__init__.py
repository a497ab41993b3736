"""Wire types, JSONL framing, the two dialects and their transports (DESIGN.md section 3).

Public names are re-exported here from the private modules that define them, on first access
(PEP 562, :mod:`roost._lazy`): the framing imports trio, and ``roost sessions --json`` (which
uses only the wire types) should not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roost._lazy import attach as _attach

if TYPE_CHECKING:
    from roost.protocol._framing import DEFAULT_MAX_LINE_BYTES as DEFAULT_MAX_LINE_BYTES
    from roost.protocol._framing import Frame as Frame
    from roost.protocol._framing import FrameError as FrameError
    from roost.protocol._framing import JsonlWriter as JsonlWriter
    from roost.protocol._framing import LineDecoder as LineDecoder
    from roost.protocol._framing import open_stdio_stream as open_stdio_stream
    from roost.protocol._framing import read_frames as read_frames

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "Frame",
    "FrameError",
    "JsonlWriter",
    "LineDecoder",
    "open_stdio_stream",
    "read_frames",
]

_LAZY = {name: "roost.protocol._framing" for name in __all__}
_RENAMED = ("FrameError", "JsonlWriter", "LineDecoder", "open_stdio_stream", "read_frames")


def _fix_module_metadata(names: list[str]) -> None:
    for name in names:
        if name in _RENAMED:
            globals()[name].__module__ = __name__


__getattr__, __dir__ = _attach(globals(), _LAZY, on_load=_fix_module_metadata)
