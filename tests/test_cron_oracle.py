"""Issue 18, finding 9: Roost's cron semantics against an independent oracle, over a random corpus.

The oracle below is written from the vixie-cron crontab(5) man page, not from croniter:

* fields: minute 0-59, hour 0-23, day of month 1-31, month 1-12, day of week 0-7 (0 and 7 are
  Sunday); month and day-of-week names (``jan``..``dec``, ``sun``..``sat``, any case) stand for
  their numbers (Roost's README also allows them in ranges);
* a field is a comma list of: ``*`` (first-last), a number, a range ``a-b`` (inclusive, a <= b),
  and a range or ``*`` followed by ``/n`` (every n-th value of the range from its start; n >= 1);
  a step after a single number (``5/10``) is not in the grammar;
* "the command will be run when the minute, hour, and month fields match the current time, and
  when at least one of the two day fields (day of month, or day of week) match", where a day
  field that starts with ``*`` counts as unrestricted: when either day field starts with ``*``,
  both must match; when both are restricted, either suffices;
* times are UTC.

The corpus comes from hypothesis; ``ROOST_CRON_EXAMPLES`` sets its size (300 by default; the soak
run uses thousands).
"""

from __future__ import annotations

import datetime
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roost.scheduling import InvalidCron, NeverFires, parse_cron

UTC = datetime.UTC
EXAMPLES = int(os.environ.get("ROOST_CRON_EXAMPLES") or 300)
BOUNDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
HORIZON_DAYS = 366 * 50


# -- the oracle -----------------------------------------------------------------------------------


def _number(text: str, field: int) -> int:
    low = text.lower()
    if field == 3 and low in MONTHS:
        return MONTHS.index(low) + 1
    if field == 4 and low in DAYS:
        return DAYS.index(low)
    if not text.isdigit():
        raise ValueError(text)
    return int(text)


def oracle_field(text: str, field: int) -> set[int]:
    """The set of values a field matches; ValueError when the man page's grammar refuses it."""
    first, last = BOUNDS[field]
    values: set[int] = set()
    for term in text.split(","):
        base, slash, step_text = term.partition("/")
        if base == "*":
            low, high = first, last
        elif "-" in base:
            a, _, b = base.partition("-")
            low, high = _number(a, field), _number(b, field)
            if low > high:
                raise ValueError(term)
        else:
            if slash:
                raise ValueError(term)      # "5/10": a step needs a range or *
            low = high = _number(base, field)
        if not (first <= low <= last and first <= high <= last):
            raise ValueError(term)
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) < 1:
                raise ValueError(term)
            step = int(step_text)
        values.update(range(low, high + 1, step))
    if field == 4 and 7 in values:
        values.discard(7)
        values.add(0)
    return values


class Oracle:
    def __init__(self, expr: str) -> None:
        fields = expr.split()
        if len(fields) != 5:
            raise ValueError(expr)
        self.sets = [oracle_field(f, i) for i, f in enumerate(fields)]
        self.dom_star, self.dow_star = fields[2].startswith("*"), fields[4].startswith("*")

    def day_matches(self, day: datetime.date) -> bool:
        dom = day.day in self.sets[2]
        dow = (day.isoweekday() % 7) in self.sets[4]
        if day.month not in self.sets[3]:
            return False
        if self.dom_star or self.dow_star:
            return dom and dow
        return dom or dow

    def next_after(self, t: datetime.datetime) -> datetime.datetime | None:
        """The first matching minute strictly after ``t``, searching day by day (50 years)."""
        t = t.replace(second=0, microsecond=0)
        day = t.date()
        for _ in range(HORIZON_DAYS):
            if self.day_matches(day):
                for hour in sorted(self.sets[1]):
                    for minute in sorted(self.sets[0]):
                        cand = datetime.datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)
                        if cand > t:
                            return cand
            day += datetime.timedelta(days=1)
        return None

    def prev_before(self, t: datetime.datetime) -> datetime.datetime | None:
        """The last matching minute strictly before ``t`` (searching back up to 50 years)."""
        day = t.date()
        for _ in range(HORIZON_DAYS):
            if self.day_matches(day):
                for hour in sorted(self.sets[1], reverse=True):
                    for minute in sorted(self.sets[0], reverse=True):
                        cand = datetime.datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)
                        if cand < t:
                            return cand
            day -= datetime.timedelta(days=1)
        return None


# -- the corpus -----------------------------------------------------------------------------------


def _atom(field: int) -> st.SearchStrategy[str]:
    first, last = BOUNDS[field]
    numbers = st.integers(first - 1 if field != 0 else 0, last + 1).map(str)
    if field == 3:
        return st.one_of(numbers, st.sampled_from(MONTHS + [m.upper() for m in MONTHS[:3]]))
    if field == 4:
        return st.one_of(numbers, st.sampled_from(DAYS + ["Mon", "SAT"]))
    return numbers


def _term(field: int) -> st.SearchStrategy[str]:
    step = st.integers(0, 25).map(lambda n: f"/{n}")
    return st.one_of(
        st.just("*"),
        st.tuples(st.just("*"), step).map("".join),
        _atom(field),
        st.tuples(_atom(field), step).map("".join),                                  # not in the grammar
        st.tuples(_atom(field), st.just("-"), _atom(field)).map("".join),
        st.tuples(_atom(field), st.just("-"), _atom(field), step).map("".join),
    )


def _field(field: int) -> st.SearchStrategy[str]:
    return st.lists(_term(field), min_size=1, max_size=3).map(",".join)


EXPRESSIONS = st.tuples(*(_field(i) for i in range(5))).map(" ".join)
INSTANTS = st.datetimes(min_value=datetime.datetime(1990, 1, 1), max_value=datetime.datetime(2090, 1, 1),
                        timezones=st.just(UTC))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EXPRESSIONS, INSTANTS)
def test_roost_agrees_with_the_man_page_oracle(expr: str, at: datetime.datetime) -> None:
    try:
        oracle: Oracle | None = Oracle(expr)
    except ValueError:
        oracle = None
    try:
        roost = parse_cron(expr, check_fires=False)
    except InvalidCron:
        assert oracle is None, f"Roost refuses {expr!r}, which the man page allows"
        return
    assert oracle is not None, f"Roost accepts {expr!r}, which the man page refuses"
    expected = oracle.next_after(at)
    try:
        got = roost.next_after(at)
    except NeverFires:
        got = None
    assert got == expected, (expr, at)
    if expected is not None:
        assert roost.prev_before(expected) == oracle.prev_before(expected), (expr, expected)


def test_the_oracle_knows_the_readme_examples() -> None:
    monday = datetime.datetime(2026, 6, 1, tzinfo=UTC)       # 1 June 2026 is a Monday
    assert Oracle("0 0 * * 1").next_after(monday) == datetime.datetime(2026, 6, 8, tzinfo=UTC)
    assert Oracle("0 0 1 * 1").next_after(monday - datetime.timedelta(days=1)) == monday
    assert Oracle("0 0 31 2 *").next_after(monday) is None
    for expr in ("0 0 * * 1", "0 0 */2 * 1", "0 0 1 * 1", "0 0 30 2 1", "*/15 9-17 * jan-mar mon-fri"):
        assert parse_cron(expr).next_after(monday) == Oracle(expr).next_after(monday), expr
