"""Subquery expressions in the distributed plan (decision 0120).

A subquery whose FROM is an expression (the outer row's array, ``FROM o.lines AS l``, a
literal, a LET variable) or that has no FROM reads no document: it runs wherever its row is
evaluated, in a leaf for WHERE and the projection, at the root for LETTING, HAVING and a
grouped projection, with the same operators ``LocalEngine`` runs. A subquery over a
keyspace would need document reads from inside a leaf's per-row work; the planner refuses
it (``refuse_keyspace_subqueries``) with a clear error, and the reference engine runs it.

Each result a subquery materialises is charged to the query's memory budget while it is
held (until the next one replaces it): a subquery over a huge array fails with
QUERY_MEMORY_LIMIT, as any operator past the budget, instead of growing unseen.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from shardex.errors import ErrorCode, ShardexError
from shardex.sql.exec.memory import Budget, value_size
from shardex.sql.local import LocalEngine
from shardex.sql.syntax.bind import BoundSelect, subqueries_of
from shardex.sql.syntax.subquery import BoundSubquery, SubqueryRunner, running_subqueries

__all__ = [
    "budgeted_runner",
    "expression_runner",
    "refuse_keyspace_subqueries",
    "with_subqueries",
]

# Runs subqueries over expressions: it holds no keyspace (those are refused at planning).
_EXPRESSIONS = LocalEngine()


def _all_subqueries(b: BoundSelect) -> list[BoundSubquery]:
    """``b``'s subqueries, found once per bound statement (the statement cache hands the
    same one to every execution)."""
    cached: list[BoundSubquery] | None = b.__dict__.get("_subqueries")
    if cached is None:
        cached = subqueries_of(b)
        object.__setattr__(b, "_subqueries", cached)  # a cache, not state: frozen stays true
    return cached


def refuse_keyspace_subqueries(b: BoundSelect) -> None:
    """A clear error when a subquery of ``b`` reads a keyspace (see the module doc)."""
    for sub in _all_subqueries(b):
        if sub.keyspaces:
            raise _refused(sorted(sub.keyspaces)[0], sub.text)


def _check_expression_only(sub: BoundSelect) -> None:
    ref = sub.from_
    if ref is not None and ref.source is None:
        raise _refused(ref.name, ref.name)
    refuse_keyspace_subqueries(sub)


def _refused(keyspace: str, text: str) -> ShardexError:
    return ShardexError(
        f"a subquery over keyspace {keyspace!r} cannot run inside a distributed query: ({text})",
        code=ErrorCode.BAD_REQUEST,
        details={
            "subquery": text,
            "keyspace": keyspace,
            "hint": "run it as its own query and pass its result as a parameter, or make it "
            "read the outer row (FROM alias.path AS x)",
        },
    )


def expression_runner(sub: BoundSelect, outer: dict[str, Any], params: Any) -> list[Any]:
    """Runs an expression subquery without charging a budget (a FROM (SELECT ...) the root
    evaluates once, whole, as any expression FROM)."""
    _check_expression_only(sub)
    return list(_EXPRESSIONS.run_select(sub, params, outer))


def budgeted_runner(budget: Budget) -> SubqueryRunner:
    """Runs expression subqueries, each result charged to ``budget`` while it is held."""
    res = budget.reserve("subquery")
    held = 0

    def run(sub: BoundSelect, outer: dict[str, Any], params: Any) -> list[Any]:
        nonlocal held
        _check_expression_only(sub)  # planning refused these already: a safeguard
        values = list(_EXPRESSIONS.run_select(sub, params, outer))
        size = value_size(values)
        res.shrink(held)
        held = 0
        if not res.grow(size):
            res.shrink(size)
            raise res.over(size, "a subquery's result is held whole")
        held = size
        return values

    return run


def with_subqueries(b: BoundSelect, rows: Iterable[Any], budget: Budget) -> Iterator[Any]:
    """``rows`` (a lazy operator chain over ``b``) pulled with ``b``'s subqueries running on
    a budgeted runner. The runner is installed around each pull, not around the chain: the
    chain may be resumed on another thread (``bridge.run_pipeline``)."""
    if not _all_subqueries(b):
        return iter(rows)
    return _pulled(iter(rows), budgeted_runner(budget))


def _pulled(it: Iterator[Any], runner: SubqueryRunner) -> Iterator[Any]:
    end = object()
    while True:
        with running_subqueries(runner):
            row = next(it, end)
        if row is end:
            return
        yield row
