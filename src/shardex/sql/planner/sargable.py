"""Sargable predicates: which conjuncts of a WHERE clause an index's key parts can serve.

Planning happens before parameter values are known, so this module only *collects*
constraints per key part (:class:`KeyAtom`); :mod:`shardex.sql.planner.key_ranges` turns them
into value intervals and scan spans at execution time, once ``$1``/``$name`` have values.

Rules (SQL++ with N1QL collation, ``MISSING < NULL < FALSE < TRUE < numbers < strings <
arrays < objects``; comparisons across types follow that order, see ``core.expr.ops``):

* ``k = e``, ``k IN [..]``, ``k BETWEEN a AND b``, ``k < e`` (and ``>``, ``<=``, ``>=``, the
  flipped ``e < k``), ``k IS NULL``, ``k IS NOT NULL``, ``k IS NOT MISSING``, ``k IS VALUED``,
  ``k LIKE "prefix%"`` constrain ``k``
  when ``e`` does not read the document (constants and parameters only).
* A one-sided comparison also excludes NULL (``NULL < 5`` is NULL, not TRUE), so ``k < 5``
  becomes the interval ``(NULL, 5)``.
* ``OR`` is sargable when every branch constrains the same key part: a union of intervals.
* An array key (``DISTINCT ARRAY v.x FOR v IN arr END``) is constrained by ``ANY [AND EVERY]
  w IN arr SATISFIES cond END`` over the same array: each conjunct of ``cond`` that
  constrains the element expression (``w.x = 5``, with ``w`` read as ``v``) constrains the key
  part, since a document that satisfies the ANY has an element, hence an entry, in the span.
  An index with a ``WHEN`` needs ``cond`` to state it as one of its conjuncts.
* Everything else is left to the filter. The planner re-applies the whole WHERE clause
  after the scan, so spans need only be a *superset* of the rows. That keeps this module
  small and makes a planner bug cost speed, not correctness. The one exception is narrow
  and checked per execution (``exact.where_decided``): a covering scan whose every WHERE
  term is a comparison with a non-NULL scalar on a key part the spans bound exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardex.core.expr import (
    And,
    Between,
    BinaryOp,
    Expr,
    In,
    IsCheck,
    Like,
    Literal,
    Or,
    walk,
)
from shardex.core.expr.ast import Identifier, Meta
from shardex.meta.array_key import ArrayIndexKey
from shardex.sql.syntax.ast import CollectionPredicate
from shardex.sql.syntax.bind import map_children

__all__ = [
    "AnyOf",
    "InList",
    "KeyAtom",
    "Prefix",
    "Range",
    "atom_for",
    "conjuncts",
    "constrain_keys",
    "reads_document",
]

_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "="}
_NULL = Literal(None)


@dataclass(frozen=True, slots=True)
class Range:
    """Values between ``low`` and ``high`` (document-free expressions; None = open end).

    ``above_null``: an open low end starts above NULL, since a one-sided comparison is
    never TRUE for a NULL key (``k < 5``) and NULL keys are indexed.
    """

    low: Expr | None
    low_inclusive: bool
    high: Expr | None
    high_inclusive: bool
    above_null: bool = False


@dataclass(frozen=True, slots=True)
class InList:
    """``key IN collection``: a point per element (an array literal or a parameter)."""

    collection: Expr


@dataclass(frozen=True, slots=True)
class Prefix:
    """``key LIKE "abc%..."``: the strings that start with the literal prefix."""

    prefix: str


@dataclass(frozen=True, slots=True)
class AnyOf:
    """A union: ``k = 1 OR k > 10``."""

    atoms: tuple[KeyAtom, ...]


KeyAtom = Range | InList | Prefix | AnyOf


def _compare(op: str, value: Expr) -> Range:
    if op == "=":
        return Range(value, True, value, True)
    if op in ("<", "<="):
        return Range(None, True, value, op == "<=", above_null=True)
    return Range(value, op == ">=", None, True)


def conjuncts(expr: Expr | None) -> list[Expr]:
    """The top-level AND terms of ``expr`` (flattened); [] for no WHERE clause."""
    if expr is None:
        return []
    if isinstance(expr, And):
        out: list[Expr] = []
        for op in expr.operands:
            out.extend(conjuncts(op))
        return out
    return [expr]


def reads_document(expr: Expr) -> bool:
    """Whether ``expr`` depends on the current document (a field or META()), i.e. is not a
    value computable from constants and parameters before the scan starts."""
    return any(isinstance(n, Identifier | Meta) for n in walk(expr))


def atom_for(pred: Expr, key: Expr) -> KeyAtom | None:
    """The constraint ``pred`` puts on ``key``, or None if it puts none the index can use."""
    if isinstance(pred, BinaryOp) and pred.op in _FLIP:
        if pred.left == key and not reads_document(pred.right):
            return _compare(pred.op, pred.right)
        if pred.right == key and not reads_document(pred.left):
            return _compare(_FLIP[pred.op], pred.left)
        return None
    if isinstance(pred, Between) and not pred.negated and pred.operand == key:
        if reads_document(pred.low) or reads_document(pred.high):
            return None
        return Range(pred.low, True, pred.high, True)
    if isinstance(pred, In) and not pred.negated and pred.operand == key:
        return None if reads_document(pred.collection) else InList(pred.collection)
    if isinstance(pred, IsCheck) and pred.operand == key:
        return _is_check(pred)
    if isinstance(pred, Like) and not pred.negated and pred.operand == key:
        return _like_prefix(pred.pattern)
    if isinstance(pred, Or):
        atoms = [atom_for(branch, key) for branch in pred.operands]
        if all(a is not None for a in atoms):
            return AnyOf(tuple(a for a in atoms if a is not None))
    return None


def _is_check(pred: IsCheck) -> KeyAtom | None:
    """``IS [NOT] NULL``; ``IS NOT MISSING`` (every indexed entry: a MISSING leading key
    is never indexed, a MISSING later key part sorts first); ``IS VALUED`` (neither MISSING
    nor NULL: above NULL). ``IS MISSING`` and ``IS NOT VALUED`` stay filters."""
    if pred.kind == "NULL":
        if pred.negated:
            return Range(None, True, None, True, above_null=True)
        return Range(_NULL, True, _NULL, True)
    if pred.kind == "MISSING" and pred.negated:
        return Range(None, True, None, True)
    if pred.kind == "VALUED" and not pred.negated:
        return Range(None, True, None, True, above_null=True)
    return None


def _like_prefix(pattern: Expr) -> KeyAtom | None:
    if not isinstance(pattern, Literal) or not isinstance(pattern.value, str):
        return None
    prefix = []
    for ch in pattern.value:
        if ch in "%_":
            break
        if ch == "\\":  # an escaped wildcard ends the simple prefix: leave it to the filter
            break
        prefix.append(ch)
    return Prefix("".join(prefix))


def constrain_keys(where: Expr | None, keys: Sequence[Expr]) -> list[list[KeyAtom]]:
    """For each key part, the atoms of ``where``'s conjuncts that constrain it.

    ``keys`` are the index's key expressions in the query's terms (alias already stripped
    by the caller). The result has one (possibly empty) list per key part.
    """
    terms = conjuncts(where)
    out: list[list[KeyAtom]] = []
    for key in keys:
        if isinstance(key, ArrayIndexKey):
            out.append([a for t in terms for a in array_atoms(t, key)])
            continue
        atoms = [a for a in (atom_for(t, key) for t in terms) if a is not None]
        out.append(atoms)
    return out


def array_atoms(pred: Expr, key: ArrayIndexKey) -> list[KeyAtom]:
    """The constraints an ``ANY ... SATISFIES ... END`` over the key's array puts on an
    array key part (module doc); none for anything else."""
    if (
        not isinstance(pred, CollectionPredicate)
        or pred.quantifier not in ("ANY", "ANY AND EVERY")
        or len(pred.bindings) != 1
    ):
        return []
    binding = pred.bindings[0]
    if binding.within or binding.source != key.source:
        return []
    cond = _renamed(pred.satisfies, binding.var, key.var)
    terms = conjuncts(cond)
    if key.when is not None and key.when not in terms:
        return []
    return [a for a in (atom_for(t, key.mapping) for t in terms) if a is not None]


def _renamed(expr: Expr, old: str, new: str) -> Expr:
    if old == new:
        return expr

    def f(node: Expr) -> Expr:
        if isinstance(node, Identifier) and node.name == old:
            return Identifier(new)
        return map_children(node, f)

    return f(expr)
