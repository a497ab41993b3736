"""Standard output after its reader went away (a closed pipe), shared by the dialects and the CLI."""

from __future__ import annotations

import os
import sys

__all__ = ["silence_stdout"]


def silence_stdout() -> None:
    """Point stdout at /dev/null (after its reader went away) so exit-time flushes stay quiet.

    Errors (no stdout file descriptor, a platform without ``dup2``) are ignored: there is nobody
    left to tell.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        # (sys.stdout is None when the process started with file descriptor 1 closed)
        os.dup2(devnull, sys.stdout.fileno() if sys.stdout is not None else 1)
        os.close(devnull)
    except (OSError, ValueError):
        pass
