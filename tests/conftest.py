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


class Database:
    """One empty database of one backend that a test may open as often as it likes (two stores
    on one database contend as two processes would; a child process opens it by :attr:`where`).

    Attributes:
        kind: ``"sqlite"`` or ``"postgres"``.
        where: the SQLite file's path, or the PostgreSQL URL (what ``storage_proc.py`` takes).
    """

    def __init__(self, kind: str, where: str) -> None:
        self.kind = kind
        self.where = where
        self._opened: list = []

    def open(self, **writer_sizes: int):
        """Open (and migrate) a store on this database; ``batch_max``/``queue_size`` size its
        writer. Closed at the end of the test (closing twice is harmless)."""
        from roost.storage import open_postgres_store, open_store

        if self.kind == "sqlite":
            store = open_store(self.where, **writer_sizes)
        else:
            store = open_postgres_store(self.where, **writer_sizes)
        self._opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self._opened:
            store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path):
    """An empty database of each backend (SQLite file, PostgreSQL database): :class:`Database`."""
    if request.param == "sqlite":
        db = Database("sqlite", str(tmp_path / "roost.db"))
    else:
        db = Database("postgres", request.getfixturevalue("pg_url"))
    yield db
    db.close_all()


@pytest.fixture
def backend(database: Database):
    """An open store of each backend (SQLite file, PostgreSQL database), for tests written
    against the store interface (``store.op(conn, ...)`` under ``read()``/``transaction()``)."""
    return database.open()
