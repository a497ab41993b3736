"""The serve socket path: its default location and the single-daemon rule.

The daemon holds an exclusive ``flock`` on ``<socket>.lock`` for its lifetime. A second daemon
fails to take it and exits non-zero (:class:`DaemonRunning`); the holder removes a socket file
only while holding the lock (so the file is stale: its daemon is dead) and only after a connect
attempt is refused. Anything at the path that is not a socket is never removed (issue 18,
finding 7: :class:`SocketPathTaken`).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import socket as stdsocket
import stat
from pathlib import Path

from roost._paths import run_dir
from roost.errors import ConfigError

__all__ = ["DaemonRunning", "SocketPathTaken", "default_socket_path", "claim_socket_path"]


class DaemonRunning(ConfigError):
    """Another live ``roost serve`` owns this socket path."""


class SocketPathTaken(DaemonRunning):
    """Something that is not a socket (a regular file, a directory, a symlink) is at the socket path."""


def default_socket_path(work_dir: Path) -> Path:
    """``$ROOST_HOME/run/<first 16 hex digits of sha256(work dir)>.sock``."""
    digest = hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:16]
    return run_dir() / f"{digest}.sock"


def claim_socket_path(path: Path) -> int:
    """Take the single-daemon lock of ``path`` and remove a stale socket file; return the lock fd.

    The default socket's directory (``$ROOST_HOME/run``) is created when missing; any other
    directory must exist (a mistyped ``--socket`` never creates directories).

    Raises:
        DaemonRunning: another daemon holds the lock, or something accepts connections on ``path``.
        SocketPathTaken: ``path`` exists and is not a socket (it is left untouched).
        ConfigError: ``path``'s directory does not exist (and is not ``$ROOST_HOME/run``), or is
            not a directory.
    """
    if path.parent.resolve() == run_dir().resolve():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    elif not path.parent.is_dir():
        what = "is not a directory" if path.parent.exists() else "does not exist"
        raise ConfigError(f"the socket's directory {path.parent} {what}; create it or give another --socket path")
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise DaemonRunning(f"another roost serve is already running on {path}") from None
        raise
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISSOCK(mode):
        # Issue 18, finding 7: only a socket is ever removed; a file, directory or symlink at the
        # path is somebody's data.
        os.close(fd)
        kind = "directory" if stat.S_ISDIR(mode) else "symbolic link" if stat.S_ISLNK(mode) else "file"
        raise SocketPathTaken(
            f"{path} exists and is a {kind}, not a socket; not removing it. "
            "Move it away or give another path with --socket"
        )
    if mode is not None:
        probe = stdsocket.socket(stdsocket.AF_UNIX, stdsocket.SOCK_STREAM)
        probe.settimeout(2.0)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink(missing_ok=True)  # stale: its daemon is dead (we hold the lock)
        else:
            os.close(fd)
            raise DaemonRunning(f"a daemon is accepting connections on {path}; not displacing it")
        finally:
            probe.close()
    return fd
