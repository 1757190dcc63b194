"""Value semantics shared by the interpreter and the compiler: N1QL truthiness, collation,
equality, arithmetic and LIKE.

Conventions (N1QL): ``None`` is NULL and ``MISSING`` is MISSING. An operator that gets a
MISSING operand yields MISSING; otherwise a NULL operand or an operand of the wrong type
yields NULL. Nothing here raises on a type mismatch.

Python's ``bool`` is a subclass of ``int``; every type test below uses ``type(x) is ...`` or
excludes bool explicitly, because TRUE is not the number 1 in SQL++.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from shardex.core.keycodec import compare_values
from shardex.core.values import MISSING

# Type ranks in N1QL collation order: MISSING < NULL < booleans < numbers < strings < arrays
# < objects.
RANK_MISSING, RANK_NULL, RANK_BOOL, RANK_NUMBER, RANK_STRING, RANK_ARRAY, RANK_OBJECT = range(7)

_RANK_BY_TYPE: dict[type, int] = {
    bool: RANK_BOOL,
    int: RANK_NUMBER,
    float: RANK_NUMBER,
    str: RANK_STRING,
    list: RANK_ARRAY,
    tuple: RANK_ARRAY,
    dict: RANK_OBJECT,
    type(None): RANK_NULL,
    type(MISSING): RANK_MISSING,
}

TYPE_NAMES = ("missing", "null", "boolean", "number", "string", "array", "object")


def type_rank(v: Any) -> int:
    rank = _RANK_BY_TYPE.get(type(v))
    if rank is not None:
        return rank
    # Rare subclasses (OrderedDict, int-like enums): decide by isinstance, bool first.
    if isinstance(v, bool):
        return RANK_BOOL
    if isinstance(v, int | float):
        return RANK_NUMBER
    if isinstance(v, str):
        return RANK_STRING
    if isinstance(v, list | tuple):
        return RANK_ARRAY
    if isinstance(v, Mapping):
        return RANK_OBJECT
    return RANK_NULL  # not a JSON value; treat as NULL rather than fail a whole batch


def type_name(v: Any) -> str:
    return TYPE_NAMES[type_rank(v)]


def is_number(v: Any) -> bool:
    t = type(v)
    return t is int or t is float or (t is not bool and isinstance(v, int | float))


def truth(v: Any) -> bool:
    """N1QL truth value: MISSING, NULL, false, 0, NaN, "", [] and {} are false."""
    t = type(v)
    if t is bool:
        return v  # type: ignore[no-any-return]
    rank = type_rank(v)
    if rank <= RANK_NULL:
        return False
    if rank == RANK_NUMBER:
        return v == v and v != 0  # NaN is false
    return len(v) > 0


# -- collation and equality ------------------------------------------------------------------


def collate(a: Any, b: Any) -> int:
    """Total order over JSON values (plus MISSING): -1, 0 or 1.

    One comparator for the whole system: the key codec's, so a filter evaluated here and an
    index range scanned over encoded keys always agree. Expression results are JSON values
    (arithmetic turns non-finite floats into NULL), which is its domain.
    """
    t = type(a)
    if t is type(b) and (t is int or t is str):  # the common case, without the type ranks
        return (a > b) - (a < b)
    return compare_values(a, b)


def equals(a: Any, b: Any) -> Any:
    """SQL++ ``=``: TRUE/FALSE, or MISSING/NULL when an operand is (also inside arrays and
    objects: ``[1, null] = [1, null]`` is NULL, while ``[1, null] = [2, null]`` is FALSE)."""
    if a is MISSING or b is MISSING:
        return MISSING
    if a is None or b is None:
        return None
    ta = type(a)
    if ta is type(b) and (ta is str or ta is int or ta is float or ta is bool):
        return a == b
    ra, rb = type_rank(a), type_rank(b)
    if ra != rb:
        return False
    if ra == RANK_ARRAY:
        if len(a) != len(b):
            return False
        return _combine_equal(equals(x, y) for x, y in zip(a, b, strict=True))
    if ra == RANK_OBJECT:
        if len(a) != len(b) or a.keys() != b.keys():
            return False
        return _combine_equal(equals(v, b[k]) for k, v in a.items())
    if ra <= RANK_NULL:  # non-JSON values treated as NULL
        return None
    return a == b


def _combine_equal(results: Any) -> Any:
    out: Any = True
    for r in results:
        if r is False:
            return False
        if r is MISSING:
            out = MISSING
        elif r is None and out is True:
            out = None
    return out


def cmp_eq(a: Any, b: Any) -> Any:
    return equals(a, b)


def cmp_ne(a: Any, b: Any) -> Any:
    e = equals(a, b)
    return (not e) if type(e) is bool else e


def _ordered(a: Any, b: Any) -> int | None:
    """collate(a, b), or None when either side is MISSING/NULL (the caller propagates)."""
    if a is MISSING or b is MISSING or a is None or b is None:
        return None
    return collate(a, b)


def cmp_lt(a: Any, b: Any) -> Any:
    ta = type(a)
    if ta is type(b) and (ta is str or ta is int):
        return a < b
    c = _ordered(a, b)
    return _unknown2(a, b) if c is None else c < 0


def cmp_le(a: Any, b: Any) -> Any:
    ta = type(a)
    if ta is type(b) and (ta is str or ta is int):
        return a <= b
    c = _ordered(a, b)
    return _unknown2(a, b) if c is None else c <= 0


def cmp_gt(a: Any, b: Any) -> Any:
    ta = type(a)
    if ta is type(b) and (ta is str or ta is int):
        return a > b
    c = _ordered(a, b)
    return _unknown2(a, b) if c is None else c > 0


def cmp_ge(a: Any, b: Any) -> Any:
    ta = type(a)
    if ta is type(b) and (ta is str or ta is int):
        return a >= b
    c = _ordered(a, b)
    return _unknown2(a, b) if c is None else c >= 0


COMPARATORS: dict[str, Callable[[Any, Any], Any]] = {
    "=": cmp_eq,
    "!=": cmp_ne,
    "<": cmp_lt,
    "<=": cmp_le,
    ">": cmp_gt,
    ">=": cmp_ge,
}


def compare(op: str, a: Any, b: Any) -> Any:
    """Evaluate a comparison operator with MISSING/NULL propagation; across types the
    result follows collation order (N1QL: 1 < "a" is TRUE)."""
    return COMPARATORS[op](a, b)


# -- arithmetic ------------------------------------------------------------------------------


def _unknown2(a: Any, b: Any) -> Any:
    return MISSING if a is MISSING or b is MISSING else None


def finite(x: Any) -> Any:
    """Non-finite floats are not JSON: an overflowing result is NULL, like an int overflow."""
    return None if type(x) is float and not math.isfinite(x) else x


def add(a: Any, b: Any) -> Any:
    if is_number(a) and is_number(b):
        try:
            return finite(a + b)
        except OverflowError:  # int too large for a float: no JSON number holds the result
            return None
    return _unknown2(a, b)


def sub(a: Any, b: Any) -> Any:
    if is_number(a) and is_number(b):
        try:
            return finite(a - b)
        except OverflowError:
            return None
    return _unknown2(a, b)


def mul(a: Any, b: Any) -> Any:
    if is_number(a) and is_number(b):
        try:
            return finite(a * b)
        except OverflowError:
            return None
    return _unknown2(a, b)


def div(a: Any, b: Any) -> Any:
    """Ints stay ints where exact (6/2 is 3, 7/2 is 3.5). x/0 is NULL, as N1QL."""
    if is_number(a) and is_number(b):
        if b == 0:
            return None
        try:
            if type(a) is int and type(b) is int and a % b == 0:
                return a // b
            return finite(a / b)
        except OverflowError:
            return None
    return _unknown2(a, b)


def mod(a: Any, b: Any) -> Any:
    """Remainder with the sign of the dividend (N1QL/Go, unlike Python's %). x%0 is NULL."""
    if is_number(a) and is_number(b):
        if b == 0:
            return None
        if type(a) is int and type(b) is int:
            r = abs(a) % abs(b)
            return -r if a < 0 else r
        try:
            return math.fmod(a, b)
        except (OverflowError, ValueError):
            return None
    return _unknown2(a, b)


ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "+": add,
    "-": sub,
    "*": mul,
    "/": div,
    "%": mod,
}


def arith(op: str, a: Any, b: Any) -> Any:
    return ARITHMETIC[op](a, b)


def negate(a: Any) -> Any:
    if is_number(a):
        return -a
    return MISSING if a is MISSING else None


def concat(a: Any, b: Any) -> Any:
    if type(a) is str and type(b) is str:
        return a + b
    return _unknown2(a, b)


def is_false(v: Any) -> bool:
    """A known value whose truth is false (MISSING and NULL are unknown, not false)."""
    return v is not MISSING and v is not None and not truth(v)


def is_true(v: Any) -> bool:
    return v is not MISSING and v is not None and truth(v)


def logical_and(a: Any, b: Any) -> Any:
    """FALSE wins, then MISSING, then NULL, then TRUE (N1QL)."""
    if is_false(a) or is_false(b):
        return False
    if a is MISSING or b is MISSING:
        return MISSING
    if a is None or b is None:
        return None
    return True


def logical_or(a: Any, b: Any) -> Any:
    """TRUE wins, then NULL, then MISSING, then FALSE (N1QL)."""
    if is_true(a) or is_true(b):
        return True
    if a is None or b is None:
        return None
    if a is MISSING or b is MISSING:
        return MISSING
    return False


def logical_not(a: Any) -> Any:
    if a is MISSING or a is None:
        return a
    return not truth(a)


# -- LIKE ------------------------------------------------------------------------------------


def like_segments(pattern: str) -> list[tuple[str, int]]:
    """Split a LIKE pattern at its ``%`` wildcards: (regex, characters matched) per segment.

    ``%`` is any run (including empty), ``_`` any one character. A backslash escapes ``%``,
    ``_`` or another backslash; before anything else it is an ordinary character. Every
    other character, including regex metacharacters, matches itself. A segment's regex has
    no quantifier or alternation (escaped characters and ``.``): matching it at a position
    costs its length, searching for it at most text x its length.
    """
    segments: list[tuple[str, int]] = []
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n and pattern[i + 1] in "%_\\":
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if c == "%":
            segments.append(("".join(out), len(out)))
            out = []
        else:
            out.append("." if c == "_" else re.escape(c))
        i += 1
    segments.append(("".join(out), len(out)))
    return segments


def _wildcard_matcher(pattern: str) -> Callable[[str], bool]:
    """``s LIKE pattern`` in time bounded by text x pattern length, whatever the pattern.

    One regex with a ``.*`` per ``%`` backtracks: ``'%a%a%a%a%b'`` against a long run of
    ``a`` takes time to the power of the ``%`` count, holding the GIL (so the node's event
    loop and heartbeats) for minutes. Segments between ``%`` have fixed lengths and any
    placement of one leaves the most room to the next when it is the leftmost, so: the
    first segment anchored at the start, the last at the end, each one between at its first
    match after the one before it.
    """
    segs = like_segments(pattern)
    if len(segs) == 1:
        whole = re.compile(segs[0][0], re.DOTALL)
        return lambda s: whole.fullmatch(s) is not None
    first = re.compile(segs[0][0], re.DOTALL)
    middle = [re.compile(rx, re.DOTALL) for rx, _ in segs[1:-1] if rx]
    last, last_len = re.compile(segs[-1][0], re.DOTALL), segs[-1][1]

    def match(s: str) -> bool:
        head = first.match(s)
        if head is None:
            return False
        pos, end = head.end(), len(s) - last_len
        if end < pos or last.fullmatch(s, end) is None:
            return False
        for rx in middle:
            m = rx.search(s, pos, end)
            if m is None:
                return False
            pos = m.end()
        return True

    return match


@lru_cache(maxsize=1024)
def like_matcher(pattern: str) -> Callable[[str], bool]:
    """A predicate for ``s LIKE pattern``; cheap string methods for the common shapes."""
    body = pattern
    special = "%_\\"
    if not any(c in special for c in body):
        return body.__eq__
    if body.endswith("%") and not any(c in special for c in body[:-1]):
        prefix = body[:-1]
        return lambda s: s.startswith(prefix)
    if body.startswith("%") and not any(c in special for c in body[1:]):
        suffix = body[1:]
        return lambda s: s.endswith(suffix)
    if (
        len(body) >= 2
        and body[0] == "%"
        and body[-1] == "%"
        and not any(c in special for c in body[1:-1])
    ):
        middle = body[1:-1]
        return lambda s: middle in s
    return _wildcard_matcher(pattern)


def like(value: Any, pattern: Any) -> Any:
    if value is MISSING or pattern is MISSING:
        return MISSING
    if type(value) is not str or type(pattern) is not str:
        return None
    return like_matcher(pattern)(value)


# -- IN and BETWEEN --------------------------------------------------------------------------


def in_collection(value: Any, collection: Any) -> Any:
    """``value IN collection`` as N1QL: TRUE on a match; else NULL if the value or some
    element is NULL, MISSING if some element is MISSING; else FALSE."""
    if value is MISSING or collection is MISSING:
        return MISSING
    if type_rank(collection) != RANK_ARRAY:
        return None
    saw_null = saw_missing = False
    for item in collection:
        if item is MISSING:
            saw_missing = True
        elif item is None or value is None:
            saw_null = True
        elif equals(value, item) is True:
            return True
    if saw_null:
        return None
    return MISSING if saw_missing else False


def between(value: Any, low: Any, high: Any) -> Any:
    if value is MISSING or low is MISSING or high is MISSING:
        return MISSING
    if value is None or low is None or high is None:
        return None
    return collate(value, low) >= 0 and collate(value, high) <= 0


# -- paths -----------------------------------------------------------------------------------


def get_field(base: Any, name: str) -> Any:
    if type(base) is dict or isinstance(base, Mapping):
        return base.get(name, MISSING)
    return MISSING


def get_element(base: Any, index: Any) -> Any:
    """``base[index]``: array element by integral number (negative from the end), or object
    field by string; MISSING for anything else, including out-of-range indexes."""
    if is_number(index):
        if type_rank(base) != RANK_ARRAY:
            return MISSING
        if type(index) is float:
            if not index.is_integer():
                return MISSING
            index = int(index)
        n = len(base)
        if -n <= index < n:
            return base[index]
        return MISSING
    if type(index) is str:
        return get_field(base, index)
    return MISSING
