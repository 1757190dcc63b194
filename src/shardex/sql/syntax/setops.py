"""Name binding for set operations (``UNION`` / ``INTERSECT`` / ``EXCEPT [ALL]``).

Each branch is bound on its own (``bind_select``, or this module for a parenthesised set
operation). The set operation's ORDER BY reads the result values, as N1QL's does: a bare
name is a field of the result (``ORDER BY name`` after ``SELECT name FROM ... UNION ...``),
SELF is the whole value (the way to order ``SELECT RAW`` branches). The scope row of an
ORDER BY term is ``{RESULT_NAME: value}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardex.core.expr import Expr, Param, walk

from .ast import Aggregate, OrderTerm, SelectStmt, SetOpStmt
from .bind import BoundSelect, SqlSemanticError, bind_select, resolve

__all__ = [
    "RESULT_NAME",
    "BoundQuery",
    "BoundSetOp",
    "bind_query",
    "bind_set_op",
    "result_scope",
]

# The scope name of a set operation's result value (NUL first: no user name collides).
RESULT_NAME = "\x00result"


@dataclass(frozen=True)
class BoundSetOp:
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


BoundQuery = BoundSelect | BoundSetOp


def bind_query(stmt: SelectStmt | SetOpStmt) -> BoundQuery:
    return bind_select(stmt) if isinstance(stmt, SelectStmt) else bind_set_op(stmt)


def bind_set_op(stmt: SetOpStmt) -> BoundSetOp:
    branches = tuple(bind_query(b) for b in stmt.branches)
    order = []
    for term in stmt.order_by:
        for n in walk(term.expr):
            if isinstance(n, Aggregate):
                raise SqlSemanticError(
                    f"aggregate {n.to_text()} is not allowed in the ORDER BY of a set "
                    "operation (it orders the result values)",
                    details={"aggregate": n.to_text(), "hint": "aggregate inside a branch"},
                )
        order.append((resolve(term.expr, RESULT_NAME, frozenset()), term))
    return BoundSetOp(stmt, branches, stmt.ops, tuple(order), stmt.limit, stmt.offset)


def result_scope(value: object) -> dict[str, object]:
    """The scope row a set operation's ORDER BY term reads ``value`` in."""
    return {RESULT_NAME: value}
