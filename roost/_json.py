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

    An integer too large for a double (about 309 digits and more), which orjson refuses
    ("number is infinity when parsed as double"), is valid JSON: such a document is decoded by the
    standard library instead, which keeps integers exact (up to Python's 4300-digit conversion
    limit), so a request line that holds one keeps its ``id`` and gets the usual parameter checks.

    Raises:
        JSONDecodeError: (a ``ValueError``) the input is not valid JSON or not valid UTF-8.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if not str(exc).startswith("number is infinity"):
            raise
        return _exact_loads(data, exc)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("number is infinity when parsed as double")
    return value


def _exact_loads(data: bytes | bytearray | memoryview | str, exc: orjson.JSONDecodeError) -> Any:
    """The standard library's decoding of ``data`` (integers exact; no NaN/Infinity, no float
    beyond a double, no lone surrogate: what orjson refuses too), or ``exc`` re-raised."""
    import json

    raw = bytes(data) if isinstance(data, memoryview) else data
    try:
        value = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # a lone surrogate cannot be encoded
    except ValueError:  # UnicodeError included; also integers past the 4300-digit limit
        raise exc from None
    return value


def __getattr__(name: str) -> Any:
    """``converter``: the shared cattrs converter for attrs classes <-> JSON-ready primitives
    (snake_case, the domain's names), built on first access (PEP 562): importing cattrs costs
    tens of milliseconds of start-up, and the hot paths encode with orjson directly."""
    if name != "converter":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from cattrs.preconf.orjson import make_converter

    value = globals()["converter"] = make_converter(omit_if_default=False)
    return value
