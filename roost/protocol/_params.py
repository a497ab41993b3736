"""Request-parameter checking: required fields, types, and unknown fields (``invalid_params``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from roost.errors import InvalidParams

__all__ = ["check_params", "STR", "INT", "BOOL", "DICT", "LIST", "NUM", "ANY"]

STR = (str,)
INT = (int,)
NUM = (int, float)
BOOL = (bool,)
DICT = (dict,)
LIST = (list,)
ANY = (object,)


def check_params(method: str, params: Any, spec: Mapping[str, tuple[tuple[type, ...], bool]]) -> dict:
    """Validate ``params`` against ``spec`` (name -> (allowed types, required)).

    ``None`` is accepted for an optional field and treated as absent.

    Returns:
        The params dict (``{}`` when omitted), without ``None``-valued optional fields.

    Raises:
        InvalidParams: params is not an object, a required field is missing, a field has the wrong
            type, or a field is unknown (named in the message).
    """
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidParams(f"{method}: params must be an object")
    unknown = sorted(set(params) - set(spec))
    if unknown:
        raise InvalidParams(f"{method}: unknown param(s): {', '.join(unknown)}")
    out: dict = {}
    for name, (types, required) in spec.items():
        value = params.get(name)
        if value is None:
            if required:
                raise InvalidParams(f"{name} is required")
            continue
        if types is not ANY:
            if bool not in types and isinstance(value, bool) and types != ANY:
                raise InvalidParams(f"{name} must be {_names(types)}, not a boolean")
            if not isinstance(value, types):
                if int in types and _beyond_64_bits(value):  # orjson reads such an integer as a float
                    raise InvalidParams(f"{name} is out of range: an integer from -2^63 to 2^63-1 is expected")
                raise InvalidParams(f"{name} must be {_names(types)}, not {type(value).__name__}")
        out[name] = value
    return out


def _beyond_64_bits(value: Any) -> bool:
    """Whether ``value`` is a decoded JSON integer too large for 64 bits (orjson gives a float)."""
    return isinstance(value, float) and value.is_integer() and abs(value) >= 2.0**63


def _names(types: tuple[type, ...]) -> str:
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        dict: "an object",
        list: "an array",
    }
    return " or ".join(names.get(t, t.__name__) for t in types)
