"""Start-up loads only what a command uses (issue 19: start fast).

Each test runs the real ``roost`` entry point (``roost.cli.main``, what the console script calls)
in a fresh interpreter, drives it through its real transport, and checks ``sys.modules`` as the
process exits: a heavy library that the command never uses must not have been imported. Time
itself is measured by ``benchmarks/bench_startup.py``, never here.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import subprocess_env
from _helpers.timing import scaled

#: Runs ``roost ARGV...`` in this interpreter and writes the imported module names to OUT at exit.
_RUNNER = """
import atexit, sys
out, argv = sys.argv[1], sys.argv[2:]
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
sys.argv = ["roost", *argv]
from roost.cli import main
main()
"""

_INITIALIZE = b'{"id":1,"method":"initialize","params":{"protocol_version":"wuu-app-server/v0.1"}}\n'

#: Libraries no command needs to start: each is imported where it is used.
_NEVER_AT_START = ("httpx", "httpx_sse", "jsonschema", "mcp", "hypercorn", "croniter", "sqlite_utils")


def _run(tmp_path: Path, argv: list[str], *, stdin: bytes = b"", **env: str) -> tuple[bytes, set[str]]:
    out = tmp_path / "modules.txt"
    proc = subprocess.run([sys.executable, "-c", _RUNNER, str(out), *argv], input=stdin,
                          capture_output=True, env=subprocess_env(**env), timeout=scaled(60), check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout, set(out.read_text().split("\n"))


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return [n for n in names if n in modules]


def test_sessions_json_imports_neither_trio_nor_sqlite_utils_on_a_current_store(tmp_path: Path) -> None:
    first, modules = _run(tmp_path, ["sessions", "--json"])  # creates and migrates the store
    assert first == b'{"protocolVersion":1,"items":[]}\n'
    assert "sqlite_utils" in modules  # the first open migrates, with sqlite-utils
    again, modules = _run(tmp_path, ["sessions", "--json"])
    assert again == first
    assert _loaded(modules, ("trio", *_NEVER_AT_START, "yaml")) == []


def test_app_server_initialize_imports_no_engine_until_a_turn(tmp_path: Path) -> None:
    _run(tmp_path, ["sessions", "--json"])  # the store exists and is current, as on every start but the first
    # openai-responses with a base URL that is never contacted: initialize needs no engine
    stdout, modules = _run(tmp_path, ["app-server"], stdin=_INITIALIZE, ROOST_PROVIDER="openai-responses",
                           ROOST_BASE_URL="http://127.0.0.1:9/v1", ROOST_MODEL="m", OPENAI_API_KEY="k")
    first = stdout.split(b"\n")[0]
    assert first.startswith(b'{"id":1,"result":{"protocol_version":"wuu-app-server/v0.1","status":"ready"')
    assert "trio" in modules and "roost.supervisor._root" in modules  # the runtime did start
    assert _loaded(modules, (*_NEVER_AT_START, "yaml", "cattrs")) == []


def test_app_server_on_the_scripted_engine_loads_its_script_but_no_http(tmp_path: Path) -> None:
    _run(tmp_path, ["sessions", "--json"])
    stdout, modules = _run(tmp_path, ["app-server"], stdin=_INITIALIZE, ROOST_PROVIDER="scripted")
    assert b'"status":"ready"' in stdout.split(b"\n")[0]
    assert "yaml" in modules  # the script is checked before initialize reports "ready"
    assert _loaded(modules, _NEVER_AT_START) == []


def test_lazy_exports_resolve_to_the_public_module() -> None:
    code = (
        "import sys, roost.engines as e, roost.storage as s, roost.protocol as p\n"
        "assert 'httpx' not in sys.modules and 'roost.storage._writer' not in sys.modules\n"
        "assert 'HttpEngine' in dir(e) and 'StoreWriter' in dir(s) and 'LineDecoder' in dir(p)\n"
        "assert e.HttpEngine.__module__ == 'roost.engines' and 'httpx' in sys.modules\n"
        "assert s.StoreWriter.__module__ == 'roost.storage' and p.LineDecoder.__module__ == 'roost.protocol'\n"
        "from roost.engines import open_engine, ScriptedEngine\n"
        "from roost._json import converter\n"
        "assert converter.unstructure(e.TextDelta('x')) == {'text': 'x'}\n"
        "try:\n    e.NoSuchThing\nexcept AttributeError as exc:\n    assert 'NoSuchThing' in str(exc)\n"
        "else:\n    raise AssertionError('no AttributeError')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=scaled(60), check=False)
    assert proc.returncode == 0, proc.stderr.decode()
