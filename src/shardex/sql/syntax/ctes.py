"""Name binding for WITH (common table expressions): ``WITH a AS (SELECT ...), b AS (expr)
SELECT ... FROM a ...``.

Each term is bound with the names before it visible (``cte_names``), the query with all of
them. A term is a query (its value: the array of its result values) or an expression (no
FROM: nothing to range over but the names before it and the parameters). Each is evaluated
once per statement, before the query, and handed to it as a parameter (``values_in``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardex.core.expr import Expr, Param, walk

from .ast import Aggregate, SelectStmt, SetOpStmt, WithStmt
from .bind import BoundSelect, SqlSemanticError, resolve
from .cte_names import cte_param, is_cte_param, visible
from .setops import BoundQuery, BoundSetOp, bind_query

__all__ = ["BoundWith", "BoundWithTerm", "bind_with", "user_params", "values_in"]


@dataclass(frozen=True)
class BoundWithTerm:
    name: str
    param: str  # the parameter its value travels as (``cte_names.cte_param``)
    expr: Expr | None  # an expression term, bound
    query: BoundQuery | None  # a query term, bound
    stmt: SelectStmt | SetOpStmt | None  # the query term as parsed


@dataclass(frozen=True)
class BoundWith:
    stmt: WithStmt
    terms: tuple[BoundWithTerm, ...]
    body: BoundQuery

    def selects(self) -> list[BoundSelect]:
        """Every SELECT of the terms and the query."""
        out: list[BoundSelect] = []
        for q in [*(t.query for t in self.terms if t.query is not None), self.body]:
            out += q.selects() if isinstance(q, BoundSetOp) else [q]
        return out

    def params(self) -> frozenset[str]:
        """The user's parameters the terms and the query use (not the WITH names')."""
        found = set(self.body.params())
        for t in self.terms:
            if t.query is not None:
                found |= t.query.params()
            elif t.expr is not None:
                found |= _params(t.expr)
        return user_params(found)


def _params(e: Expr) -> set[str]:
    return {n.name for n in walk(e) if isinstance(n, Param)}


def user_params(names: frozenset[str] | set[str]) -> frozenset[str]:
    return frozenset(n for n in names if not is_cte_param(n))


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
