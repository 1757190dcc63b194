"""Conditional, comparison and type-conversion functions beyond the core set:
NVL2, DECODE, EQ/NE/LT/LE/GT/GE/BETWEEN as functions, IS_MISSING and friends, and
TO_ARRAY / TO_ATOM / TO_OBJECT.

Registered into the shared registry on import (see ``functions_num``).
"""

from __future__ import annotations

from typing import Any

from shardex.core.values import MISSING

from .functions import FunctionSpec, _fn, register_function
from .ops import RANK_ARRAY, RANK_OBJECT, between, compare, equals, type_rank


@_fn("NVL2", 3, propagate=False)
def _nvl2(a: Any, b: Any, c: Any) -> Any:
    return b if a is not MISSING and a is not None else c


def _decode_match(value: Any, search: Any) -> bool:
    # DECODE matches MISSING with MISSING and NULL with NULL, unlike '='.
    if value is MISSING or search is MISSING:
        return value is search
    if value is None or search is None:
        return value is search
    return equals(value, search) is True


@_fn("DECODE", 3, None, propagate=False)
def _decode(value: Any, *pairs: Any) -> Any:
    """DECODE(expr, search1, result1 [, search2, result2 ...] [, default]); no match and no
    default is NULL."""
    n = len(pairs) - len(pairs) % 2
    for i in range(0, n, 2):
        if _decode_match(value, pairs[i]):
            return pairs[i + 1]
    return pairs[-1] if len(pairs) % 2 else None


def _comparison(name: str, op: str) -> None:
    register_function(FunctionSpec(name, 2, 2, lambda a, b: compare(op, a, b)))


for _name, _op in (("EQ", "="), ("NE", "!="), ("LT", "<"), ("LE", "<="), ("GT", ">")):
    _comparison(_name, _op)
_comparison("GE", ">=")


@_fn("BETWEEN", 3)
def _between(v: Any, low: Any, high: Any) -> Any:
    return between(v, low, high)


def _is_null(v: Any) -> Any:
    return MISSING if v is MISSING else v is None


def _is_valued(v: Any) -> Any:
    return v is not MISSING and v is not None


_IS_CHECKS = (
    ("IS_MISSING", lambda v: v is MISSING),
    ("IS_NOT_MISSING", lambda v: v is not MISSING),
    ("IS_NULL", _is_null),
    ("IS_NOT_NULL", lambda v: MISSING if v is MISSING else v is not None),
    ("IS_VALUED", _is_valued),
    ("IS_NOT_VALUED", lambda v: not _is_valued(v)),
)
for _name, _impl in _IS_CHECKS:
    register_function(FunctionSpec(_name, 1, 1, _impl, propagate=False))
register_function(FunctionSpec("IS_KNOWN", 1, 1, _is_valued, propagate=False))
register_function(FunctionSpec("IS_NOT_KNOWN", 1, 1, lambda v: not _is_valued(v), False))


@_fn("TO_ARRAY", 1, -1, "TOARRAY")
def _to_array(v: Any) -> Any:
    return v if type_rank(v) == RANK_ARRAY else [v]


@_fn("TO_ATOM", 1, -1, "TOATOM")
def _to_atom(v: Any) -> Any:
    rank = type_rank(v)
    if rank == RANK_ARRAY:
        return _to_atom_inner(v[0]) if len(v) == 1 else None
    if rank == RANK_OBJECT:
        return _to_atom_inner(next(iter(v.values()))) if len(v) == 1 else None
    return v


def _to_atom_inner(v: Any) -> Any:
    return None if v is None else _to_atom(v)


@_fn("TO_OBJECT", 1, -1, "TOOBJECT", "TOOBJ")
def _to_object(v: Any) -> Any:
    return v if type_rank(v) == RANK_OBJECT else {}
