"""Name binding for WITH (common table expressions): ``WITH a AS (SELECT ...), b AS (expr)
SELECT ... FROM a ...``.

Each term is bound with the names before it visible (``cte_names``), the query with all of
them. A term is a query (its value: the array of its result values) or an expression (no
FROM: nothing to range over but the names before it and the parameters). Each is evaluated
once per statement, before the query, and handed to it as a parameter (``values_in``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shardex.core.expr import evaluate, walk

from .ast import Aggregate, WithStmt
from .bind import SqlSemanticError, resolve
from .bound_with import BoundWith, BoundWithTerm, user_params
from .cte_names import cte_param, visible
from .setops import BoundQuery, bind_query

__all__ = [
    "BoundWith",
    "BoundWithTerm",
    "bind_with",
    "user_params",
    "valued_terms",
    "values_in",
]


def bind_with(stmt: WithStmt) -> BoundWith:
    terms: list[BoundWithTerm] = []
    names: list[str] = []
    for t in stmt.terms:
        with visible(names):
            if t.query is not None:
                terms.append(
                    BoundWithTerm(t.name, cte_param(t.name), None, bind_query(t.query), t.query)
                )
            else:
                assert t.expr is not None
                for n in walk(t.expr):
                    if isinstance(n, Aggregate):
                        raise SqlSemanticError(
                            f"aggregate {n.to_text()} is not allowed in WITH {t.name}",
                            details={"aggregate": n.to_text(), "hint": "use a SELECT"},
                        )
                expr = resolve(t.expr, None, frozenset())
                terms.append(BoundWithTerm(t.name, cte_param(t.name), expr, None, None))
        names.append(t.name)
    with visible(names):
        body = bind_query(stmt.body)
    return BoundWith(stmt, tuple(terms), body)


def values_in(params: Any, values: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with the WITH values (parameter name -> value) added: a mapping, the
    positional values under "1", "2", ... (which ``$1`` reads as it reads a list)."""
    if isinstance(params, Mapping):
        return {**params, **values}
    out: dict[str, Any] = {}
    if isinstance(params, Sequence) and not isinstance(params, str):
        out = {str(i): v for i, v in enumerate(params, 1)}
    return {**out, **values}


def valued_terms(
    w: BoundWith,
    params: Any,
    run: Callable[[BoundQuery, Any], list[Any]],
    outer: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``params`` with the value of every term of ``w``, each evaluated once, in order (a
    term sees those before it): a query term's by ``run(query, params)``, an expression
    term's over ``outer`` (a subquery's enclosing row; none for a statement's WITH)."""
    values: dict[str, Any] = {}
    for t in w.terms:
        seen = values_in(params, values)
        if t.query is not None:
            values[t.param] = run(t.query, seen)
        else:
            assert t.expr is not None
            values[t.param] = evaluate(t.expr, outer or {}, params=seen)
    return values_in(params, values)
