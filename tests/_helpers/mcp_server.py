"""A small MCP server for the MCP plugin tests, written with the official SDK's server API
(``MCPServer``, the SDK 2.x name of FastMCP).

Run it as ``python mcp_server.py stdio`` (stdin/stdout) or ``python mcp_server.py http PORT_FILE``
(streamable HTTP on 127.0.0.1, an OS-chosen port written to PORT_FILE once it listens).
``noisy`` is ``stdio`` after a first stdout line that is not JSON-RPC; ``garbage`` writes that
line and then never answers (a server whose stdout cannot be used). ``hang_start PID_FILE``
writes its pid and never starts (on SIGTERM it writes ``PID_FILE.term`` and exits: it was asked
to stop, not killed); ``die_start`` fails at start with a ``ModuleNotFoundError`` on stderr.

Tools:
    echo(text): returns ``echo: <text>`` (annotated ``readOnlyHint``: never needs approval).
    write_note(text): appends ``text`` to the file ``$MCP_NOTES`` (a mutating tool), returns ``noted``.
    whoami(): this server process's pid (a reconnect starts a new process).
    crash(): the process exits at once, mid-call.
    hang(): blocks the whole server (a synchronous sleep): it answers nothing any more.
"""

from __future__ import annotations

import os
import socket
import sys
import time


def _before_the_sdk() -> None:
    """The modes that never serve, handled before the SDK's (slow) import: on a loaded machine
    their first act then comes well within the tests' ``connect_timeout``."""
    mode = sys.argv[1] if len(sys.argv) >= 2 else ""
    if mode == "garbage":
        sys.stdout.write("starting up, not JSON\n")
        sys.stdout.flush()
        time.sleep(3600)
    if mode == "hang_start" and len(sys.argv) >= 3:
        import signal

        def _asked_to_stop(*_: object) -> None:
            with open(sys.argv[2] + ".term", "w", encoding="utf-8") as out:
                out.write("SIGTERM")
            os._exit(0)

        signal.signal(signal.SIGTERM, _asked_to_stop)
        with open(sys.argv[2], "w", encoding="utf-8") as out:
            out.write(str(os.getpid()))
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    _before_the_sdk()

from mcp.server.mcpserver import MCPServer  # noqa: E402
from mcp_types import ToolAnnotations  # noqa: E402

server = MCPServer("roost-test-mcp")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def echo(text: str) -> str:
    """Echo the text back."""
    return f"echo: {text}"


@server.tool()
def write_note(text: str) -> str:
    """Append a note to the notes file."""
    with open(os.environ["MCP_NOTES"], "a", encoding="utf-8") as notes:
        notes.write(text + "\n")
    return "noted"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def whoami() -> str:
    """The server's process id."""
    return f"pid {os.getpid()}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def crash() -> str:
    """Exit the server process mid-call."""
    os._exit(3)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def hang() -> str:
    """Block the whole server (a synchronous sleep on its event loop): it answers nothing any more."""
    time.sleep(3600)
    return "unreachable"


def _serve_http(port_file: str) -> None:
    import anyio
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning")
    with open(port_file + ".tmp", "w", encoding="utf-8") as out:
        out.write(str(port))
    os.replace(port_file + ".tmp", port_file)
    anyio.run(lambda: uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "die_start":
        print("loading the notes plugin", file=sys.stderr, flush=True)
        import roost_test_no_such_module  # noqa: F401
    elif len(sys.argv) >= 2 and sys.argv[1] == "http":
        _serve_http(sys.argv[2])
    elif len(sys.argv) >= 2 and sys.argv[1] == "noisy":
        sys.stdout.write("starting up, not JSON\n")
        sys.stdout.flush()
        server.run("stdio")
    else:
        server.run("stdio")
