"""Grouping and aggregation in two phases: PARTIAL on every leaf fragment, FINAL at the root.

A partial state merges exactly: the final result is the same whichever way the input rows
were split among leaves and in whatever order partials arrive.

State per aggregate (``AggSpec.kind``):
- COUNT(*) / COUNT(x): an int (COUNT(x) counts values that are neither MISSING nor NULL).
- SUM(x) / AVG(x): ``SumState`` = exact integer sum, exact float sum (as a ``Fraction``:
  adding floats in a different order would round differently), count of numbers. Final:
  SUM is the int, or the correctly rounded float when a float took part; AVG is the exact
  sum divided by the count, rounded once. Non-numbers are ignored; no numbers gives NULL.
- MIN(x) / MAX(x): the least / greatest non-MISSING, non-NULL value by SQL++ collation.
- ARRAY_AGG(x): the list of non-MISSING values, returned in collation order as N1QL does
  (so the result is the same whichever way the rows were split and merged).
- COUNTN(x): an int, the count of number values.
- MEDIAN(x): the list of number values (it grows with the group: budgeted and spilled like
  ARRAY_AGG's); FINAL sorts it: the middle value, or the mean of the two middle ones.
- VARIANCE / STDDEV and their _SAMP and _POP forms: ``SquaresState`` = count, the sum and
  the sum of squares of the numbers, held exactly (ints, and ``Fraction`` for floats, as
  SUM's): M2 = sum of squares - sum * sum / count is computed exactly once at FINAL and
  rounded once, so merged partials give the same bits whatever the split (the property a
  float (count, mean, M2) merge only approximates) and nothing cancels catastrophically.
  One number gives 0 for VARIANCE, STDDEV and the _POP forms, NULL for the _SAMP forms
  (N1QL); no number gives NULL.
- any DISTINCT form: ``{identity: value}`` of the distinct values, reduced at FINAL.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from shardex.core.expr import MISSING
from shardex.core.expr.ops import collate, is_number

from .basic import RowFn, value_identity

# Variance kinds: (population, NULL for one value, square root).
_SPREAD: dict[str, tuple[bool, bool, bool]] = {
    "VARIANCE": (False, False, False),
    "VAR_SAMP": (False, True, False),
    "VARIANCE_SAMP": (False, True, False),
    "VAR_POP": (True, False, False),
    "VARIANCE_POP": (True, False, False),
    "STDDEV": (False, False, True),
    "STDDEV_SAMP": (False, True, True),
    "STDDEV_POP": (True, False, True),
}
KINDS = ("COUNT", "COUNTN", "SUM", "AVG", "MIN", "MAX", "ARRAY_AGG", "MEDIAN", *_SPREAD)


@dataclass(frozen=True, slots=True)
class AggSpec:
    kind: str  # one of KINDS
    arg: RowFn | None  # None: COUNT(*)
    distinct: bool = False


@dataclass(slots=True)
class SumState:
    ints: int = 0
    floats: Fraction = field(default_factory=Fraction)
    count: int = 0
    saw_float: bool = False

    def add(self, v: Any, n: int = 1) -> None:
        """``v`` added ``n`` times: exact, as the sums are."""
        if type(v) is int:
            self.ints += v * n
        else:
            self.floats += Fraction(v) * n
            self.saw_float = True
        self.count += n

    def merge(self, other: SumState) -> None:
        self.ints += other.ints
        self.floats += other.floats
        self.count += other.count
        self.saw_float = self.saw_float or other.saw_float

    def total(self) -> Any:
        if self.count == 0:
            return None
        if not self.saw_float:
            return self.ints
        return _finite(self.ints + self.floats)

    def average(self) -> Any:
        if self.count == 0:
            return None
        q = (self.ints + self.floats) / self.count
        if q.denominator == 1 and not self.saw_float:
            return int(q)
        return _finite(q)


@dataclass(slots=True)
class SquaresState:
    """Count, sum and sum of squares of numbers, exact (see the module doc)."""

    count: int = 0
    ints: int = 0
    int_squares: int = 0
    floats: Fraction = field(default_factory=Fraction)
    float_squares: Fraction = field(default_factory=Fraction)

    def add(self, v: Any, n: int = 1) -> None:
        if type(v) is int:
            self.ints += v * n
            self.int_squares += v * v * n
        else:
            f = Fraction(v)
            self.floats += f * n
            self.float_squares += f * f * n
        self.count += n

    def merge(self, other: SquaresState) -> None:
        self.count += other.count
        self.ints += other.ints
        self.int_squares += other.int_squares
        self.floats += other.floats
        self.float_squares += other.float_squares

    def spread(self, kind: str) -> Any:
        population, null_for_one, root = _SPREAD[kind]
        n = self.count
        if n == 0 or (n == 1 and null_for_one):
            return None
        if n == 1:
            return 0.0
        total = self.ints + self.floats
        m2 = self.int_squares + self.float_squares - total * total / n
        var = _finite(m2 / (n if population else n - 1))
        if var is None:
            return None
        return math.sqrt(var) if root else var


def _median(values: list[Any]) -> Any:
    if not values:
        return None
    values.sort()
    mid = len(values) // 2
    if len(values) % 2:
        return values[mid]
    a, b = values[mid - 1], values[mid]
    if type(a) is int and type(b) is int and (a + b) % 2 == 0:
        return (a + b) // 2
    return _finite(Fraction(a) / 2 + Fraction(b) / 2)


def _finite(q: Fraction) -> Any:
    try:
        return float(q)
    except OverflowError:
        return None


def _init(spec: AggSpec) -> Any:
    if spec.distinct:
        return {}
    if spec.kind in ("COUNT", "COUNTN"):
        return 0
    if spec.kind in ("SUM", "AVG"):
        return SumState()
    if spec.kind in ("ARRAY_AGG", "MEDIAN"):
        return []
    if spec.kind in _SPREAD:
        return SquaresState()
    return MISSING  # MIN / MAX: nothing seen yet


def _better(kind: str, current: Any, v: Any) -> Any:
    if current is MISSING:
        return v
    c = collate(v, current)
    return v if (c < 0 if kind == "MIN" else c > 0) else current


def _accumulate(spec: AggSpec, state: Any, row: Any, n: int = 1) -> Any:
    """``state`` after ``n`` rows equal to ``row`` (``n`` > 1: a run of index entries with
    one key on a covering scan, taken in one step: each kind's state is what ``n`` single
    steps give)."""
    if spec.arg is None:  # COUNT(*)
        return state + n
    v = spec.arg(row)
    if v is MISSING:
        return state
    if spec.distinct:
        if v is not None:
            state.setdefault(value_identity(v), v)
        return state
    kind = spec.kind
    if kind == "ARRAY_AGG":
        if n == 1:
            state.append(v)
        else:
            state.extend([v] * n)
        return state
    if v is None:
        return state
    if kind == "COUNT":
        return state + n
    if kind in ("SUM", "AVG") or kind in _SPREAD:
        if is_number(v):
            state.add(v, n)
        return state
    if not is_number(v) and kind in ("COUNTN", "MEDIAN"):
        return state
    if kind == "COUNTN":
        return state + n
    if kind == "MEDIAN":
        state.extend([v] * n)
        return state
    return _better(kind, state, v)


def _merge(spec: AggSpec, a: Any, b: Any) -> Any:
    if spec.distinct:
        for k, v in b.items():
            a.setdefault(k, v)
        return a
    kind = spec.kind
    if kind in ("COUNT", "COUNTN"):
        return a + b
    if kind in ("SUM", "AVG") or kind in _SPREAD:
        a.merge(b)
        return a
    if kind in ("ARRAY_AGG", "MEDIAN"):
        a.extend(b)
        return a
    return a if b is MISSING else _better(kind, a, b)


def _finalize(spec: AggSpec, state: Any) -> Any:
    if spec.distinct:
        values = list(state.values())
        if spec.kind == "COUNT":
            return len(values)
        if spec.kind == "ARRAY_AGG":
            # Distinct values in collation order: deterministic whatever the merge order.
            return sorted(values, key=_CollateKey) if values else None
        plain = AggSpec(spec.kind, lambda v: v)
        s = _init(plain)
        for v in values:
            s = _accumulate(plain, s, v)
        return _finalize(plain, s)
    kind = spec.kind
    if kind in ("COUNT", "COUNTN"):
        return state
    if kind == "SUM":
        return state.total()
    if kind == "AVG":
        return state.average()
    if kind == "MEDIAN":
        return _median(state)
    if kind in _SPREAD:
        return state.spread(kind)
    if kind == "ARRAY_AGG":
        return sorted(state, key=_CollateKey) if state else None
    return None if state is MISSING else state


class _CollateKey:
    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __lt__(self, other: _CollateKey) -> bool:
        return collate(self.v, other.v) < 0


# A partial group: (group key values, aggregate states).
PartialGroup = tuple[tuple[Any, ...], tuple[Any, ...]]


def partial_aggregate(
    rows: Iterable[Any], keys: Sequence[RowFn], aggs: Sequence[AggSpec]
) -> Iterator[PartialGroup]:
    """PARTIAL phase: one ``(key values, states)`` per group present in ``rows``. Groups are
    keyed by SQL++ equality of the key values (MISSING and NULL are groups of their own)."""
    groups: dict[bytes, tuple[tuple[Any, ...], list[Any]]] = {}
    for row in rows:
        kv = tuple(k(row) for k in keys)
        ident = b"".join(value_identity(v) for v in kv)
        g = groups.get(ident)
        if g is None:
            g = groups[ident] = (kv, [_init(a) for a in aggs])
        states = g[1]
        for i, a in enumerate(aggs):
            states[i] = _accumulate(a, states[i], row)
    for kv, states in groups.values():
        yield kv, tuple(states)


def final_aggregate(
    partials: Iterable[PartialGroup],
    aggs: Sequence[AggSpec],
    *,
    global_group: bool = False,
) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """FINAL phase: merge the partial states of equal groups and compute the results.
    Yields ``(key values, aggregate values)``. ``global_group`` (aggregates without GROUP
    BY) yields exactly one group even when there were no rows (COUNT 0, SUM NULL, ...)."""
    groups: dict[bytes, tuple[tuple[Any, ...], list[Any]]] = {}
    for kv, states in partials:
        ident = b"".join(value_identity(v) for v in kv)
        g = groups.get(ident)
        if g is None:
            groups[ident] = (kv, list(states))
            continue
        merged = g[1]
        for i, a in enumerate(aggs):
            merged[i] = _merge(a, merged[i], states[i])
    if global_group and not groups:
        groups[b""] = ((), [_init(a) for a in aggs])
    for kv, states in groups.values():
        yield kv, tuple(_finalize(a, s) for a, s in zip(aggs, states, strict=True))


def aggregate(
    rows: Iterable[Any],
    keys: Sequence[RowFn],
    aggs: Sequence[AggSpec],
    *,
    global_group: bool = False,
) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """Single-process grouping: PARTIAL then FINAL."""
    return final_aggregate(partial_aggregate(rows, keys, aggs), aggs, global_group=global_group)


# The per-state steps, for group tables kept elsewhere (the budgeted, spilling ones of
# ``shardex.sql.exec.spill_groups``): one definition of what a state is and how it merges.
init_state = _init
accumulate = _accumulate
merge_state = _merge
finalize_state = _finalize
