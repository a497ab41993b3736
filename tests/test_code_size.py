"""Size limits of roost/ (mission rules; issue 12, Build 2): no module over 600 lines, no function
over 80 lines (a function's lines from its ``def`` to its last line, docstring included).

Exemptions are explicit and each says why. A listed module or function may shrink but not grow
past the size it is listed with, and an exemption that is no longer needed fails the test too, so
the list only ever gets shorter. Code that other branches of the same session are changing right
now is listed in the ``IN_FLUX_*`` tables instead: held to its size too, but its entry may outlive
the need (those branches split or shrink it); remove such an entry once they are merged.
"""

from __future__ import annotations

import ast
from pathlib import Path

import roost

ROOT = Path(roost.__file__).parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

#: module (relative to roost/) -> (lines it may have, why it is exempt)
MODULE_EXEMPTIONS: dict[str, tuple[int, str]] = {}

#: "module:function" -> (lines it may have, why it is exempt)
FUNCTION_EXEMPTIONS: dict[str, tuple[int, str]] = {
    "storage/_schema.py:_m0001_core": (150, "schema DDL: the first migration's CREATE statements"),
}

#: Being changed right now on branches of this session not yet merged into main (pgd: PostgreSQL,
#: xnode: cross-node delivery): split once they are merged, so the merge stays mechanical.
IN_FLUX_MODULES: dict[str, tuple[int, str]] = {}
IN_FLUX_FUNCTIONS: dict[str, tuple[int, str]] = {}


def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    modules, functions = {}, {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        source = path.read_text()
        modules[rel] = source.count("\n")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno is not None
                key = f"{rel}:{node.name}"
                functions[key] = max(functions.get(key, 0), node.end_lineno - node.lineno + 1)
    return modules, functions


def _over(
    sizes: dict[str, int],
    limit: int,
    exemptions: dict[str, tuple[int, str]],
    in_flux: dict[str, tuple[int, str]] | None = None,
) -> list[str]:
    problems = []
    allowed_sizes = {name: allowed for name, (allowed, _why) in {**(in_flux or {}), **exemptions}.items()}
    for name, lines in sorted(sizes.items()):
        allowed = max(limit, allowed_sizes.get(name, limit))
        if lines > allowed:
            problems.append(f"{name}: {lines} lines (limit {allowed})")
    for name in sorted(exemptions):
        if sizes.get(name, 0) <= limit:
            problems.append(f"{name}: exempt but now within {limit} lines; remove its exemption")
    return problems


def test_no_module_over_600_lines() -> None:
    modules, _ = _sizes()
    problems = _over(modules, MAX_MODULE_LINES, MODULE_EXEMPTIONS, IN_FLUX_MODULES)
    assert not problems, "\n".join(problems)


def test_no_function_over_80_lines() -> None:
    _, functions = _sizes()
    problems = _over(functions, MAX_FUNCTION_LINES, FUNCTION_EXEMPTIONS, IN_FLUX_FUNCTIONS)
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_long_function_and_a_stale_exemption() -> None:
    assert _over({"m.py:f": 81}, MAX_FUNCTION_LINES, {}) == ["m.py:f: 81 lines (limit 80)"]
    assert _over({"m.py:f": 90}, MAX_FUNCTION_LINES, {"m.py:f": (95, "x")}) == []
    assert _over({"m.py:f": 96}, MAX_FUNCTION_LINES, {"m.py:f": (95, "x")}) == ["m.py:f: 96 lines (limit 95)"]
    assert _over({"m.py:f": 70}, MAX_FUNCTION_LINES, {"m.py:f": (95, "x")}) == [
        "m.py:f: exempt but now within 80 lines; remove its exemption"
    ]
    assert _over({"m.py:f": 70}, MAX_FUNCTION_LINES, {}, {"m.py:f": (95, "x")}) == []
    assert _over({"m.py:f": 99}, MAX_FUNCTION_LINES, {}, {"m.py:f": (95, "x")}) == ["m.py:f: 99 lines (limit 95)"]
