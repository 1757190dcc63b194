"""From key constraints to scan spans, once parameter values are known.

Each key part's atoms (:mod:`shardex.sql.planner.sargable`) become a union of value
intervals; the atoms of one key part are intersected. Spans are then built left to right:
while a key part is pinned to a finite set of points (``=``, ``IN``) the spans fan out over
them (up to ``max_spans``); the first key part with a real range closes the spans; a key part
with no atoms stops the walk (the remaining parts are unbounded).

Spans come out in *index order* (the order entries sort in), in the scan API's shape:
``{"low": [...] | None, "high": [...] | None, "inclusion": "both"|"low"|"high"|"neither"}``,
where a shorter list bounds only the leading key parts. For a DESC key part the value
interval is reversed: its high value becomes the span's low bound.

Bound values that evaluate to MISSING make their interval empty (a comparison with MISSING
is never TRUE). A NULL bound value is kept as the NULL key: ``k = NULL`` scans the NULL
entries and the re-applied filter drops them, which is slower than needed but never wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardex.core.expr import MISSING, Expr, Literal, Param, evaluate
from shardex.core.keycodec import compare_values

from .sargable import AnyOf, InList, KeyAtom, Prefix, Range

__all__ = ["OPEN", "Interval", "atom_intervals", "exact_key_parts", "key_spans", "spans_for"]

DEFAULT_MAX_SPANS = 1024


class _Open:
    """An unbounded end (distinct from every JSON value, NULL included)."""

    def __repr__(self) -> str:
        return "OPEN"


OPEN: Any = _Open()
# Values equal to themselves under ``compare_values`` whatever they hold (a float may be
# NaN; arrays and objects may hold one): an interval with one such object at both ends is
# a point without comparing.
_SELF_EQUAL: Any = frozenset({str, int, bool, type(None)})
_ABOVE_NULL = "above-null"  # an interval end just above NULL (exclusive NULL)


@dataclass(frozen=True, slots=True)
class Interval:
    low: Any  # a JSON value or OPEN
    low_inclusive: bool
    high: Any
    high_inclusive: bool

    def is_point(self) -> bool:
        if self.low is self.high and type(self.low) in _SELF_EQUAL:  # ``k = $1``: no compare
            return self.low_inclusive and self.high_inclusive
        return (
            self.low is not OPEN
            and self.high is not OPEN
            and self.low_inclusive
            and self.high_inclusive
            and compare_values(self.low, self.high) == 0
        )


def _cmp_low(a: Interval, b: Interval) -> int:
    """Order of two low ends: OPEN first; at equal values an inclusive end is lower."""
    if a.low is OPEN or b.low is OPEN:
        return (0 if b.low is OPEN else -1) if a.low is OPEN else 1
    c = compare_values(a.low, b.low)
    if c:
        return c
    return (b.low_inclusive - a.low_inclusive) if a.low_inclusive != b.low_inclusive else 0


def _cmp_high(a: Interval, b: Interval) -> int:
    """Order of two high ends: OPEN last; at equal values an inclusive end is higher."""
    if a.high is OPEN or b.high is OPEN:
        return (0 if b.high is OPEN else 1) if a.high is OPEN else -1
    c = compare_values(a.high, b.high)
    if c:
        return c
    return (a.high_inclusive - b.high_inclusive) if a.high_inclusive != b.high_inclusive else 0


def _empty(iv: Interval) -> bool:
    if iv.low is OPEN or iv.high is OPEN:
        return False
    if iv.low is iv.high and type(iv.low) in _SELF_EQUAL:  # one value at both ends
        return not (iv.low_inclusive and iv.high_inclusive)
    c = compare_values(iv.low, iv.high)
    return c > 0 or (c == 0 and not (iv.low_inclusive and iv.high_inclusive))


def _touches(a: Interval, b: Interval) -> bool:
    """Whether ``b`` (with ``b.low >= a.low``) overlaps or abuts ``a``, so they can merge."""
    if a.high is OPEN or b.low is OPEN:
        return True
    c = compare_values(b.low, a.high)
    return c < 0 or (c == 0 and (a.high_inclusive or b.low_inclusive))


def normalise(intervals: Sequence[Interval]) -> list[Interval]:
    """Sorted, disjoint, non-empty intervals covering the same values."""
    if len(intervals) == 1:  # a point query's one interval: nothing to sort or merge
        return [] if _empty(intervals[0]) else [intervals[0]]
    ivs = sorted((iv for iv in intervals if not _empty(iv)), key=_LowKey)
    out: list[Interval] = []
    for iv in ivs:
        if out and _touches(out[-1], iv):
            last = out[-1]
            if _cmp_high(iv, last) > 0:
                out[-1] = Interval(last.low, last.low_inclusive, iv.high, iv.high_inclusive)
        else:
            out.append(iv)
    return out


class _LowKey:
    __slots__ = ("iv",)

    def __init__(self, iv: Interval) -> None:
        self.iv = iv

    def __lt__(self, other: _LowKey) -> bool:
        return _cmp_low(self.iv, other.iv) < 0


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for x in a:
        for y in b:
            lo = x if _cmp_low(x, y) >= 0 else y
            hi = x if _cmp_high(x, y) <= 0 else y
            iv = Interval(lo.low, lo.low_inclusive, hi.high, hi.high_inclusive)
            if not _empty(iv):
                out.append(iv)
    return normalise(out)


def _value(expr: Expr, params: Any) -> Any:
    return evaluate(expr, None, params=params)


def atom_intervals(atom: KeyAtom, params: Any = None) -> list[Interval]:
    """The values ``atom`` allows, as normalised intervals."""
    if isinstance(atom, Range):
        low = OPEN if atom.low is None else _value(atom.low, params)
        if atom.high is atom.low and isinstance(atom.low, Param | Literal):
            high = low  # ``k = $1``: one parameter, read once (a function could differ)
        else:
            high = OPEN if atom.high is None else _value(atom.high, params)
        if low is MISSING or high is MISSING:
            return []
        if low is OPEN and atom.above_null:
            return normalise([Interval(None, False, high, atom.high_inclusive)])
        return normalise([Interval(low, atom.low_inclusive, high, atom.high_inclusive)])
    if isinstance(atom, InList):
        coll = _value(atom.collection, params)
        if not isinstance(coll, list):
            return []
        # x IN [NULL] is never TRUE: skip NULL and MISSING elements.
        points = [v for v in coll if v is not None and v is not MISSING]
        return normalise([Interval(v, True, v, True) for v in points])
    if isinstance(atom, Prefix):
        if not atom.prefix:  # every string: strings sort below the empty array
            return [Interval("", True, [], False)]
        last = atom.prefix[-1]
        if ord(last) == 0x10FFFF:
            return [Interval(atom.prefix, True, [], False)]
        upper = atom.prefix[:-1] + chr(ord(last) + 1)
        return [Interval(atom.prefix, True, upper, False)]
    if isinstance(atom, AnyOf):
        out: list[Interval] = []
        for a in atom.atoms:
            out.extend(atom_intervals(a, params))
        return normalise(out)
    raise TypeError(f"not a key atom: {atom!r}")


def _key_intervals(atoms: Sequence[KeyAtom], params: Any) -> list[Interval]:
    # The first atom's intervals as they are (normalised already): intersecting them
    # with the whole line, as the loop would, only copies them.
    ivs = atom_intervals(atoms[0], params)
    for atom in atoms[1:]:
        if not ivs:
            break
        ivs = intersect(ivs, atom_intervals(atom, params))
    return ivs


def _inclusion(low_inclusive: bool, high_inclusive: bool) -> str:
    if low_inclusive and high_inclusive:
        return "both"
    if low_inclusive:
        return "low"
    return "high" if high_inclusive else "neither"


def _span(prefix: list[Any], iv: Interval | None, desc: bool) -> dict[str, Any]:
    """One span: the points of ``prefix`` on the leading key parts, then ``iv`` (None = the
    rest unbounded) on the next one, in index order."""
    if iv is None:
        bound = list(prefix) or None
        return {"low": bound, "high": bound, "inclusion": "both"}
    lo_v, lo_inc, hi_v, hi_inc = iv.low, iv.low_inclusive, iv.high, iv.high_inclusive
    if desc:  # reversed order: the interval's high value sorts first
        lo_v, lo_inc, hi_v, hi_inc = hi_v, hi_inc, lo_v, lo_inc
    # An OPEN end bounds only the prefix, inclusively (every entry starting with it).
    low = list(prefix) if lo_v is OPEN else [*prefix, lo_v]
    high = list(prefix) if hi_v is OPEN else [*prefix, hi_v]
    lo_inc = True if lo_v is OPEN else lo_inc
    hi_inc = True if hi_v is OPEN else hi_inc
    return {"low": low or None, "high": high or None, "inclusion": _inclusion(lo_inc, hi_inc)}


def key_spans(
    per_key: Sequence[Sequence[KeyAtom]],
    desc: Sequence[bool],
    params: Any = None,
    *,
    max_spans: int = DEFAULT_MAX_SPANS,
) -> list[dict[str, Any]]:
    """Spans for the constraints ``per_key`` (one list of atoms per index key part).

    ``[]`` means no entry can match (e.g. ``k = 1 AND k = 2``); a single span with both
    bounds None is the whole index.
    """
    walk = _walk(per_key, params, max_spans)
    if walk.empty:
        return []
    if walk.last is None:
        return [_span(p, None, False) for p in walk.prefixes]
    return [_span(p, iv, desc[walk.last]) for p in walk.prefixes for iv in walk.last_ivs]


@dataclass(frozen=True, slots=True)
class _Walk:
    """The spans' shape: ``prefixes`` (points of the pinned leading key parts), then the
    key part ``last`` closing them with ``last_ivs`` (None: the rest unbounded)."""

    prefixes: list[list[Any]]
    last: int | None = None
    last_ivs: tuple[Interval, ...] = ()
    hulled: bool = False  # ``last_ivs`` is the hull of more intervals than ``max_spans``
    empty: bool = False  # no entry can match


def _walk(per_key: Sequence[Sequence[KeyAtom]], params: Any, max_spans: int) -> _Walk:
    prefixes: list[list[Any]] = [[]]
    for i, atoms in enumerate(per_key):
        if not atoms:
            break
        ivs = _key_intervals(atoms, params)
        if not ivs:
            return _Walk([], empty=True)
        if all(iv.is_point() for iv in ivs) and len(prefixes) * len(ivs) <= max_spans:
            prefixes = [[*p, iv.low] for p in prefixes for iv in ivs]
            continue
        if len(prefixes) * len(ivs) > max_spans:
            return _Walk(prefixes, i, (_hull(ivs),), hulled=True)
        return _Walk(prefixes, i, tuple(ivs))
    return _Walk(prefixes)


def exact_key_parts(
    per_key: Sequence[Sequence[KeyAtom]], params: Any = None, *, max_spans: int = DEFAULT_MAX_SPANS
) -> int:
    """How many leading key parts ``key_spans`` bounds exactly: an entry is in the spans
    if and only if its values on those parts lie in their atoms' intervals (a hull past
    ``max_spans`` is wider: its part is not counted)."""
    walk = _walk(per_key, params, max_spans)
    pinned = len(walk.prefixes[0]) if walk.prefixes else 0
    if walk.last is None or walk.hulled:
        return pinned
    return walk.last + 1


def _hull(ivs: Sequence[Interval]) -> Interval:
    first, last = ivs[0], ivs[-1]
    return Interval(first.low, first.low_inclusive, last.high, last.high_inclusive)


def spans_for(
    where: Expr | None, keys: Sequence[Expr], desc: Sequence[bool], params: Any = None
) -> list[dict[str, Any]]:
    """Convenience: constrain ``keys`` with ``where`` and build the spans."""
    from .sargable import constrain_keys

    return key_spans(constrain_keys(where, keys), desc, params)
