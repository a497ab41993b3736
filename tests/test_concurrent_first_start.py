"""Processes that open a new store at the same moment all start (none fails "database is locked").

Switching a new SQLite file to WAL needs the database to itself, and SQLite answers that with an
immediate "database is locked" while another process migrates; ``open_store`` tries again until
its busy timeout (roost/storage/_store.py, ``_migrate_patiently``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from _helpers.cli import roost_argv
from _helpers.timing import scaled

INITIALIZE = b'{"id":"1","method":"initialize","params":{"protocol_version":"wuu-app-server/v0.1"}}\n'


def test_app_servers_started_together_on_a_new_home_all_answer(tmp_path: Path) -> None:
    for round_ in range(6):
        home = tmp_path / f"home{round_}"
        home.mkdir()
        env = {**os.environ, "ROOST_HOME": str(home), "ROOST_PROVIDER": "scripted"}
        procs = [
            subprocess.Popen(
                [*roost_argv(), "app-server"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=str(tmp_path),
            )
            for _ in range(3)
        ]
        outputs = [p.communicate(INITIALIZE, timeout=scaled(60)) for p in procs]
        for proc, (out, err) in zip(procs, outputs, strict=True):
            assert b'"result"' in out.splitlines()[0] if out else False, err.decode()[-500:]
            assert proc.returncode == 0, err.decode()[-500:]
