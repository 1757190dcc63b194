"""Evaluation of the statement-only expression nodes (see ``ast.py``), registered with the
shared interpreter so ``evaluate`` and ``compile_expression`` handle them.

Variables: a comprehension evaluates its body against a new root that is the current root
(an object) plus the bound variable, so ``v.x`` and outer names both resolve as plain
identifiers. In SQL the root is the small scope object ``{alias: document, let vars...}``,
so the copy per element is a few pointers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from shardex.core.expr import MISSING, register_node, truth
from shardex.core.expr.evaluator import Env, evaluate_in
from shardex.core.expr.ops import RANK_ARRAY, RANK_OBJECT, type_rank
from shardex.errors import ExpressionEvalError

from .ast import Aggregate, ArrayComprehension, Binding, CollectionPredicate


def _within(value: Any) -> Iterator[Any]:
    """Every value nested anywhere inside ``value`` (children first-level first)."""
    stack = [value]
    while stack:
        v = stack.pop()
        rank = type_rank(v)
        items = v if rank == RANK_ARRAY else v.values() if rank == RANK_OBJECT else ()
        for item in items:
            yield item
            if type_rank(item) in (RANK_ARRAY, RANK_OBJECT):
                stack.append(item)


def _sources(bindings: tuple[Binding, ...], env: Env) -> list[list[Any]] | Any:
    """The collections of the bindings, or MISSING/NULL when one is not an array."""
    out: list[list[Any]] = []
    for b in bindings:
        coll = evaluate_in(b.source, env)
        if coll is MISSING:
            return MISSING
        if b.within:
            if type_rank(coll) not in (RANK_ARRAY, RANK_OBJECT):
                return None
            out.append(list(_within(coll)))
        elif type_rank(coll) != RANK_ARRAY:
            return None
        else:
            out.append(list(coll))
    return out


def _scopes(bindings: tuple[Binding, ...], sources: list[list[Any]], env: Env) -> Iterator[Env]:
    # Several bindings iterate in parallel (N1QL), stopping at the shortest collection.
    base = env.doc if isinstance(env.doc, dict) else {}
    for items in zip(*sources, strict=False):
        scope = dict(base)
        for b, item in zip(bindings, items, strict=True):
            scope[b.var] = item
        yield Env(scope, env.meta, env.params)


def _collection_predicate(node: CollectionPredicate, env: Env) -> Any:
    sources = _sources(node.bindings, env)
    if not isinstance(sources, list):
        return sources
    seen = False
    for scope in _scopes(node.bindings, sources, env):
        seen = True
        ok = truth(evaluate_in(node.satisfies, scope))
        if node.quantifier == "ANY" and ok:
            return True
        if node.quantifier != "ANY" and not ok:
            return False
    if node.quantifier == "ANY":
        return False
    if node.quantifier == "EVERY":
        return True
    return seen  # ANY AND EVERY: non-empty and all satisfied


def _array_comprehension(node: ArrayComprehension, env: Env) -> Any:
    sources = _sources(node.bindings, env)
    if not isinstance(sources, list):
        return sources
    out: list[Any] = []
    for scope in _scopes(node.bindings, sources, env):
        if node.when is not None and not truth(evaluate_in(node.when, scope)):
            continue
        v = evaluate_in(node.mapping, scope)
        if node.first:
            return v
        if v is not MISSING:  # N1QL drops MISSING results from ARRAY comprehensions
            out.append(v)
    return MISSING if node.first else out


def _aggregate(node: Aggregate, env: Env) -> Any:
    raise ExpressionEvalError(
        f"aggregate {node.to_text()} is not allowed here",
        details={
            "aggregate": node.to_text(),
            "hint": "use it in the projection, HAVING or ORDER BY of a SELECT with FROM",
        },
    )


register_node(CollectionPredicate, _collection_predicate)
register_node(ArrayComprehension, _array_comprehension)
register_node(Aggregate, _aggregate)
