"""The default suite's short fuzz of the stdin dialects ``repl --vscode`` and ``run --bridge``
(the soak suite runs the long one): no crash, every line answered (tests/_helpers/fuzz.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _helpers.appserver import script_env
from _helpers.fuzz import BRIDGE, VSCODE, fuzz_bridge, fuzz_vscode

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")

LINES = 40
#: Lines every dialect must survive whatever hypothesis draws.
NASTY = [b"", b"{", b"[]", b"null", b'"text"', b"\xff\xfe", b'{"type": 1}', b'{"type": null}',
         b'{"type": "user_input", "text": 5}', b'{"type": "user_input", "images": "x"}',
         b'{"type": "approval_response", "approved": "yes"}', b'{"type": "' + b"x" * 5000 + b'"}']


async def test_repl_vscode_survives_fuzzed_lines(tmp_path: Path, roost_home: Path) -> None:
    env = script_env(tmp_path, roost_home, "default: echo\n")
    lines = NASTY + [VSCODE.example() for _ in range(LINES)]
    assert await fuzz_vscode(env, tmp_path, lines) == (0, 0)


async def test_run_bridge_survives_fuzzed_lines(tmp_path: Path, roost_home: Path) -> None:
    env = script_env(tmp_path, roost_home, "default: echo\n")
    lines = [line for line in NASTY if line] + [BRIDGE.example() for _ in range(LINES)]
    assert await fuzz_bridge(env, tmp_path, lines) == (0, 0)
