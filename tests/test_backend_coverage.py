"""Every store and lease test runs against both backends (issue 13, Tests), and stays so.

The tests of tests/test_store.py and tests/test_leases.py are collected (in a child pytest, with a
small plugin that reports each item's fixtures and parameters); each must take a both-backends
fixture of conftest.py (``database`` or ``backend``, parametrised ``sqlite``/``postgres``) and be
collected once per backend, or be listed below: a test of one backend's own mechanism names its
twin, the test of the same promise on the other backend (the twin must exist); a test that opens
no database says so. An entry for a test that runs on both backends, or that no longer exists, is
an error too, so the table stays small and true. The check itself is shown to fail on planted
violations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from _helpers.timing import scaled

TESTS = Path(__file__).parent
COVERED = ("test_store.py", "test_leases.py")
BOTH_BACKENDS = frozenset({"database", "backend"})
BACKENDS = ("sqlite", "postgres")

#: Tests of one backend's own mechanism -> (what is backend-specific, its twin on the other backend).
BACKEND_SPECIFIC: dict[str, tuple[str, str]] = {
    "test_store.py::test_open_store_default_path_is_roost_home": (
        "the default store is the SQLite file $ROOST_HOME/roost.db",
        "test_pg_store.py::test_the_url_setting_selects_the_backend",
    ),
    "test_store.py::test_memory_store_is_ephemeral": (
        "open_store(':memory:') is a temporary SQLite file, deleted on close",
        "test_store.py::test_a_closed_store_refuses_reads_and_transactions",
    ),
    "test_store.py::test_sqlite_errors_are_translated": (
        "sqlite3's exceptions", "test_store.py::test_postgres_errors_are_translated",
    ),
    "test_store.py::test_postgres_errors_are_translated": (
        "psycopg's exceptions (SQLSTATE)", "test_store.py::test_sqlite_errors_are_translated",
    ),
    "test_store.py::test_nested_savepoints_unwind_as_a_stack_with_one_prepared_statement_each": (
        "the SQLite savepoint SQL of storage._connect.immediate (psycopg names PostgreSQL's)",
        "test_store.py::test_one_failing_write_rolls_back_alone",
    ),
    "test_store.py::test_begin_immediate_polls_for_the_lock_and_a_held_lock_ends_in_store_busy": (
        "SQLite's write lock and busy handler (PostgreSQL waits on row locks up to lock_timeout)",
        "test_store.py::test_postgres_errors_are_translated",
    ),
}
#: Tests that open no database at all -> why.
NO_DATABASE: dict[str, str] = {
    "test_store.py::test_public_names_are_exported": "checks the package's exported names",
}

_PLUGIN = '''
import json

def pytest_collection_modifyitems(session, config, items):
    out = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        out.append({
            "test": item.nodeid.split("::")[0].rsplit("/", 1)[-1] + "::" + item.originalname,
            "fixtures": sorted(item.fixturenames),
            "params": sorted(str(v) for v in callspec.params.values()) if callspec else [],
        })
    with open(config.getoption("--coverage-out"), "w") as f:
        json.dump(out, f)

def pytest_addoption(parser):
    parser.addoption("--coverage-out")
'''


def collect(tmp_path: Path, *files: str) -> list[dict]:
    """Collect ``files`` of tests/ in a child pytest; one record per item (test, fixtures, params)."""
    (tmp_path / "coverage_plugin.py").write_text(_PLUGIN)
    out = tmp_path / "items.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(TESTS)]))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-p", "coverage_plugin",
         f"--coverage-out={out}", *[str(TESTS / f) for f in files]],
        cwd=TESTS.parent, env=env, capture_output=True, text=True, timeout=scaled(120),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def problems(items: list[dict], specific: dict[str, tuple[str, str]], no_database: dict[str, str],
             covered: tuple[str, ...] = COVERED) -> list[str]:
    """What breaks the promise: uncovered tests, stale or twinless table entries."""
    by_test: dict[str, list[dict]] = {}
    for item in items:
        by_test.setdefault(item["test"], []).append(item)
    found = []
    both = set()
    for test, records in by_test.items():
        takes = all(BOTH_BACKENDS & set(r["fixtures"]) for r in records)
        params = {p for r in records for p in r["params"]}
        if takes and set(BACKENDS) <= params:
            both.add(test)
    for test in by_test:
        if test.split("::")[0] not in covered or test in both:
            continue
        if test not in specific and test not in no_database:
            found.append(f"{test} runs on one backend only: take the `database` or `backend` fixture, or list it"
                         " in BACKEND_SPECIFIC with its twin")
    for test, (_, twin) in specific.items():
        if test not in by_test:
            found.append(f"BACKEND_SPECIFIC lists {test}, which no longer exists")
        elif test in both:
            found.append(f"BACKEND_SPECIFIC lists {test}, which runs on both backends: remove the entry")
        if twin not in by_test:
            found.append(f"the twin of {test}, {twin}, does not exist")
    for test in no_database:
        if test not in by_test:
            found.append(f"NO_DATABASE lists {test}, which no longer exists")
        elif any(BOTH_BACKENDS & set(r["fixtures"]) or "pg_url" in r["fixtures"] for r in by_test[test]):
            found.append(f"NO_DATABASE lists {test}, which opens a database")
    return found


def test_every_store_and_lease_test_runs_on_both_backends(tmp_path: Path) -> None:
    twin_files = {twin.split("::")[0] for _, twin in BACKEND_SPECIFIC.values()}
    items = collect(tmp_path, *sorted(set(COVERED) | twin_files))
    assert problems(items, BACKEND_SPECIFIC, NO_DATABASE) == []
    tests = {item["test"] for item in items if item["test"].split("::")[0] in COVERED}
    on_one = set(BACKEND_SPECIFIC) | set(NO_DATABASE)
    assert len(tests - on_one) >= 30  # the bulk really is on both (a guard against an empty collection)


def test_the_check_fails_on_planted_violations() -> None:
    def item(test: str, fixtures: list[str], params: list[str]) -> dict:
        return {"test": test, "fixtures": fixtures, "params": params}

    good = [item("test_store.py::a", ["database"], ["sqlite"]), item("test_store.py::a", ["database"], ["postgres"])]
    assert problems(good, {}, {}) == []
    one = [item("test_store.py::b", ["tmp_path"], [])]
    assert "test_store.py::b runs on one backend only" in problems(one, {}, {})[0]
    sqlite_only = [item("test_leases.py::c", ["backend"], ["sqlite"])]  # a fixture narrowed to one backend
    assert "runs on one backend only" in problems(sqlite_only, {}, {})[0]
    twinless = {"test_store.py::b": ("why", "test_store.py::gone")}
    assert problems(one, twinless, {}) == ["the twin of test_store.py::b, test_store.py::gone, does not exist"]
    stale = {"test_store.py::a": ("why", "test_store.py::a")}
    assert "runs on both backends: remove the entry" in problems(good, stale, {})[0]
    assert "no longer exists" in problems([], {}, {"test_store.py::x": "why"})[0]
    assert "opens a database" in problems(good, {}, {"test_store.py::a": "why"})[0]
    elsewhere = [item("test_other.py::d", ["tmp_path"], [])]  # files outside the promise are not checked
    assert problems(elsewhere, {}, {}) == []
