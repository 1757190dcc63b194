"""Array functions (N1QL's ARRAY_*), except the ARRAY_AGG aggregate.

Registered into the shared registry on import (see ``functions_num``). As N1QL: an argument
that should be an array and is not gives NULL, a MISSING argument gives MISSING and a NULL
one NULL (unless the function says otherwise, as ARRAY_BINARY_SEARCH), positions are
0-based with negative positions counted from the end, and values compare and order under
SQL++ collation (``1`` and ``1.0`` are the same value, NULL sorts before numbers).

Two functions build arrays whose size comes from a number rather than from their inputs
(ARRAY_REPEAT, ARRAY_RANGE): past ``MAX_GENERATED_ELEMENTS`` they refuse with an
EXPRESSION_EVAL error naming the size, since one document's ``ARRAY_REPEAT(x, 1e12)``
would otherwise exhaust a node's memory.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

from shardex.core.keycodec_values import encode_value
from shardex.core.values import MISSING
from shardex.errors import ExpressionEvalError

from .functions import _fn, _int_arg
from .ops import RANK_ARRAY, RANK_OBJECT, collate, is_number, type_rank

MAX_GENERATED_ELEMENTS = 1_000_000


def _is_array(v: Any) -> bool:
    return type(v) is list or type_rank(v) == RANK_ARRAY


def _key(v: Any) -> bytes:
    """Identity of a value (1 and 1.0 are one value, NULL is one value): distinct values and
    the set operations (UNION, INTERSECT, SYMDIFF) group by it."""
    return encode_value(v)


def _eq_key(v: Any) -> bytes | None:
    """The key under which values compare equal with ``=``, or None for a value that equals
    nothing (NULL, or an array or object holding one: ``[1, null] = [1, null]`` is NULL).
    Functions that look for a value (CONTAINS, POSITION, REMOVE, REPLACE, PUT, EXCEPT) match
    by it, as N1QL, so ``ARRAY_REMOVE(a, [1, null])`` removes nothing."""
    return None if _holds_null(v) else encode_value(v)


def _holds_null(v: Any) -> bool:
    if v is None:
        return True
    if type(v) is list or type_rank(v) == RANK_ARRAY:
        return any(_holds_null(x) for x in v)
    if type(v) is dict or type_rank(v) == RANK_OBJECT:
        return any(_holds_null(x) for x in v.values())
    return False


def _eq_keys(values: Iterable[Any]) -> set[bytes]:
    return {k for k in map(_eq_key, values) if k is not None}


def _sorted(values: Iterable[Any]) -> list[Any]:
    return sorted(values, key=_key)  # the key codec's bytes sort in collation order


def _distinct(values: Iterable[Any]) -> list[Any]:
    seen: set[bytes] = set()
    out = []
    for v in values:
        k = _key(v)
        if k not in seen:
            seen.add(k)
            out.append(v)
    return out


def _check_size(function: str, n: int | float) -> None:
    if n > MAX_GENERATED_ELEMENTS:
        raise ExpressionEvalError(
            f"{function} would build an array of {n:.0f} values (nested values counted), "
            f"more than the limit of {MAX_GENERATED_ELEMENTS}",
            details={
                "function": function,
                "elements": int(n) if math.isfinite(n) else str(n),
                "limit": MAX_GENERATED_ELEMENTS,
                "hint": "build the array in smaller pieces or filter the input first",
            },
        )


def _position(arr: list[Any], pos: Any, *, allow_end: bool) -> int | None:
    """A 0-based position in ``arr`` (negative counts from the end), or None when not an
    integral number or out of range (``allow_end``: the position just past the last)."""
    i = _int_arg(pos)
    if i is None:
        return None
    n = len(arr)
    if i < 0:
        i += n
    if i < 0 or i > n or (i == n and not allow_end):
        return None
    return i


# -- building and editing --------------------------------------------------------------------


@_fn("ARRAY_APPEND", 2, None)
def _append(arr: Any, *values: Any) -> Any:
    return [*arr, *values] if _is_array(arr) else None


@_fn("ARRAY_PREPEND", 2, None)
def _prepend(*args: Any) -> Any:
    arr = args[-1]
    return [*args[:-1], *arr] if _is_array(arr) else None


@_fn("ARRAY_PUT", 2, None)
def _put(arr: Any, *values: Any) -> Any:
    """Append each value not already present."""
    if not _is_array(arr):
        return None
    out = list(arr)
    seen = _eq_keys(out)
    for v in values:
        k = _eq_key(v)
        if k is None or k not in seen:
            if k is not None:
                seen.add(k)
            out.append(v)
    return out


@_fn("ARRAY_INSERT", 3, None)
def _insert(arr: Any, pos: Any, *values: Any) -> Any:
    if not _is_array(arr):
        return None
    i = _position(arr, pos, allow_end=True)
    return None if i is None else [*arr[:i], *values, *arr[i:]]


@_fn("ARRAY_CONCAT", 2, None)
def _concat(*arrays: Any) -> Any:
    if not all(_is_array(a) for a in arrays):
        return None
    return [v for a in arrays for v in a]


@_fn("ARRAY_REMOVE", 2, None)
def _remove(arr: Any, *values: Any) -> Any:
    if not _is_array(arr):
        return None
    drop = _eq_keys(values)
    return [v for v in arr if _eq_key(v) not in drop]


def _replaced(arr: list[Any], new: Any, limit: Any, is_old: Callable[[Any], bool]) -> Any:
    """``arr`` with its first ``limit`` (all when MISSING) elements ``is_old`` accepts
    replaced by ``new``; NULL for a limit that is not an integer."""
    n = len(arr) if limit is MISSING else _int_arg(limit)
    if n is None:
        return None
    out = []
    for v in arr:
        if n > 0 and is_old(v):
            out.append(new)
            n -= 1
        else:
            out.append(v)
    return out


@_fn("ARRAY_REPLACE", 3, 4)
def _replace(arr: Any, old: Any, new: Any, limit: Any = MISSING) -> Any:
    if not _is_array(arr):
        return None
    target = _eq_key(old)
    return _replaced(arr, new, limit, lambda v: target is not None and _eq_key(v) == target)


@_fn("ARRAY_REPLACE_EQUIVALENT", 3, 4, propagate=False)
def _replace_equivalent(arr: Any, old: Any, new: Any, limit: Any = MISSING) -> Any:
    """ARRAY_REPLACE matching by identity instead of ``=``: NULL replaces NULL."""
    if arr is MISSING or old is MISSING or new is MISSING:
        return MISSING
    if not _is_array(arr) or limit is None:
        return None
    target = _key(old)
    return _replaced(arr, new, limit, lambda v: _key(v) == target)


@_fn("ARRAY_REVERSE", 1)
def _reverse(arr: Any) -> Any:
    return arr[::-1] if _is_array(arr) else None


@_fn("ARRAY_SORT", 1)
def _sort(arr: Any) -> Any:
    return _sorted(arr) if _is_array(arr) else None


@_fn("ARRAY_DISTINCT", 1)
def _array_distinct(arr: Any) -> Any:
    return _distinct(arr) if _is_array(arr) else None


@_fn("ARRAY_FLATTEN", 2)
def _flatten(arr: Any, depth: Any) -> Any:
    """Nested arrays spliced in up to ``depth`` levels; a negative depth flattens fully."""
    d = _int_arg(depth)
    if not _is_array(arr) or d is None:
        return None

    def splice(items: list[Any], level: int, out: list[Any]) -> list[Any]:
        for v in items:
            if level != 0 and _is_array(v):
                splice(v, level - 1, out)
            else:
                out.append(v)
        return out

    return splice(arr, d, [])


@_fn("ARRAY_MOVE", 3)
def _move(arr: Any, src: Any, dst: Any) -> Any:
    if not _is_array(arr):
        return None
    i, j = _position(arr, src, allow_end=False), _position(arr, dst, allow_end=False)
    if i is None or j is None:
        return None
    out = list(arr)
    out.insert(j, out.pop(i))
    return out


@_fn("ARRAY_SWAP", 3)
def _swap(arr: Any, a: Any, b: Any) -> Any:
    if not _is_array(arr):
        return None
    i, j = _position(arr, a, allow_end=False), _position(arr, b, allow_end=False)
    if i is None or j is None:
        return None
    out = list(arr)
    out[i], out[j] = out[j], out[i]
    return out


def _weight(v: Any, cap: int) -> int:
    """The number of values in ``v`` (itself and everything nested), counted up to ``cap``."""
    seen, stack = 0, [v]
    while stack and seen <= cap:
        x = stack.pop()
        seen += 1
        if type(x) is list or type_rank(x) == RANK_ARRAY:
            stack.extend(x)
        elif type(x) is dict or type_rank(x) == RANK_OBJECT:
            stack.extend(x.values())
    return seen


@_fn("ARRAY_REPEAT", 2)
def _repeat(value: Any, count: Any) -> Any:
    """The copies share one value, but whatever reads the result (the client's JSON, a sort
    key, ENCODE_JSON) walks every copy: the limit counts the values inside each copy too."""
    n = _int_arg(count)
    if n is None or n < 0:
        return None
    if n:
        _check_size("ARRAY_REPEAT", n * _weight(value, MAX_GENERATED_ELEMENTS // n + 1))
    return [value] * n


@_fn("ARRAY_RANGE", 2, 3)
def _range(start: Any, end: Any, step: Any = MISSING) -> Any:
    if step is MISSING:
        step = 1
    if not (is_number(start) and is_number(end) and is_number(step)) or step == 0:
        return None
    span = (end - start) / step  # may be inf for extreme floats: refused below, not NULL
    if span <= 0:
        return []
    _check_size("ARRAY_RANGE", span)
    count = math.ceil(span)
    if type(start) is int and type(step) is int:
        return list(range(start, start + count * step, step))
    # Multiplying rather than adding keeps rounding errors from accumulating.
    return [start + i * step for i in range(count)]


# -- looking into an array -------------------------------------------------------------------


@_fn("ARRAY_LENGTH", 1)
def _length(arr: Any) -> Any:
    return len(arr) if _is_array(arr) else None


@_fn("ARRAY_COUNT", 1)
def _count(arr: Any) -> Any:
    """Elements that are not NULL."""
    return sum(v is not None for v in arr) if _is_array(arr) else None


@_fn("ARRAY_CONTAINS", 2)
def _contains(arr: Any, value: Any) -> Any:
    if not _is_array(arr):
        return None
    k = _eq_key(value)
    return k is not None and any(_eq_key(v) == k for v in arr)


def _membership(all_of: bool) -> Callable[[Any, Any], Any]:
    def check(arr: Any, values: Any) -> Any:
        if not (_is_array(arr) and _is_array(values)):
            return None
        have = _eq_keys(arr)
        found = (_eq_key(v) in have for v in values)
        return all(found) if all_of else any(found)

    return check


_fn("ARRAY_CONTAINS_ALL", 2)(_membership(all_of=True))
_fn("ARRAY_CONTAINS_ANY", 2)(_membership(all_of=False))


@_fn("ARRAY_POSITION", 2, -1, "ARRAY_POS")
def _array_position(arr: Any, value: Any) -> Any:
    if not _is_array(arr):
        return None
    k = _eq_key(value)
    if k is None:
        return -1
    return next((i for i, v in enumerate(arr) if _eq_key(v) == k), -1)


@_fn("ARRAY_BINARY_SEARCH", 2, propagate=False)
def _binary_search(arr: Any, value: Any) -> Any:
    """Position of the first element equal to ``value`` in an array sorted by collation,
    else -1. Looking for MISSING or NULL is allowed (MISSING never matches: an array holds
    no MISSING)."""
    if arr is MISSING or not _is_array(arr):
        return MISSING if arr is MISSING else None
    if value is MISSING:
        return -1
    keys = [_key(v) for v in arr]
    target = _key(value)
    i = bisect_left(keys, target)
    return i if i < len(keys) and keys[i] == target else -1


@_fn("ARRAY_IFNULL", 1)
def _ifnull(arr: Any) -> Any:
    if not _is_array(arr):
        return None
    return next((v for v in arr if v is not None), None)


def _extreme(sign: int) -> Callable[[Any], Any]:
    def pick(arr: Any) -> Any:
        if not _is_array(arr):
            return None
        best: Any = None
        for v in arr:
            if v is not None and (best is None or collate(v, best) * sign > 0):
                best = v
        return best

    return pick


_fn("ARRAY_MAX", 1)(_extreme(1))
_fn("ARRAY_MIN", 1)(_extreme(-1))


def _numbers(arr: list[Any]) -> list[Any]:
    return [v for v in arr if is_number(v)]


@_fn("ARRAY_SUM", 1)
def _sum(arr: Any) -> Any:
    """Sum of the numbers (other elements are skipped); 0 for none."""
    return sum(_numbers(arr)) if _is_array(arr) else None


@_fn("ARRAY_AVG", 1)
def _avg(arr: Any) -> Any:
    """Mean of the numbers (other elements are skipped); NULL for none."""
    if not _is_array(arr):
        return None
    nums = _numbers(arr)
    if not nums:
        return None
    if all(type(x) is int for x in nums):
        q = Fraction(sum(nums), len(nums))  # exact, as AVG: the mean of [0, 1, 1, 2, 3, 5] is 2
        return int(q) if q.denominator == 1 else float(q)
    return sum(nums) / len(nums)


@_fn("ARRAY_STAR", 1)
def _star(arr: Any) -> Any:
    """An array of objects as an object of arrays: for every field name any element has,
    the array of each element's value of it (NULL where an element has none)."""
    if not _is_array(arr):
        return None
    objects = [v if type_rank(v) == RANK_OBJECT else {} for v in arr]
    names = sorted({name for o in objects for name in o})
    return {name: [o.get(name) for o in objects] for name in names}


# -- set operations --------------------------------------------------------------------------


def _all_arrays(arrays: tuple[Any, ...]) -> bool:
    return all(_is_array(a) for a in arrays)


@_fn("ARRAY_UNION", 2, None)
def _union(*arrays: Any) -> Any:
    return _distinct(v for a in arrays for v in a) if _all_arrays(arrays) else None


@_fn("ARRAY_INTERSECT", 2, None)
def _intersect(first: Any, *others: Any) -> Any:
    """Distinct values of the first array that every other array also holds."""
    if not _all_arrays((first, *others)):
        return None
    sets = [{_key(v) for v in a} for a in others]
    return [v for v in _distinct(first) if all(_key(v) in s for s in sets)]


@_fn("ARRAY_EXCEPT", 2)
def _except(arr: Any, drop: Any) -> Any:
    """Elements of the first array that the second does not hold."""
    if not (_is_array(arr) and _is_array(drop)):
        return None
    dropped = _eq_keys(drop)
    return [v for v in arr if _eq_key(v) not in dropped]


def _symdiff(keep: Callable[[int], bool]) -> Callable[..., Any]:
    """Distinct values whose number of input arrays holding them passes ``keep``."""

    def impl(*arrays: Any) -> Any:
        if not _all_arrays(arrays):
            return None
        counts: dict[bytes, int] = {}
        first: dict[bytes, Any] = {}
        for a in arrays:
            for v in _distinct(a):
                k = _key(v)
                counts[k] = counts.get(k, 0) + 1
                first.setdefault(k, v)
        return [first[k] for k, n in counts.items() if keep(n)]

    return impl


_fn("ARRAY_SYMDIFF", 2, None, "ARRAY_SYMDIFF1")(_symdiff(lambda n: n == 1))
_fn("ARRAY_SYMDIFFN", 2, None)(_symdiff(lambda n: n % 2 == 1))


def slice_array(base: Any, start: Any, end: Any = MISSING, *, to_end: bool = False) -> Any:
    """``base[start:end]``, or ``base[start:]`` when ``to_end``. Negative positions count
    from the end; a position outside the array, or a start past the end, is NULL (N1QL)."""
    if base is MISSING or start is MISSING or (end is MISSING and not to_end):
        return MISSING
    if not _is_array(base):
        return None
    n = len(base)
    i = _int_arg(start)
    j = n if to_end else _int_arg(end)
    if i is None or j is None:
        return None
    i, j = (i + n if i < 0 else i), (j + n if j < 0 else j)
    if not 0 <= i <= j <= n:
        return None
    return base[i:j]
