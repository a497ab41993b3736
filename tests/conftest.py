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


# -- PostgreSQL (issue 13): one throwaway cluster per session, a fresh database per test ----------


@pytest.fixture(scope="session")
def pg_server():
    """The session's PostgreSQL server (tests/_helpers/postgres.py); fails in CI when missing."""
    from _helpers.postgres import start_cluster

    with start_cluster() as server:
        yield server


@pytest.fixture
def pg_url(pg_server) -> str:
    """The URL of an empty database of its own on the session's server."""
    from _helpers.postgres import fresh_database

    with fresh_database(pg_server) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path):
    """An open store of each backend (SQLite file, PostgreSQL database), for tests written
    against the store interface (``store.op(conn, ...)`` under ``read()``/``transaction()``)."""
    from roost.storage import open_postgres_store, open_store

    if request.param == "sqlite":
        store = open_store(tmp_path / "roost.db")
    else:
        store = open_postgres_store(request.getfixturevalue("pg_url"))
    yield store
    store.close()
