"""Where Roost keeps its files: ``$ROOST_HOME`` (default ``~/.roost``)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["roost_home", "database_path", "config_path", "run_dir"]


def roost_home() -> Path:
    """Return ``$ROOST_HOME`` (default ``~/.roost``), creating it (mode 0700) when missing.

    Raises:
        ConfigError: it exists and is not a directory, or cannot be created.
    """
    raw = os.environ.get("ROOST_HOME") or str(Path.home() / ".roost")
    home = Path(raw).expanduser()
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        from roost.errors import ConfigError

        raise ConfigError(f"ROOST_HOME {str(home)!r} is not a usable directory: {exc.strerror or exc}") from exc
    return home


def database_path() -> Path:
    """Return ``$ROOST_HOME/roost.db``."""
    return roost_home() / "roost.db"


def config_path() -> Path:
    """Return ``$ROOST_HOME/config.toml`` (it may not exist)."""
    return roost_home() / "config.toml"


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
