"""Lazy package exports (PEP 562): a room's ``__init__`` names an export's module without importing it.

Start-up time is a product goal (issue 19: ``roost app-server`` answers ``initialize`` in under
250 ms; ``roost sessions --json`` exits in under 200 ms), and a package ``__init__`` that imports
every module makes each command pay for all of them (httpx, PyYAML, trio ...). A room lists its
costly exports in a dict and hands it to :func:`attach`::

    _LAZY = {"HttpEngine": "roost.engines._http"}
    __getattr__, __dir__ = attach(globals(), _LAZY, on_load=_fix_module_metadata)

Type checkers see the real names through ``if TYPE_CHECKING:`` imports beside the dict.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["attach", "publish"]


def attach(
    namespace: dict[str, Any], lazy: Mapping[str, str], *, on_load: Callable[[list[str]], None] | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Return a module's ``__getattr__`` and ``__dir__`` for lazily imported exports.

    Args:
        namespace: the package's ``globals()``; a loaded export is stored there, so the next
            access is a plain attribute lookup.
        lazy: export name -> absolute name of the module defining it.
        on_load: called with the names just stored (all exports of the module that was imported),
            e.g. to set their ``__module__`` to the package's.

    Returns:
        ``(__getattr__, __dir__)``. ``__getattr__`` raises ``AttributeError`` for a name that is
        neither loaded nor lazy, and propagates the module's own ``ImportError``; ``__dir__``
        lists the loaded names and every lazy export.
    """
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module_name = lazy.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(module_name)
        names = [n for n, m in lazy.items() if m == module_name]
        for n in names:
            namespace[n] = getattr(module, n)
        if on_load is not None:
            on_load(names)
        return namespace[name]

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(lazy))

    return __getattr__, __dir__


def publish(namespace: dict[str, Any], names: list[str]) -> None:
    """Give each export in ``names`` the package's name as its ``__module__`` (where it can be
    set), so tracebacks and reprs show ``roost.storage.X``, not the private module (trio's
    ``fixup_module_metadata`` habit). Objects whose ``__module__`` is read-only are left alone.

    Args:
        namespace: the package's ``globals()``, already holding the exports.
        names: the exports to rename (e.g. the names :func:`attach` just loaded).
    """
    package = namespace["__name__"]
    for name in names:
        obj = namespace[name]
        if not getattr(obj, "__module__", "").startswith(package + "._"):
            continue
        try:
            obj.__module__ = package
        except (AttributeError, TypeError):
            continue  # a builtin or an instance without a settable __module__
