"""``benchmarks/bench_*.py --help`` says what the one JSON line each script prints holds.

Every script's ``--help`` shows its whole module docstring, as written (not only its first
paragraph, which is all some showed), and that docstring names the fields of the JSON line with
their units. The quick benchmarks are run here with tiny sizes, and every key of the line they
print (at every level of nesting) must be named in their ``--help``; the slower ones (real daemons,
PostgreSQL, real-time cron slots) are not run in the tests.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers.timing import scaled

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = sorted((ROOT / "benchmarks").glob("bench_*.py"))
#: script -> arguments that make it run in about a second (and the figures it prints).
QUICK = {
    "bench_store.py": ["--tasks", "3", "--per-task", "3"],
    "bench_framing.py": ["--lines", "200", "--repeat", "1"],
    "bench_leases.py": ["--operations", "10"],
    "bench_json.py": ["--ops", "50", "--repeat", "1"],
    "bench_kernel.py": ["--actors", "20", "--messages", "300", "--asks", "20", "--children", "5"],
    "bench_engines.py": ["--deltas", "20", "--latency-chunks", "5"],
}


def _help(script: Path) -> str:
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=ROOT,
                         timeout=scaled(120))
    assert out.returncode == 0, out.stderr
    return out.stdout


def _words(text: str) -> str:
    return " ".join(text.split())


def _keys(value, path=()):
    """``(path, key)`` of every key of a decoded JSON value, nested ones included."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield path, key
            yield from _keys(inner, (*path, key))
    elif isinstance(value, list):
        for inner in value:
            yield from _keys(inner, path)


def test_every_benchmark_is_checked():
    assert len(BENCHMARKS) > 10 and set(QUICK) <= {b.name for b in BENCHMARKS}


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda p: p.name)
def test_help_shows_the_whole_docstring_with_its_output_fields(script):
    doc = ast.get_docstring(ast.parse(script.read_text()), clean=False)
    assert doc, f"{script.name} has no module docstring"
    shown = _words(_help(script))
    assert _words(doc) in shown, f"{script.name} --help does not show its module docstring as written"
    assert "JSON line" in doc and "Output" in doc, f"{script.name}: no Output section naming the JSON line's fields"


@pytest.mark.parametrize("name", sorted(QUICK))
def test_help_names_every_field_the_benchmark_prints(name):
    script = ROOT / "benchmarks" / name
    out = subprocess.run([sys.executable, str(script), *QUICK[name]], capture_output=True, text=True, cwd=ROOT,
                         timeout=scaled(120))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1, out.stdout
    figures = json.loads(lines[0])
    shown = _help(script)
    missing = sorted({".".join((*path, key)) for path, key in _keys(figures)
                      if not re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", shown)})
    assert not missing, f"{name} --help does not name {missing}"
