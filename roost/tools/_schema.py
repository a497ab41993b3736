"""Minimal argument validation against a tool's JSON schema (required keys, types, enums, bounds).

This is deliberately a small subset of JSON Schema: the built-in tools declare flat ``object``
schemas, and the model needs a precise message naming the bad field, not a full validator.
"""

from __future__ import annotations

from typing import Any

from roost.errors import InvalidToolArguments

__all__ = ["validate_args"]

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def _type_ok(value: Any, expected: str | list[str]) -> bool:
    names = [expected] if isinstance(expected, str) else expected
    for name in names:
        kinds = _TYPES.get(name)
        if kinds is None:
            return True  # an unknown type name constrains nothing
        if isinstance(value, bool) and name in ("integer", "number"):
            continue  # JSON booleans are not numbers
        if isinstance(value, kinds):
            return True
        if name == "integer" and isinstance(value, float) and value.is_integer():
            return True
    return False


def validate_args(args: Any, schema: dict[str, Any]) -> dict[str, Any]:
    """Check ``args`` against an ``object`` schema and return them with defaults filled in.

    Checks: ``args`` is an object; every ``required`` key is present; each known property has the
    declared ``type`` (``integer`` accepts integral floats, and booleans are never numbers), is in
    its ``enum``, within ``minimum``/``maximum``; no unknown keys when ``additionalProperties`` is
    false. Integral floats given for ``integer`` properties are converted to ``int``.

    Args:
        args: the decoded arguments of a tool call.
        schema: the tool's parameter schema.

    Returns:
        A new dict: ``args`` plus each absent property's ``default``.

    Raises:
        InvalidToolArguments: the first violation found; ``.field`` names the argument.
    """
    if not isinstance(args, dict):
        raise InvalidToolArguments(f"arguments must be a JSON object, got {type(args).__name__}", field=None)
    props: dict[str, Any] = schema.get("properties", {})
    for key in schema.get("required", ()):
        if key not in args or args[key] is None:
            raise InvalidToolArguments(f"missing required argument {key!r}", field=key)
    if schema.get("additionalProperties") is False:
        for key in args:
            if key not in props:
                raise InvalidToolArguments(f"unknown argument {key!r}", field=key)
    out = dict(args)
    for key, prop in props.items():
        if key not in out or out[key] is None:
            if "default" in prop:
                out[key] = prop["default"]
            else:
                out.pop(key, None)
            continue
        value = out[key]
        expected = prop.get("type")
        if expected is not None and not _type_ok(value, expected):
            raise InvalidToolArguments(
                f"argument {key!r} must be of type {expected}, got {type(value).__name__}",
                field=key,
            )
        if expected == "integer" and isinstance(value, float):
            value = out[key] = int(value)
        if "enum" in prop and value not in prop["enum"]:
            raise InvalidToolArguments(f"argument {key!r} must be one of {prop['enum']!r}, got {value!r}", field=key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in prop and value < prop["minimum"]:
                raise InvalidToolArguments(f"argument {key!r} must be >= {prop['minimum']}, got {value!r}", field=key)
            if "maximum" in prop and value > prop["maximum"]:
                raise InvalidToolArguments(f"argument {key!r} must be <= {prop['maximum']}, got {value!r}", field=key)
    return out
