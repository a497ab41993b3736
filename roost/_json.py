"""JSON encoding for every wire and storage path: orjson behind cattrs preconfigured converters.

orjson was chosen over msgspec by measurement (``benchmarks/bench_json.py``); both are far ahead of
the standard library, and orjson has a first-party cattrs preconfigured converter.

Hot paths encode each event once: :func:`dumps` returns ``bytes`` ready for a transport, and
:func:`dumps_line` adds the newline of JSONL framing in the same call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from cattrs.preconf.orjson import OrjsonConverter

    converter: OrjsonConverter

__all__ = ["dumps", "dumps_line", "loads", "JSONDecodeError", "converter"]

JSONDecodeError = orjson.JSONDecodeError

_OPTS = orjson.OPT_NON_STR_KEYS


def dumps(value: Any) -> bytes:
    """Encode ``value`` (primitives, dicts, lists, attrs instances) as compact UTF-8 JSON bytes.

    Raises:
        TypeError: ``value`` holds something JSON cannot represent.
    """
    try:
        return orjson.dumps(value, option=_OPTS)
    except orjson.JSONEncodeError as exc:
        return _big_int_fallback(value, exc)


def _big_int_fallback(value: Any, exc: Exception) -> bytes:
    """The standard library's encoding for a value orjson refuses only for an integer beyond 64
    bits (e.g. a client's request id, echoed exactly); any other refusal is re-raised."""
    if "64-bit" not in str(exc):
        raise exc
    import json

    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def dumps_line(value: Any) -> bytes:
    """Like :func:`dumps`, with the trailing ``\\n`` of JSONL framing."""
    try:
        return orjson.dumps(value, option=_OPTS | orjson.OPT_APPEND_NEWLINE)
    except orjson.JSONEncodeError as exc:
        return _big_int_fallback(value, exc) + b"\n"


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Decode one JSON value.

    Raises:
        JSONDecodeError: (a ``ValueError``) the input is not valid JSON or not valid UTF-8.
    """
    return orjson.loads(data)


def __getattr__(name: str) -> Any:
    """``converter``: the shared cattrs converter for attrs classes <-> JSON-ready primitives
    (snake_case, the domain's names), built on first access (PEP 562): importing cattrs costs
    tens of milliseconds of start-up, and the hot paths encode with orjson directly."""
    if name != "converter":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from cattrs.preconf.orjson import make_converter

    value = globals()["converter"] = make_converter(omit_if_default=False)
    return value
