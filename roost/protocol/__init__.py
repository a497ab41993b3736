"""Wire types, JSONL framing, the two dialects and their transports (DESIGN.md section 3).

Public names are re-exported here from the private modules that define them.
"""

from __future__ import annotations

from roost.protocol._framing import DEFAULT_MAX_LINE_BYTES as DEFAULT_MAX_LINE_BYTES
from roost.protocol._framing import Frame as Frame
from roost.protocol._framing import FrameError as FrameError
from roost.protocol._framing import JsonlWriter as JsonlWriter
from roost.protocol._framing import LineDecoder as LineDecoder
from roost.protocol._framing import line_limit as line_limit
from roost.protocol._framing import open_stdio_stream as open_stdio_stream
from roost.protocol._framing import read_frames as read_frames

__all__ = [
    "DEFAULT_MAX_LINE_BYTES",
    "Frame",
    "FrameError",
    "JsonlWriter",
    "LineDecoder",
    "line_limit",
    "open_stdio_stream",
    "read_frames",
]

for _name in ("FrameError", "JsonlWriter", "LineDecoder", "line_limit", "open_stdio_stream", "read_frames"):
    globals()[_name].__module__ = __name__
del _name
