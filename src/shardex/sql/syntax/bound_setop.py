"""A bound set operation (``setops.bind_set_op``; a subquery's, ``bind.bind_set_op_subquery``):
its branches bound, its ORDER BY over ``{RESULT_NAME: value}``. Apart from ``setops.py`` so
the binder, which ``setops.py`` builds on, can make one for a subquery expression."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardex.core.expr import Expr, Param, walk

from .ast import OrderTerm, SetOpStmt

if TYPE_CHECKING:
    from .bind import BoundSelect

__all__ = ["BoundSetOp"]


@dataclass(frozen=True)
class BoundSetOp:
    """``stmt`` bound."""

    stmt: SetOpStmt
    branches: tuple[BoundSelect | BoundSetOp, ...]
    ops: tuple[tuple[str, bool], ...]  # (UNION | INTERSECT | EXCEPT, ALL) between branches
    order: tuple[tuple[Expr, OrderTerm], ...]  # bound over ``{RESULT_NAME: value}``
    limit: Expr | None
    offset: Expr | None

    def params(self) -> frozenset[str]:
        """Names of the parameters every branch and the trailing clauses use."""
        found: set[str] = set()
        for b in self.branches:
            found |= b.params()
        tail = [e for e, _ in self.order] + [e for e in (self.limit, self.offset) if e]
        found |= {n.name for e in tail for n in walk(e) if isinstance(n, Param)}
        return frozenset(found)

    def selects(self) -> list[BoundSelect]:
        """Every SELECT branch, nested set operations flattened, in order."""
        out: list[BoundSelect] = []
        for b in self.branches:
            out += b.selects() if isinstance(b, BoundSetOp) else [b]
        return out
