"""What a bound WITH is: its terms (each a query or an expression, read by the query as a
parameter, ``cte_names.cte_param``) and its query. A statement's WITH (``ctes.bind_with``)
and a subquery expression's (``bind.bind_with_subquery``) bind to the same shape: the first
is valued once per statement, the second once per evaluation of its subquery."""

from __future__ import annotations

from dataclasses import dataclass

from shardex.core.expr import Expr, Param, walk

from .ast import SelectStmt, SetOpStmt, WithStmt
from .bound_select import BoundSelect
from .bound_setop import BoundSetOp
from .cte_names import is_cte_param

__all__ = ["BoundWith", "BoundWithTerm", "user_params"]


@dataclass(frozen=True)
class BoundWithTerm:
    name: str
    param: str  # the parameter its value travels as (``cte_names.cte_param``)
    expr: Expr | None  # an expression term, bound
    query: BoundSelect | BoundSetOp | None  # a query term, bound
    stmt: SelectStmt | SetOpStmt | None  # the query term as parsed


@dataclass(frozen=True)
class BoundWith:
    stmt: WithStmt
    terms: tuple[BoundWithTerm, ...]
    body: BoundSelect | BoundSetOp

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
