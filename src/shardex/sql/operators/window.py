"""Window functions over rows: each row gets every window's value, as N1QL 7 defines them.

The rows (after WHERE, or a grouped query's groups after HAVING) are read whole, split into
partitions by the PARTITION BY values (key-codec identity: SQL++ equality, MISSING apart
from NULL), each partition sorted stably by its ORDER BY key (``sort.encode_sort_key``:
collation, DESC, NULLS FIRST|LAST). Rows with equal keys are peers. Then per row:

* ROW_NUMBER: its position (from 1); RANK: 1 + the rows before its peers; DENSE_RANK: its
  peer group's number; PERCENT_RANK: (RANK - 1) / (rows - 1), 0 for one row; CUME_DIST: the
  rows up to its last peer / rows; NTILE(n): its bucket of n as equal as can be (the first
  rows % n buckets one larger); LAG / LEAD(expr, offset 1, default NULL): ``expr`` of the
  row ``offset`` before / after it (IGNORE NULLS: counting only rows where it is valued).
* RATIO_TO_REPORT(expr): expr over the SUM of expr in the frame (NULL unless both are
  numbers and the sum is not 0).
* FIRST_VALUE, LAST_VALUE, NTH_VALUE(expr, n) [FROM LAST] and the aggregates: over the
  row's frame. ``ROWS``: positions; ``RANGE``: ORDER BY values (an offset needs one numeric
  ORDER BY term; rows whose value is no number frame their peers), ``CURRENT ROW`` its
  peers; ``GROUPS``: peer groups. The default frame is RANGE BETWEEN UNBOUNDED PRECEDING AND
  CURRENT ROW with ORDER BY, else the whole partition. EXCLUDE CURRENT ROW / GROUP / TIES
  take the row, its peers, or its other peers out. An empty frame gives NULL (COUNT: 0).

The rows keep their input order; the output is each row with the values set (a new dict).
The pieces (``partition_key``, ``order_key``, ``evaluate_partition``) serve a caller that
holds one partition at a time (the spilling window of the distributed plan).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardex.core.expr import MISSING, Expr, compile_expression, evaluate
from shardex.core.expr.ops import is_number
from shardex.errors import ErrorCode, ShardexError

from .aggregate import AggSpec, accumulate, finalize_state, init_state
from .basic import RowFn, value_identity
from .sort import SortSpec, encode_sort_key

if TYPE_CHECKING:
    from shardex.sql.syntax.bind import BoundSelect

__all__ = [
    "FrameSpec",
    "WindowSpec",
    "evaluate_partition",
    "order_key",
    "partition_key",
    "window",
    "window_specs",
    "windowed_in_place",
]

Row = dict[str, Any]
_PRECEDING, _CURRENT, _FOLLOWING = "PRECEDING", "CURRENT ROW", "FOLLOWING"
_UNBOUNDED_PRECEDING, _UNBOUNDED_FOLLOWING = "UNBOUNDED PRECEDING", "UNBOUNDED FOLLOWING"
# Aggregates whose running state can be finalised at every row without changing it.
_RUNNING = frozenset({"COUNT", "COUNTN", "SUM", "AVG", "MIN", "MAX"})
_RATIO_SUM = "\x00ratio"  # RATIO_TO_REPORT's frame sum, set then taken off each row


@dataclass(frozen=True, slots=True)
class FrameSpec:
    unit: str  # ROWS, RANGE or GROUPS
    start: tuple[str, Any]  # (kind, offset value or None)
    end: tuple[str, Any]
    exclude: str | None = None


DEFAULT_ORDERED = FrameSpec("RANGE", (_UNBOUNDED_PRECEDING, None), (_CURRENT, None))
WHOLE = FrameSpec("ROWS", (_UNBOUNDED_PRECEDING, None), (_UNBOUNDED_FOLLOWING, None))


@dataclass(frozen=True, slots=True)
class WindowSpec:
    name: str  # the row key its value is set under
    function: str
    args: tuple[RowFn, ...]
    partition: tuple[RowFn, ...] = ()
    order: tuple[RowFn, ...] = ()
    sort: tuple[SortSpec, ...] = ()
    frame: FrameSpec | None = None
    distinct: bool = False
    star: bool = False
    ignore_nulls: bool = False
    from_last: bool = False

    @property
    def effective_frame(self) -> FrameSpec:
        if self.frame is not None:
            return self.frame
        return DEFAULT_ORDERED if self.order else WHOLE


def window(rows: Iterable[Row], specs: Sequence[WindowSpec]) -> Iterator[Row]:
    """``rows`` (in their order), each a new dict with every window's value set."""
    return iter(windowed_in_place([dict(row) for row in rows], specs))


def windowed_in_place(rows: list[Row], specs: Sequence[WindowSpec]) -> list[Row]:
    """``rows`` (dicts of the caller's own) with every window's value set in them."""
    for spec in specs:
        for keys, part in _partitions(rows, spec):
            evaluate_partition(spec, part, keys)
    return rows


def partition_key(spec: WindowSpec, row: Row) -> bytes:
    """The identity of ``row``'s partition: each PARTITION BY value's own encoding
    (self-delimiting; MISSING has one, unlike inside an array), as GROUP BY keys its groups.
    The concatenation is prefix-free: sorting by it keeps a partition's rows together."""
    return b"".join(value_identity(f(row)) for f in spec.partition)


def order_key(spec: WindowSpec, row: Row) -> bytes:
    """``row``'s ORDER BY key within its partition (b"" without ORDER BY: all peers)."""
    if not spec.order:
        return b""
    return encode_sort_key([f(row) for f in spec.order], spec.sort)


def _partitions(rows: list[Row], spec: WindowSpec) -> Iterator[tuple[list[bytes], list[Row]]]:
    """Each partition's rows in ORDER BY order, with their sort keys."""
    if not spec.partition:
        parts: Iterable[list[Row]] = [rows]
    else:
        by: dict[bytes, list[Row]] = {}
        for row in rows:
            by.setdefault(partition_key(spec, row), []).append(row)
        parts = by.values()
    for part in parts:
        if spec.order:
            keyed = [(order_key(spec, r), r) for r in part]
            keyed.sort(key=lambda kr: kr[0])  # stable: ties keep their input order
            yield [k for k, _ in keyed], [r for _, r in keyed]
        else:
            yield [b""] * len(part), part


class _Partition:
    """One sorted partition: its rows, their peer groups and (for RANGE offsets) the
    numeric ORDER BY values."""

    def __init__(self, spec: WindowSpec, rows: list[Row], keys: list[bytes]) -> None:
        self.rows = rows
        self.n = len(rows)
        self.group_of: list[int] = []  # peer group index of each row
        self.group_start: list[int] = []  # first row of each peer group
        for i, k in enumerate(keys):
            if i == 0 or k != keys[i - 1]:
                self.group_start.append(i)
            self.group_of.append(len(self.group_start) - 1)
        self.group_start.append(self.n)  # sentinel: the end of the last group
        self.spec = spec
        self._values: list[Any] | None = None

    def peers(self, i: int) -> tuple[int, int]:
        g = self.group_of[i]
        return self.group_start[g], self.group_start[g + 1]

    def order_values(self) -> list[Any]:
        if self._values is None:
            f = self.spec.order[0]
            self._values = [f(r) for r in self.rows]
        return self._values

    def frame(self, i: int) -> list[int]:
        """The positions of row ``i``'s frame, in order."""
        fr = self.spec.effective_frame
        lo = self._bound(i, fr.unit, fr.start, start=True)
        hi = self._bound(i, fr.unit, fr.end, start=False)  # exclusive
        if lo >= hi:
            return []
        if fr.exclude is None:
            return list(range(lo, hi))
        p_lo, p_hi = self.peers(i)
        if fr.exclude == _CURRENT:
            drop = {i}
        elif fr.exclude == "GROUP":
            drop = set(range(p_lo, p_hi))
        else:  # TIES: the peers but the row itself
            drop = set(range(p_lo, p_hi)) - {i}
        return [j for j in range(lo, hi) if j not in drop]

    def _bound(self, i: int, unit: str, bound: tuple[str, Any], *, start: bool) -> int:
        kind, offset = bound
        if kind == _UNBOUNDED_PRECEDING:
            return 0
        if kind == _UNBOUNDED_FOLLOWING:
            return self.n
        p_lo, p_hi = self.peers(i)
        if unit == "ROWS":
            pos = i if kind == _CURRENT else i - offset if kind == _PRECEDING else i + offset
            pos = min(max(pos, 0), self.n) if start else min(max(pos + 1, 0), self.n)
            return pos
        if kind == _CURRENT:
            return p_lo if start else p_hi
        if unit == "GROUPS":
            g = self.group_of[i] + (-offset if kind == _PRECEDING else offset)
            groups = len(self.group_start) - 1
            if start:
                return self.n if g >= groups else self.group_start[max(g, 0)]
            return 0 if g < 0 else self.group_start[min(g + 1, groups)]
        return self._range_bound(i, kind, offset, start=start)

    def _range_bound(self, i: int, kind: str, offset: Any, *, start: bool) -> int:
        """RANGE with an offset: rows whose ORDER BY value is within ``offset`` of row
        ``i``'s (numbers only; the sort direction decides which side PRECEDING is)."""
        values = self.order_values()
        v = values[i]
        p_lo, p_hi = self.peers(i)
        if not is_number(v):
            return p_lo if start else p_hi
        desc = self.spec.sort[0].desc
        toward_start = kind == _PRECEDING
        # The value the bound reaches: PRECEDING is smaller ascending, larger descending.
        target = v - offset if toward_start != desc else v + offset
        # Numbers are one run in the sorted partition; find the run and search within it.
        first = next(j for j in range(self.n) if is_number(values[j]))
        last = first
        while last < self.n and is_number(values[last]):
            last += 1
        run = values[first:last]
        keyed = [-x for x in run] if desc else run
        t = -target if desc else target
        if start:
            return first + bisect.bisect_left(keyed, t)
        return first + bisect.bisect_right(keyed, t)


def evaluate_partition(spec: WindowSpec, rows: list[Row], keys: list[bytes]) -> None:
    """Sets ``spec``'s value in each row of one partition, ``rows`` in ORDER BY order with
    their ORDER BY keys ``keys``."""
    if not rows:
        return
    p = _Partition(spec, rows, keys)
    fn, name, n = spec.function, spec.name, p.n
    if fn == "ROW_NUMBER":
        for i, r in enumerate(rows):
            r[name] = i + 1
    elif fn in ("RANK", "PERCENT_RANK"):
        for i, r in enumerate(rows):
            rank = p.peers(i)[0] + 1
            r[name] = rank if fn == "RANK" else ((rank - 1) / (n - 1) if n > 1 else 0)
    elif fn == "DENSE_RANK":
        for i, r in enumerate(rows):
            r[name] = p.group_of[i] + 1
    elif fn == "CUME_DIST":
        for i, r in enumerate(rows):
            r[name] = p.peers(i)[1] / n
    elif fn == "NTILE":
        _ntile(spec, rows)
    elif fn in ("LAG", "LEAD"):
        _lag_lead(spec, rows)
    elif fn in ("FIRST_VALUE", "LAST_VALUE", "NTH_VALUE"):
        _nth(spec, p)
    elif fn == "RATIO_TO_REPORT":
        _ratio(spec, p)
    else:
        _aggregate(spec, p)


def _arg(spec: WindowSpec, k: int, row: Row, default: Any) -> Any:
    return spec.args[k](row) if len(spec.args) > k else default


def _ntile(spec: WindowSpec, rows: list[Row]) -> None:
    k = spec.args[0](rows[0])
    if not is_number(k) or k != int(k) or k < 1:
        for r in rows:
            r[spec.name] = None  # N1QL: NTILE's argument is a positive integer
        return
    k, n = int(k), len(rows)
    size, extra = divmod(n, k)
    i = 0
    for bucket in range(1, min(k, n) + 1):
        for _ in range(size + (1 if bucket <= extra else 0)):
            rows[i][spec.name] = bucket
            i += 1


def _valued(v: Any) -> bool:
    return v is not MISSING and v is not None


def _lag_lead(spec: WindowSpec, rows: list[Row]) -> None:
    step = -1 if spec.function == "LAG" else 1
    values = [spec.args[0](r) for r in rows]
    for i, r in enumerate(rows):
        offset = _arg(spec, 1, r, 1)
        default = _arg(spec, 2, r, None)
        if not is_number(offset) or offset != int(offset) or offset < 0:
            r[spec.name] = None
            continue
        offset = int(offset)
        if not spec.ignore_nulls:
            j = i + step * offset
            r[spec.name] = values[j] if 0 <= j < len(rows) else default
            continue
        j, left = i, offset
        found = default
        while left > 0:
            j += step
            if not 0 <= j < len(rows):
                break
            if _valued(values[j]):
                left -= 1
                if left == 0:
                    found = values[j]
        r[spec.name] = found if offset > 0 else values[i]


def _nth(spec: WindowSpec, p: _Partition) -> None:
    values = [spec.args[0](r) for r in p.rows]
    for i, r in enumerate(p.rows):
        frame = p.frame(i)
        if spec.ignore_nulls:
            frame = [j for j in frame if _valued(values[j])]
        if spec.function == "FIRST_VALUE":
            nth, from_last = 1, False
        elif spec.function == "LAST_VALUE":
            nth, from_last = 1, True
        else:
            nth, from_last = spec.args[1](r), spec.from_last
            if not is_number(nth) or nth != int(nth) or nth < 1:
                r[spec.name] = None
                continue
            nth = int(nth)
        if nth > len(frame):
            r[spec.name] = None
            continue
        r[spec.name] = values[frame[-nth] if from_last else frame[nth - 1]]


def _ratio(spec: WindowSpec, p: _Partition) -> None:
    """The row's value over the SUM of the frame's (NULL for a value that is no number or
    a sum of 0)."""
    total = dataclasses.replace(spec, function="SUM", name=_RATIO_SUM)
    _aggregate(total, p)
    for r in p.rows:
        v, s = spec.args[0](r), r.pop(_RATIO_SUM)
        r[spec.name] = v / s if is_number(v) and is_number(s) and s != 0 else None


def _aggregate(spec: WindowSpec, p: _Partition) -> None:
    agg = AggSpec(spec.function, None if spec.star else spec.args[0], spec.distinct)
    fr = spec.effective_frame
    rows = p.rows
    whole = fr.start[0] == _UNBOUNDED_PRECEDING and fr.end[0] == _UNBOUNDED_FOLLOWING
    if whole and fr.exclude is None:
        value = _over(agg, rows)
        for r in rows:
            r[spec.name] = value
        return
    running = (
        fr.start[0] == _UNBOUNDED_PRECEDING
        and fr.end[0] == _CURRENT
        and fr.exclude is None
        and spec.function in _RUNNING
        and not spec.distinct
    )
    if running:  # the default frame with ORDER BY: one pass, a value per frame end
        state = init_state(agg)
        done = 0
        for i, r in enumerate(rows):
            end = p.peers(i)[1] if fr.unit != "ROWS" else i + 1
            while done < end:
                state = accumulate(agg, state, rows[done])
                done += 1
            r[spec.name] = finalize_state(agg, state)
        return
    for i, r in enumerate(rows):
        r[spec.name] = _over(agg, [rows[j] for j in p.frame(i)])


def _over(agg: AggSpec, rows: Iterable[Row]) -> Any:
    state = init_state(agg)
    for r in rows:
        state = accumulate(agg, state, r)
    return finalize_state(agg, state)


# -- specs from a bound statement -------------------------------------------------------


def window_specs(b: BoundSelect, params: Any) -> list[WindowSpec]:
    """The window functions of ``b`` as operator specs (shared with the fragments); frame
    offsets evaluated once (constants or parameters: non-negative numbers)."""
    out = []
    for w in b.windows:
        frame = None
        if w.frame is not None:
            f = w.frame
            frame = FrameSpec(
                f.unit,
                (f.start.kind, _frame_offset(f.start.offset, f.unit, params)),
                (f.end.kind, _frame_offset(f.end.offset, f.unit, params)),
                f.exclude,
            )
        out.append(
            WindowSpec(
                w.name,
                w.function,
                tuple(_row_fn(a, params) for a in w.args),
                tuple(_row_fn(p, params) for p in w.partition),
                tuple(_row_fn(e, params) for e, _ in w.order),
                tuple(SortSpec(o.desc, o.nulls_first) for _, o in w.order),
                frame,
                w.distinct,
                w.star,
                w.ignore_nulls,
                w.from_last,
            )
        )
    return out


def _frame_offset(expr: Expr | None, unit: str, params: Any) -> Any:
    if expr is None:
        return None
    v = evaluate(expr, {}, params=params)
    whole = unit != "RANGE"  # ROWS and GROUPS count rows and groups
    if isinstance(v, bool) or not is_number(v) or v < 0 or (whole and v != int(v)):
        kind = "a whole number" if whole else "a number"
        raise ShardexError(
            f"a {unit} frame offset must be {kind} >= 0, got {v!r}",
            code=ErrorCode.BAD_REQUEST,
            details={"value": repr(v), "hint": f"{unit} BETWEEN 2 PRECEDING AND CURRENT ROW"},
        )
    return int(v) if whole else v


def _row_fn(expr: Expr, params: Any) -> RowFn:
    f = compile_expression(expr)
    return lambda row: f(row, None, params)
