"""Issue 18, finding 10: no broad ``except`` in Roost swallows an error without a log line.

A handler of ``Exception``, ``BaseException``, ``RoostError`` (or a bare ``except:``) whose body
does nothing but ``pass``/``continue``/``return``/``...`` hides failures. Each such place must at
least log (or re-raise, or turn the error into an answer).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "roost"
BROAD = {"Exception", "BaseException", "RoostError"}


def _names(node: ast.expr | None) -> set[str]:
    if node is None:
        return {"<bare>"}
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(e) for e in node.elts))
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return set()


def _silent(body: list[ast.stmt]) -> bool:
    for stmt in body:
        if isinstance(stmt, (ast.Pass, ast.Continue)):
            continue
        if isinstance(stmt, ast.Return) and (stmt.value is None or isinstance(stmt.value, ast.Constant)):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue
        return False
    return True


def silent_handlers() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler) and (_names(node.type) & (BROAD | {"<bare>"})) \
                    and _silent(node.body):
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    return found


def test_no_broad_handler_swallows_silently() -> None:
    assert silent_handlers() == []
