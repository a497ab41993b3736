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


def test_sessions_json_imports_neither_trio_nor_sqlite_utils(tmp_path: Path) -> None:
    first, modules = _run(tmp_path, ["sessions", "--json"])  # creates and migrates the store
    assert first == b'{"protocolVersion":1,"items":[]}\n'
    assert "sqlite_utils" not in modules  # a fresh store is migrated by plain SQL
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


#: Like ``_RUNNER``, and also writes the module names to OUT + ".initialize" the moment the first
#: ``initialize`` response is queued (nothing has run since: no checkpoint between the two).
_AT_INITIALIZE = """
import atexit, sys
out, argv = sys.argv[1], sys.argv[2:]
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
import roost.protocol._appserver as appserver
handle = appserver.AppServerSession._handle
async def _handle(self, rid, name, handler, params):
    await handle(self, rid, name, handler, params)
    if name == "initialize":
        open(out + ".initialize", "w").write("\\n".join(sorted(sys.modules)))
appserver.AppServerSession._handle = _handle
sys.argv = ["roost", *argv]
from roost.cli import main
main()
"""

#: What ``roost app-server`` loads only once a turn (or a later request) needs it.
_NOT_BEFORE_A_TURN = (*_NEVER_AT_START, "yaml", "cattrs", "roost.engines._http", "roost.actors._taskqueue",
                      "roost.actors._objectives", "roost.actors._scheduler")


def test_app_server_on_a_fresh_home_loads_no_engine_store_tool_or_watcher_before_initialize(tmp_path: Path) -> None:
    """As the side-by-side harness starts it (/work/shared/peers: a fresh ROOST_HOME, the OpenAI
    Responses provider on a local URL never contacted): the first store is migrated without
    sqlite-utils; no file watcher library (watchfiles, anyio) is loaded at all (the configuration
    file is polled, roost/protocol/_as_reload.py); the engine (httpx) is still not loaded after
    ``thread/start``."""
    out = tmp_path / "modules.txt"
    home = tmp_path / "fresh-home"
    requests = _INITIALIZE + b'{"id":2,"method":"thread/start","params":{}}\n'
    argv = ["app-server", "--provider", "openai-responses", "--base-url", "http://127.0.0.1:9/v1",
            "--model", "mock-model", "--api-key-env", "MOCK_KEY"]
    proc = subprocess.run([sys.executable, "-c", _AT_INITIALIZE, str(out), *argv], input=requests,
                          capture_output=True, env=subprocess_env(ROOST_HOME=str(home), MOCK_KEY="k"),
                          timeout=scaled(60), check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.split(b"\n")
    assert lines[0].startswith(b'{"id":1,"result":{"protocol_version":"wuu-app-server/v0.1","status":"ready"')
    assert any(line.startswith(b'{"id":2,"result":{"thread":') for line in lines), lines
    at_initialize = set(Path(f"{out}.initialize").read_text().split("\n"))
    assert "roost.supervisor._root" in at_initialize and (home / "roost.db").exists()
    assert _loaded(at_initialize, (*_NOT_BEFORE_A_TURN, "watchfiles", "anyio")) == []
    at_exit = set(out.read_text().split("\n"))
    assert _loaded(at_exit, (*_NOT_BEFORE_A_TURN, "watchfiles", "anyio")) == []
