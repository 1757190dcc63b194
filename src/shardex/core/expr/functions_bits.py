"""Bitwise functions (BITAND, BITOR, BITXOR, BITNOT, BITSHIFT, BITSET, BITCLEAR, BITTEST /
ISBITSET) over 64-bit two's complement integers, as N1QL.

Registered into the shared registry on import (see ``functions_num``). An argument that is
not an integral number (``1.0`` is one, ``1.5`` is not) or does not fit 64 bits gives NULL.
Bit positions count from 1 (the least significant bit) to 64; a position outside that range
gives NULL. Shifts are logical (the sign bit is not copied in) and ``rotate`` makes them
circular.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from typing import Any

from shardex.core.values import MISSING

from .functions import _fn, _int_arg
from .ops import RANK_ARRAY, type_rank

_BITS = 64
_MASK = (1 << _BITS) - 1
_SIGN = 1 << (_BITS - 1)


def _word(v: Any) -> int | None:
    """``v`` as an unsigned 64-bit word, or None when not a 64-bit integer."""
    i = _int_arg(v)
    if i is None or not -_SIGN <= i < _SIGN:
        return None
    return i & _MASK


def _signed(word: int) -> int:
    return word - (1 << _BITS) if word & _SIGN else word


def _fold(op: Callable[[int, int], int]) -> Callable[..., Any]:
    def impl(*values: Any) -> Any:
        words = [_word(v) for v in values]
        if any(w is None for w in words):
            return None
        return _signed(reduce(op, words))  # type: ignore[arg-type]

    return impl


_fn("BITAND", 2, None)(_fold(lambda a, b: a & b))
_fn("BITOR", 2, None)(_fold(lambda a, b: a | b))
_fn("BITXOR", 2, None)(_fold(lambda a, b: a ^ b))


@_fn("BITNOT", 1)
def _bitnot(v: Any) -> Any:
    w = _word(v)
    return None if w is None else _signed(~w & _MASK)


@_fn("BITSHIFT", 2, 3)
def _bitshift(v: Any, amount: Any, rotate: Any = MISSING) -> Any:
    """Left for a positive ``amount``, right for a negative one."""
    w, n = _word(v), _int_arg(amount)
    circular = False if rotate is MISSING else rotate
    if w is None or n is None or type(circular) is not bool:
        return None
    if circular:
        n %= _BITS
        return _signed(((w << n) | (w >> (_BITS - n))) & _MASK)
    if abs(n) >= _BITS:
        return 0
    return _signed((w << n) & _MASK if n >= 0 else w >> -n)


def _mask(positions: Any) -> int | None:
    """The bits at 1-based ``positions`` (one integer or an array of them) as a word."""
    items = positions if type_rank(positions) == RANK_ARRAY else [positions]
    mask = 0
    for p in items:
        i = _int_arg(p)
        if i is None or not 1 <= i <= _BITS:
            return None
        mask |= 1 << (i - 1)
    return mask


@_fn("BITSET", 2)
def _bitset(v: Any, positions: Any) -> Any:
    w, m = _word(v), _mask(positions)
    return None if w is None or m is None else _signed(w | m)


@_fn("BITCLEAR", 2)
def _bitclear(v: Any, positions: Any) -> Any:
    w, m = _word(v), _mask(positions)
    return None if w is None or m is None else _signed(w & ~m & _MASK)


@_fn("BITTEST", 2, 3, "ISBITSET")
def _bittest(v: Any, positions: Any, all_set: Any = MISSING) -> Any:
    """Whether any (or with ``all_set``, every) bit at ``positions`` is 1."""
    w, m = _word(v), _mask(positions)
    every = False if all_set is MISSING else all_set
    if w is None or m is None or type(every) is not bool:
        return None
    return (w & m) == m if every else (w & m) != 0
