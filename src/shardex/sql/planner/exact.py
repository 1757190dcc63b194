"""When a covering scan's spans decide its WHERE clause by themselves, so the leaves need
not evaluate it on every row (for a 100-row covering query the filter was the largest
Python cost of a leaf).

Spans are built to be a superset of the matching entries (``sargable``), and the filter
normally runs after the scan. They are exact - an entry is in them if and only if the
WHERE clause is TRUE for its key values - when all of these hold, checked per execution
with the parameter values:

* every top-level AND term constrains exactly one index key part, and is ``k = v``,
  ``k < v`` (``<=``, ``>``, ``>=``, either side) or ``k BETWEEN v AND w``, where each bound
  evaluates to a JSON scalar other than NULL (a boolean, a finite number or a string):
  these compare by the key codec's collation on both sides, and the one-sided intervals
  start above NULL as the comparison does (``sargable._compare``). NULL, MISSING, arrays
  and objects as bounds, IN, LIKE, OR, IS checks and anything reading the document twice
  keep the filter;
* each such key part is one the spans bound exactly (``key_ranges.exact_key_parts``): a
  leading part pinned to points, or the part that closes the spans, not hulled.

Only for covering scans: a fetched document may have changed since its index entry was
read, and then the WHERE clause must be evaluated on the document itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from shardex.core.expr import Between, BinaryOp, Expr, evaluate

from .key_ranges import exact_key_parts
from .sargable import KeyAtom, atom_for, conjuncts, reads_document

__all__ = ["where_decided"]

_COMPARISONS = frozenset(("=", "<", "<=", ">", ">="))


def where_decided(
    where: Expr | None,
    keys: Sequence[Expr],
    per_key: Sequence[Sequence[KeyAtom]],
    params: Any,
) -> bool:
    """Whether the spans of ``per_key`` (the constraints of ``where`` on ``keys``, in
    document terms) select exactly the entries whose key values satisfy ``where``."""
    terms = conjuncts(where)
    exact = exact_key_parts(per_key, params)
    for term in terms:
        parts = [i for i, key in enumerate(keys) if atom_for(term, key) is not None]
        if len(parts) != 1 or parts[0] >= exact or not _scalar_bounds(term, params):
            return False
    return True


def _scalar_bounds(term: Expr, params: Any) -> bool:
    if isinstance(term, BinaryOp) and term.op in _COMPARISONS:
        bounds = [term.left if reads_document(term.right) else term.right]
    elif isinstance(term, Between) and not term.negated:
        bounds = [term.low, term.high]
    else:
        return False
    return all(_is_scalar(evaluate(b, None, params=params)) for b in bounds)


def _is_scalar(value: Any) -> bool:
    t = type(value)
    if t is float:
        return math.isfinite(value)
    return t is bool or t is int or t is str
