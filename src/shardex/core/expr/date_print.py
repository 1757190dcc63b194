"""Printing dates with a ``date_format.Layout`` (``format_moment``)."""

from __future__ import annotations

from datetime import UTC, timezone

from .date_calendar import NS_PER_S, Moment, probe_datetime
from .date_format import DEFAULT_LAYOUT, MONTHS, WEEKDAYS, Comp, Layout


def _num(v: int, comp: Comp) -> str:
    if comp.pad == "":
        return str(v)
    text = str(abs(v)).rjust(comp.width, "0" if comp.pad == "0" else " ")
    return "-" + text if v < 0 else text


def _cased(name: str, comp: Comp) -> str:
    if comp.case.startswith("upper"):
        return name.upper()
    if comp.case.startswith("lower"):
        return name.lower()
    return name


def _offset_text(off: int, style: str) -> str:
    if style.startswith("Z") and off == 0:
        return "Z"
    style = style.lstrip("Z")
    sign = "-" if off < 0 else "+"
    h, rest = divmod(abs(off), 3600)
    mi, s = divmod(rest, 60)
    if style == "h":
        return f"{sign}{h:02d}"
    if style == "":
        return f"{sign}{h:02d}{mi:02d}"
    if style == "::":
        return f"{sign}{h:02d}:{mi:02d}:{s:02d}"
    if style == ":::":
        return f"{sign}{h:02d}" + (f":{mi:02d}" if mi or s else "") + (f":{s:02d}" if s else "")
    return f"{sign}{h:02d}:{mi:02d}"


def _zone_name(m: Moment, abbr: bool) -> str:
    zone = m.zone
    if zone is UTC:
        return "UTC"
    key = getattr(zone, "key", None)
    if key is not None and not abbr:
        return str(key)
    if isinstance(zone, timezone) or key is None:
        return _offset_text(m.offset, "")
    name = probe_datetime(m.wall // NS_PER_S).replace(tzinfo=zone).tzname()
    return name or _offset_text(m.offset, "")


def format_moment(m: Moment, layout: Layout | None) -> str:
    """``m`` printed with ``layout`` (the default format when None)."""
    layout = layout or DEFAULT_LAYOUT
    assert layout is not None
    f = m.fields()
    out: list[str] = []
    for tok in layout.tokens:
        if isinstance(tok, str):
            out.append(tok)
            continue
        k = tok.kind
        if k == "Y":
            out.append(_num(f.year, tok))
        elif k == "y":
            out.append(_num(f.year % 100, tok))
        elif k == "C":
            out.append(_num(f.year // 100, tok))
        elif k == "m":
            out.append(_num(f.month, tok))
        elif k in "Bb":
            name = MONTHS[f.month - 1]
            out.append(_cased(name if k == "B" else name[:3], tok))
        elif k == "d":
            out.append(_num(f.day, tok))
        elif k in "Aa":
            name = WEEKDAYS[f.weekday]
            out.append(_cased(name if k == "A" else name[:3], tok))
        elif k == "j":
            out.append(_num(f.day_of_year, tok))
        elif k == "H":
            out.append(_num(f.hour, tok))
        elif k == "I":
            out.append(_num((f.hour + 11) % 12 + 1, tok))
        elif k == "p":
            out.append(_cased("PM" if f.hour >= 12 else "AM", tok))
        elif k == "M":
            out.append(_num(f.minute, tok))
        elif k == "S":
            out.append(_num(f.second, tok))
        elif k == "F":
            digits = str(f.nanos).rjust(9, "0")[: max(1, min(tok.width, 9))]
            if tok.style == "trim":
                digits = digits.rstrip("0")
                if not digits:
                    continue
            out.append(tok.sep + digits)
        elif k == "z":
            if tok.style in ("name", "abbr"):
                out.append(_zone_name(m, tok.style == "abbr"))
            else:
                out.append(_offset_text(m.offset, tok.style))
        elif k == "f":
            out.append(_ordinal(f.day))
        else:
            out.append(_output_only(k, m, tok))
    return "".join(out)


def _ordinal(day: int) -> str:
    if day % 100 in (11, 12, 13):
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")


def _output_only(k: str, m: Moment, tok: Comp) -> str:
    f = m.fields()
    if k == "s":
        return str(m.ns // NS_PER_S)
    if k == "q":
        return str((f.month - 1) // 3 + 1)
    if k == "w":
        return str(f.weekday)
    if k == "u":
        return str((f.weekday + 6) % 7 + 1)
    if k == "U":
        return _num((f.day_of_year - 1 + 7 - f.weekday) // 7, tok)
    if k == "W":
        return _num((f.day_of_year - 1 + 7 - (f.weekday + 6) % 7) // 7, tok)
    if k == "V":
        return _num(f.iso_week()[1], tok)
    if k == "G":
        return _num(f.iso_week()[0], tok)
    secs, nanos = divmod(m.ns, NS_PER_S)
    h, rest = divmod(secs, 3600)
    text = f"{h}:{rest // 60:02d}:{rest % 60:02d}"
    return text + (f".{nanos // 1_000_000:03d}" if k == "@" else "")
