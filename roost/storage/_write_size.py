"""How much text a queued write carries: the store writer commits a small write on the event
loop's thread and a large one in its worker thread (:mod:`roost.storage._writer`), and opens a
fresh connection after a group that bound a lot of text."""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable
from typing import Any

import attrs

__all__ = ["carries_at_most", "bound_bytes", "group_bound_bytes"]

_TEXT = (str, bytes, bytearray, memoryview)
#: Types that hold no text (skipped without further checks: most bound values are these).
_NO_TEXT = frozenset({int, float, bool, type(None)})


def carries_at_most(group: Iterable[Any], limit: int, *, look_at: int = 4096) -> bool:
    """Whether ``group``'s writes (objects with ``fn``, ``args`` and ``kwargs``) carry at most
    ``limit`` bytes of text: in their arguments and in what their functions close over
    (closures, ``functools.partial``, containers, Roost's attrs records; a write's text is often
    captured, e.g. an interrupted turn's items). Looks at no more than ``look_at`` values: more
    counts as too much (an estimate, cheap for small writes)."""
    stack: list[Any] = []
    for write in group:
        stack.extend((write.fn, write.args, write.kwargs))
    seen: set[int] = set()
    total = 0
    while stack:
        look_at -= 1
        if look_at < 0:
            return False
        value = stack.pop()
        if isinstance(value, _TEXT):
            total += len(value)
            if total > limit:
                return False
            continue
        if type(value) in _NO_TEXT:
            continue
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend(value)
        elif isinstance(value, functools.partial):
            stack.extend((value.func, value.args, value.keywords))
        elif isinstance(value, types.FunctionType):
            for cell in value.__closure__ or ():
                try:
                    contents = cell.cell_contents
                except ValueError:  # an empty cell has no contents
                    continue
                stack.append(contents)
        elif attrs.has(type(value)) and type(value).__module__.startswith("roost."):
            # Roost's own records only: a library's attrs class (a trio.Event and its tasks)
            # leads into the whole runtime.
            stack.extend(getattr(value, f.name, None) for f in attrs.fields(type(value)))
    return True


def group_bound_bytes(group: Iterable[Any]) -> int:
    """:func:`bound_bytes` of the arguments of ``group``'s writes (most have none: closures)."""
    return sum(bound_bytes((w.args, w.kwargs)) for w in group if w.args or w.kwargs)


def bound_bytes(value: Any, depth: int = 0) -> int:
    """Bytes of text (``str``/``bytes``) in ``value``, looking into containers up to 6 levels deep
    and into attrs instances (an estimate of what a write binds; cheap for small writes: it runs
    after every group committed in the worker thread)."""
    if isinstance(value, _TEXT):
        return len(value)
    if depth >= 6 or type(value) in _NO_TEXT:
        return 0
    total = 0
    depth += 1
    if isinstance(value, dict):
        for v in value.values():
            total += bound_bytes(v, depth)
    elif isinstance(value, (list, tuple)):
        for v in value:
            total += bound_bytes(v, depth)
    elif attrs.has(type(value)):
        for f in attrs.fields(type(value)):
            total += bound_bytes(getattr(value, f.name, None), depth)
    return total
