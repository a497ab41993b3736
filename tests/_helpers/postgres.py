"""A throwaway PostgreSQL cluster for the test session (or an existing server).

``ROOST_TEST_DATABASE_URL`` (a URL of a role that may ``CREATE DATABASE``) selects an existing
server. Otherwise the Debian ``postgresql`` server binaries (``initdb``, ``pg_ctl``; PostgreSQL
15 in CI, installed by ``.ci/run``) make a cluster in a temporary directory, listening on
127.0.0.1 on a free port with its unix socket in the same directory, durability switched off
(``fsync=off``: a test cluster is thrown away). PostgreSQL refuses to run as root, so under root
the cluster belongs to the system user ``roostpg`` (created with ``useradd`` when missing).

In CI (``CI=true``) a missing server is a failure, never a skip.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

ENV_URL = "ROOST_TEST_DATABASE_URL"
PG_USER = "roostpg"
_databases = itertools.count(1)


@dataclass
class PgServer:
    """A running server: ``admin_url`` reaches its ``postgres`` database as a superuser."""

    admin_url: str
    startup_seconds: float
    owned: bool

    def url_for(self, dbname: str) -> str:
        base, _, _ = self.admin_url.rpartition("/")
        return f"{base}/{dbname}"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(reason: str) -> None:
    if _in_ci():
        pytest.fail(f"PostgreSQL is required in CI: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL not available: {reason} (set {ENV_URL} or install the postgresql package)")


def _bindir() -> str | None:
    found = shutil.which("pg_ctl")
    if found:
        return os.path.dirname(os.path.realpath(found))
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)
    return os.path.dirname(candidates[0]) if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_as() -> str | None:
    """The account to run the server under: ``roostpg`` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
            check=True,
            capture_output=True,
        )
    return PG_USER


@contextmanager
def start_cluster() -> Iterator[PgServer]:
    """Start a throwaway cluster (or use ``$ROOST_TEST_DATABASE_URL``) for the session."""
    url = os.environ.get(ENV_URL, "").strip()
    if url:
        yield PgServer(admin_url=url, startup_seconds=0.0, owned=False)
        return
    bindir = _bindir()
    if bindir is None:
        _unavailable("no pg_ctl/initdb on PATH or under /usr/lib/postgresql/*/bin")
    assert bindir is not None
    started = time.monotonic()
    user = _run_as()
    root = tempfile.mkdtemp(prefix="roost-pg-")
    os.chmod(root, 0o755)
    if user:
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    data, log = os.path.join(root, "data"), os.path.join(root, "server.log")
    port = _free_port()

    def run(*argv: str) -> None:
        done = subprocess.run(argv, user=user, capture_output=True, text=True, cwd=root)
        if done.returncode != 0:
            tail = ""
            if os.path.exists(log):
                with open(log) as f:
                    tail = f.read()[-2000:]
            _unavailable(f"{argv[0]} failed ({done.returncode}): {done.stderr.strip()[-1500:]} {tail}")

    try:
        run(f"{bindir}/initdb", "-D", data, "-U", "roost", "--auth=trust", "-E", "UTF8", "--no-sync",
            "--no-instructions")
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root}"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        run(f"{bindir}/pg_ctl", "-D", data, "-l", log, "-o", options, "-w", "-t", "60", "start")
        yield PgServer(
            admin_url=f"postgresql://roost@127.0.0.1:{port}/postgres",
            startup_seconds=time.monotonic() - started,
            owned=True,
        )
    finally:
        if os.path.exists(os.path.join(data, "postmaster.pid")):
            subprocess.run([f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"], user=user,
                           capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def fresh_database(server: PgServer) -> Iterator[str]:
    """Create an empty database on ``server`` and yield its URL; drop it afterwards."""
    import psycopg

    name = f"roost_test_{os.getpid()}_{next(_databases)}"
    with psycopg.connect(server.admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    try:
        yield server.url_for(name)
    finally:
        with psycopg.connect(server.admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
