"""The static checks of the test command (scripts/dev.py ``test``): import contracts, ruff, mypy.

Each check runs on the real tree and, to show it would fail, on a copy with a planted violation:
an upward import (storage -> actors), a private cross-package import, a package cycle, a lint
error and a type error. The configuration is the project's (pyproject.toml).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers.timing import scaled

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _run(tool: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / tool), *args], cwd=cwd, capture_output=True, text=True, timeout=scaled(600))


def _copy_tree(tmp_path: Path) -> Path:
    """A copy of the package and pyproject.toml, for planting violations without touching the tree."""
    shutil.copytree(ROOT / "roost", tmp_path / "roost", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_import_contracts_hold_on_the_tree() -> None:
    result = _run("lint-imports")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("path", "source", "contract"),
    [
        ("storage/_planted.py", "from roost.actors import Actor\n", "Rooms point one way"),
        ("cli/_planted.py", "from roost.storage._threads import get_thread\n", "private modules"),
        ("model_planted.py", "import roost.cli\n", "Rooms point one way"),
    ],
)
def test_import_contracts_fail_on_a_planted_violation(tmp_path: Path, path: str, source: str, contract: str) -> None:
    tree = _copy_tree(tmp_path)
    if path == "model_planted.py":  # the bottom layer (model) importing the top one (cli)
        target = tree / "roost" / "model.py"
        target.write_text(target.read_text() + "\n" + source)
    else:
        (tree / "roost" / path).write_text(source)
    result = subprocess.run(
        [str(BIN / "lint-imports")],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=scaled(600),
        env={"PYTHONPATH": str(tree), "PATH": str(BIN)},
    )
    assert result.returncode != 0, result.stdout
    assert contract in result.stdout and "BROKEN" in result.stdout


def test_ruff_passes_on_the_tree() -> None:
    result = _run("ruff", "check", "roost", "scripts")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_and_mypy_fail_on_a_planted_violation(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "planted.py").write_text(
        "import os\n\n\ndef half(n: int) -> int:\n    return n / 2\n\n\ndef untyped(x):\n    return x\n"
    )
    lint = _run("ruff", "check", "planted.py", cwd=tmp_path)
    assert lint.returncode != 0 and "F401" in lint.stdout  # `os` imported but unused
    types = _run("mypy", "--no-incremental", "planted.py", cwd=tmp_path)
    assert types.returncode != 0
    assert "Incompatible return value type" in types.stdout  # float returned as int
    assert "Function is missing a type annotation" in types.stdout  # disallow_untyped_defs


def test_the_test_command_runs_every_check_before_pytest() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import dev  # scripts/dev.py
    finally:
        sys.path.pop(0)
    tools = [check[0] for check in dev.CHECKS]
    assert tools == ["ruff", "ruff", "mypy", "lint-imports"]
    assert ("ruff", "format", "--check") == dev.CHECKS[1][:3]


def test_the_roost_command_of_dev_py_runs_in_the_callers_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import dev  # scripts/dev.py
    finally:
        sys.path.pop(0)
    calls: list[dict] = []

    def fake_run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append({"args": args, "cwd": kwargs.get("cwd"), "here": Path.cwd()})
        return subprocess.CompletedProcess(args, 0)

    monkeypatch.setattr(dev, "ensure_venv", lambda: None)
    monkeypatch.setattr(dev, "compile_bytecode", lambda **_: None)
    monkeypatch.setattr(dev.subprocess, "run", fake_run)
    monkeypatch.chdir(tmp_path)
    assert dev.main(["roost", "validate", "o.yaml"]) == 0
    assert dev.main(["demo"]) == 0
    for call in calls:  # no cwd: the child starts in the caller's directory (a relative path is the caller's)
        assert call["cwd"] is None and call["here"] == tmp_path
    assert calls[0]["args"][1:] == ["validate", "o.yaml"] and calls[1]["args"][1] == "demo"
