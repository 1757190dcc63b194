"""Subquery expressions: ``(SELECT ...)`` as a value (the array of its result values) and
``EXISTS``, evaluated by the shared interpreter.

Name binding turns a parsed ``Subquery`` into a ``BoundSubquery``: the inner statement bound
with the enclosing query's names visible (``outer``), so a correlated reference such as
``o.lines`` in ``(SELECT RAW SUM(l.price) FROM o.lines AS l)`` stays a plain identifier that
reads the outer row. Evaluating one needs an engine that can read keyspaces: whoever runs a
statement installs a ``SubqueryRunner`` with ``running_subqueries`` (the local engine, a
fragment); a subquery runs with the current row as its outer row.

An uncorrelated subquery may be valued once before its statement runs (the distributed plan
runs one over a keyspace as a query of its own): its value then travels in the statement's
parameters under ``subquery_param(text)`` and is read from there instead of running again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shardex.core.expr import Expr, Identifier, register_node
from shardex.core.expr.ast import PREC_ATOM
from shardex.core.expr.evaluator import Env, evaluate_in
from shardex.core.expr.ops import RANK_ARRAY, type_rank
from shardex.errors import ErrorCode, ShardexError

from .ast import META_KEY, Exists, outer_meta_name

_MARK = Identifier("\x00subquery")
_NOT_VALUED = object()

# (bound inner statement, outer row, params) -> the subquery's result values.
SubqueryRunner = Callable[[Any, dict[str, Any], Any], list[Any]]

_runner: ContextVar[SubqueryRunner | None] = ContextVar("shardex_subquery_runner", default=None)


@dataclass(frozen=True, slots=True)
class BoundSubquery(Expr):
    """A bound ``(SELECT ...)``. ``refs``: the enclosing query's names it reads (empty: not
    correlated, its value is the same for every outer row). ``keyspaces``: the keyspaces it
    (or a subquery inside it) reads documents of; ``scans``: those read without USE KEYS
    (a whole keyspace, which needs an index scan)."""

    bound: Any = field(compare=False)  # BoundSelect (bind.py imports this module)
    text: str
    refs: frozenset[str] = frozenset()
    keyspaces: frozenset[str] = frozenset()
    scans: frozenset[str] = frozenset()
    alias: str | None = None  # the enclosing FROM alias: its META() is passed on
    # Its text means what it was bound to on its own (no inlined WITH name of an enclosing
    # subquery in it): with no ``refs`` it can be run once as a query of its own.
    standalone: bool = True
    precedence: ClassVar[int] = PREC_ATOM

    def children(self) -> tuple[Expr, ...]:
        # The outer names it reads, and a marker: analyses that walk trees (constant
        # folding, the paths a query reads) must see that it depends on the row and on
        # documents, though its inner statement is no child expression.
        return (_MARK, *(Identifier(n) for n in sorted(self.refs)))

    def to_text(self) -> str:
        return f"({self.text})"

    @property
    def valued_once(self) -> bool:
        """Whether its value is the same for the whole statement and its text can be run on
        its own: what may be valued before the statement (``subquery_param``)."""
        return self.standalone and not self.refs


_VALUE_PREFIX = "\x00subquery."


def subquery_param(text: str) -> str:
    """The parameter an uncorrelated subquery's value travels under, valued once."""
    return _VALUE_PREFIX + text


@contextlib.contextmanager
def running_subqueries(runner: SubqueryRunner) -> Iterator[None]:
    """Subqueries evaluated inside the block run on ``runner``."""
    token = _runner.set(runner)
    try:
        yield
    finally:
        _runner.reset(token)


def current_runner() -> SubqueryRunner | None:
    return _runner.get()


def _subquery(node: BoundSubquery, env: Env) -> Any:
    run = _runner.get()
    if run is None:
        raise ShardexError(
            f"a subquery cannot run here: ({node.text})",
            code=ErrorCode.BAD_REQUEST,
            details={"subquery": node.text, "hint": "use subqueries inside a statement"},
        )
    params = env.params
    if node.valued_once and isinstance(params, dict):
        valued = params.get(subquery_param(node.text), _NOT_VALUED)
        if valued is not _NOT_VALUED:
            return valued
    return run(node.bound, outer_row(node, env.doc), params)


def outer_row(node: BoundSubquery, row: Any) -> dict[str, Any]:
    """The outer row ``node`` runs with when evaluated on ``row``."""
    outer = row if isinstance(row, dict) else {}
    if node.alias is not None and META_KEY in outer:
        # The subquery's own rows replace META_KEY: the enclosing alias's stays readable.
        outer = {**outer, outer_meta_name(node.alias): outer[META_KEY]}
    return outer


def _exists(node: Exists, env: Env) -> Any:
    value = evaluate_in(node.operand, env)
    return type_rank(value) == RANK_ARRAY and len(value) > 0


register_node(BoundSubquery, _subquery)
register_node(Exists, _exists)
