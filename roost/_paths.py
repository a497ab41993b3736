"""Where Roost keeps its files: ``$ROOST_HOME`` (default ``~/.roost``); and the settings of this
process read from its environment (numeric variables, the node name, the usable cores)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = [
    "roost_home",
    "database_path",
    "config_path",
    "run_dir",
    "positive_env",
    "usable_cores",
    "check_env_settings",
    "tree_settings",
]


def roost_home(*, create: bool = True) -> Path:
    """Return ``$ROOST_HOME`` (default ``~/.roost``), creating it (mode 0700) when missing unless
    ``create`` is false (a read-only query such as ``roost status`` leaves no directory behind).

    Raises:
        ConfigError: it exists and is not a directory, or cannot be created.
    """
    raw = os.environ.get("ROOST_HOME") or str(Path.home() / ".roost")
    home = Path(raw).expanduser()
    try:
        if not create:
            _check_existing(home)
            return home
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        from roost.errors import ConfigError

        if _is_non_directory(home):
            why = "it is a file, not a directory"
        elif isinstance(exc, NotADirectoryError):
            why = "a part of its path is a file, not a directory"
        else:
            why = str(exc.strerror or exc)
        raise ConfigError(f"ROOST_HOME {str(home)!r} is not a usable directory: {why}") from exc
    return home


def _is_non_directory(path: Path) -> bool:
    """Whether ``path`` exists and is not a directory (False when it cannot be looked at)."""
    try:
        return not stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False


def _check_existing(home: Path) -> None:
    """For ``roost_home(create=False)``: a missing ``home`` is fine (nothing to read yet) when it
    could be created; raise the OSError that makes it unusable otherwise (a file, a file in its
    path, a directory this process cannot search or read)."""
    try:
        info = os.stat(home)
    except FileNotFoundError:
        return  # (a file in its path is ENOTDIR, raised by os.stat itself)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(20, "not a directory", str(home))
    if not os.access(home, os.R_OK | os.X_OK):
        raise PermissionError(13, "Permission denied", str(home))


def database_path() -> Path:
    """Return ``$ROOST_HOME/roost.db``."""
    return roost_home() / "roost.db"


def config_path() -> Path:
    """Return ``$ROOST_HOME/config.toml`` (it may not exist)."""
    return roost_home() / "config.toml"


def node_name() -> str:
    """This node's name in a cluster: ``"<host>:<ROOST_HOME>"``. Stable across restarts of a
    daemon (unlike its lease owner identity), distinct for two daemons of one host with their
    own homes (issue 13: a task remembers the node that dispatched it, whose client gets its
    result)."""
    import socket

    return f"{socket.gethostname()}:{roost_home()}"


def run_dir() -> Path:
    """Return ``$ROOST_HOME/run`` (sockets and pid files), mode 0700, creating it when missing.

    Raises:
        ConfigError: ``$ROOST_HOME`` or its ``run`` directory is not usable (not a directory, a
            read-only file system, no permission).
    """
    path = roost_home() / "run"
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        from roost.errors import ConfigError

        raise ConfigError(
            f"{str(path)!r} (ROOST_HOME's socket directory) is not usable: {exc.strerror or exc}; "
            "make ROOST_HOME a writable directory, or pass --socket PATH"
        ) from exc
    return path


def usable_cores() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``, else ``os.cpu_count()``), >= 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def positive_env(name: str, default: float, *, integer: bool = False, unit: str = "") -> float:
    """``$name`` as a positive number (an ``int`` with ``integer=True``), or ``default`` when it is
    unset or empty; the one reader of Roost's numeric tuning variables.

    Raises:
        ConfigError: the variable is set but is not a positive (finite) number, e.g.
            ``ROOST_MAX_PARALLEL must be a positive integer, got 'abc'`` (a command reports it at
            start-up and exits 2).
    """
    from roost.errors import ConfigError

    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    value: float
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        if integer:
            what = "a positive integer" + (f" ({unit})" if unit else "")
        else:
            what = "a positive number" + (f" of {unit}" if unit else "")
        raise ConfigError(f"{name} must be {what}, got {raw!r}")
    return value


#: The numeric tuning variables: name -> (integer?, unit), each read by :func:`positive_env`.
_TUNING_ENV = {
    "ROOST_LEASE_TTL": (False, "seconds"),
    "ROOST_IDLE_UNLOAD_S": (False, "seconds"),
    "ROOST_TASK_POLL_S": (False, "seconds"),
    "ROOST_MAX_LINE_BYTES": (True, "bytes"),
    "ROOST_OUTBOX_BYTES": (True, "bytes"),
    "ROOST_MAX_PARALLEL": (True, ""),
    "ROOST_MAX_DEPTH": (True, ""),
}


def check_env_settings() -> None:
    """Check every numeric tuning variable (:data:`_TUNING_ENV`) at start-up.

    Raises:
        ConfigError: the first one that is set but invalid (see :func:`positive_env`).
    """
    for name, (integer, unit) in _TUNING_ENV.items():
        positive_env(name, 1, integer=integer, unit=unit)


def tree_settings() -> tuple[int, int]:
    """``(max_parallel, max_depth)`` from ``ROOST_MAX_PARALLEL`` / ``ROOST_MAX_DEPTH`` (5 and 3)."""
    parallel = int(positive_env("ROOST_MAX_PARALLEL", 5, integer=True))
    return parallel, int(positive_env("ROOST_MAX_DEPTH", 3, integer=True))
