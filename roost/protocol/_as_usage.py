"""``usage/overview`` and ``settings/usage`` (app-server-protocol.md, "Usage overview").

Both summarize the token usage Roost recorded on its turns (``turns.usage``; read with
:func:`roost.storage.list_usage_records`, never conversation content). A turn is a usage record
when it reported tokens; it counts on the calendar day of its start in the requested IANA
``timezone`` (default UTC). These values exclude unreported and external activity and are not
billing totals.

Totals (``metrics`` and each day): ``input_tokens``, ``output_tokens``, ``cached_tokens``,
``total_tokens`` (input + output), ``turns``, ``sessions`` (distinct conversations; a worker's
usage counts for its root conversation), ``agents`` (distinct worker threads); ``metrics`` adds
``active_days``. ``settings/usage`` adds ``engine_breakdowns``: Roost has one engine, the built-in
one, so there is one entry ``{engine_id: "roost", in_wuu: totals}``; ``outside`` is absent (Roost
reads no external engine ledger).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from roost.errors import InvalidParams
from roost.protocol._appserver import AppServerSession, method
from roost.protocol._as_common import read_store
from roost.protocol._params import STR, check_params
from roost.storage import list_usage_records

__all__ = ["summarize_usage"]

_COUNTS = ("input_tokens", "output_tokens", "cached_tokens")


def _zone(name: str | None) -> tuple[str, Any]:
    """``(name, tzinfo)`` of an IANA zone; omitted means UTC.

    Raises:
        InvalidParams: not a known IANA zone name.
    """
    if name is None:
        return "UTC", UTC
    try:
        return name, ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidParams(f"timezone {name!r} is not a known IANA time zone (e.g. America/Los_Angeles)") from None


class _Tally:
    def __init__(self) -> None:
        self.counts = dict.fromkeys(_COUNTS, 0)
        self.turns = 0
        self.sessions: set[str] = set()
        self.agents: set[str] = set()

    def add(self, record: dict) -> None:
        for key in _COUNTS:
            self.counts[key] += record[key]
        self.turns += 1
        self.sessions.add(record["root_thread_id"])
        if record["kind"] == "worker":
            self.agents.add(record["thread_id"])

    def view(self) -> dict:
        return {
            **self.counts,
            "total_tokens": self.counts["input_tokens"] + self.counts["output_tokens"],
            "turns": self.turns,
            "sessions": len(self.sessions),
            "agents": len(self.agents),
        }


def summarize_usage(records: list[dict], tz: Any) -> dict:
    """Aggregate usage records (:func:`roost.storage.list_usage_records`) by calendar day in ``tz``.

    Returns:
        ``{total_sessions, metrics, days}``: ``days`` ascending by ``date`` (``YYYY-MM-DD``), one per
        active day; an empty list of records gives zero totals and no days.
    """
    total = _Tally()
    days: dict[str, _Tally] = {}
    for record in records:
        started = datetime.fromisoformat(record["started_at"])
        if started.tzinfo is None:
            started = started.replace(tzinfo=UTC)
        day = started.astimezone(tz).date().isoformat()
        total.add(record)
        days.setdefault(day, _Tally()).add(record)
    metrics = {**total.view(), "active_days": len(days)}
    return {
        "total_sessions": metrics["sessions"],
        "metrics": metrics,
        "days": [{"date": day, **days[day].view()} for day in sorted(days)],
    }


async def _summary(session: AppServerSession, p: dict) -> tuple[str, dict, list[dict]]:
    zone_name, tz = _zone(p.get("timezone"))
    records = await read_store(session, list_usage_records)
    return zone_name, summarize_usage(records, tz), records


@method("usage/overview")
async def usage_overview(session: AppServerSession, params: Any) -> dict:
    """``usage/overview``: ``{timezone, total_sessions, metrics, days}`` (module docstring).

    Raises:
        InvalidParams: ``timezone`` is not a known IANA zone.
    """
    p = check_params("usage/overview", params, {"timezone": (STR, False)})
    zone_name, summary, _ = await _summary(session, p)
    return {"timezone": zone_name, **summary}


@method("settings/usage")
async def settings_usage(session: AppServerSession, params: Any) -> dict:
    """``settings/usage``: the usage page's snapshot, ``{timezone, total_sessions, metrics, days,
    engine_breakdowns}`` (module docstring).

    Raises:
        InvalidParams: ``timezone`` is not a known IANA zone.
    """
    p = check_params("settings/usage", params, {"timezone": (STR, False)})
    zone_name, summary, records = await _summary(session, p)
    in_roost = _Tally()
    for record in records:
        in_roost.add(record)
    breakdown = {"engine_id": "roost", "display_name": "Roost built-in engine", "in_wuu": in_roost.view()}
    return {"timezone": zone_name, **summary, "engine_breakdowns": [breakdown]}
