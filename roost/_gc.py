"""The garbage-collector policy of Roost's long-running servers (issue 19, "fair when saturated").

A server's steady state makes almost no cyclic garbage (a turn's objects are freed by reference
counting), yet with CPython's default thresholds (700, 10, 10) the collector ran 13-15 % of wall
time with 100 threads streaming, and each full collection rescanned every live object, holding
the event loop for 50-230 ms. :func:`apply_server_gc_policy` freezes what start-up made (modules,
classes, the runtime: never rescanned again) and raises the thresholds so that collections are
rare and a full one only scans what was created since start-up.

Gen-0 threshold 10,000 instead of 20,000 was measured in session 26 (the peers harness's saturated
phase, 100 threads streaming, four alternating runs each, load 2-7): each gen-0 pause halved (CPU
p50 6.1 -> 3.2 ms, wall 13 -> 6 ms) but there were 2.4 times as many and the collector's CPU in the
measuring windows rose by a third (337 -> 456 ms over the four runs), with no interrupt or
first-delta latency gain that the machine's noise let through (5,000: pauses of 1.6 ms, and gen-1
collections of 30-40 ms CPU appear). So the threshold stays 20,000.
"""

from __future__ import annotations

import gc
import os

__all__ = ["SERVER_GC_THRESHOLDS", "apply_server_gc_policy"]

#: ``gc.set_threshold`` of a server: gen-0 after 20,000 net allocations instead of 700.
SERVER_GC_THRESHOLDS = (20_000, 20, 20)


def apply_server_gc_policy() -> bool:
    """Freeze the objects alive now and set :data:`SERVER_GC_THRESHOLDS`; call once start-up
    has imported what the server runs and its runtime is up (:func:`roost.supervisor.open_runtime`
    does, for a server's ``node_kind``). ``ROOST_GC=default`` keeps CPython's collector as it is.

    Returns:
        Whether the policy was applied.
    """
    if os.environ.get("ROOST_GC", "").strip().lower() == "default":
        return False
    gc.freeze()  # no gc.collect() first: not on the way to a request (start-up left ~4k garbage objects)
    gc.set_threshold(*SERVER_GC_THRESHOLDS)
    return True
