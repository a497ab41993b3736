"""Shared fixtures: an isolated ROOST_HOME per test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def roost_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point ROOST_HOME at a fresh directory so no test touches ~/.roost."""
    home = tmp_path / "roost-home"
    home.mkdir()
    monkeypatch.setenv("ROOST_HOME", str(home))
    for name in ("ROOST_PROVIDER", "ROOST_BASE_URL", "ROOST_MODEL", "ROOST_SCRIPT"):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def roost_cmd() -> list[str]:
    """The argv prefix that runs the real `roost` command of this checkout."""
    exe = Path(sys.executable).with_name("roost")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "roost"]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env
