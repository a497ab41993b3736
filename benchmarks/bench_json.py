"""JSON codecs on Roost's hot paths: orjson vs msgspec vs the standard library, in operations/s.

Three workloads, each producing (or consuming) the same bytes in every library:

* ``encode_dict``: a streamed-delta event as a plain dict (``item/agentMessage/delta``).
* ``encode_event``: the same event as a typed class: an attrs class through
  ``roost._json.converter.unstructure`` + ``orjson.dumps`` (what Roost does; ``_hook`` calls the
  converter's generated function directly, skipping its dispatch), vs ``attrs.asdict`` +
  ``orjson.dumps``, vs a ``msgspec.Struct`` through ``msgspec.json.Encoder``, vs ``attrs.asdict``
  + ``json.dumps``.
* ``decode_request``: one request line (``turn/start``) to Python objects; msgspec also decodes it
  straight into a typed Struct.

Each figure is the best of ``--repeat`` timed loops of ``--ops`` operations.

Output (one JSON line on stdout):

* ``benchmark``: ``"json"``; ``unit``: ``"ops_per_s"``, the unit of every figure of the three
  workload objects;
* ``python``: the Python version; ``versions``: ``{orjson, msgspec}``, the libraries' versions;
* ``ops``: operations per timed loop, ``best_of``: timed loops per case (counts);
* ``event_bytes``: size of the encoded event, ``request_bytes``: of the decoded request line, in
  bytes;
* ``encode_dict``: operations per second of ``orjson``, ``msgspec`` and ``stdlib`` (``json.dumps``);
* ``encode_event``: operations per second of ``orjson_cattrs`` (Roost's way), ``orjson_cattrs_hook``
  (the converter's generated function called directly), ``orjson_attrs_asdict``,
  ``msgspec_struct`` and ``stdlib_asdict``;
* ``decode_request``: operations per second of ``orjson``, ``msgspec`` (to Python objects),
  ``msgspec_typed_struct`` (to a typed Struct) and ``stdlib`` (``json.loads``);
* ``wall_s``: wall time of all the timing, in seconds.

Run: ``.venv/bin/python benchmarks/bench_json.py [--ops 100000] [--repeat 5]`` (about 15 s).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs
import msgspec
import orjson
from _util import arg_parser, emit

from roost._json import converter

THREAD_ID = "thr_01J9Z6W3M4K7Q8R2T5V6X7Y8Z9"
TURN_ID = "turn_01J9Z6W4A1B2C3D4E5F6G7H8J9"
ITEM_ID = "item_01J9Z6W5K1L2M3N4P5Q6R7S8T9"

EVENT_DICT: dict[str, Any] = {
    "method": "item/agentMessage/delta",
    "params": {"thread_id": THREAD_ID, "turn_id": TURN_ID, "item_id": ITEM_ID, "delta": "hello "},
}

REQUEST_LINE = (
    b'{"id":42,"method":"turn/start","params":{"thread_id":"' + THREAD_ID.encode() + b'",'
    b'"input":[{"type":"text","text":"Summarise the open issues in this repository and propose '
    b'a plan for the next release."}],"model":"scripted","effort":"medium"}}\n'
)


# -- attrs (Roost's way) ------------------------------------------------------------------------


@attrs.define(kw_only=True)
class AgentMessageDeltaA:
    """The params of an ``item/agentMessage/delta`` notification, as an attrs class."""

    thread_id: str
    turn_id: str
    item_id: str
    delta: str


@attrs.define(kw_only=True)
class NotificationA:
    """A notification envelope carrying a typed event."""

    method: str
    params: AgentMessageDeltaA


# -- msgspec ------------------------------------------------------------------------------------


class AgentMessageDeltaM(msgspec.Struct, kw_only=True):
    thread_id: str
    turn_id: str
    item_id: str
    delta: str


class NotificationM(msgspec.Struct, kw_only=True):
    method: str
    params: AgentMessageDeltaM


class TextInputM(msgspec.Struct, kw_only=True):
    type: str
    text: str


class TurnStartParamsM(msgspec.Struct, kw_only=True):
    thread_id: str
    input: list[TextInputM]
    model: str | None = None
    effort: str | None = None


class TurnStartRequestM(msgspec.Struct, kw_only=True):
    id: int
    method: str
    params: TurnStartParamsM


def _best_rates(cases: dict[str, dict[str, Callable[[], Any]]], ops: int, repeat: int) -> dict[str, dict[str, int]]:
    """Best-of-``repeat`` rate of each case, in calls per second.

    The rounds are interleaved (every case once per round) so that a burst of load from another
    process penalises one round of every case rather than every round of one case.
    """
    rng = range(ops)
    best = {name: {lib: float("inf") for lib in fns} for name, fns in cases.items()}
    for _ in range(repeat):
        for name, fns in cases.items():
            for lib, fn in fns.items():
                t0 = time.perf_counter()
                for _ in rng:
                    fn()
                best[name][lib] = min(best[name][lib], time.perf_counter() - t0)
    return {name: {lib: round(ops / s) for lib, s in libs.items()} for name, libs in best.items()}


def _cases() -> dict[str, dict[str, Callable[[], Any]]]:
    event_a = NotificationA(
        method="item/agentMessage/delta",
        params=AgentMessageDeltaA(thread_id=THREAD_ID, turn_id=TURN_ID, item_id=ITEM_ID, delta="hello "),
    )
    event_m = NotificationM(
        method="item/agentMessage/delta",
        params=AgentMessageDeltaM(thread_id=THREAD_ID, turn_id=TURN_ID, item_id=ITEM_ID, delta="hello "),
    )
    encoder = msgspec.json.Encoder()
    any_decoder = msgspec.json.Decoder()
    typed_decoder = msgspec.json.Decoder(TurnStartRequestM)
    compact = {"separators": (",", ":"), "ensure_ascii": False}
    unstructure = converter.unstructure
    hook = converter.get_unstructure_hook(NotificationA)  # the generated function, no dispatch
    asdict = attrs.asdict
    dumps = json.dumps

    cases: dict[str, dict[str, Callable[[], Any]]] = {
        "encode_dict": {
            "orjson": lambda: orjson.dumps(EVENT_DICT),
            "msgspec": lambda: encoder.encode(EVENT_DICT),
            "stdlib": lambda: dumps(EVENT_DICT, **compact).encode(),
        },
        "encode_event": {
            "orjson_cattrs": lambda: orjson.dumps(unstructure(event_a)),
            "orjson_cattrs_hook": lambda: orjson.dumps(hook(event_a)),
            "orjson_attrs_asdict": lambda: orjson.dumps(asdict(event_a)),
            "msgspec_struct": lambda: encoder.encode(event_m),
            "stdlib_asdict": lambda: dumps(asdict(event_a), **compact).encode(),
        },
        "decode_request": {
            "orjson": lambda: orjson.loads(REQUEST_LINE),
            "msgspec": lambda: any_decoder.decode(REQUEST_LINE),
            "msgspec_typed_struct": lambda: typed_decoder.decode(REQUEST_LINE),
            "stdlib": lambda: json.loads(REQUEST_LINE),
        },
    }
    _check(cases, event_a)
    return cases


def _check(cases: dict[str, dict[str, Callable[[], Any]]], event_a: NotificationA) -> None:
    """Refuse to time libraries that do not produce the same JSON (a benchmark of wrong output)."""
    for name, fns in cases.items():
        if name.startswith("encode"):
            outputs = {lib: orjson.loads(fn()) for lib, fn in fns.items()}
            if any(out != EVENT_DICT for out in outputs.values()):
                raise AssertionError(f"{name}: outputs differ: {outputs}")
        else:
            plain = orjson.loads(REQUEST_LINE)
            for lib, fn in fns.items():
                out = fn()
                if isinstance(out, msgspec.Struct):
                    out = msgspec.to_builtins(out)
                if out != plain:
                    raise AssertionError(f"{name}/{lib}: decoded {out!r}")
    if converter.structure(converter.unstructure(event_a), NotificationA) != event_a:
        raise AssertionError("cattrs round trip of the attrs event changed it")


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--ops", type=int, default=100_000, help="operations per timed loop")
    parser.add_argument("--repeat", type=int, default=5, help="timed loops per case (best is kept)")
    args = parser.parse_args()
    if args.ops < 1 or args.repeat < 1:
        parser.error("--ops and --repeat must be >= 1")
    cases = _cases()
    wall0 = time.perf_counter()
    results = _best_rates(cases, args.ops, args.repeat)
    emit(
        {
            "benchmark": "json",
            "unit": "ops_per_s",
            "python": platform.python_version(),
            "versions": {"orjson": orjson.__version__, "msgspec": msgspec.__version__},
            "ops": args.ops,
            "best_of": args.repeat,
            "event_bytes": len(orjson.dumps(EVENT_DICT)),
            "request_bytes": len(REQUEST_LINE),
            **results,
            "wall_s": round(time.perf_counter() - wall0, 2),
        }
    )


if __name__ == "__main__":
    sys.exit(main())
