"""Name binding for set operations (``UNION`` / ``INTERSECT`` / ``EXCEPT [ALL]``).

Each branch is bound on its own (``bind_select``, or this module for a parenthesised set
operation). The set operation's ORDER BY reads the result values, as N1QL's does: a bare
name is a field of the result (``ORDER BY name`` after ``SELECT name FROM ... UNION ...``),
SELF is the whole value (the way to order ``SELECT RAW`` branches). The scope row of an
ORDER BY term is ``{RESULT_NAME: value}``.
"""

from __future__ import annotations

from .ast import RESULT_NAME, SelectStmt, SetOpStmt
from .bind import BoundSelect, bind_select, set_op_order
from .bound_setop import BoundSetOp

__all__ = [
    "RESULT_NAME",
    "BoundQuery",
    "BoundSetOp",
    "bind_query",
    "bind_set_op",
    "result_scope",
]


BoundQuery = BoundSelect | BoundSetOp


def bind_query(stmt: SelectStmt | SetOpStmt) -> BoundQuery:
    return bind_select(stmt) if isinstance(stmt, SelectStmt) else bind_set_op(stmt)


def bind_set_op(stmt: SetOpStmt) -> BoundSetOp:
    branches = tuple(bind_query(b) for b in stmt.branches)
    return BoundSetOp(stmt, branches, stmt.ops, set_op_order(stmt), stmt.limit, stmt.offset)


def result_scope(value: object) -> dict[str, object]:
    """The scope row a set operation's ORDER BY term reads ``value`` in."""
    return {RESULT_NAME: value}
