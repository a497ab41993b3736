"""``storage`` is the only room that speaks SQL (issue 12, Build 4; DESIGN.md section 3).

An AST check of every module outside ``roost/storage``: no ``.execute``/``.executemany``/
``.executescript`` call and no string (docstrings aside) that starts like an SQL statement. A
consistent multi-statement read is :func:`roost.storage.read_snapshot`, not a ``BEGIN`` of one's
own. The check is also shown to fail on planted violations.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import roost

ROOT = Path(roost.__file__).parent
_SQL = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|BEGIN|COMMIT|ROLLBACK|PRAGMA|WITH|VACUUM|ATTACH)\b"
)
_EXECUTE = {"execute", "executemany", "executescript"}


def sql_outside_storage(source: str, name: str = "<source>") -> list[str]:
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _EXECUTE:
            found.append(f"{name}:{node.lineno}: .{node.func.attr}(...)")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and _SQL.match(node.value)
        ):
            found.append(f"{name}:{node.lineno}: SQL text {node.value[:40]!r}")
    return found


def test_no_sql_outside_storage() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] == "storage":
            continue
        found += sql_outside_storage(path.read_text(), str(rel))
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "planted",
    [
        'conn.execute("BEGIN")',
        "rows = db.executemany(q, params)",
        'QUERY = "SELECT id FROM threads WHERE kind = ?"',
        "sql = '''\n  UPDATE turns SET status = ?'''",
    ],
)
def test_the_check_fails_on_a_planted_violation(planted: str) -> None:
    assert sql_outside_storage(planted), planted


def test_the_check_leaves_docstrings_and_prose_alone() -> None:
    assert not sql_outside_storage('def f():\n    """SELECT the best one."""\n    return "select a model"\n')
