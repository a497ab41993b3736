"""The daemon's logs: one JSON object per line to a rotating file, readable lines on stderr.

``roost serve`` (issue 17, "Seeing into the daemon") logs every ``roost.*`` logger (``roost.serve``,
``roost.scheduler``, ``roost.supervisor`` ...) to

* ``$ROOST_HOME/logs/roost.log``: one JSON object per line (``logging.handlers.RotatingFileHandler``,
  :data:`MAX_BYTES` per file, :data:`BACKUPS` old files ``roost.log.1`` ...). Fields: ``ts`` (ISO 8601
  UTC), ``level``, ``logger``, ``msg``, ``pid``, ``exc`` (a traceback, when one was logged) and every
  ``extra=`` field of the call (``event``, ``task_id``, ``client``, ``schedule`` ...; one named like
  a field of the record itself is written ``extra_<name>``). ``event``
  names what happened: ``task_accepted``, ``task_started``, ``task_finished``,
  ``client_connected``, ``client_dropped``, ``approval_asked``, ``approval_answered``,
  ``schedule_fired``, ``schedule_run_finished``, ``schedule_adopted``, ``daemon_started``.
* stderr: ``TIME LEVEL LOGGER: message`` lines.

Both get INFO and above; ``-v`` adds DEBUG (and DEBUG of other libraries on stderr).
"""

from __future__ import annotations

import datetime
import logging
import logging.handlers
import os
import sys
from pathlib import Path
from typing import Any

from roost._json import dumps

__all__ = [
    "BACKUPS",
    "MAX_BYTES",
    "WORKER_INDEX_ENV",
    "JsonFormatter",
    "log_path",
    "setup_daemon_logging",
    "worker_index",
]

#: Bytes per log file before it rotates.
MAX_BYTES = 10 << 20
#: Rotated files kept (``roost.log.1`` .. ``roost.log.5``).
BACKUPS = 5

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


#: The environment variable that tells a worker of ``roost serve --workers`` its index (as
#: ``roost status`` lists it): it names the worker's log file.
WORKER_INDEX_ENV = "ROOST_WORKER_INDEX"


def worker_index() -> int:
    """This headless worker's index, from :data:`WORKER_INDEX_ENV` (0 when unset)."""
    return int(os.environ.get(WORKER_INDEX_ENV) or 0)


def log_path(home: Path, worker: int | None = None) -> Path:
    """``HOME/logs/roost.log``, or ``HOME/logs/roost.worker-K.log`` for worker ``K`` of
    ``roost serve --workers`` (one file per process, so that no two processes rotate one file)."""
    return home / "logs" / ("roost.log" if worker is None else f"roost.worker-{worker}.log")


#: The fields every record carries; an ``extra`` field of the same name is written ``extra_<name>``.
_OWN = frozenset({"ts", "level", "logger", "msg", "pid", "exc"})


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object (no newline inside; see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                if key in _OWN:  # an extra field never overwrites the record's own
                    key = f"extra_{key}"
                doc[key] = value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else str(value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return dumps(doc).decode()


def setup_daemon_logging(verbose: bool, home: Path, worker: int | None = None) -> Path | None:
    """Route the ``roost`` loggers to ``home/logs/roost.log`` (JSON) and stderr (readable).

    ``worker``: the index of a headless worker of ``roost serve --workers``, which logs to a file
    of its own (:func:`log_path`): :class:`logging.handlers.RotatingFileHandler` rotates by
    renaming, which is safe for one process per file only.

    Returns:
        The log file's path, or ``None`` when it could not be opened (then a warning on stderr
        says why and the daemon logs to stderr alone).
    """
    level = logging.DEBUG if verbose else logging.INFO
    root = logging.getLogger()
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.handlers[:] = [stderr]
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    roost = logging.getLogger("roost")
    roost.setLevel(level)
    path = log_path(home, worker)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")
    except OSError as exc:
        roost.warning("cannot open the log file %s: %s; logging to stderr only", path, exc)
        return None
    handler.setFormatter(JsonFormatter())
    handler.setLevel(level)
    for old in [h for h in roost.handlers if isinstance(h, logging.handlers.RotatingFileHandler)]:
        roost.removeHandler(old)
        old.close()
    roost.addHandler(handler)
    os.chmod(path, 0o600)
    return path
