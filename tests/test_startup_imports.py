"""Start-up loads only what a command uses (issue 19: start fast).

Each test runs the real ``roost`` entry point (``roost.cli.main``, what the console script calls)
in a fresh interpreter, drives it through its real transport, and checks ``sys.modules`` as the
process exits: a heavy library that the command never uses must not have been imported. Time
itself is measured by ``benchmarks/bench_startup.py``, never here.
"""

from __future__ import annotations

import json
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
    assert "roost.engines._scripted" in modules  # the script is checked before initialize reports "ready"
    # the built-in script ships parsed (scripts/demo.json): PyYAML loads only for a YAML script file
    assert _loaded(modules, (*_NEVER_AT_START, "yaml")) == []


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
#: ``initialize`` response has been written by the early answer, before the event loop exists
#: (``roost.protocol._as_early``; the patch imports nothing more).
_AT_INITIALIZE = """
import atexit, sys
out, argv = sys.argv[1], sys.argv[2:]
atexit.register(lambda: open(out, "w").write("\\n".join(sorted(sys.modules))))
import roost.protocol._as_early as early
answer = early.answer_initialize_early
def _answer(**kwargs):
    state = answer(**kwargs)
    if state.owner is not None:
        open(out + ".initialize", "w").write("\\n".join(sorted(sys.modules)))
    return state
early.answer_initialize_early = _answer
sys.argv = ["roost", *argv]
from roost.cli import main
main()
"""

#: What ``roost app-server`` loads only once a turn (or a later request) needs it.
_NOT_BEFORE_A_TURN = (*_NEVER_AT_START, "yaml", "cattrs", "roost.engines._http", "roost.actors._taskqueue",
                      "roost.actors._objectives", "roost.actors._scheduler")

#: The runtime and its event loop: none of it is loaded when the early answer is written.
_RUNTIME = ("trio", "anyio", "watchfiles", "roost.supervisor", "roost.actors", "roost.protocol._appserver",
            "roost.protocol._framing")

_HARNESS_ARGV = ["app-server", "--provider", "openai-responses", "--base-url", "http://127.0.0.1:9/v1",
                 "--model", "mock-model", "--api-key-env", "MOCK_KEY"]


def _serve_file(tmp_path: Path, requests: bytes, *, runner: str = _AT_INITIALIZE, argv: list[str] = _HARNESS_ARGV,
                **env: str) -> subprocess.CompletedProcess:
    """Run ``roost ARGV`` with stdin read from a file holding ``requests``: all of it is waiting
    when the server starts, as when a client writes ``initialize`` right after the spawn."""
    requests_file = tmp_path / "requests.jsonl"
    requests_file.write_bytes(requests)
    env.setdefault("ROOST_HOME", str(tmp_path / "fresh-home"))
    with requests_file.open("rb") as stdin:
        return subprocess.run([sys.executable, "-c", runner, str(tmp_path / "modules.txt"), *argv], stdin=stdin,
                              capture_output=True, env=subprocess_env(MOCK_KEY="k", **env), timeout=scaled(60),
                              check=False)


def test_app_server_on_a_fresh_home_answers_initialize_before_the_runtime_loads(tmp_path: Path) -> None:
    """As the side-by-side harness starts it (/work/shared/peers: a fresh ROOST_HOME, the OpenAI
    Responses provider on a local URL never contacted): the first store is created and migrated
    (without sqlite-utils) before ``initialize`` is answered, and the answer is written before
    trio and the runtime load; the request that came in the same read
    is then served by the session (no byte lost); the engine (httpx) is still not loaded after
    ``thread/start``."""
    out = tmp_path / "modules.txt"
    home = tmp_path / "fresh-home"
    proc = _serve_file(tmp_path, _INITIALIZE + b'{"id":2,"method":"thread/start","params":{}}\n')
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.split(b"\n")
    assert lines[0].startswith(b'{"id":1,"result":{"protocol_version":"wuu-app-server/v0.1","status":"ready"')
    assert any(line.startswith(b'{"id":2,"result":{"thread":') for line in lines), lines
    at_initialize = set(Path(f"{out}.initialize").read_text().split("\n"))
    assert (home / "roost.db").exists()
    assert _loaded(at_initialize, (*_NOT_BEFORE_A_TURN, *_RUNTIME)) == []
    at_exit = set(out.read_text().split("\n"))
    assert "roost.supervisor._root" in at_exit  # the runtime did start
    # no file watcher library at all: the configuration file is polled (roost/protocol/_as_reload.py)
    assert _loaded(at_exit, (*_NOT_BEFORE_A_TURN, "watchfiles", "anyio")) == []


def test_the_early_initialize_answer_is_the_sessions_answer(tmp_path: Path) -> None:
    """The early answer of ``initialize`` and the session's answer of a repeated one are the same
    result (same owner id as the runtime's lease owner); what the first request set (client,
    capabilities) stays; every request read in the same chunk as the first is answered."""
    first = (b'{"id":"a","method":"initialize","params":{"protocol_version":"wuu-app-server/v0.1",'
             b'"client":{"name":"early-client"},"capabilities":{"reverse_rpc":{"methods":["approval/request"]}}}}\n')
    more = b"".join(b'{"id":%d,"method":"thread/list","params":{}}\n' % i for i in range(40))
    again = b'{"id":"b","method":"initialize","params":{}}\n'
    proc = _serve_file(tmp_path, first + more + again)
    assert proc.returncode == 0, proc.stderr.decode()
    assert Path(f"{tmp_path / 'modules.txt'}.initialize").exists()  # answered early
    replies = [json.loads(line) for line in proc.stdout.splitlines()]
    by_id = {r["id"]: r for r in replies if "id" in r}
    assert replies[0]["id"] == "a" and set(by_id) == {"a", "b", *range(40)}
    assert by_id["a"]["result"] == by_id["b"]["result"]
    assert by_id["a"]["result"]["runtime_host"]["instance_id"].split(":")[1].isdigit()


def test_a_first_line_the_early_answer_does_not_take_gets_the_sessions_answer(tmp_path: Path) -> None:
    """An ``initialize`` with a wrong version or an unknown param, or a first request that is not
    ``initialize``, is left to the session: the same errors and answers as without the early path."""
    bad_version = b'{"id":1,"method":"initialize","params":{"protocol_version":"v9"}}\n'
    unknown = b'{"id":2,"method":"initialize","params":{"colour":"red"}}\n'
    listed = b'{"id":3,"method":"thread/list","params":{}}\n'
    proc = _serve_file(tmp_path, bad_version + unknown + listed + b'{"id":4,"method":"initialize"}\n')
    assert proc.returncode == 0, proc.stderr.decode()
    assert not Path(f"{tmp_path / 'modules.txt'}.initialize").exists()
    replies = {r["id"]: r for r in map(json.loads, proc.stdout.splitlines()) if "id" in r}
    assert replies[1]["error"]["code"] == "invalid_params" and "v9" in replies[1]["error"]["message"]
    assert replies[2]["error"]["code"] == "invalid_params" and "colour" in replies[2]["error"]["message"]
    assert "threads" in replies[3]["result"] and replies[4]["result"]["status"] == "ready"


def test_a_start_that_fails_after_the_early_answer_tells_the_client(tmp_path: Path) -> None:
    """The runtime fails after the store opened (the test-only fault point ``runtime.opened``)
    while ``initialize`` was already answered: the client gets ``{"id": null, "error"}`` on stdout,
    and the process ends as such a failed start always did (a traceback and exit status 1 for an
    unexpected error; a RoostError would be one line and exit status 2)."""
    proc = _serve_file(tmp_path, _INITIALIZE, ROOST_FAULTS="runtime.opened=raise")
    assert proc.returncode == 1, proc.stderr.decode()
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines[0]["id"] == 1 and lines[0]["result"]["status"] == "ready"
    assert lines[1] == {"id": None, "error": {"code": "internal_error",
                                              "message": "InjectedFault: fault injected at runtime.opened"}}
    assert "InjectedFault" in proc.stderr.decode()


def test_an_unusable_home_is_reported_before_any_answer(tmp_path: Path) -> None:
    """A store that cannot be opened is reported as before the early answer existed: nothing on
    stdout, one line on stderr, exit status 2 (the early answer waits for the store)."""
    home = tmp_path / "not-a-dir"
    home.write_text("a file")
    proc = _serve_file(tmp_path, _INITIALIZE, ROOST_HOME=str(home))
    assert proc.returncode == 2, proc.stderr.decode()
    assert proc.stdout == b""
    assert proc.stderr.decode().startswith("roost app-server: error: ")


def test_on_the_scripted_engine_the_early_answer_checks_the_script_without_trio(tmp_path: Path) -> None:
    """The scripted engine is opened (its script checked: ``status`` ready) for the early answer
    without loading the event loop: trio is imported by its turns, not by the engine module."""
    proc = _serve_file(tmp_path, _INITIALIZE, argv=["app-server"], ROOST_PROVIDER="scripted")
    assert proc.returncode == 0, proc.stderr.decode()
    assert b'"status":"ready"' in proc.stdout.split(b"\n")[0]
    at_initialize = set(Path(f"{tmp_path / 'modules.txt'}.initialize").read_text().split("\n"))
    assert "roost.engines._scripted" in at_initialize
    assert _loaded(at_initialize, (*_RUNTIME, "yaml")) == []
