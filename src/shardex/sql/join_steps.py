"""The FROM clause's JOIN, NEST and UNNEST terms over the FROM term's rows, in the order
written, for whoever runs a statement: ``LocalEngine`` (inner keyspaces in memory) and the
distributed plan's initiator (inner documents read through the cluster). Each says how it
reads an inner keyspace with an ``InnerSides``; the methods are ``planner.joins``'s."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from shardex.core.expr import Expr, compile_expression
from shardex.sql.operators import UnnestSpec, unnest
from shardex.sql.operators.join import (
    JoinSpec,
    hash_join,
    index_join,
    lookup_join,
    nl_join,
    piece,
    right_join,
)
from shardex.sql.planner.joins import JoinPlan
from shardex.sql.syntax.bind import BoundSelect

Row = dict[str, Any]
# (docid, document) or (docid, document, META()): the inner documents a join reads
Docs = Iterable[tuple[Any, ...]]


class InnerSides(Protocol):
    """How a statement's runner reads the inner keyspace of join ``k`` (``b.joins[k]``)."""

    def fetch(self, k: int, keyspace: str, ids: list[str]) -> dict[str, tuple[Any, Row]]:
        """``id -> (document, META())`` of the ``ids`` that exist (ON KEYS)."""

    def scan(self, k: int) -> Docs:
        """(docid, document[, META()]) of every inner document the join may match."""

    def probe(self, k: int, values: list[Any]) -> Docs:
        """(docid, document[, META()]) of the inner documents whose probed key (the plan's first
        inner key, through its index) is among ``values``."""

    def held(self, rows: Iterable[Row]) -> Iterable[Row]:
        """``rows`` as a join holds them whole (a table of the left rows: USE HASH(PROBE),
        RIGHT JOIN), each charged to the runner's memory, if it keeps an account."""


def join_spec(
    plan: JoinPlan, params: Any, compile_fn: Callable[[Expr], Any] = compile_expression
) -> JoinSpec:
    j = plan.join

    def fn(e: Expr | None) -> Any:
        if e is None:
            return None
        f = compile_fn(e)
        return lambda row: f(row, None, params)

    def many(exprs: tuple[Expr, ...]) -> Any:
        if not exprs:
            return None
        fs = [compile_fn(e) for e in exprs]
        return lambda row: [f(row, None, params) for f in fs]

    return JoinSpec(
        alias=j.alias,
        meta_name=j.meta_name,
        kind=j.kind,
        nest=j.nest,
        on=fn(j.on),
        keys=fn(j.on_keys),
        outer_key=many(plan.outer_keys),
        inner_key=many(plan.inner_keys),
        build_inner=plan.build == "inner",
    )


def joined_rows(
    b: BoundSelect,
    rows: Iterable[Row],
    plans: Sequence[JoinPlan],
    sides: InnerSides,
    params: Any,
    unnest_specs: Sequence[UnnestSpec],
    compile_fn: Callable[[Expr], Any] = compile_expression,
    *,
    outer: Row | None = None,
) -> Iterator[Row]:
    """``rows`` (the FROM term's scope rows) through every JOIN / NEST (``plans``, one per
    ``b.joins``) and UNNEST term in the order written; ``outer``: a subquery's enclosing
    names, which a RIGHT JOIN's unmatched inner document keeps (the left side's do not)."""
    out: Iterable[Row] = rows
    for i in range(len(unnest_specs) + 1):
        for k, plan in enumerate(plans):
            if plan.join.position == i:
                out = _join(out, k, plan, sides, params, compile_fn, outer)
        if i < len(unnest_specs):
            out = unnest(out, [unnest_specs[i]])
    return iter(out)


def _join(
    rows: Iterable[Row],
    k: int,
    plan: JoinPlan,
    sides: InnerSides,
    params: Any,
    compile_fn: Callable[[Expr], Any],
    outer: Row | None,
) -> Iterator[Row]:
    spec = join_spec(plan, params, compile_fn)
    keyspace = plan.join.keyspace

    def pieces(docs: Docs) -> Iterator[Row]:
        return (piece(spec, *d) for d in docs)

    if plan.method == "keys":
        return lookup_join(rows, spec, lambda ids: sides.fetch(k, keyspace, ids))
    if plan.join.kind == "right":
        return right_join(sides.held(rows), spec, pieces(sides.scan(k)), outer)
    if plan.method == "index_nl":
        return index_join(rows, spec, lambda values: list(pieces(sides.probe(k, values))))
    if plan.method == "hash":
        left = rows if spec.build_inner else sides.held(rows)
        return hash_join(left, spec, _lazy(lambda: pieces(sides.scan(k))))
    return _nl(rows, spec, lambda: list(pieces(sides.scan(k))))


def _lazy(make: Callable[[], Iterable[Row]]) -> Iterator[Row]:
    """The inner side read when the join first asks (not when the pipeline is built)."""
    yield from make()


def _nl(rows: Iterable[Row], spec: JoinSpec, make: Callable[[], list[Row]]) -> Iterator[Row]:
    yield from nl_join(rows, spec, make())
