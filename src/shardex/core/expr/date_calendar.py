"""Calendar arithmetic for the date functions: instants, zones, parts, adding, truncating.

An instant is an int of nanoseconds since 1970-01-01T00:00:00Z. Its civil fields (year,
month, ...) are computed here on the proleptic Gregorian calendar from a day count, not by
``datetime``: N1QL dates reach year 0 (a time-only string such as ``"11:42:01Z"`` is on
0000-01-01) and ``datetime`` stops at year 1.

A ``Moment`` is an instant seen in a zone: a fixed UTC offset (a string's ``+08:00``) or an
IANA zone (``zoneinfo``, whose offset changes with daylight saving time). Adding days or
months, truncating and extracting parts work on the moment's wall time, then map back to an
instant through its zone (the same wall time across a DST change; a wall time in a DST gap
or overlap resolves as ``zoneinfo`` does, with ``fold=0``).

The "local" zone of N1QL (the query node's) is UTC in shardex: an expression is evaluated on
many processes (nodes, Spark executors building index keys), which must agree on the
instant a zone-less string such as ``"2016-05-15"`` denotes (decision 0118).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Final
from zoneinfo import ZoneInfo

NS_PER_MS: Final = 1_000_000
NS_PER_S: Final = 1_000_000_000
NS_PER_DAY: Final = 86_400 * NS_PER_S

LOCAL_ZONE: Final[tzinfo] = UTC


@functools.lru_cache(maxsize=256)
def zone_named(name: str) -> tzinfo | None:
    """The IANA zone ``name`` (case-sensitive, as in N1QL), or None when there is none."""
    if name == "UTC":
        return UTC
    if not name or name.startswith(("/", ".")) or ".." in name:
        return None
    try:
        return ZoneInfo(name)
    except (ValueError, OSError, KeyError):  # ZoneInfoNotFoundError is a KeyError
        return None


def fixed_zone(offset_s: int) -> tzinfo:
    return UTC if offset_s == 0 else timezone(timedelta(seconds=offset_s))


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of the proleptic Gregorian date (any year, year 0 included)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(z: int) -> tuple[int, int, int]:
    z += 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (m <= 2), m, d


def is_leap(y: int) -> bool:
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def days_in_month(y: int, m: int) -> int:
    if m == 2:
        return 29 if is_leap(y) else 28
    return 30 if m in (4, 6, 9, 11) else 31


def probe_datetime(wall_s: int) -> datetime:
    """A naive ``datetime`` near ``wall_s`` (seconds of wall time since the epoch), its year
    clamped to what ``datetime`` holds (a zone's rules before year 1 are its earliest)."""
    days, secs = divmod(wall_s, 86_400)
    y, m, d = civil_from_days(days)
    if y < 1:
        return datetime(1, 1, 1, 0, 0, 0)
    if y > 9999:
        return datetime(9999, 12, 31, 23, 59, 59)
    return datetime(y, m, d, secs // 3600, secs // 60 % 60, secs % 60)


def offset_at(zone: tzinfo, ns: int) -> int:
    """UTC offset in seconds of ``zone`` at the instant ``ns``."""
    if isinstance(zone, timezone):
        off = zone.utcoffset(None)
        return int(off.total_seconds()) if off is not None else 0
    utc = probe_datetime(ns // NS_PER_S).replace(tzinfo=UTC)
    off = utc.astimezone(zone).utcoffset()
    return int(off.total_seconds()) if off is not None else 0


def offset_of_wall(zone: tzinfo, wall_ns: int) -> int:
    """UTC offset in seconds that ``zone`` gives the wall time ``wall_ns``."""
    if isinstance(zone, timezone):
        return offset_at(zone, 0)
    off = probe_datetime(wall_ns // NS_PER_S).replace(tzinfo=zone).utcoffset()
    return int(off.total_seconds()) if off is not None else 0


@dataclass(frozen=True, slots=True)
class Moment:
    """An instant (``ns``) seen in ``zone``; ``offset`` is the zone's offset then (seconds)."""

    ns: int
    zone: tzinfo
    offset: int

    @staticmethod
    def at(ns: int, zone: tzinfo) -> Moment:
        return Moment(ns, zone, offset_at(zone, ns))

    @staticmethod
    def of_wall(wall_ns: int, zone: tzinfo) -> Moment:
        off = offset_of_wall(zone, wall_ns)
        return Moment(wall_ns - off * NS_PER_S, zone, off)

    @property
    def wall(self) -> int:
        return self.ns + self.offset * NS_PER_S

    def fields(self) -> Fields:
        return Fields.of(self.wall)

    def in_zone(self, zone: tzinfo) -> Moment:
        return Moment.at(self.ns, zone)


@dataclass(frozen=True, slots=True)
class Fields:
    """Civil fields of a wall time."""

    year: int
    month: int
    day: int
    hour: int
    minute: int
    second: int
    nanos: int  # within the second
    days: int  # since 1970-01-01

    @staticmethod
    def of(wall_ns: int) -> Fields:
        days, rest = divmod(wall_ns, NS_PER_DAY)
        y, m, d = civil_from_days(days)
        secs, nanos = divmod(rest, NS_PER_S)
        return Fields(y, m, d, secs // 3600, secs // 60 % 60, secs % 60, nanos, days)

    @property
    def weekday(self) -> int:
        """0 = Sunday .. 6 = Saturday (1970-01-01 was a Thursday)."""
        return (self.days + 4) % 7

    @property
    def day_of_year(self) -> int:
        return self.days - days_from_civil(self.year, 1, 1) + 1

    def iso_week(self) -> tuple[int, int]:
        """(ISO year, ISO week): weeks start on Monday; week 1 holds January 4."""
        iso_dow = (self.weekday + 6) % 7  # Monday 0
        thursday = self.days - iso_dow + 3
        y = civil_from_days(thursday)[0]
        return y, (thursday - days_from_civil(y, 1, 1)) // 7 + 1


def wall_ns(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0, nanos: int = 0) -> int:
    return (days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s) * NS_PER_S + nanos


# -- parts -------------------------------------------------------------------------------------

_PART_ALIASES: Final = {"doy": "day_of_year", "dow": "day_of_week"}


def part_name(part: object) -> str | None:
    if type(part) is not str:
        return None
    p = part.lower()
    return _PART_ALIASES.get(p, p)


def date_part(m: Moment, part: str) -> int | None:
    """The value of ``part`` (a ``part_name``) of the moment's wall time, None if unknown."""
    f = m.fields()
    y = f.year
    match part:
        case "millennium":
            return y // 1000 + 1
        case "century":
            return y // 100 + 1
        case "decade":
            return y // 10
        case "year":
            return y
        case "iso_year":
            return f.iso_week()[0]
        case "quarter":
            return (f.month - 1) // 3 + 1
        case "month":
            return f.month
        case "week":
            return -(-f.day_of_year // 7)
        case "iso_week":
            return f.iso_week()[1]
        case "day":
            return f.day
        case "day_of_year":
            return f.day_of_year
        case "day_of_week":
            return f.weekday
        case "hour":
            return f.hour
        case "minute":
            return f.minute
        case "second":
            return f.second
        case "millisecond":
            return f.nanos // NS_PER_MS
        case "timezone":
            return m.offset
        case "timezone_hour":
            return int(m.offset / 3600)
        case "timezone_minute":
            return int(m.offset % (3600 if m.offset >= 0 else -3600) / 60)
    return None


_FIXED_NS: Final = {
    "millisecond": NS_PER_MS,
    "second": NS_PER_S,
    "minute": 60 * NS_PER_S,
    "hour": 3600 * NS_PER_S,
}
_YEARS: Final = {"millennium": 1000, "century": 100, "decade": 10, "year": 1}
_MONTHS: Final = {"quarter": 3, "month": 1}


def _add_months(f: Fields, months: int, calendar: bool) -> tuple[int, int, int]:
    """The date ``months`` after ``f``'s. ``calendar``: a day past the target month's end is
    its last day, and a month's last day maps to the target's last day; otherwise the day
    overflows into the next month (Jan 31 + 1 month is Mar 2 or 3), as N1QL's ``month``."""
    total = f.year * 12 + f.month - 1 + months
    y, m = divmod(total, 12)
    m += 1
    if not calendar:
        return y, m, f.day
    last = days_in_month(y, m)
    if f.day >= last or f.day == days_in_month(f.year, f.month):
        return y, m, last
    return y, m, f.day


def date_add(m: Moment, n: int, part: str) -> Moment | None:
    """``m`` plus ``n`` ``part``s, None for a part that cannot be added."""
    step = _FIXED_NS.get(part)
    if step is not None:
        return Moment.at(m.ns + n * step, m.zone)
    f = m.fields()
    time_ns = m.wall - f.days * NS_PER_DAY
    if part in ("day", "week"):
        days = f.days + n * (7 if part == "week" else 1)
    elif part in _YEARS or part in _MONTHS or part == "calendar_month":
        months = n * (12 * _YEARS[part] if part in _YEARS else _MONTHS.get(part, 1))
        y, mo, d = _add_months(f, months, part == "calendar_month")
        days = days_from_civil(y, mo, 1) + d - 1  # a day past the month's end overflows
    else:
        return None
    return Moment.of_wall(days * NS_PER_DAY + time_ns, m.zone)


def date_trunc(m: Moment, part: str) -> Moment | None:
    """``m`` truncated to the start of its ``part`` (in its wall time)."""
    step = _FIXED_NS.get(part)
    if step is not None:
        return Moment.of_wall(m.wall - m.wall % step, m.zone)
    f = m.fields()
    y, mo = f.year, f.month
    if part == "day":
        days = f.days
    elif part == "week":
        days = f.days - f.weekday
    elif part == "iso_week":
        days = f.days - (f.weekday + 6) % 7
    elif part == "month":
        days = days_from_civil(y, mo, 1)
    elif part == "quarter":
        days = days_from_civil(y, mo - (mo - 1) % 3, 1)
    elif part in _YEARS:
        span = _YEARS[part]
        days = days_from_civil(y - y % span, 1, 1)
    else:
        return None
    return Moment.of_wall(days * NS_PER_DAY, m.zone)


_DIFF_YEARS: Final = {"millennium": 1000, "century": 100, "decade": 10, "year": 1}


def date_diff(a: Moment, b: Moment, part: str) -> int | None:
    """Whole ``part``s from ``b`` to ``a`` by their wall times: the difference of the two
    dates' ``part`` numbers (``2018-09-10 23:59:59`` to ``2018-09-11 00:00:01`` is one day)."""
    step = _FIXED_NS.get(part)
    if step is not None:
        return a.wall // step - b.wall // step
    fa, fb = a.fields(), b.fields()
    if part == "day":
        return fa.days - fb.days
    if part == "week":
        return (fa.days - fa.weekday) // 7 - (fb.days - fb.weekday) // 7
    if part == "month":
        return (fa.year * 12 + fa.month) - (fb.year * 12 + fb.month)
    if part == "quarter":
        return (fa.year * 4 + (fa.month - 1) // 3) - (fb.year * 4 + (fb.month - 1) // 3)
    span = _DIFF_YEARS.get(part)
    if span is not None:
        return fa.year // span - fb.year // span
    return None
