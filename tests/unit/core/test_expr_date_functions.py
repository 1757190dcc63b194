"""The date and time functions (``functions_date``), each checked with both engines
(``expr_eval_env.py``): formats of the four conventions, parts, arithmetic across month ends,
leap years and DST changes, time zones, durations, NULL for what is no date, and the
statement time of ``NOW_*``.

Values marked "docs" are the examples of Couchbase's date function reference; the
conformance cases (case_func_date.json) run through ``test_sql_conformance``.
"""

from __future__ import annotations

from zoneinfo import ZoneInfo

from shardex.core.expr import evaluate
from shardex.core.expr.date_calendar import Moment, date_add, wall_ns
from shardex.core.expr.functions_date import (
    STATEMENT_TIME,
    with_statement_time,
    without_statement_time,
)
from shardex.sql.local import LocalEngine
from shardex.sql.syntax.params import check_params
from tests.unit.core.expr_eval_env import M, N, check_table, ev

MAY15 = 1463284740000  # 2016-05-15T03:59:00Z

PARTS: list[tuple[str, object]] = [
    # docs: the parts of 2006-01-02T15:04:05.999Z
    ("DATE_PART_STR('2006-01-02T15:04:05.999Z', 'millennium')", 3),
    ("DATE_PART_STR('2006-01-02T15:04:05.999Z', 'century')", 21),
    ("DATE_PART_STR('2006-01-02T15:04:05.999Z', 'decade')", 200),
    ("DATE_PART_STR('2006-01-02T15:04:05.999Z', 'quarter')", 1),
    ("DATE_PART_STR('2006-01-02T15:04:05.999Z', 'Day_Of_Week')", 1),  # parts ignore case
    ("DATE_PART_STR('2006-01-02T15:04:05.999Z', 'dow')", 1),
    ("DATE_PART_STR('2006-01-02T15:04:05.999Z', 'doy')", 2),
    ("DATE_PART_STR('2006-01-02T15:04:05.999Z', 'millisecond')", 999),
    ("DATE_PART_STR('2006-01-02T15:04:05.999Z', 'timezone')", 0),
    ("DATE_PART_STR('2006-01-08T15:04:05.999Z', 'iso_week')", 1),  # docs
    ("DATE_PART_STR('2006-01-08T15:04:05.999Z', 'week')", 2),  # docs
    # 2021-01-01 is a Friday: ISO week 53 of 2020
    ("DATE_PART_STR('2021-01-01', 'iso_week')", 53),
    ("DATE_PART_STR('2021-01-01', 'iso_year')", 2020),
    ("DATE_PART_STR('2016-01-01T00:00:00+05:30', 'timezone')", 19800),
    ("DATE_PART_STR('2016-01-01T00:00:00+05:30', 'timezone_minute')", 30),
    ("DATE_PART_STR('2016-01-01T00:00:00-03:30', 'timezone_hour')", -3),
    ("DATE_PART_STR('2016-01-01T00:00:00-03:30', 'timezone_minute')", -30),
    ("DATE_PART_STR('2016-01-01', 'fortnight')", N),
    ("DATE_PART_STR(nope, 'day')", M),
    ("DATE_PART_STR(nothing, 'day')", N),
    ("DATE_PART_STR('2016-01-01', 5)", N),
    # leap years: 2000 is one, 2100 is not
    ("DATE_PART_STR('2016-12-31', 'day_of_year')", 366),
    ("DATE_PART_STR('2000-02-29', 'day')", 29),
    ("DATE_PART_STR('2100-02-29', 'day')", N),
    (f"DATE_PART_MILLIS({MAY15}, 'day', 'America/Tijuana')", 14),  # docs
    (f"DATE_PART_MILLIS({MAY15}, 'day', 'UTC')", 15),  # docs
    (f"DATE_PART_MILLIS({MAY15}, 'day', 'Mars/Base')", N),
    (f"DATE_PART_MILLIS({MAY15}, 'day', 'utc')", N),  # zone names are case-sensitive
    (f"DATE_PART_MILLIS('{MAY15}', 'day')", N),
    ("WEEKDAY_STR('2017-02-05')", "Sunday"),  # docs
    ("WEEKDAY_MILLIS(1486237655742, 'America/Tijuana')", "Saturday"),  # docs
]

ZONES: list[tuple[str, object]] = [
    (f"MILLIS_TO_TZ({MAY15}, 'America/New_York')", "2016-05-14T23:59:00-04:00"),  # docs
    (f"MILLIS_TO_TZ({MAY15}, 'Asia/Kolkata')", "2016-05-15T09:29:00+05:30"),  # docs
    (f"MILLIS_TO_ZONE_NAME({MAY15}, 'UTC')", "2016-05-15T03:59:00Z"),  # docs
    (f"MILLIS_TO_UTC({MAY15}, '1111-11-11')", "2016-05-15"),  # docs
    (f"MILLIS_TO_UTC({MAY15}, 'invalid format')", "2016-05-15T03:59:00Z"),  # docs
    (f"MILLIS_TO_UTC({MAY15}, 5)", N),
    (f"MILLIS_TO_TZ({MAY15}, 'Nowhere/Special')", N),
    # New York's DST began 2016-03-13 02:00 EST: 06:00Z is 01:00 EST, 07:00Z 03:00 EDT
    ("MILLIS_TO_TZ(1457848800000, 'America/New_York')", "2016-03-13T01:00:00-05:00"),
    ("MILLIS_TO_TZ(1457852400000, 'America/New_York')", "2016-03-13T03:00:00-04:00"),
    ("DATE_PART_MILLIS(1457852400000, 'timezone', 'America/New_York')", -14400),
    ("STR_TO_UTC('1111-11-11T00:00:00+08:00')", "1111-11-10T16:00:00Z"),  # docs
    ("STR_TO_UTC('1111-11-11')", "1111-11-11"),  # docs: the input's format
    # docs: New York's local mean time before 1883 (-04:56:02)
    ("STR_TO_TZ('1111-11-11T00:00:00+08:00', 'America/New_York')", "1111-11-10T11:03:58-04:56"),
    ("STR_TO_TZ('2016-01-22T09:50:08-08:00', 'UTC', '2006-01-02 15:04')", "2016-01-22 17:50"),
    ("STR_TO_TZ('2016-01-22T09:50:08-08:00', 'Bad/Zone')", N),
    ("DATE_FORMAT_STR('01:10:05', '1111-11-11T01:01:01Z')", "0000-01-01T01:10:05Z"),  # docs
    ("DATE_FORMAT_STR('2016-05-15', '1111-11-11T00:00:00+00:00')", "2016-05-15T00:00:00Z"),
]

FORMATS: list[tuple[str, object]] = [
    ("STR_TO_MILLIS('2016-05-15T03:59:00Z')", MAY15),  # docs
    ("MILLIS('2016-05-15T03:59:00Z')", MAY15),
    ("STR_TO_MILLIS('19/08/2011 6:33:23+0000', '02/01/2006 15:04:05Z0700')", 1313735603000),
    ("STR_TO_MILLIS('2016/05/15 03:59:00Z')", MAY15),
    ("STR_TO_MILLIS('2016-13-01')", N),
    ("STR_TO_MILLIS('2016-02-30')", N),
    ("STR_TO_MILLIS('02/01/2012')", N),  # not an ISO-8601 form
    ("STR_TO_MILLIS('01:01.111')", N),  # docs: invalid
    ("STR_TO_MILLIS('hello')", N),
    ("STR_TO_MILLIS(5)", N),
    ("STR_TO_MILLIS('2016-05-15', 7)", N),
    ("STR_TO_MILLIS('13', '%I')", N),  # a 12-hour clock has no 13
    ("STR_TO_MILLIS('20160515', '%Y%m%d')", 1463270400000),
    ("STR_TO_MILLIS('15 may 2016', '%d %^b %Y')", 1463270400000),  # ^: any case
    ("STR_TO_MILLIS('15 may 2016', '%d %b %Y')", N),
    ("STR_TO_MILLIS('1463284740', '%s')", MAY15),
    ("MILLIS_TO_UTC(0, '%A %d %B %Y, %I:%M %p')", "Thursday 01 January 1970, 12:00 AM"),
    ("MILLIS_TO_UTC(0, 'DD-MON-YYYY Dy')", "01-JAN-1970 Thu"),
    ("MILLIS_TO_UTC(0, 'Jan _2 3:04PM')", "Jan  1 12:00AM"),
    ("MILLIS_TO_UTC(1500, '2006-01-02 15:04:05.000')", "1970-01-01 00:00:01.500"),
    ("MILLIS_TO_UTC(1500, '2006-01-02 15:04:05.999')", "1970-01-01 00:00:01.5"),
    ("MILLIS_TO_UTC(0, '%Y 100%%')", "1970 100%"),
    ("DATE_FORMAT_STR('15-MAY-2016', 'DD-MON-YYYY', 'YYYY-MM-DD')", "2016-05-15"),  # docs
    # docs
    (
        "DATE_TRUNC_STR('05/18/2016 03:59:00', 'month', 'MM/DD/YYYY HH24:MI:SS')",
        "05/01/2016 00:00:00",
    ),
]

ARITHMETIC: list[tuple[str, object]] = [
    (f"DATE_ADD_MILLIS({MAY15}, 3, 'day')", 1463543940000),  # docs
    (f"DATE_ADD_MILLIS({MAY15}, -3, 'year')", 1368590340000),  # docs
    (f"DATE_ADD_MILLIS({MAY15}, 1.5, 'day')", N),
    (f"DATE_ADD_MILLIS({MAY15}, 1, 'fortnight')", N),
    ("DATE_ADD_STR('2016-05-15 03:59:00Z', 3, 'day')", "2016-05-18 03:59:00Z"),
    ("DATE_ADD_STR('2016-02-29', 1, 'year')", "2017-03-01"),  # Feb 29 + a year overflows
    ("DATE_ADD_STR('2016-02-29', 4, 'year')", "2020-02-29"),
    ("DATE_ADD_STR('2016-02-29', 1, 'calendar_month')", "2016-03-31"),  # last day to last
    ("DATE_ADD_STR('2016-01-31', 1, 'month')", "2016-03-02"),
    ("DATE_ADD_STR('2016-01-31', 1, 'quarter')", "2016-05-01"),
    (
        "DATE_ADD_STR('2016-12-31T23:59:59.999+08:00', 1, 'millisecond')",
        "2017-01-01T00:00:00+08:00",
    ),
    ("DATE_ADD_STR('0000-01-01', -1, 'day')", "-0001-12-31"),
    (f"DATE_DIFF_MILLIS(1557892740000, {MAY15}, 'year')", 3),  # docs
    (f"DATE_DIFF_MILLIS(1463025540000, {MAY15}, 'day')", -3),  # docs
    ("DATE_DIFF_STR('2016-03-01', '2016-02-28', 'day')", 2),  # 2016 is a leap year
    ("DATE_DIFF_STR('2015-03-01', '2015-02-28', 'day')", 1),
    ("DATE_DIFF_STR('2016-01-09', '2016-01-02', 'week')", 1),  # Sunday-based weeks
    ("DATE_DIFF_STR('2016-01-10', '2016-01-09', 'week')", 1),
    ("DATE_DIFF_ABS_STR('2016-01-01', '2017-01-01', 'year')", 1),
    ("DATE_DIFF_STR('2016-01-01', 'x', 'year')", N),
    (f"DATE_TRUNC_MILLIS({MAY15}, 'day')", 1463270400000),  # docs
    (f"DATE_TRUNC_MILLIS({MAY15}, 'month')", 1462060800000),  # docs
    (f"DATE_TRUNC_MILLIS({MAY15}, 'year')", 1451606400000),  # docs
    ("DATE_TRUNC_STR('2016-05-18T03:59:00Z', 'day')", "2016-05-18T00:00:00Z"),  # docs
    ("DATE_TRUNC_STR('2016-05-18T03:59:00+02:00', 'quarter')", "2016-04-01T00:00:00+02:00"),
    ("DATE_TRUNC_STR('2016-05-18', 'century')", "2000-01-01"),
    (
        "DATE_RANGE_STR('2018-01-01', '2019-01-01', 'month', 4)",
        ["2018-01-01", "2018-05-01", "2018-09-01"],
    ),  # docs
    ("DATE_RANGE_STR('2018-01-01', '2017-01-01', 'month')", []),  # away from the end
    ("DATE_RANGE_STR('2018-01-01', '2019-01-01', 'month', 0)", N),
    ("DATE_RANGE_MILLIS(0, 3, 'millisecond')", [0, 1, 2]),
    ("DATE_RANGE_MILLIS(0, 10000000000, 'millisecond')", N),  # past RANGE_LIMIT
]

DURATIONS: list[tuple[str, object]] = [
    ("DURATION_TO_STR(2000)", "2µs"),  # docs
    ("DURATION_TO_STR(2000000)", "2ms"),  # docs
    ("DURATION_TO_STR(2000000000)", "2s"),  # docs
    ("DURATION_TO_STR(1500000)", "1.5ms"),
    ("DURATION_TO_STR(3723500000000)", "1h2m3.5s"),
    ("DURATION_TO_STR(-60000000000)", "-1m0s"),
    ("DURATION_TO_STR(0)", "0s"),
    ("DURATION_TO_STR('1s')", N),
    ("STR_TO_DURATION('1h')", 3600000000000),  # docs
    ("STR_TO_DURATION('1us')", 1000),  # docs
    ("STR_TO_DURATION('1µs')", 1000),
    ("STR_TO_DURATION('1.5ms')", 1500000),
    ("STR_TO_DURATION('2h45m')", 9900000000000),
    ("STR_TO_DURATION('-1.5h')", -5400000000000),
    ("STR_TO_DURATION('1x')", N),
    ("STR_TO_DURATION('')", N),
]


def test_parts_and_zones() -> None:
    check_table(PARTS)
    check_table(ZONES)


def test_formats_of_the_four_conventions() -> None:
    check_table(FORMATS)


def test_date_arithmetic() -> None:
    check_table(ARITHMETIC)


def test_durations() -> None:
    check_table(DURATIONS)


def test_adding_days_across_a_dst_change_keeps_the_wall_time() -> None:
    ny = ZoneInfo("America/New_York")
    noon = Moment.of_wall(wall_ns(2016, 3, 12, 12), ny)  # EST, the day before DST
    nxt = date_add(noon, 1, "day")
    assert nxt is not None
    assert nxt.fields().hour == 12 and nxt.offset == -4 * 3600
    assert nxt.ns - noon.ns == 23 * 3600 * 10**9  # the day was 23 hours long
    later = date_add(noon, 24, "hour")  # a duration: the instant moves 24 hours
    assert later is not None and later.fields().hour == 13


def test_now_is_the_statement_time_stamped_in_the_params() -> None:
    params = with_statement_time(None, MAY15 * 10**6)
    assert ev("NOW_MILLIS()", params=params) == MAY15
    assert ev("NOW_UTC()", params=params) == "2016-05-15T03:59:00Z"
    assert ev("NOW_STR('1111-11-11')", params=params) == "2016-05-15"
    assert ev("NOW_TZ('Asia/Kolkata')", params=params) == "2016-05-15T09:29:00+05:30"
    assert ev("NOW_TZ('Bad/Zone')", params=params) is None
    # Without a stamp NOW_* read the clock: a number, not the stamped time.
    assert isinstance(evaluate("NOW_MILLIS()", {}), float)


def test_stamped_params_read_and_check_as_given() -> None:
    stamped = with_statement_time([10, "x"], 5)
    assert stamped[STATEMENT_TIME] == 5
    assert ev("$1 + 1", params=stamped) == 11 and ev("$2", params=stamped) == "x"
    assert without_statement_time(stamped) == [10, "x"]
    named = with_statement_time({"a": 1}, 5)
    assert ev("$a", params=named) == 1 and without_statement_time(named) == {"a": 1}
    assert without_statement_time(with_statement_time(None, 5)) is None
    check_params({"1", "2"}, stamped)  # the count check still sees two values


def test_every_row_of_a_statement_sees_one_now() -> None:
    engine = LocalEngine()
    engine.create_keyspace("t")
    engine.keyspaces["t"].update({f"d{i}": {"i": i} for i in range(200)})
    rows = engine.query("SELECT NOW_MILLIS() AS n, NOW_STR() AS s, i FROM t")
    assert len(rows) == 200
    assert len({r["n"] for r in rows}) == 1 and len({r["s"] for r in rows}) == 1
    # CLOCK_* is the time of evaluation; aggregates without FROM run on one row.
    assert engine.query("SELECT COUNT(*) AS c GROUP BY NOW_STR()") == [{"c": 1}]
