"""roost.log records: an ``extra=`` field never overwrites the record's own ts/level/logger/msg/pid."""

from __future__ import annotations

import json
import logging
import os

from roost.cli._logs import JsonFormatter


def _record(**extra: object) -> logging.LogRecord:
    logger = logging.getLogger("roost.test_log_format")
    return logger.makeRecord(logger.name, logging.INFO, __file__, 1, "worker %d started", (3,), None, extra=extra)


def test_an_extra_field_named_like_a_record_field_is_prefixed() -> None:
    doc = json.loads(JsonFormatter().format(_record(pid=999999, ts="x", level="y", event="worker_started")))
    assert doc["pid"] == os.getpid() and doc["level"] == "INFO" and doc["ts"] != "x"
    assert doc["extra_pid"] == 999999 and doc["extra_ts"] == "x" and doc["extra_level"] == "y"
    assert doc["msg"] == "worker 3 started" and doc["event"] == "worker_started"


def test_plain_extra_fields_keep_their_names() -> None:
    doc = json.loads(JsonFormatter().format(_record(worker=1, worker_pid=42)))
    assert doc["worker"] == 1 and doc["worker_pid"] == 42 and "extra_worker" not in doc
