"""The listeners of ``roost serve``, children of the root supervisor (DESIGN.md section 2).

Each is a *permanent* child: a restart after a crash binds the same Unix socket path or TCP port
again. A listener only accepts: every accepted client runs as a child of the daemon's
``connections`` supervisor (:meth:`ServeDaemon.start_connection`), so a listener's crash never
ends an attached client.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
from pathlib import Path
from typing import Any

import trio

__all__ = ["ACCEPT_TRANSIENT", "run_http_listener", "run_unix_listener"]

log = logging.getLogger("roost.serve")

#: accept() errors that mean "out of a resource for now", not a broken listener (as trio.serve_listeners).
ACCEPT_TRANSIENT = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


async def run_unix_listener(daemon: Any, *, task_status: Any) -> None:
    """Accept Unix-socket clients of ``daemon`` until cancelled (each a child of ``connections``)."""
    listener = trio.SocketListener(await _bind_unix(daemon.options.socket_path))
    async with listener:
        task_status.started()
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_TRANSIENT:
                    raise
                log.error("serve: accept failed (%s); retrying", exc)
                await trio.sleep(0.1)
                continue
            daemon.start_connection(functools.partial(daemon.serve_unix, stream), stream)


async def run_http_listener(daemon: Any, *, task_status: Any) -> None:
    """Serve ``/attach`` and ``/mcp`` on the HTTP port until cancelled (the same port again on a
    restart: ``daemon.http_port`` keeps the one bound first, also for ``--http-port 0``)."""
    from roost.protocol._serve_http import serve_http

    options = daemon.options
    port = daemon.http_port if daemon.http_port is not None else options.http_port
    assert port is not None
    async with trio.open_nursery() as nursery:
        daemon.http_port = await nursery.start(
            functools.partial(serve_http, daemon, options.host, port, options.ssl_context)
        )
        task_status.started()


async def _bind_unix(path: Path) -> trio.socket.SocketType:
    """A listening Unix socket at ``path`` (mode 0600), replacing the file of an earlier bind by
    this daemon (it holds the socket path's lock, see :func:`claim_socket_path`)."""
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
    old = os.umask(0o177)
    try:
        await sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(512)
    return sock
