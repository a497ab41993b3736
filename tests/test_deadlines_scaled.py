"""Every test deadline scales with ``ROOST_TEST_TIMEOUT_SCALE`` (issue 18): no raw number.

A deadline is the first argument of ``trio.fail_after``/``trio.move_on_after`` or a ``timeout=``
keyword of any call. It must not be a numeric literal, nor a module-level name bound to one; wrap
it in :func:`_helpers.timing.scaled` (``trio.fail_after(scaled(30))``, ``TIMEOUT = scaled(30)``).
A number that is the subject of the test rather than a bound on a wait (a cancellation at once, a
timeout the test expects to fire) carries ``# not a deadline`` on its line.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
DEADLINE_CALLS = frozenset({"fail_after", "move_on_after"})
EXEMPT = "# not a deadline"


def _numeric(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _deadlines(tree: ast.Module) -> list[ast.AST]:
    """The argument nodes in deadline position."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in DEADLINE_CALLS and node.args:
            found.append(node.args[0])
        found.extend(k.value for k in node.keywords if k.arg == "timeout")
    return found


def raw_deadlines(root: Path = TESTS) -> dict[Path, list[ast.AST]]:
    """Per test file, the raw numeric deadlines: literals in deadline position, and the literal
    values of module-level names used there (``TIMEOUT = 30`` ... ``fail_after(TIMEOUT)``)."""
    result: dict[Path, list[ast.AST]] = {}
    for path in sorted(root.rglob("*.py")):
        if path.name == "timing.py" and path.parent.name == "_helpers":
            continue
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        tree = ast.parse(source)
        constants = {
            stmt.targets[0].id: stmt.value
            for stmt in tree.body
            if isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and _numeric(stmt.value)
        }
        hits: dict[tuple[int, int], ast.AST] = {}
        for node in _deadlines(tree):
            if isinstance(node, ast.Name) and node.id in constants:
                node = constants[node.id]
            elif not _numeric(node):
                continue
            if EXEMPT not in lines[node.lineno - 1]:
                hits[(node.lineno, node.col_offset)] = node
        if hits:
            result[path] = list(hits.values())
    return result


def test_no_test_uses_a_raw_numeric_deadline() -> None:
    raw = raw_deadlines()
    where = [f"{path.relative_to(TESTS.parent)}:{node.lineno}" for path, nodes in raw.items() for node in nodes]
    assert not where, "wrap these deadlines in _helpers.timing.scaled(...): " + ", ".join(where)


def test_the_check_sees_a_raw_deadline_and_its_module_constant(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "import trio\nLIMIT = 7\n"
        "async def test_a():\n"
        "    with trio.fail_after(30):\n        pass\n"
        "    with trio.move_on_after(LIMIT):\n        pass\n"
        "    client.wait(timeout=2.5)\n"
        "    with trio.fail_after(scaled(30)):\n        pass\n"
        "    with trio.move_on_after(0):  # not a deadline\n        pass\n"
    )
    [(path, nodes)] = raw_deadlines(tmp_path).items()
    assert sorted(n.lineno for n in nodes) == [2, 4, 8]
