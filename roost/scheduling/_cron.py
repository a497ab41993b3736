"""Five-field cron expressions evaluated in UTC, with vixie-cron day matching.

Rules (pinned by ``tests/test_schedule_cron.py``):

* Exactly five whitespace-separated fields: minute (0-59), hour (0-23), day of month (1-31),
  month (1-12 or ``jan``-``dec``), day of week (0-7 or ``sun``-``sat``; 0 and 7 are Sunday).
  Each field is ``*``, a number or name, a range ``a-b``, a step ``*/n`` or ``a-b/n``, or a comma
  list of those. A 6-field (seconds) expression, ``@daily``-style nicknames and the non-standard
  ``L``, ``W``, ``#``, ``?`` and ``H`` are rejected.
* Times are UTC. Every input and output is a timezone-aware UTC ``datetime``; the host's ``TZ``
  has no effect on any result.
* Day of month and day of week combine as in vixie cron: when either field *starts with* ``*``
  (including ``*/2``), a day must match both fields; when both are restricted, a day matching
  either field fires. So ``0 0 30 2 1`` fires at midnight on every Monday of February (there is
  no February 30), ``0 0 */2 * 1`` only on odd-numbered days that are Mondays, and ``0 0 30 2 *``
  never fires.
* An expression is valid only if it has a next fire time (searched up to 50 years ahead). One
  that can never fire (``0 0 31 2 *``) raises :class:`NeverFires`.

croniter does the calendar search; this module decides the syntax, every field's values and the
day rule: croniter is handed each field as the explicit list of its values (its own reading of
``0-0``, ``5/10`` or day 0 differs from vixie cron; its ``day_or`` otherwise treats ``*/2`` as a
restriction). ``tests/test_cron_oracle.py`` checks all of this against an oracle written from the
crontab(5) man page over a random corpus (issue 18, finding 9).
"""

from __future__ import annotations

import datetime
import functools
import re

import attrs
from croniter import croniter
from croniter.croniter import CroniterBadCronError, CroniterBadDateError, CroniterError

from roost.errors import UsageError

__all__ = ["CronExpr", "InvalidCron", "NeverFires", "parse_cron", "format_slot", "parse_slot"]

UTC = datetime.UTC

_NAMES = "jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec|sun|mon|tue|wed|thu|fri|sat"
_ATOM = rf"(?:\d+|{_NAMES})"
_TERM = rf"(?:\*|{_ATOM}(?:-{_ATOM})?)(?:/\d+)?"
_FIELD = re.compile(rf"^{_TERM}(?:,{_TERM})*$", re.IGNORECASE)
_FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week")


class InvalidCron(UsageError, ValueError):
    """The text is not a valid 5-field cron expression (syntax or range)."""


class NeverFires(InvalidCron):
    """The expression is well formed but has no fire time (e.g. ``0 0 31 2 *``)."""


@attrs.frozen
class CronExpr:
    """A validated 5-field UTC cron expression. Build it with :func:`parse_cron`.

    Attributes:
        text: the expression as given (whitespace normalised to single spaces).
        day_or: vixie rule: ``True`` when both day fields are restricted (either matches).
    """

    text: str
    day_or: bool
    #: each field as the explicit comma list of its values (what croniter is given): Roost
    #: decides every field's meaning itself, croniter only searches the calendar
    expanded: str = attrs.field(default="", eq=False, repr=False)

    @property
    def _search_text(self) -> str:
        return self.expanded or self.text

    def next_after(self, after: datetime.datetime) -> datetime.datetime:
        """Return the first fire time strictly after ``after`` (aware UTC, whole minute).

        Not thread-safe (a croniter iterator per expression text is reused); call it from one
        thread, e.g. the trio thread.

        Args:
            after: an aware datetime (any zone; converted to UTC).

        Raises:
            NeverFires: no fire time within 50 years of ``after``.
            UsageError: ``after`` is naive.
        """
        if after.tzinfo is None:
            raise UsageError("cron times must be timezone-aware (UTC)")
        after = after.astimezone(UTC)
        it = _ITERATORS.get(self)
        try:
            if it is None:
                it = croniter(self._search_text, after, day_or=self.day_or)
                if len(_ITERATORS) >= _CACHE_MAX:
                    _ITERATORS.clear()
                _ITERATORS[self] = it
            else:
                it.set_current(after, force=True)
            nxt = it.get_next(datetime.datetime)
        except CroniterBadDateError as exc:
            raise NeverFires(f"cron {self.text!r} never fires") from exc
        return nxt.astimezone(UTC)

    def due_slots(
        self, start: datetime.datetime, end: datetime.datetime, *, limit: int
    ) -> tuple[list[datetime.datetime], datetime.datetime]:
        """Return the fire times ``t`` with ``start <= t <= end`` (oldest first, only the
        ``limit`` most recent) and the first fire time after ``end``.

        Raises:
            NeverFires: as :meth:`next_after`.
        """
        # Issue 18, finding 8: walk back from ``end``, so the cost is O(limit) whatever the gap
        # (a 30-day outage of an every-minute job is 43,200 slots, of which ``limit`` are kept).
        following = self.next_after(end)
        out: list[datetime.datetime] = []
        if limit <= 0:
            return out, following
        end = end.astimezone(UTC)
        cursor = end.replace(second=0, microsecond=0) + datetime.timedelta(minutes=1)
        start = start.astimezone(UTC)
        while len(out) < limit:
            t = self.prev_before(cursor)
            if t is None or t < start:
                break
            out.append(t)
            cursor = t
        out.reverse()
        return out, following

    def prev_before(self, before: datetime.datetime) -> datetime.datetime | None:
        """Return the last fire time strictly before ``before`` (aware UTC), or None if none is found
        (croniter searches a bounded range back).

        Not thread-safe, like :meth:`next_after`.
        """
        if before.tzinfo is None:
            raise UsageError("cron times must be timezone-aware (UTC)")
        it = croniter(self._search_text, before.astimezone(UTC), day_or=self.day_or)
        try:
            prev = it.get_prev(datetime.datetime)
        except CroniterBadDateError:
            return None
        return prev.astimezone(UTC)


#: Reused croniter iterators, by expression (bounded; cleared when full).
_ITERATORS: dict[CronExpr, croniter] = {}
_CACHE_MAX = 4096


@functools.lru_cache(maxsize=4096)
def _compile(norm: str) -> CronExpr:
    fields = norm.split(" ")
    if len(fields) != 5:
        raise InvalidCron(
            f"cron {norm!r} has {len(fields)} field(s); exactly 5 are required "
            "(minute hour day-of-month month day-of-week, UTC)"
        )
    expanded = []
    for index, (name, field) in enumerate(zip(_FIELD_NAMES, fields, strict=True)):
        if not _FIELD.match(field):
            raise InvalidCron(f"cron {norm!r}: unsupported {name} field {field!r}")
        try:
            expanded.append(",".join(str(v) for v in sorted(_field_values(field, index))))
        except ValueError as exc:
            raise InvalidCron(f"cron {norm!r}: {name} field {field!r}: {exc}") from None
    dom, dow = fields[2], fields[4]
    expr = CronExpr(norm, day_or=not (dom.startswith("*") or dow.startswith("*")), expanded=" ".join(expanded))
    try:
        croniter(expr.expanded, day_or=expr.day_or)
    except (CroniterBadCronError, CroniterError, ValueError) as exc:
        raise InvalidCron(f"cron {norm!r}: {exc}") from exc
    return expr


_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _value(text: str, index: int) -> int:
    low = text.lower()
    if index == 3 and low in _MONTHS:
        return _MONTHS.index(low) + 1
    if index == 4 and low in _DAYS:
        return _DAYS.index(low)
    if not text.isdigit():
        raise ValueError(f"{text!r} is not a number{' or name' if index in (3, 4) else ''} here")
    return int(text)


def _field_values(field: str, index: int) -> set[int]:
    """The values field number ``index`` matches, by crontab(5) (vixie cron).

    ``*`` is first-last; ``a-b`` is inclusive and needs ``a <= b``; a step ``/n`` (n >= 1) follows
    ``*`` or a range and takes every n-th value from the range's start; a step after a single
    value (``5/10``) is refused, as in vixie cron. Day of week 7 is Sunday (0).

    Raises:
        ValueError: a value out of the field's range, a reversed range, a bad step.
    """
    first, last = _BOUNDS[index]
    values: set[int] = set()
    for term in field.split(","):
        base, slash, step_text = term.partition("/")
        if base == "*":
            low, high = first, last
        elif "-" in base:
            a, _, b = base.partition("-")
            low, high = _value(a, index), _value(b, index)
            if low > high:
                raise ValueError(f"range {base!r} runs backwards")
        elif slash:
            raise ValueError(f"a step needs a range or *, not {term!r} (write {base}-{last}/{step_text})")
        else:
            low = high = _value(base, index)
        for v in (low, high):
            if not first <= v <= last:
                raise ValueError(f"{v} is out of range {first}-{last}")
        step = int(step_text) if slash and step_text.isdigit() else 1
        if slash and step < 1:
            raise ValueError(f"step {step_text!r} must be at least 1")
        values.update(range(low, high + 1, step))
    if index == 4 and 7 in values:
        values.discard(7)
        values.add(0)
    return values


def parse_cron(text: str, *, now: datetime.datetime | None = None, check_fires: bool = True) -> CronExpr:
    """Validate ``text`` and return a :class:`CronExpr` (syntax checks are cached per text).

    Args:
        text: the expression.
        now: the reference time for the "can fire" check (default: the current UTC time).
        check_fires: also check that it has a next fire time after ``now``.

    Raises:
        InvalidCron: not 5 fields, unsupported syntax, or a value out of range.
        NeverFires: it can never fire (only with ``check_fires``).
    """
    fields = str(text).split()
    if len(fields) != 5:
        raise InvalidCron(
            f"cron {text!r} has {len(fields)} field(s); exactly 5 are required "
            "(minute hour day-of-month month day-of-week, UTC)"
        )
    expr = _compile(" ".join(fields))
    if check_fires:
        expr.next_after(now or datetime.datetime.now(UTC))
    return expr


def format_slot(t: datetime.datetime) -> str:
    """Return the canonical text of a time: ISO 8601 UTC with microseconds and ``Z``.

    The same format as stored record timestamps, so text order is time order.
    """
    if t.tzinfo is None:
        raise UsageError("slot times must be timezone-aware (UTC)")
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_slot(text: str) -> datetime.datetime:
    """Parse text written by :func:`format_slot` (or any ISO 8601 with an offset) to aware UTC."""
    value = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
