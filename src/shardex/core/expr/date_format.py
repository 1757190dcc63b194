"""Date string formats of the date functions: reading a format and parsing dates with it
(printing is ``date_print``).

N1QL accepts four conventions for a format string, one per string:

* ISO-8601 example dates (``"1111-11-11T11:11:11.111Z"``, ``"2016-12-03"``): the format
  of the example, as a date string without a format is read (``parse_default``);
* date string codes (``"YYYY-MM-DD hh:mm:ss TZD"``, ``"DD MON YY"``, ``"HH12 pm"``);
* Go reference dates (``"2006-01-02T15:04:05Z07:00"``, ``"02/01/2006"``);
* percent specifiers (``"%Y-%m-%dT%T%z"``, ``"%-I%P on %-d%f %^b"``).

A format is compiled once (``layout_of``, cached) into a ``Layout``: literal text and
``Comp`` components. Parsing reads components leniently (a number up to its width, a name in
any case where the convention allows it) and fills defaults as N1QL does: year 0 (or the
century 19/20 for a two-digit year), month and day 1, time 0, the local zone; a space in
the format matches any one character. Every parse or print failure is None: the functions
give NULL for a date or format they cannot read.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, tzinfo
from typing import Final

from .date_calendar import (
    LOCAL_ZONE,
    NS_PER_S,
    Moment,
    days_from_civil,
    days_in_month,
    fixed_zone,
    wall_ns,
    zone_named,
)

MONTHS: Final = (
    *("January", "February", "March", "April", "May", "June"),
    *("July", "August", "September", "October", "November", "December"),
)
WEEKDAYS: Final = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")


@dataclass(frozen=True, slots=True)
class Comp:
    """One component of a layout. ``kind``: Y year, y two-digit year, C century, m month,
    B/b month name/abbreviation, d day, A/a weekday name/abbreviation, j day of year, H hour
    0-23, I hour 1-12, p AM/PM, M minute, S second, F fraction, z zone, f ordinal suffix,
    and output-only ones (``date_print``: q w u U W V G, epoch times s # @)."""

    kind: str
    width: int = 2
    pad: str = "0"  # "0", " " or "" (none)
    case: str = "title"  # names and AM/PM: "title", "upper", "lower"; "any" parses any case
    style: str = ""  # zone: "Z:" "Z" "Zh" ":" "" "h" "::" "name" "abbr"; fraction: "trim"
    sep: str = ""  # a fraction's separator ("." or ","), printed (and parsed) before it


Token = str | Comp


@dataclass(frozen=True, slots=True)
class Layout:
    tokens: tuple[Token, ...]
    go: bool = False  # Go's rule: seconds may be followed by a fraction the layout lacks


def _layout(tokens: list[Token], go: bool = False) -> Layout | None:
    merged: list[Token] = []
    for t in tokens:
        if isinstance(t, str) and merged and isinstance(merged[-1], str):
            merged[-1] += t
        else:
            merged.append(t)
    has_component = any(isinstance(t, Comp) for t in merged)
    return Layout(tuple(merged), go) if has_component else None


# -- ISO-8601 date strings (no format given) ----------------------------------------------------

_ISO: Final = re.compile(
    r"(?:(\d{4})([-/])(\d{2})\2(\d{2}))?"
    r"(?:((?(1)[T ]|))(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}(?::?\d{2})?)?)?"
)
_ISO_ZONE: Final = Comp("z", style="Z:")


def _iso_match(text: str) -> re.Match[str] | None:
    m = _ISO.fullmatch(text)
    if m is None or (m.group(1) is None and m.group(6) is None):
        return None
    return m


def _iso_layout(m: re.Match[str]) -> Layout:
    tokens: list[Token] = []
    if m.group(1) is not None:
        sep = m.group(2)
        tokens += [Comp("Y", 4), sep, Comp("m"), sep, Comp("d")]
    if m.group(6) is not None:
        tokens += [m.group(5) or "", Comp("H"), ":", Comp("M"), ":", Comp("S")]
        frac = m.group(9)
        if frac is not None:
            # Zeros are Go's fixed digits (".000"); other examples print milliseconds
            # without trailing zeros, as N1QL's ISO formats do.
            fixed = set(frac) == {"0"}
            tokens.append(
                Comp("F", len(frac) if fixed else 3, style="" if fixed else "trim", sep=".")
            )
        if m.group(10) is not None:
            tokens.append(_ISO_ZONE)
    layout = _layout(tokens)
    assert layout is not None
    return layout


def _zone_of(text: str) -> tzinfo | None:
    if text == "Z":
        return UTC
    if text[0] in "+-":
        digits = text[1:].replace(":", "")
        if not digits.isdigit() or len(digits) not in (2, 4, 6):
            return None
        h, mi, s = int(digits[:2]), int(digits[2:4] or 0), int(digits[4:6] or 0)
        if h > 23 or mi > 59 or s > 59:
            return None
        off = h * 3600 + mi * 60 + s
        return fixed_zone(-off if text[0] == "-" else off)
    return zone_named(text)


def parse_default(text: str) -> tuple[Moment, Layout] | None:
    """A date string in one of N1QL's ISO-8601 forms (``-`` or ``/`` between the date's
    fields), with the layout it was written in (results keep the input's format)."""
    m = _iso_match(text)
    if m is None:
        return None
    y, mo, d = (int(m.group(i)) for i in (1, 3, 4)) if m.group(1) else (0, 1, 1)
    h, mi, s = (int(m.group(i)) for i in (6, 7, 8)) if m.group(6) else (0, 0, 0)
    frac = m.group(9) or ""
    nanos = int(frac.ljust(9, "0")) if frac else 0
    if not _valid(y, mo, d, h, mi, s):
        return None
    zone = LOCAL_ZONE if m.group(10) is None else _zone_of(m.group(10))
    if zone is None:
        return None
    return Moment.of_wall(wall_ns(y, mo, d, h, mi, s, nanos), zone), _iso_layout(m)


def _valid(y: int, mo: int, d: int, h: int, mi: int, s: int) -> bool:
    return 1 <= mo <= 12 and 1 <= d <= days_in_month(y, mo) and h < 24 and mi < 60 and s < 60


# -- format strings ----------------------------------------------------------------------------

_CODES: Final = [
    ("MONTH", Comp("B", case="upper")),
    ("Month", Comp("B")),
    ("month", Comp("B", case="lower")),
    ("YYYY", Comp("Y", 4)),
    ("HH12", Comp("I")),
    ("HH24", Comp("H")),
    ("DAY", Comp("A", case="upper")),
    ("Day", Comp("A")),
    ("day", Comp("A", case="lower")),
    ("MON", Comp("b", case="upper")),
    ("Mon", Comp("b")),
    ("mon", Comp("b", case="lower")),
    ("TZD", Comp("z", style="Z:")),
    ("TZN", Comp("z", style="abbr")),
    ("CC", Comp("C")),
    ("YY", Comp("y")),
    ("MM", Comp("m")),
    ("DD", Comp("d")),
    ("DY", Comp("a", case="upper")),
    ("Dy", Comp("a")),
    ("dy", Comp("a", case="lower")),
    ("hh", Comp("H")),
    ("HH", Comp("I")),
    ("mm", Comp("M")),
    ("MI", Comp("M")),
    ("ss", Comp("S")),
    ("SS", Comp("S")),
    ("AM", Comp("p", case="upper")),
    ("PM", Comp("p", case="upper")),
    ("PP", Comp("p", case="upper")),
    ("am", Comp("p", case="lower")),
    ("pm", Comp("p", case="lower")),
    ("pp", Comp("p", case="lower")),
    ("s", Comp("F", 3)),
]


def _codes(fmt: str) -> Layout | None:
    tokens: list[Token] = []
    i = 0
    while i < len(fmt):
        for code, comp in _CODES:
            if fmt.startswith(code, i):
                # Text components of the codes convention parse in any case (``pp`` reads
                # "AM"); they print in the case the code is written in.
                tokens.append(_any_case(comp) if comp.kind in "BbAap" else comp)
                i += len(code)
                break
        else:
            tokens.append(fmt[i])
            i += 1
    return _layout(tokens)


def _any_case(c: Comp) -> Comp:
    return Comp(c.kind, c.width, c.pad, c.case + "|any", c.style, c.sep)


_GO: Final = [
    ("January", Comp("B")),
    ("Jan", Comp("b")),
    ("Monday", Comp("A")),
    ("Mon", Comp("a")),
    ("MST", Comp("z", style="abbr")),
    ("2006", Comp("Y", 4)),
    ("002", Comp("j", 3)),
    ("__2", Comp("j", 3, " ")),
    ("_2", Comp("d", 2, " ")),
    ("01", Comp("m")),
    ("02", Comp("d")),
    ("03", Comp("I")),
    ("04", Comp("M")),
    ("05", Comp("S")),
    ("06", Comp("y")),
    ("15", Comp("H")),
    ("1", Comp("m", 2, "")),
    ("2", Comp("d", 2, "")),
    ("3", Comp("I", 2, "")),
    ("4", Comp("M", 2, "")),
    ("5", Comp("S", 2, "")),
    ("PM", Comp("p", case="upper")),
    ("pm", Comp("p", case="lower")),
    ("Z07:00:00", Comp("z", style="Z::")),
    ("-07:00:00", Comp("z", style="::")),
    ("Z070000", Comp("z", style="Z::")),
    ("-070000", Comp("z", style="::")),
    ("Z07:00", Comp("z", style="Z:")),
    ("-07:00", Comp("z", style=":")),
    ("Z0700", Comp("z", style="Z")),
    ("-0700", Comp("z", style="")),
    ("Z07", Comp("z", style="Zh")),
    ("-07", Comp("z", style="h")),
]
_GO_FRACTION: Final = re.compile(r"[.,](0+|9+)(?!\d)")


def _go(fmt: str) -> Layout | None:
    tokens: list[Token] = []
    i = 0
    while i < len(fmt):
        m = _GO_FRACTION.match(fmt, i)
        if m is not None and i > 0:
            run = m.group(1)
            tokens.append(Comp("F", len(run), style="trim" if run[0] == "9" else "", sep=fmt[i]))
            i = m.end()
            continue
        for ref, comp in _GO:
            if fmt.startswith(ref, i):
                tokens.append(comp)
                i += len(ref)
                break
        else:
            tokens.append(fmt[i])
            i += 1
    return _layout(tokens, go=True)


_PERCENT: Final = re.compile(r"%([-_0^#]*)(\d*)(:{0,3})(.)", re.DOTALL)
_PERCENT_ELEMENTS: Final = {
    "Y": Comp("Y", 4),
    "C": Comp("C"),
    "y": Comp("y"),
    "m": Comp("m"),
    "B": Comp("B"),
    "b": Comp("b"),
    "h": Comp("b"),
    "d": Comp("d"),
    "e": Comp("d", 2, " "),
    "A": Comp("A"),
    "a": Comp("a"),
    "f": Comp("f"),
    "H": Comp("H"),
    "k": Comp("H", 2, " "),
    "I": Comp("I"),
    "l": Comp("I", 2, " "),
    "p": Comp("p", case="upper"),
    "P": Comp("p", case="lower"),
    "M": Comp("M"),
    "S": Comp("S"),
    "N": Comp("F", 3),
    "z": Comp("z", style=""),
    "Z": Comp("z", style="name"),
    "s": Comp("s", 0, ""),
    "j": Comp("j", 3),
    "q": Comp("q", 1),
    "w": Comp("w", 1),
    "u": Comp("u", 1),
    "U": Comp("U"),
    "W": Comp("W"),
    "V": Comp("V"),
    "G": Comp("G", 4),
    "#": Comp("#", 0, ""),
    "@": Comp("@", 0, ""),
}
_PERCENT_MACROS: Final = {
    "D": "%Y-%m-%d",
    "x": "%Y-%m-%d",
    "F": "%Y-%m-%dT%H:%M:%S.%N%:z",
    "T": "%H:%M:%S",
    "X": "%H:%M:%S",
    "R": "%H:%M",
    "r": "%I:%M:%S %p",
}
_ZONE_COLONS: Final = {1: ":", 2: "::", 3: ":::"}


def _percent(fmt: str) -> Layout | None:
    tokens: list[Token] = []
    i = 0
    while i < len(fmt):
        if fmt[i] != "%":
            tokens.append(fmt[i])
            i += 1
            continue
        m = _PERCENT.match(fmt, i)
        if m is None:
            return None
        flags, width, colons, element = m.groups()
        i = m.end()
        if element == "%":
            tokens.append("%")
            continue
        if element in _PERCENT_MACROS:
            inner = _percent(_PERCENT_MACROS[element])
            assert inner is not None
            tokens.extend(inner.tokens)
            continue
        comp = _PERCENT_ELEMENTS.get(element)
        if comp is None:
            return None
        pad = "" if "-" in flags else " " if "_" in flags else comp.pad
        case = comp.case
        if "^" in flags:
            case = "upper|any"
        style = _ZONE_COLONS.get(len(colons), comp.style) if element == "z" else comp.style
        w = int(width) if width else comp.width
        tokens.append(Comp(comp.kind, w, pad, case, style, comp.sep))
    return _layout(tokens)


@functools.lru_cache(maxsize=1024)
def layout_of(fmt: str) -> Layout | None:
    """The layout of a format string in any of the four conventions, None if it has no date
    component (the output functions then print the default format)."""
    if "%" in fmt:
        return _percent(fmt)
    m = _iso_match(fmt)
    if m is not None:
        return _iso_layout(m)
    if any(c.isdigit() for c in fmt.replace("HH12", "").replace("HH24", "")):
        return _go(fmt)
    return _codes(fmt)


DEFAULT_LAYOUT: Final = _go("2006-01-02T15:04:05.999Z07:00")


# -- parsing -----------------------------------------------------------------------------------


class _Fail(Exception):
    pass


_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_+\-/]*")
_OFFSET: Final = re.compile(r"[+-]\d{2}(?::?\d{2}(?::?\d{2})?)?")
_SUFFIX: Final = re.compile(r"st|nd|rd|th", re.IGNORECASE)
_FRACTION: Final = re.compile(r"[.,]\d+")
_INTEGER: Final = re.compile(r"-?\d+")


def _number(text: str, i: int, width: int, kind: str) -> tuple[int, int]:
    j = i
    while j < len(text) and j - i < max(width, 1) and text[j].isdigit():
        j += 1
    if j == i:
        if kind == "Y" and i < len(text) and text[i] == "-":  # a year before year 0
            v, k = _number(text, i + 1, width, kind)
            return -v, k
        raise _Fail
    return int(text[i:j]), j


def _name(text: str, i: int, names: Sequence[str], comp: Comp) -> tuple[int, int]:
    any_case = comp.case.endswith("any")
    for idx, name in sorted(enumerate(names), key=lambda p: -len(p[1])):
        piece = text[i : i + len(name)]
        if piece == name or (any_case and piece.lower() == name.lower()):
            return idx, i + len(name)
    raise _Fail


def _names(kind: str) -> Sequence[str]:
    if kind == "B":
        return MONTHS
    if kind == "b":
        return [m[:3] for m in MONTHS]
    if kind == "A":
        return WEEKDAYS
    return [w[:3] for w in WEEKDAYS]


def parse_with(text: str, layout: Layout) -> Moment | None:
    """``text`` read with ``layout``; None when it does not match or names no valid date."""
    try:
        return _parse(text, layout)
    except _Fail:
        return None


def _parse(text: str, layout: Layout) -> Moment | None:
    got: dict[str, int] = {}
    zone: tzinfo | None = None
    i = 0
    tokens = layout.tokens
    for n, tok in enumerate(tokens):
        if isinstance(tok, str):
            for ch in tok:
                if i >= len(text) or (ch != " " and text[i] != ch):
                    raise _Fail
                i += 1
            continue
        kind = tok.kind
        if kind in "YyCmdjHIMSGqwuUWV":
            if tok.pad == " ":
                while i < len(text) and text[i] == " ":
                    i += 1
            v, i = _number(text, i, tok.width if kind != "Y" else 4, kind)
            got[kind] = v
            if kind == "S" and layout.go and _next_not_fraction(tokens, n):
                m = _FRACTION.match(text, i)
                if m is not None:
                    got["F"] = int(m.group()[1:10].ljust(9, "0"))
                    i = m.end()
        elif kind in "BbAa":
            v, i = _name(text, i, _names(kind), tok)
            got[kind] = v
        elif kind == "p":
            piece = text[i : i + 2]
            upper = tok.case.startswith("upper")
            if tok.case.endswith("any"):
                piece = piece.upper() if upper else piece.lower()
            options = ("AM", "PM") if upper else ("am", "pm")
            if piece not in options:
                raise _Fail
            got["p"] = options.index(piece)
            i += 2
        elif kind == "F":
            if tok.sep:
                if i < len(text) and text[i] in ".," and text[i + 1 : i + 2].isdigit():
                    i += 1
                elif tok.style == "trim":
                    continue
                else:
                    raise _Fail
            j = i
            while j < len(text) and text[j].isdigit():
                j += 1
            if j == i:
                raise _Fail
            got["F"] = int(text[i:j][:9].ljust(9, "0"))
            i = j
        elif kind == "z":
            zone, i = _parse_zone(text, i)
        elif kind == "f":
            m = _SUFFIX.match(text, i)
            if m is None:
                raise _Fail
            i = m.end()
        elif kind == "s":
            m = _INTEGER.match(text, i)
            if m is None:
                raise _Fail
            got["s"] = int(m.group())
            i = m.end()
        else:
            raise _Fail  # an output-only component
    if i != len(text):
        raise _Fail
    return _resolve(got, zone)


def _next_not_fraction(tokens: tuple[Token, ...], n: int) -> bool:
    nxt = tokens[n + 1] if n + 1 < len(tokens) else None
    return not (isinstance(nxt, Comp) and nxt.kind == "F")


def _parse_zone(text: str, i: int) -> tuple[tzinfo, int]:
    if text.startswith("Z", i) and not text[i + 1 : i + 2].isalpha():
        return UTC, i + 1
    m = _OFFSET.match(text, i) or _NAME.match(text, i)
    if m is None:
        raise _Fail
    zone = _zone_of(m.group())
    if zone is None:
        raise _Fail
    return zone, m.end()


def _resolve(got: dict[str, int], zone: tzinfo | None) -> Moment | None:
    if zone is None:
        zone = LOCAL_ZONE
    if "s" in got:
        return Moment.at(got["s"] * NS_PER_S, zone)
    if "Y" in got:
        year = got["Y"]
    elif "y" in got:
        century = got.get("C", 19 if got["y"] >= 69 else 20)
        year = century * 100 + got["y"]
    else:
        year = got.get("C", 0) * 100
    name = got.get("B", got.get("b"))
    month, day = got.get("m", 1 if name is None else name + 1), got.get("d", 1)
    if "j" in got and "m" not in got and "d" not in got:
        days = days_from_civil(year, 1, 1) + got["j"] - 1
    else:
        if not 1 <= month <= 12 or not 1 <= day <= days_in_month(year, month):
            return None
        days = days_from_civil(year, month, day)
    if "I" in got:
        hour = got["I"]
        if not 1 <= hour <= 12:
            return None
        if "p" in got:
            hour = hour % 12 + 12 * got["p"]
    else:
        hour = got.get("H", 0)
        if got.get("p") == 1 and hour < 12:
            hour += 12
        elif got.get("p") == 0 and hour == 12:
            hour = 0
    minute, second = got.get("M", 0), got.get("S", 0)
    if hour > 23 or minute > 59 or second > 59:
        return None
    wall = (days * 86_400 + hour * 3600 + minute * 60 + second) * NS_PER_S + got.get("F", 0)
    return Moment.of_wall(wall, zone)
