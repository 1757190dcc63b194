"""Number functions beyond the core set: trigonometry, logarithms, constants, rounding
variants and RANDOM.

Registered into the shared ``FUNCTIONS`` registry on import (``shardex.core.expr`` imports
this module), so index definitions, the projector and SQL all see them. As everywhere in the
registry, a result no JSON number can hold (NaN, an infinity) is NULL: shardex has no
non-finite numbers (``keycodec`` cannot order them), so ``ACOS(3)``, ``SQRT(-1)`` and
``NaN()`` are NULL where N1QL prints ``"NaN"``.
"""

from __future__ import annotations

import math
import random
from decimal import ROUND_HALF_UP
from typing import Any

from shardex.core.values import MISSING

from .functions import (
    FunctionSpec,
    _fn,
    _normalize_number,
    _round,
    _round_to,
    register_function,
)
from .ops import is_number


def _unary(name: str, fn: Any, *aliases: str) -> None:
    def impl(x: Any) -> Any:
        if not is_number(x):
            return None
        return _normalize_number(fn(x))

    impl.__name__ = name.lower()
    register_function(FunctionSpec(name, 1, 1, impl), *aliases)


_unary("ACOS", math.acos)
_unary("ASIN", math.asin)
_unary("ATAN", math.atan)
_unary("COS", math.cos)
_unary("SIN", math.sin)
_unary("TAN", math.tan)
_unary("EXP", math.exp)
_unary("LN", math.log)
_unary("LOG", math.log10)
_unary("DEGREES", math.degrees)
_unary("RADIANS", math.radians)


@_fn("ATAN2", 2)
def _atan2(a: Any, b: Any) -> Any:
    """N1QL: the arctangent of ``b / a`` (Go's ``math.Atan2(a, b)`` argument order)."""
    if not (is_number(a) and is_number(b)):
        return None
    return _normalize_number(math.atan2(a, b))


@_fn("PI", 0)
def _pi() -> Any:
    return math.pi


@_fn("E", 0)
def _e() -> Any:
    return math.e


@_fn("NAN", 0)
def _nan() -> Any:
    return math.nan  # NULL after the registry's non-finite guard (see the module doc)


@_fn("POSINF", 0, -1, "POS_INF")
def _posinf() -> Any:
    return math.inf


@_fn("NEGINF", 0, -1, "NEG_INF")
def _neginf() -> Any:
    return -math.inf


@_fn("ROUND_NEAREST", 1, 2)
def _round_nearest(x: Any, digits: Any = MISSING) -> Any:
    """Half away from zero (ROUND_NEAREST(2.5) is 3); ROUND and ROUND_EVEN are half-even."""
    return _round_to(x, digits, ROUND_HALF_UP)


# ROUND is already half to even (N1QL's default); ROUND_EVEN names that explicitly.
register_function(FunctionSpec("ROUND_EVEN", 1, 2, _round))


def _random(seed: Any = MISSING) -> Any:
    if seed is MISSING:
        return random.random()
    if seed is None or not (is_number(seed) or type(seed) is str):
        return None
    return random.Random(seed).random()  # deterministic per seed, not N1QL's generator


register_function(FunctionSpec("RANDOM", 0, 1, _random, propagate=False, deterministic=False))
