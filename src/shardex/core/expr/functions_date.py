"""N1QL's date and time functions, registered into ``FUNCTIONS`` on import.

Dates are Epoch milliseconds (``*_MILLIS``) or date strings (``*_STR``) in N1QL's formats
(``date_format``); calendar work is in ``date_calendar``. As everywhere in the registry a
wrong type, an unknown part or zone, or a string that is no date gives NULL, never an error.
A result string keeps the format of the input string (``DATE_ADD_STR('2006-01-02', 1,
'year')`` is ``'2007-01-02'``); without an input string it is the full date and time
(``2006-01-02T15:04:05.999Z07:00``), also when a format is given that names no component.

The statement time. ``NOW_*`` give the time of the statement: one value for every row and
every fragment of it, wherever they run. The node that receives a statement stamps its
params with that time (``with_statement_time``: a key no parameter can have, shipped to
every fragment with the params) and ``NOW_*`` read it from there (``FunctionSpec.
with_params``); ``CLOCK_*`` read the clock of the process evaluating them. Without a stamp
(an expression evaluated outside a statement) ``NOW_*`` read the clock too.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, tzinfo
from typing import Any, Final

from shardex.core.values import MISSING

from .date_calendar import (
    LOCAL_ZONE,
    NS_PER_MS,
    Moment,
    date_add,
    date_diff,
    date_part,
    date_trunc,
    part_name,
    zone_named,
)
from .date_format import DEFAULT_LAYOUT, WEEKDAYS, Layout, layout_of, parse_default
from .date_format import parse_with as _parse_with
from .date_print import format_moment
from .functions import FunctionSpec, register_function
from .ops import is_number

STATEMENT_TIME: Final = " now"  # params key of the statement time (ns); no name has a space
_POSITIONAL: Final = " positional"  # how many positional params a stamped list had
RANGE_LIMIT: Final = 1_000_000  # most dates a DATE_RANGE_* gives (else NULL)


# -- the statement time ------------------------------------------------------------------------


def with_statement_time(params: Any, now_ns: int | None = None) -> dict[str, Any]:
    """``params`` stamped with the statement time: a mapping (positional values under "1",
    "2", ..., which ``$1`` reads as it reads a list) with ``STATEMENT_TIME``."""
    now = time.time_ns() if now_ns is None else now_ns
    if isinstance(params, Mapping):
        return {**params, STATEMENT_TIME: now}
    if isinstance(params, Sequence) and not isinstance(params, str):
        out: dict[str, Any] = {str(i): v for i, v in enumerate(params, 1)}
        out[_POSITIONAL] = len(params)
        out[STATEMENT_TIME] = now
        return out
    return {STATEMENT_TIME: now}


def without_statement_time(params: Any) -> Any:
    """The params as the caller gave them (a stamped list is a list again)."""
    if not isinstance(params, Mapping) or STATEMENT_TIME not in params:
        return params
    if _POSITIONAL in params:
        return [params[str(i)] for i in range(1, params[_POSITIONAL] + 1)]
    rest = {k: v for k, v in params.items() if k != STATEMENT_TIME}
    return rest or None


_MENTIONS_NOW: Final = re.compile(r"(?i)\bnow_")


@functools.lru_cache(maxsize=1024)
def mentions_statement_time(sql: str) -> bool:
    """Whether a statement's text may call ``NOW_*`` (the others need no stamp); kept per
    text, as every execution of a statement asks."""
    return _MENTIONS_NOW.search(sql) is not None


def statement_time(params: Any) -> int:
    """The statement time (ns) stamped in ``params``, else the clock's."""
    if isinstance(params, Mapping):
        now = params.get(STATEMENT_TIME)
        if type(now) is int:
            return now
    return time.time_ns()


# -- argument checks ---------------------------------------------------------------------------


def _ns_of_millis(ms: Any) -> int | None:
    if not is_number(ms):
        return None
    if type(ms) is int:
        return ms * NS_PER_MS
    if not math.isfinite(ms):
        return None
    whole = math.floor(ms)
    return whole * NS_PER_MS + round((ms - whole) * NS_PER_MS)


def _millis(ns: int) -> int:
    return ns // NS_PER_MS


def _integer(n: Any) -> int | None:
    if type(n) is int:
        return n
    if type(n) is float and n.is_integer():
        return int(n)
    return None


def _zone(tz: Any) -> tzinfo | None:
    return zone_named(tz) if type(tz) is str else None


def _out_layout(fmt: Any) -> Layout | None:
    """The output layout of an optional ``fmt`` argument: the default when not given (or
    when it names no component), None for a non-string (the function gives NULL)."""
    if fmt is MISSING:
        return DEFAULT_LAYOUT
    if type(fmt) is not str:
        return None
    return layout_of(fmt) or DEFAULT_LAYOUT


def _parse(text: Any, fmt: Any = MISSING) -> tuple[Moment, Layout] | None:
    """A date string (in ``fmt`` when given) with the layout its results keep."""
    if type(text) is not str:
        return None
    if fmt is MISSING:
        return parse_default(text)
    if type(fmt) is not str:
        return None
    layout = layout_of(fmt)
    if layout is None:
        return None
    m = _parse_with(text, layout)
    return None if m is None else (m, layout)


def _fn(name: str, lo: int, hi: int, impl: Callable[..., Any], *aliases: str, **kw: Any) -> None:
    register_function(FunctionSpec(name, lo, hi, impl, **kw), *aliases)


# -- clock and statement time ------------------------------------------------------------------


def _show(ns: int, zone: tzinfo | None, fmt: Any) -> Any:
    layout = _out_layout(fmt)
    if layout is None or zone is None:
        return None
    return format_moment(Moment.at(ns, zone), layout)


def _tz_show(ns: int, tz: Any, fmt: Any) -> Any:
    return _show(ns, _zone(tz), fmt)


_fn("CLOCK_MILLIS", 0, 0, lambda: time.time_ns() / NS_PER_MS, deterministic=False)
_fn("CLOCK_STR", 0, 1, lambda fmt=MISSING: _show(time.time_ns(), LOCAL_ZONE, fmt),
    "CLOCK_LOCAL", deterministic=False)  # fmt: skip
_fn("CLOCK_UTC", 0, 1, lambda fmt=MISSING: _show(time.time_ns(), UTC, fmt), deterministic=False)
_fn("CLOCK_TZ", 1, 2, lambda tz, fmt=MISSING: _tz_show(time.time_ns(), tz, fmt),
    deterministic=False)  # fmt: skip

_now: Final = {"deterministic": False, "with_params": True}
_fn("NOW_MILLIS", 0, 0, lambda p: statement_time(p) / NS_PER_MS, **_now)
_fn("NOW_STR", 0, 1, lambda p, fmt=MISSING: _show(statement_time(p), LOCAL_ZONE, fmt),
    "NOW_LOCAL", **_now)  # fmt: skip
_fn("NOW_UTC", 0, 1, lambda p, fmt=MISSING: _show(statement_time(p), UTC, fmt), **_now)
_fn("NOW_TZ", 1, 2, lambda p, tz, fmt=MISSING: _tz_show(statement_time(p), tz, fmt), **_now)


# -- conversions -------------------------------------------------------------------------------


def _str_to_millis(text: Any, fmt: Any = MISSING) -> Any:
    got = _parse(text, fmt)
    return None if got is None else _millis(got[0].ns)


def _millis_to(ms: Any, zone: tzinfo | None, fmt: Any) -> Any:
    ns = _ns_of_millis(ms)
    return None if ns is None else _show(ns, zone, fmt)


def _str_to_zone(text: Any, zone: tzinfo | None, a: Any, b: Any) -> Any:
    """STR_TO_TZ / STR_TO_UTC's optional ``[input format,] output format``."""
    infmt, outfmt = (a, b) if b is not MISSING else (MISSING, a)
    got = _parse(text, infmt)
    if got is None or zone is None:
        return None
    layout = got[1] if outfmt is MISSING else _out_layout(outfmt)
    if layout is None:
        return None
    return format_moment(got[0].in_zone(zone), layout)


_fn("STR_TO_MILLIS", 1, 2, _str_to_millis, "MILLIS")
_fn("MILLIS_TO_STR", 1, 2, lambda ms, fmt=MISSING: _millis_to(ms, LOCAL_ZONE, fmt),
    "MILLIS_TO_LOCAL")  # fmt: skip
_fn("MILLIS_TO_UTC", 1, 2, lambda ms, fmt=MISSING: _millis_to(ms, UTC, fmt))
_fn("MILLIS_TO_TZ", 2, 3, lambda ms, tz, fmt=MISSING: _millis_to(ms, _zone(tz), fmt),
    "MILLIS_TO_ZONE_NAME")  # fmt: skip
_fn("STR_TO_UTC", 1, 3, lambda s, a=MISSING, b=MISSING: _str_to_zone(s, UTC, a, b))
_fn("STR_TO_TZ", 2, 4, lambda s, tz, a=MISSING, b=MISSING: _str_to_zone(s, _zone(tz), a, b),
    "STR_TO_ZONE_NAME")  # fmt: skip


def _date_format_str(text: Any, a: Any, b: Any = MISSING) -> Any:
    infmt, outfmt = (a, b) if b is not MISSING else (MISSING, a)
    got = _parse(text, infmt)
    layout = _out_layout(outfmt)
    if got is None or layout is None:
        return None
    return format_moment(got[0], layout)


_fn("DATE_FORMAT_STR", 2, 3, _date_format_str)


# -- arithmetic --------------------------------------------------------------------------------


def _moment_of_millis(ms: Any, tz: Any = MISSING) -> Moment | None:
    ns = _ns_of_millis(ms)
    zone = LOCAL_ZONE if tz is MISSING else _zone(tz)
    return None if ns is None or zone is None else Moment.at(ns, zone)


def _add(m: Moment | None, n: Any, part: Any) -> Moment | None:
    k, p = _integer(n), part_name(part)
    if m is None or k is None or p is None:
        return None
    return date_add(m, k, p)


def _date_add_millis(ms: Any, n: Any, part: Any) -> Any:
    r = _add(_moment_of_millis(ms), n, part)
    return None if r is None else _millis(r.ns)


def _date_add_str(text: Any, n: Any, part: Any) -> Any:
    got = _parse(text)
    r = _add(got[0] if got else None, n, part)
    return None if r is None or got is None else format_moment(r, got[1])


_fn("DATE_ADD_MILLIS", 3, 3, _date_add_millis)
_fn("DATE_ADD_STR", 3, 3, _date_add_str)


def _diff(a: Moment | None, b: Moment | None, part: Any, absolute: bool) -> Any:
    p = part_name(part)
    if a is None or b is None or p is None:
        return None
    d = date_diff(a, b, p)
    return abs(d) if absolute and d is not None else d


def _diff_str(a: Any, b: Any, part: Any, absolute: bool = False) -> Any:
    ga, gb = _parse(a), _parse(b)
    return _diff(ga[0] if ga else None, gb[0] if gb else None, part, absolute)


def _diff_millis(a: Any, b: Any, part: Any, absolute: bool = False) -> Any:
    return _diff(_moment_of_millis(a), _moment_of_millis(b), part, absolute)


_fn("DATE_DIFF_MILLIS", 3, 3, _diff_millis)
_fn("DATE_DIFF_STR", 3, 3, _diff_str)
_fn("DATE_DIFF_ABS_MILLIS", 3, 3, lambda a, b, p: _diff_millis(a, b, p, True))
_fn("DATE_DIFF_ABS_STR", 3, 3, lambda a, b, p: _diff_str(a, b, p, True))


def _part(m: Moment | None, part: Any) -> Any:
    p = part_name(part)
    return None if m is None or p is None else date_part(m, p)


def _date_part_str(text: Any, part: Any) -> Any:
    got = _parse(text)
    return _part(got[0] if got else None, part)


_fn("DATE_PART_MILLIS", 2, 3, lambda ms, part, tz=MISSING: _part(_moment_of_millis(ms, tz), part))
_fn("DATE_PART_STR", 2, 2, _date_part_str)


def _trunc_millis(ms: Any, part: Any) -> Any:
    m, p = _moment_of_millis(ms), part_name(part)
    r = None if m is None or p is None else date_trunc(m, p)
    return None if r is None else _millis(r.ns)


def _trunc_str(text: Any, part: Any, fmt: Any = MISSING) -> Any:
    got, p = _parse(text, fmt), part_name(part)
    r = None if got is None or p is None else date_trunc(got[0], p)
    return None if r is None or got is None else format_moment(r, got[1])


_fn("DATE_TRUNC_MILLIS", 2, 2, _trunc_millis)
_fn("DATE_TRUNC_STR", 2, 3, _trunc_str)


def _range(start: Moment, end: Moment, part: Any, n: Any) -> list[Moment] | None:
    """The dates from ``start`` towards ``end`` (excluded), ``n`` ``part``s apart: each
    from the one before, except by ``calendar_month``, which counts from ``start`` (its day
    clamps to each month's end without drifting)."""
    step, p = (1 if n is MISSING else _integer(n)), part_name(part)
    if step is None or p is None or step == 0:
        return None
    if (end.ns - start.ns) * step <= 0:
        return []
    out: list[Moment] = []
    cur: Moment | None = start
    while cur is not None and (cur.ns < end.ns if step > 0 else cur.ns > end.ns):
        if len(out) >= RANGE_LIMIT:
            return None
        out.append(cur)
        if p == "calendar_month":
            cur = date_add(start, step * len(out), p)
        else:
            cur = date_add(cur, step, p)
        if cur is not None and cur.ns == out[-1].ns:
            return None  # a step that does not move
    return None if cur is None else out


def _range_millis(a: Any, b: Any, part: Any, n: Any = MISSING) -> Any:
    ma, mb = _moment_of_millis(a), _moment_of_millis(b)
    if ma is None or mb is None or not _small_enough(ma, mb, part, n):
        return None
    got = _range(ma, mb, part, n)
    return None if got is None else [_millis(m.ns) for m in got]


def _range_str(a: Any, b: Any, part: Any, n: Any = MISSING) -> Any:
    ga, gb = _parse(a), _parse(b)
    if ga is None or gb is None or not _small_enough(ga[0], gb[0], part, n):
        return None
    got = _range(ga[0], gb[0], part, n)
    return None if got is None else [format_moment(m, ga[1]) for m in got]


_SPAN_NS: Final = {"millisecond": NS_PER_MS, "second": 10**9, "minute": 6 * 10**10}


def _small_enough(a: Moment, b: Moment, part: Any, n: Any) -> bool:
    """False when a fixed-length step would give more than ``RANGE_LIMIT`` dates (known
    before making any: ``DATE_RANGE_MILLIS(0, 1e10, 'millisecond')``)."""
    span, step = _SPAN_NS.get(part_name(part) or ""), 1 if n is MISSING else _integer(n)
    if span is None or not step:
        return True
    return abs(b.ns - a.ns) // (span * abs(step)) <= RANGE_LIMIT


_fn("DATE_RANGE_MILLIS", 3, 4, _range_millis)
_fn("DATE_RANGE_STR", 3, 4, _range_str)


def _weekday(m: Moment | None) -> Any:
    return None if m is None else WEEKDAYS[m.fields().weekday]


def _weekday_str(text: Any) -> Any:
    got = _parse(text)
    return _weekday(got[0] if got else None)


_fn("WEEKDAY_MILLIS", 1, 2, lambda ms, tz=MISSING: _weekday(_moment_of_millis(ms, tz)))
_fn("WEEKDAY_STR", 1, 1, _weekday_str)


# -- durations (Go's notation: "1h2m3.5s", "1.5ms", "-2µs") -----------------------------------

_UNITS: Final = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign
    "μs": 1_000,  # U+03BC greek mu
    "ms": 1_000_000,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_DURATION_PART: Final = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def _str_to_duration(text: Any) -> Any:
    if type(text) is not str or not text:
        return None
    sign, body = (-1, text[1:]) if text[0] == "-" else (1, text.lstrip("+"))
    if body == "0":
        return 0
    pos, total = 0, 0
    while pos < len(body):
        m = _DURATION_PART.match(body, pos)
        if m is None:
            return None
        number, unit = m.groups()
        whole, _, frac = number.partition(".")
        scale = _UNITS[unit]
        total += int(whole or 0) * scale
        if frac:
            total += int(frac) * scale // 10 ** len(frac)
        pos = m.end()
    return sign * total if pos else None


def _duration_to_str(ns: Any) -> Any:
    """Go's ``Duration.String``: ``"2µs"``, ``"1.5ms"``, ``"1h2m3.5s"``, ``"0s"``."""
    if not is_number(ns) or (type(ns) is float and not math.isfinite(ns)):
        return None
    d = int(ns)
    sign, d = ("-", -d) if d < 0 else ("", d)
    if d == 0:
        return "0s"
    if d < 10**9:
        for unit, scale in (("ns", 1), ("µs", 10**3), ("ms", 10**6)):
            if d < scale * 1000:
                return sign + _decimal(d, scale) + unit
    h, rest = divmod(d, 3600 * 10**9)
    mi, rest = divmod(rest, 60 * 10**9)
    text = _decimal(rest, 10**9) + "s"
    if h or mi:
        text = f"{mi}m" + text
    if h:
        text = f"{h}h" + text
    return sign + text


def _decimal(v: int, scale: int) -> str:
    whole, frac = divmod(v, scale)
    if not frac:
        return str(whole)
    digits = str(frac).rjust(len(str(scale)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


_fn("STR_TO_DURATION", 1, 1, _str_to_duration)
_fn("DURATION_TO_STR", 1, 1, _duration_to_str)
