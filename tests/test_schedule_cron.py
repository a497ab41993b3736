"""Cron semantics (roost.scheduling): 5 fields, UTC only, vixie day-of-month/day-of-week rule."""

from __future__ import annotations

import datetime
import os
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roost.errors import UsageError
from roost.scheduling import InvalidCron, NeverFires, format_slot, parse_cron, parse_slot
from _helpers.timing import scaled

UTC = datetime.timezone.utc


def at(*args: int) -> datetime.datetime:
    return datetime.datetime(*args, tzinfo=UTC)


def fires(expr: str, after: datetime.datetime, n: int) -> list[datetime.datetime]:
    cron = parse_cron(expr, now=after)
    out, t = [], after
    for _ in range(n):
        t = cron.next_after(t)
        out.append(t)
    return out


def test_exactly_five_fields():
    for bad in ("* * * * * *", "0 0 * *", "@daily", "", "0 0 1 1 1 2026"):
        with pytest.raises(InvalidCron):
            parse_cron(bad, now=at(2026, 1, 1))
    assert parse_cron("  0   9 * *  1-5 ", now=at(2026, 1, 1)).text == "0 9 * * 1-5"


def test_nonstandard_syntax_and_ranges_rejected():
    for bad in ("0 0 L * *", "0 0 ? * *", "0 0 * * 1#2", "H 0 * * *", "0 0 15W * *",
                "60 * * * *", "* 24 * * *", "0 0 0 * *", "0 0 * 13 *", "0 0 * * 8", "a b c d e"):
        with pytest.raises(InvalidCron):
            parse_cron(bad, now=at(2026, 1, 1))
    # names and 7-as-Sunday are standard
    assert fires("0 0 1 jan *", at(2026, 6, 1), 1) == [at(2027, 1, 1)]
    assert fires("0 0 * * 7", at(2026, 1, 1), 1) == fires("0 0 * * sun", at(2026, 1, 1), 1) == [at(2026, 1, 4)]


def test_never_firing_expression_is_rejected():
    for never in ("0 0 31 2 *", "0 0 30 2 *", "0 0 31 4,6,9,11 *"):
        with pytest.raises(NeverFires):
            parse_cron(never, now=at(2026, 1, 1))


def test_leap_day():
    assert fires("0 0 29 2 *", at(2026, 1, 1), 3) == [at(2028, 2, 29), at(2032, 2, 29), at(2036, 2, 29)]
    # 2100 is not a leap year: from 2096 the next 29 February is in 2104
    assert fires("0 0 29 2 *", at(2096, 3, 1), 1) == [at(2104, 2, 29)]
    # starting exactly on a leap day slot gives the next one, not the same one
    assert fires("30 12 29 2 *", at(2028, 2, 29, 12, 30), 1) == [at(2032, 2, 29, 12, 30)]


def test_vixie_day_of_month_or_day_of_week():
    # both restricted: either matches. There is no 30 February, so Mondays of February fire.
    got = fires("0 0 30 2 1", at(2026, 1, 1), 5)
    assert got == [at(2026, 2, 2), at(2026, 2, 9), at(2026, 2, 16), at(2026, 2, 23), at(2027, 2, 1)]
    assert all(t.weekday() == 0 for t in got)
    # the 1st of the month OR a Monday
    got = fires("0 0 1 * 1", at(2026, 1, 26), 3)
    assert got == [at(2026, 2, 1), at(2026, 2, 2), at(2026, 2, 9)]  # 1 Feb 2026 is a Sunday


def test_vixie_star_field_means_and():
    # day-of-week restricted, day-of-month '*': only Mondays
    assert all(t.weekday() == 0 for t in fires("0 0 * * 1", at(2026, 1, 1), 10))
    # a field *starting* with '*' ('*/2') still counts as unrestricted: odd days that are Mondays
    got = fires("0 0 */2 * 1", at(2026, 1, 1), 6)
    assert got[:3] == [at(2026, 1, 5), at(2026, 1, 19), at(2026, 2, 9)]
    assert all(t.weekday() == 0 and t.day % 2 == 1 for t in got)
    # day-of-month restricted, day-of-week '*/1': only the 13th (not every day)
    assert fires("0 0 13 * */1", at(2026, 1, 1), 2) == [at(2026, 1, 13), at(2026, 2, 13)]
    # '1-31' is a restriction (does not start with '*'): OR with Friday = every day
    assert fires("0 0 1-31 * 5", at(2026, 1, 1), 3) == [at(2026, 1, 2), at(2026, 1, 3), at(2026, 1, 4)]


def test_naive_times_refused_and_other_zones_converted():
    cron = parse_cron("0 12 * * *", now=at(2026, 1, 1))
    with pytest.raises(UsageError):
        cron.next_after(datetime.datetime(2026, 1, 1))
    plus2 = datetime.timezone(datetime.timedelta(hours=2))
    nxt = cron.next_after(datetime.datetime(2026, 1, 1, 13, 0, tzinfo=plus2))  # 11:00 UTC
    assert nxt == at(2026, 1, 1, 12) and nxt.tzinfo == UTC


def test_slot_text_round_trip_and_order():
    t = at(2026, 3, 29, 1, 0)
    assert format_slot(t) == "2026-03-29T01:00:00.000000Z"
    assert parse_slot(format_slot(t)) == t
    assert format_slot(at(2026, 1, 1, 9)) < format_slot(at(2026, 1, 1, 10))


def test_due_slots_is_inclusive_keeps_the_latest_and_gives_the_following():
    cron = parse_cron("*/15 * * * *", now=at(2026, 1, 1))
    assert cron.due_slots(at(2026, 1, 1, 0, 0), at(2026, 1, 1, 1, 0), limit=10) == ([
        at(2026, 1, 1, 0, m) for m in (0, 15, 30, 45)] + [at(2026, 1, 1, 1, 0)], at(2026, 1, 1, 1, 15))
    assert cron.due_slots(at(2026, 1, 1, 0, 0), at(2026, 1, 1, 1, 0), limit=2) == (
        [at(2026, 1, 1, 0, 45), at(2026, 1, 1, 1, 0)], at(2026, 1, 1, 1, 15))
    assert cron.due_slots(at(2026, 1, 1, 0, 1), at(2026, 1, 1, 0, 14), limit=2) == ([], at(2026, 1, 1, 0, 15))


def test_reused_iterators_give_the_same_answers_in_any_order():
    cron = parse_cron("0 0 29 2 *", now=at(2026, 1, 1))
    assert cron.next_after(at(2096, 3, 1)) == at(2104, 2, 29)
    assert cron.next_after(at(2026, 1, 1)) == at(2028, 2, 29)
    assert parse_cron("0 0 29 2 *") is cron  # compiled once per text


_DST_SCRIPT = r"""
import datetime, time, json
time.tzset()
from roost.errors import UsageError
from roost.scheduling import parse_cron
UTC = datetime.timezone.utc
out = []
for expr, start in (("30 1 * * *", datetime.datetime(2026, 3, 7, tzinfo=UTC)),
                    ("30 6 * * *", datetime.datetime(2026, 10, 31, tzinfo=UTC)),
                    ("0 * * * *", datetime.datetime(2026, 3, 29, 0, 30, tzinfo=UTC))):
    cron = parse_cron(expr, now=start)
    t = start
    for _ in range(4):
        t = cron.next_after(t)
        out.append(t.isoformat())
print(json.dumps([time.tzname, out]))
"""


def test_host_timezone_has_no_effect_across_dst():
    """The same results under UTC, New York (DST 8 March 2026) and Berlin (DST 29 March 2026)."""
    results = {}
    for tz in ("UTC", "America/New_York", "Europe/Berlin"):
        env = dict(os.environ, TZ=tz)
        proc = subprocess.run([sys.executable, "-c", _DST_SCRIPT], capture_output=True, text=True,
                              env=env, timeout=scaled(60))
        assert proc.returncode == 0, proc.stderr
        names, times = json.loads(proc.stdout)
        results[tz] = times
        if tz != "UTC":
            assert names[0] != "UTC"  # the zone really was in effect
    assert results["UTC"] == results["America/New_York"] == results["Europe/Berlin"]
    assert results["UTC"][:4] == [f"2026-03-0{d}T01:30:00+00:00" for d in (7, 8, 9)] + ["2026-03-10T01:30:00+00:00"]
    assert results["UTC"][8:] == [f"2026-03-29T0{h}:00:00+00:00" for h in (1, 2, 3, 4)]


@settings(max_examples=200, deadline=None)
@given(
    minute=st.sampled_from(["*", "0", "*/7", "5,35", "10-20/5"]),
    hour=st.sampled_from(["*", "3", "*/6", "22-23"]),
    dom=st.sampled_from(["*", "1", "*/2", "13", "29", "31", "1-31"]),
    month=st.sampled_from(["*", "2", "*/3", "jan,jul"]),
    dow=st.sampled_from(["*", "1", "*/2", "0", "5-6"]),
    start=st.datetimes(min_value=datetime.datetime(2000, 1, 1), max_value=datetime.datetime(2090, 1, 1)),
)
def test_next_matches_the_vixie_rule_by_brute_force(minute, hour, dom, month, dow, start):
    """Property: next_after agrees with a minute-by-minute vixie matcher (over the next 400 days)."""
    expr = f"{minute} {hour} {dom} {month} {dow}"
    start = start.replace(tzinfo=UTC)
    try:
        cron = parse_cron(expr, now=start)
    except NeverFires:
        return
    nxt = cron.next_after(start)
    assert nxt > start and nxt.second == 0 and nxt.microsecond == 0
    assert _vixie_match(expr, nxt)
    # no match strictly between start and nxt (checked at the day level, then by minute)
    t = (start + datetime.timedelta(minutes=1)).replace(second=0, microsecond=0)
    horizon = min(nxt, start + datetime.timedelta(days=400))
    while t < horizon:
        if _day_match(expr, t):
            day_end = t.replace(hour=23, minute=59)
            u = t
            while u <= min(day_end, horizon - datetime.timedelta(minutes=1)):
                assert not _vixie_match(expr, u), (expr, start, u, nxt)
                u += datetime.timedelta(minutes=1)
        t = (t + datetime.timedelta(days=1)).replace(hour=0, minute=0)


_MONTHS = {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())}


def _values(field: str, lo: int, hi: int) -> set[int]:
    out: set[int] = set()
    for term in field.split(","):
        base, _, step = term.partition("/")
        if base == "*":
            a, b = lo, hi
        elif "-" in base:
            a, b = (int(_MONTHS.get(x, x)) for x in base.split("-"))
        else:
            a = b = int(_MONTHS.get(base, base))
        out.update(range(a, b + 1, int(step) if step else 1))
    return out


def _day_match(expr: str, t: datetime.datetime) -> bool:
    _, _, dom, month, dow = expr.split()
    if t.month not in _values(month, 1, 12):
        return False
    dows = {d % 7 for d in _values(dow, 0, 7)}
    d_ok, w_ok = t.day in _values(dom, 1, 31), (t.isoweekday() % 7) in dows
    if dom.startswith("*") or dow.startswith("*"):
        return d_ok and w_ok
    return d_ok or w_ok


def _vixie_match(expr: str, t: datetime.datetime) -> bool:
    minute, hour, *_ = expr.split()
    return t.minute in _values(minute, 0, 59) and t.hour in _values(hour, 0, 23) and _day_match(expr, t)

