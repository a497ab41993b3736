"""The soak suite's ``soak_report`` fixture: one JSON line of figures per test, never captured."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest

from soak._soak import ITERATIONS


@pytest.fixture
def soak_report(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``soak_report(name, **figures)`` prints ``{"soak": name, "iterations": N, ...}`` on one line
    (past pytest's capture) and appends it to ``$ROOST_SOAK_REPORT`` when that is set."""
    capman = request.config.pluginmanager.getplugin("capturemanager")

    def emit(name: str, **figures: object) -> None:
        line = json.dumps({"soak": name, "iterations": ITERATIONS, **figures}, sort_keys=True)
        with capman.global_and_fixture_disabled():
            print("\n" + line, flush=True)
        path = os.environ.get("ROOST_SOAK_REPORT")
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    return emit
