"""The JSONL line decoder: ``--lines`` small JSON lines fed to LineDecoder in 64 KiB chunks.

Each of ``--repeat`` passes decodes the whole input; the fastest pass is reported.

Output (one JSON line on stdout):

* ``benchmark``: ``"framing_decode"``;
* ``lines``: lines decoded per pass (a count); ``bytes``: their total size, in bytes;
* ``avg_line_bytes``: mean line size, in bytes; ``chunk_bytes``: bytes fed per call (65536);
* ``best_of``: passes run (a count); ``seconds``: the fastest pass, in seconds;
* ``lines_per_s``: lines decoded per second; ``mb_per_s``: input decoded per second, in MB
  (10^6 bytes);
* ``python``: the Python version.

Run: ``.venv/bin/python benchmarks/bench_framing.py [--lines 100000] [--repeat 5]``.
"""

from __future__ import annotations

import sys
import time

from _util import arg_parser

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
    parser = arg_parser(__doc__)
    parser.add_argument("--lines", type=int, default=100_000, help="lines to decode per pass (default 100000)")
    parser.add_argument("--repeat", type=int, default=5, help="passes; the fastest is reported (default 5)")
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
